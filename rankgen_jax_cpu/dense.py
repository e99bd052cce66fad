"""A dense layer x w on CPU whose three products are the kernels of `cpu_kernels.cc`.

The forward product x w and d_x = d_y w^T read x (or d_y) in place and the weight
packed once per call into panels that stay in L1; XLA:CPU's own dots run the same
shapes at 225-330 GFLOP/s on a 2-core AVX-512 Xeon, the kernel at 267-333 (8192
tokens; both vary from run to run, docs/performance/cpu-kernels.md, 'Dense-layer kernels'). The weight gradient
x^T d_y, a transposed-left product with a long K (the tokens), is where XLA:CPU is
slowest: [512, 384] at 187-197 GFLOP/s against the kernel's 265-272. At T5 small's
MLP shapes ([512, 1024], [1024, 512]) the kernel is also ahead alone (265-278
against 232-265) but the training step did not move, so weights above 512 x 512
keep XLA's gradient.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rankgen_jax_cpu.build import require

WEIGHT_GRADIENT_TARGET = "rankgen_weight_gradient"
MATMUL_TARGET = "rankgen_matmul"
MATMUL_TRANSPOSED_TARGET = "rankgen_matmul_transposed"
MAX_KERNEL_GRADIENT_ELEMENTS = 512 * 512


def kernel_gradient_applies(m: int, n: int) -> bool:
    """Whether a [m, n] weight's gradient comes from the kernel rather than XLA (see the module docstring)."""
    return m * n <= MAX_KERNEL_GRADIENT_ELEMENTS


def weight_gradient(x_TxM: jax.Array, d_y_TxN: jax.Array) -> jax.Array:
    """x^T d_y in float32 for 2-D x [T, M] and d_y [T, N]."""
    require()
    out_type = jax.ShapeDtypeStruct((x_TxM.shape[-1], d_y_TxN.shape[-1]), jnp.float32)
    return jax.ffi.ffi_call(WEIGHT_GRADIENT_TARGET, out_type)(x_TxM.astype(jnp.float32), d_y_TxN.astype(jnp.float32))


def matmul(a: jax.Array, w: jax.Array, transposed: bool = False) -> jax.Array:
    """a [..., K] @ w for float32 w [K, N], or @ w.T for w [N, K] when `transposed`."""
    require()
    n = w.shape[0] if transposed else w.shape[1]
    out_type = jax.ShapeDtypeStruct((*a.shape[:-1], n), jnp.float32)
    target = MATMUL_TRANSPOSED_TARGET if transposed else MATMUL_TARGET
    return jax.ffi.ffi_call(target, out_type)(a.astype(jnp.float32), w.astype(jnp.float32))


@jax.custom_vjp
def fused_dense(x: jax.Array, w_MxN: jax.Array) -> jax.Array:
    """x @ w for float32 x [..., M] and w [M, N], with the CPU kernels' matmuls."""
    return matmul(x, w_MxN)


def _fwd(x, w_MxN):
    return matmul(x, w_MxN), (x, w_MxN)


def dense_weight_gradient(x: jax.Array, d_y: jax.Array) -> jax.Array:
    """x^T d_y over all leading axes: the kernel for weights up to 512 x 512, else XLA's dot."""
    tokens = math.prod(x.shape[:-1])  # not reshape(-1, M): M may be 0
    x_TxM, d_y_TxN = x.reshape(tokens, x.shape[-1]), d_y.reshape(tokens, d_y.shape[-1])
    if kernel_gradient_applies(x_TxM.shape[1], d_y_TxN.shape[1]):
        return weight_gradient(x_TxM, d_y_TxN)
    return jnp.dot(x_TxM.T, d_y_TxN)


def _bwd(residuals, d_y):
    x, w_MxN = residuals
    return matmul(d_y, w_MxN, transposed=True), dense_weight_gradient(x, d_y)


fused_dense.defvjp(_fwd, _bwd)
