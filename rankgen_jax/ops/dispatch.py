"""The one place that picks how each model op runs: XLA, or the C++ kernels for XLA:CPU (`rankgen_jax.kernels`).

The models call dense, rms_norm, gated_gelu, gated_gelu_mlp and attention and
never look at the platform. The kernels run where they apply: compiling for
CPU, float32 throughout, at most one device in the mesh (they have no sharding
rule), and the kernels built and enabled here (`kernels.build.available`).
Everywhere else XLA runs the same function; on CPU its attention uses the VJP
written for XLA:CPU's matmuls (`attention.softmax_attention_cpu`), on GPU cuDNN's
fused attention where it applies (`attention.library_attention`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rankgen_jax.kernels import build as cpu_kernels
from rankgen_jax.kernels.dense import fused_dense
from rankgen_jax.kernels.fused_attention import fused_attention
from rankgen_jax.kernels.gated_gelu import fused_gated_gelu, fused_gated_gelu_mlp
from rankgen_jax.kernels.rms_norm import fused_rms_norm
from rankgen_jax.ops.attention import (
    cudnn_supports,
    library_attention,
    softmax_attention_autodiff,
    softmax_attention_cpu,
)


def target_platform() -> str:
    """The platform the computation being traced targets: the mesh's, else the default backend's.

    The mesh decides when they differ: an AOT compile for a TPU topology runs on a CPU host.
    """
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return device.platform if device is not None else jax.default_backend()


def _compiling_for_cpu() -> bool:
    return target_platform() == "cpu"


def _cpu_kernels_apply(x: jax.Array, dtype) -> bool:
    """CPU, float32 throughout, and at most one device in the mesh (the kernels have no sharding rule)."""
    if not _compiling_for_cpu() or jnp.dtype(dtype) != jnp.float32 or x.dtype != jnp.float32:
        return False
    return jax.sharding.get_abstract_mesh().size <= 1 and cpu_kernels.available()


def dense(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
    """x @ kernel over the last axis of x, computed in `dtype` (the kernels' matmuls where they apply)."""
    if _cpu_kernels_apply(x, dtype):
        return fused_dense(x, kernel)
    return jnp.dot(x.astype(dtype), kernel.astype(dtype))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale over the last axis, computed in float32, returned in `dtype`."""
    if _cpu_kernels_apply(x, dtype):
        return fused_rms_norm(x, scale, eps)
    x32 = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(variance + eps) * scale).astype(dtype)


def gated_gelu(gate: jax.Array, linear: jax.Array, dtype) -> jax.Array:
    """gelu(gate) * linear with the tanh GELU (T5 1.1)."""
    if _cpu_kernels_apply(gate, dtype) and linear.dtype == jnp.float32:
        return fused_gated_gelu(gate, linear)
    return jax.nn.gelu(gate, approximate=True) * linear


def gated_gelu_mlp(x_TxD: jax.Array, w0_DxF: jax.Array, w1_DxF: jax.Array, wo_FxD: jax.Array, dtype,
                   dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """T5 1.1's MLP block, (gelu(x w0) * (x w1)) wo, with `dropout` (if any) on the hidden activations.

    Without dropout, and where the kernels apply, the whole block is one fused
    kernel (`kernels.gated_gelu.fused_gated_gelu_mlp`); otherwise each product
    and the GELU are dispatched on their own.
    """
    if dropout is None and _cpu_kernels_apply(x_TxD, dtype):
        return fused_gated_gelu_mlp(x_TxD, w0_DxF, w1_DxF, wo_FxD)
    h_TxF = gated_gelu(dense(x_TxD, w0_DxF, dtype), dense(x_TxD, w1_DxF, dtype), dtype)
    if dropout is not None:
        h_TxF = dropout(h_TxF)
    return dense(h_TxF, wo_FxD, dtype)


GPU_PLATFORMS = ("gpu", "cuda")


def attention_implementation(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, dtype, with_dropout: bool) -> str:
    """Which attention runs: `cpu_kernel`, `cpu` (XLA with the CPU VJP), `cudnn` or `xla`.

    GPU: cuDNN's fused attention where it takes the inputs (bfloat16 / float16, head dim,
    even lengths; no dropout), XLA's otherwise. TPU: XLA's, which fuses the softmax into
    the surrounding matmuls itself.
    """
    if not with_dropout and _cpu_kernels_apply(q_BxLxHxK, dtype):
        return "cpu_kernel"
    platform = target_platform()
    if platform == "cpu":
        return "cpu"
    if platform in GPU_PLATFORMS and not with_dropout and cudnn_supports(q_BxLxHxK, k_BxLxHxK):
        return "cudnn"
    return "xla"


def attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL, keep_BxHxLxL, dtype) -> jax.Array:
    """softmax(q k^T + position_bias + mask_bias) v, [B, L, H, K] in and out; logits and softmax in float32.

    position_bias: [1, H, L, L] or None; mask_bias_Bx1x1xL: additive key mask;
    keep_BxHxLxL: dropout's keep mask scaled by 1/keep_prob, or None. The
    implementation is `attention_implementation`'s pick.
    """
    implementation = attention_implementation(q_BxLxHxK, k_BxLxHxK, dtype, keep_BxHxLxL is not None)
    if implementation == "cpu_kernel":
        return fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL)
    if implementation == "cudnn":
        return library_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL, dtype, "cudnn")
    bias = mask_bias_Bx1x1xL if position_bias is None else position_bias.astype(jnp.float32) + mask_bias_Bx1x1xL
    softmax_attention = softmax_attention_cpu if implementation == "cpu" else softmax_attention_autodiff
    return softmax_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype)
