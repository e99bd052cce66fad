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

import numpy as np

from rankgen_jax.errors import RankgenError

# jax is imported inside the functions: the configs import this module, and `rankgen-jax compile`
# must set libtpu's environment before jax loads.

PARAM_DTYPE = np.dtype(np.float32)
ACTIVATION_DTYPES = ("auto", "float32", "bfloat16")
# Platforms whose matmul units run bfloat16 at a multiple of their float32 rate.
ACCELERATOR_PLATFORMS = ("gpu", "cuda", "rocm", "tpu")


def check_activation_dtype(name: str, where: str) -> None:
    if name not in ACTIVATION_DTYPES:
        raise RankgenError(f"{where}={name!r}: expected one of {ACTIVATION_DTYPES}")


def resolve_activation_dtype(name: str, platform: str):
    """The activation dtype a config's `dtype` names, on `platform` (`auto`: bfloat16 on accelerators)."""
    import jax.numpy as jnp

    check_activation_dtype(name, "dtype")
    if name == "auto":
        return jnp.dtype(jnp.bfloat16 if platform in ACCELERATOR_PLATFORMS else jnp.float32)
    return jnp.dtype(name)


def activation_dtype(name: str):
    """The activation dtype for the computation being traced."""
    from rankgen_jax.ops.dispatch import target_platform

    return resolve_activation_dtype(name, target_platform())
