"""T5 1.1's gated GELU on CPU, gelu(gate) * linear with the tanh GELU: the kernels of `cpu_kernels.cc`.

XLA:CPU computes the same thing in fused element-wise loops, but its tanh is
costly: replacing the GELU by a ReLU made the tiny train step 5% faster. The
kernel does one pass each way and recomputes tanh in the backward pass.

`fused_gated_gelu_mlp` is the whole MLP block, (gelu(x w0) * (x w1)) wo. Its
input side computes both products and the GELU in one kernel pass (the GELU
reads each task's rows while they are still in cache), and its backward pass
forms d_h = d_y wo^T a few rows at a time and applies the GELU's gradient to
them without writing d_h to memory. Same bits as the separate kernels; the
weight gradients are `dense.dense_weight_gradient`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax_cpu.build import require
from rankgen_jax_cpu.dense import dense_weight_gradient, matmul

FORWARD_TARGET = "rankgen_gated_gelu_forward"
BACKWARD_TARGET = "rankgen_gated_gelu_backward"
DENSE_TARGET = "rankgen_gated_gelu_dense"
DENSE_BACKWARD_TARGET = "rankgen_gated_gelu_dense_backward"


@jax.custom_vjp
def fused_gated_gelu(gate: jax.Array, linear: jax.Array) -> jax.Array:
    """gelu(gate, approximate=True) * linear, float32, any shape (both the same)."""
    require()
    return jax.ffi.ffi_call(FORWARD_TARGET, jax.ShapeDtypeStruct(gate.shape, jnp.float32))(gate, linear)


def _fwd(gate, linear):
    return fused_gated_gelu(gate, linear), (gate, linear)


def _bwd(residuals, d_out):
    gate, linear = residuals
    out_types = (jax.ShapeDtypeStruct(gate.shape, jnp.float32),) * 2
    return tuple(jax.ffi.ffi_call(BACKWARD_TARGET, out_types)(gate, linear, d_out.astype(jnp.float32)))


fused_gated_gelu.defvjp(_fwd, _bwd)


def _mlp_input_side(x, w0_DxF, w1_DxF):
    """(gate, linear, gelu(gate) * linear) for float32 x [..., D]."""
    require()
    shape = jax.ShapeDtypeStruct((*x.shape[:-1], w0_DxF.shape[1]), jnp.float32)
    return jax.ffi.ffi_call(DENSE_TARGET, (shape,) * 3)(x, w0_DxF, w1_DxF)


@jax.custom_vjp
def fused_gated_gelu_mlp(x: jax.Array, w0_DxF: jax.Array, w1_DxF: jax.Array, wo_FxD: jax.Array) -> jax.Array:
    """(gelu(x w0, approximate=True) * (x w1)) wo for float32 x [..., D]: T5 1.1's MLP block."""
    return matmul(_mlp_input_side(x, w0_DxF, w1_DxF)[2], wo_FxD)


def _mlp_fwd(x, w0_DxF, w1_DxF, wo_FxD):
    gate, linear, h = _mlp_input_side(x, w0_DxF, w1_DxF)
    return matmul(h, wo_FxD), (x, w0_DxF, w1_DxF, wo_FxD, gate, linear, h)


def _mlp_bwd(residuals, d_y):
    x, w0_DxF, w1_DxF, wo_FxD, gate, linear, h = residuals
    d_y = d_y.astype(jnp.float32)
    out_types = (jax.ShapeDtypeStruct(gate.shape, jnp.float32),) * 2
    d_gate, d_linear = jax.ffi.ffi_call(DENSE_BACKWARD_TARGET, out_types)(d_y, wo_FxD, gate, linear)
    # d_x as two kernel products and XLA's add: computing it inside the kernel above, from
    # rows still in cache, was slower in the step (it serialises the weight gradients behind it).
    d_x = matmul(d_gate, w0_DxF, transposed=True) + matmul(d_linear, w1_DxF, transposed=True)
    return (d_x, dense_weight_gradient(x, d_gate), dense_weight_gradient(x, d_linear),
            dense_weight_gradient(h, d_y))


fused_gated_gelu_mlp.defvjp(_mlp_fwd, _mlp_bwd)
