"""The dtype policy of every model, in one place.

- Parameters, their gradients and the optimizer state: float32 (`PARAM_DTYPE`);
  the layers cast a weight to the activation dtype where they use it.
- Activations (matmul inputs and outputs, the residual stream): the encoder
  config's `dtype`. `auto`, the default, is bfloat16 where the program is
  compiled for an accelerator (GPU, TPU) and float32 on CPU, whose matmuls gain
  nothing from bfloat16; `float32` or `bfloat16` force one.
- Always float32, whatever the activations: norm statistics (`dispatch.rms_norm`,
  BERT's LayerNorm), attention logits, T5's position bias and the softmax
  statistics (`ops.attention`), pooled vectors and projections (`models.heads`),
  similarity logits and losses (`losses`).

The platform is the one the computation is traced for (the mesh's, so an
ahead-of-time compile for a TPU topology on a CPU host resolves to bfloat16).
"""

from __future__ import annotations

import jax.numpy as jnp

from rankgen_jax.errors import RankgenError
from rankgen_jax.ops.dispatch import target_platform

PARAM_DTYPE = jnp.float32
ACTIVATION_DTYPES = ("auto", "float32", "bfloat16")
# Platforms whose matmul units run bfloat16 at a multiple of their float32 rate.
ACCELERATOR_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")


def check_activation_dtype(name: str, where: str) -> None:
    if name not in ACTIVATION_DTYPES:
        raise RankgenError(f"{where}={name!r}: expected one of {ACTIVATION_DTYPES}")


def resolve_activation_dtype(name: str, platform: str) -> jnp.dtype:
    """The activation dtype a config's `dtype` names, on `platform` (`auto`: bfloat16 on accelerators)."""
    check_activation_dtype(name, "dtype")
    if name == "auto":
        return jnp.dtype(jnp.bfloat16 if platform in ACCELERATOR_PLATFORMS else jnp.float32)
    return jnp.dtype(name)


def activation_dtype(name: str) -> jnp.dtype:
    """The activation dtype for the computation being traced."""
    return resolve_activation_dtype(name, target_platform())
