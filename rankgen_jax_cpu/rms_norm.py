"""T5's RMS norm on CPU, x / sqrt(mean(x^2) + eps) * scale in float32: the kernel of `cpu_kernels.cc`.

XLA:CPU splits the row reduction into a reduce-window and a reduce and makes
several passes over the activations each way; the kernel reads each row once
forward and once backward, and saves 1/rms per row for the backward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rankgen_jax_cpu.build import require

FORWARD_TARGET = "rankgen_rms_norm_forward"
BACKWARD_TARGET = "rankgen_rms_norm_backward"


def fused_rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMS norm over the last axis of float32 `x` ([..., D]) with `scale` [D]."""
    require()
    return _fused(x.astype(jnp.float32), scale.astype(jnp.float32), float(eps))


def _forward_call(x, scale, eps):
    out_types = (jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call(FORWARD_TARGET, out_types)(x, scale, jnp.full((1,), eps, jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fused(x, scale, eps):
    return _forward_call(x, scale, eps)[0]


def _fused_fwd(x, scale, eps):
    y, inv_rms = _forward_call(x, scale, eps)
    return y, (x, scale, inv_rms)


def _fused_bwd(eps, residuals, d_y):
    del eps  # inside inv_rms
    x, scale, inv_rms = residuals
    out_types = (jax.ShapeDtypeStruct(x.shape, jnp.float32), jax.ShapeDtypeStruct(scale.shape, jnp.float32))
    return tuple(jax.ffi.ffi_call(BACKWARD_TARGET, out_types)(x, scale, inv_rms, d_y.astype(jnp.float32)))


_fused.defvjp(_fused_fwd, _fused_bwd)
