"""The plug-in's `KernelSet`: the kernels of this package, and the inputs they apply to."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax.ops import dispatch
from rankgen_jax_cpu.build import available
from rankgen_jax_cpu.dense import fused_dense
from rankgen_jax_cpu.fused_attention import fused_attention
from rankgen_jax_cpu.gated_gelu import fused_gated_gelu, fused_gated_gelu_mlp
from rankgen_jax_cpu.rms_norm import fused_rms_norm


def kernels_apply(x: jax.Array, dtype) -> bool:
    """Compiling for CPU, float32 throughout, and at most one device in the mesh (the kernels have no sharding rule)."""
    if dispatch.target_platform() != "cpu" or jnp.dtype(dtype) != jnp.float32 or x.dtype != jnp.float32:
        return False
    return jax.sharding.get_abstract_mesh().size <= 1


def kernel_set() -> dispatch.KernelSet | None:
    """The kernels, compiled and registered with XLA:CPU; None where they cannot or should not run here (it warns why)."""
    if not available():
        return None
    return dispatch.KernelSet(name="cpu_kernel", applies=kernels_apply, dense=fused_dense, rms_norm=fused_rms_norm,
                              gated_gelu=fused_gated_gelu, gated_gelu_mlp=fused_gated_gelu_mlp,
                              attention=fused_attention)
