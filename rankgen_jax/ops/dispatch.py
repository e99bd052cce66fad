"""The one place that picks how each model op runs: XLA, or a kernel plug-in's faster implementation.

The models call dense, rms_norm, gated_gelu, gated_gelu_mlp and attention and
never look at the platform. XLA is the implementation everywhere; on CPU its
attention uses the VJP written for XLA:CPU's matmuls (`attention.softmax_attention_cpu`),
on GPU cuDNN's fused attention where it applies (`attention.library_attention`).

A kernel plug-in is a separately importable package that offers a `KernelSet`:
the same five ops, and the inputs they apply to. Nothing here imports one. It
runs only when enabled: named in `RANKGEN_KERNEL_PLUGIN` (loaded on first use),
or passed to `use_kernels`. The repository's `rankgen_jax_cpu` is one: C++
kernels for XLA:CPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rankgen_jax.errors import RankgenError
from rankgen_jax.ops.attention import (
    cudnn_supports,
    library_attention,
    softmax_attention_autodiff,
    softmax_attention_cpu,
)

PLUGIN_VARIABLE = "RANKGEN_KERNEL_PLUGIN"


@dataclasses.dataclass(frozen=True)
class KernelSet:
    """A plug-in's implementations of the model ops, with the same signatures as this module's (less `dtype`).

    applies(x, dtype): whether they run for an input `x` computed in `dtype`
    (checked at trace time: platform, dtypes, mesh); where False, XLA runs.
    name: what `attention_implementation` reports for the plug-in's attention.
    """

    name: str
    applies: Callable[[Any, Any], bool]
    dense: Callable[..., jax.Array]
    rms_norm: Callable[..., jax.Array]
    gated_gelu: Callable[..., jax.Array]
    gated_gelu_mlp: Callable[..., jax.Array]
    attention: Callable[..., jax.Array]


# The kernel set in use: unset until `active_kernels` first reads RANKGEN_KERNEL_PLUGIN.
_UNSET = object()
_active: list = [_UNSET]


def use_kernels(kernels: KernelSet | None) -> None:
    """Run `kernels` where they apply from now on (None: XLA only), whatever RANKGEN_KERNEL_PLUGIN says."""
    _active[0] = kernels


def active_kernels() -> KernelSet | None:
    """The kernel set in use; on first call, the one of the plug-in RANKGEN_KERNEL_PLUGIN names (if any).

    A plug-in is a module with `kernel_set() -> KernelSet | None` (None where
    its kernels cannot run here; it says why).
    """
    if _active[0] is _UNSET:
        module_name = os.environ.get(PLUGIN_VARIABLE, "").strip()
        kernels = None
        if module_name:
            try:
                module = importlib.import_module(module_name)
            except ImportError as err:
                raise RankgenError(f"{PLUGIN_VARIABLE}={module_name!r}: the kernel plug-in cannot be imported "
                                   f"({err}); install it, or unset {PLUGIN_VARIABLE} to run XLA only") from err
            if not callable(getattr(module, "kernel_set", None)):
                raise RankgenError(f"{PLUGIN_VARIABLE}={module_name!r}: that module has no kernel_set() function, "
                                   "so it is not a kernel plug-in")
            kernels = module.kernel_set()
        _active[0] = kernels
    return _active[0]


def target_platform() -> str:
    """The platform the computation being traced targets: the mesh's, else the default backend's.

    The mesh decides when they differ: an AOT compile for a TPU topology runs on a CPU host.
    """
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return device.platform if device is not None else jax.default_backend()


def _kernels_for(*xs: jax.Array, dtype) -> KernelSet | None:
    """The active kernel set if it applies to every input, else None (XLA)."""
    kernels = active_kernels()
    if kernels is None or not all(kernels.applies(x, dtype) for x in xs):
        return None
    return kernels


def dense(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
    """x @ kernel over the last axis of x, computed in `dtype`."""
    if kernels := _kernels_for(x, dtype=dtype):
        return kernels.dense(x, kernel)
    return jnp.dot(x.astype(dtype), kernel.astype(dtype))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale over the last axis, computed in float32, returned in `dtype`."""
    if kernels := _kernels_for(x, dtype=dtype):
        return kernels.rms_norm(x, scale, eps)
    x32 = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(variance + eps) * scale).astype(dtype)


def gated_gelu(gate: jax.Array, linear: jax.Array, dtype) -> jax.Array:
    """gelu(gate) * linear with the tanh GELU (T5 1.1)."""
    if kernels := _kernels_for(gate, linear, dtype=dtype):
        return kernels.gated_gelu(gate, linear)
    return jax.nn.gelu(gate, approximate=True) * linear


def gated_gelu_mlp(x_TxD: jax.Array, w0_DxF: jax.Array, w1_DxF: jax.Array, wo_FxD: jax.Array, dtype,
                   dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """T5 1.1's MLP block, (gelu(x w0) * (x w1)) wo, with `dropout` (if any) on the hidden activations.

    Without dropout, and where a kernel set applies, the whole block is its one
    `gated_gelu_mlp`; otherwise each product and the GELU are dispatched on their own.
    """
    if dropout is None and (kernels := _kernels_for(x_TxD, dtype=dtype)):
        return kernels.gated_gelu_mlp(x_TxD, w0_DxF, w1_DxF, wo_FxD)
    h_TxF = gated_gelu(dense(x_TxD, w0_DxF, dtype), dense(x_TxD, w1_DxF, dtype), dtype)
    if dropout is not None:
        h_TxF = dropout(h_TxF)
    return dense(h_TxF, wo_FxD, dtype)


GPU_PLATFORMS = ("gpu", "cuda")


def attention_implementation(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, dtype, with_dropout: bool) -> str:
    """Which attention runs: a kernel set's (its name), `cpu` (XLA with the CPU VJP), `cudnn` or `xla`.

    GPU: cuDNN's fused attention where it takes the inputs (bfloat16 / float16, head dim,
    even lengths; no dropout), XLA's otherwise. TPU: XLA's, which fuses the softmax into
    the surrounding matmuls itself.
    """
    if not with_dropout and (kernels := _kernels_for(q_BxLxHxK, dtype=dtype)):
        return kernels.name
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
    if implementation == "cudnn":
        return library_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL, dtype, "cudnn")
    if implementation not in ("cpu", "xla"):
        return active_kernels().attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL)
    bias = mask_bias_Bx1x1xL if position_bias is None else position_bias.astype(jnp.float32) + mask_bias_Bx1x1xL
    softmax_attention = softmax_attention_cpu if implementation == "cpu" else softmax_attention_autodiff
    return softmax_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype)
