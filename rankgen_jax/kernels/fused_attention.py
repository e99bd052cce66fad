"""Fused softmax attention on CPU: a C++ kernel (`attention_cpu.cc`) behind the XLA FFI.

The kernel is compiled on first use with the system C++ compiler (`$CXX`, else
g++), for this machine's instruction set, into a cache folder keyed by the
source, the flags, jaxlib's version and the CPU. Where no compiler works, or
`RANKGEN_FUSED_ATTENTION=0`, `available()` is False and callers use the XLA
implementations: one warning says why, and nothing else changes.

It computes what `attention.softmax_attention_autodiff` computes (float32, no
dropout, self-attention) with one task per (batch row, head) whose [L, L]
matrices never leave the cache; the backward pass recomputes the weights from
the saved log-normalisers, as flash attention does.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

SOURCE = Path(__file__).with_name("attention_cpu.cc")
CXX_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared")
FORWARD_TARGET = "rankgen_attention_forward"
BACKWARD_TARGET = "rankgen_attention_backward"


def _cpu_signature() -> str:
    """Model name and feature flags: -march=native code must not run on another CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def cache_dir() -> Path:
    """Where compiled kernels are kept (`RANKGEN_KERNEL_CACHE`, else ~/.cache/rankgen_jax/kernels)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rankgen_jax" / "kernels"
    return Path(os.environ.get("RANKGEN_KERNEL_CACHE", default))


def _compile() -> Path:
    """The kernel library, compiled now unless the cache holds this exact build; raises on failure."""
    import jaxlib

    compiler = os.environ.get("CXX", "g++")
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), compiler, *CXX_FLAGS, jaxlib.__version__, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    library = cache_dir() / f"attention_cpu-{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        built = Path(tmp) / library.name
        command = [compiler, *CXX_FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", str(built)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
        os.replace(built, library)  # atomic: concurrent processes see all of it or nothing
    return library


@functools.cache
def available() -> bool:
    """Whether the fused kernel is compiled and registered with XLA:CPU (compiles it once)."""
    if os.environ.get("RANKGEN_FUSED_ATTENTION", "1") == "0":
        return False
    try:
        import ctypes

        library = ctypes.cdll.LoadLibrary(str(_compile()))
        jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(library.RankgenAttentionForward), platform="cpu")
        jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(library.RankgenAttentionBackward), platform="cpu")
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        print(f"warning: fused CPU attention unavailable, using XLA's: {err}", file=sys.stderr)
        return False
    return True


def _as_kernel_inputs(position_bias, mask_bias_Bx1x1xL):
    batch, length = mask_bias_Bx1x1xL.shape[0], mask_bias_Bx1x1xL.shape[-1]
    if position_bias is None:
        pos_HxLxL = jnp.zeros((0,), jnp.float32)
    else:
        if position_bias.shape[0] != 1:
            raise ValueError(f"fused attention takes one position bias for the batch, got shape {position_bias.shape}")
        pos_HxLxL = position_bias.reshape(position_bias.shape[1:]).astype(jnp.float32)
    # The mask bias comes from the input ids: no gradient is computed for it.
    mask_BxL = jax.lax.stop_gradient(mask_bias_Bx1x1xL.reshape(batch, length).astype(jnp.float32))
    return pos_HxLxL, mask_BxL


def fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL) -> jax.Array:
    """softmax(q k^T + position_bias + mask_bias) v in float32, [B, L, H, K] in and out.

    position_bias: [1, H, L, L] or None; mask_bias_Bx1x1xL: additive, per key. No dropout.
    """
    if not available():
        raise RuntimeError("the fused CPU attention kernel is not available here (see the warning above)")
    pos_HxLxL, mask_BxL = _as_kernel_inputs(position_bias, mask_bias_Bx1x1xL)
    return _fused(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, pos_HxLxL, mask_BxL)


def _forward_call(q, k, v, pos_HxLxL, mask_BxL):
    batch, length, heads, _ = q.shape
    out_types = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32))
    return jax.ffi.ffi_call(FORWARD_TARGET, out_types)(q, k, v, pos_HxLxL, mask_BxL)


@jax.custom_vjp
def _fused(q, k, v, pos_HxLxL, mask_BxL):
    return _forward_call(q, k, v, pos_HxLxL, mask_BxL)[0]


def _fused_fwd(q, k, v, pos_HxLxL, mask_BxL):
    out, lse_BxHxL = _forward_call(q, k, v, pos_HxLxL, mask_BxL)
    return out, (q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL)


def _fused_bwd(residuals, d_out):
    q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL = residuals
    out_types = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v, pos_HxLxL))
    d_q, d_k, d_v, d_pos = jax.ffi.ffi_call(BACKWARD_TARGET, out_types)(
        q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL, d_out.astype(jnp.float32)
    )
    # mask_BxL is under stop_gradient (fused_attention): its cotangent is never used.
    return d_q, d_k, d_v, d_pos, jnp.zeros_like(mask_BxL)


_fused.defvjp(_fused_fwd, _fused_bwd)
