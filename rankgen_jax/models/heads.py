"""Heads that turn encoder hidden states into vectors, and the dual encoder built from them."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankgen_jax.configs import HeadConfig, ModelConfig
from rankgen_jax.models.layers import DenseKernel, activation_dtype
from rankgen_jax.models.t5 import EncoderOutput, T5Encoder


def masked_mean(x_BxLxD: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """Mean over the non-pad positions (in float32)."""
    mask = mask_BxL.astype(jnp.float32)[..., None]
    total = jnp.sum(x_BxLxD.astype(jnp.float32) * mask, axis=1)
    return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def pool(output: EncoderOutput, mask_BxL: jax.Array, pooling: str) -> jax.Array:
    """One vector per input: `first` token, `mean` of the last layer over non-pad tokens,
    `first_last_avg` (embedding output and last layer), `last2_avg` (last two layers)."""
    last = output.last_hidden_state
    if pooling == "first":
        return last[:, 0].astype(jnp.float32)
    if pooling == "mean":
        return masked_mean(last, mask_BxL)
    if output.hidden_states is None:
        raise ValueError(f"pooling {pooling!r} needs the encoder's hidden states")
    if pooling == "first_last_avg":
        first = output.hidden_states[0]
    elif pooling == "last2_avg":
        first = output.hidden_states[-2]
    else:
        raise ValueError(f"unknown pooling {pooling!r}")
    return masked_mean((first.astype(jnp.float32) + last.astype(jnp.float32)) / 2.0, mask_BxL)


def l2_normalize(x_BxD: jax.Array, eps: float = 1e-12) -> jax.Array:
    return x_BxD * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(x_BxD), axis=-1, keepdims=True), eps))


class VectorHead(nn.Module):
    """Pooling -> optional bias-free projection (`projection_layer`) -> optional L2 norm."""

    config: HeadConfig
    d_model: int

    @nn.compact
    def __call__(self, output: EncoderOutput, mask_BxL: jax.Array) -> jax.Array:
        vectors_BxD = pool(output, mask_BxL, self.config.pooling)
        if self.config.projection_dim != 0:
            out_dim = self.config.output_dim(self.d_model)
            vectors_BxD = DenseKernel(out_dim, ("embed", "projection"), jnp.float32, name="projection_layer")(vectors_BxD)
        if self.config.l2_normalize:
            vectors_BxD = l2_normalize(vectors_BxD)
        return vectors_BxD


class DualEncoder(nn.Module):
    """Shared encoder + vector head; score of a (query, candidate) pair is a dot product.

    The encoder and the head share this module's scope, so the parameter tree is
    T5X's: {token_embedder, encoder, projection_layer}.
    """

    config: ModelConfig

    def setup(self):
        if self.config.head is None:
            raise ValueError("DualEncoder needs a ModelConfig with a head")
        self.backbone = T5Encoder(self.config.encoder)
        nn.share_scope(self, self.backbone)
        self.head = VectorHead(self.config.head, self.config.encoder.d_model)
        nn.share_scope(self, self.head)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        if attention_mask is None:
            attention_mask = input_ids != self.config.encoder.pad_id
        needs_states = self.config.head.pooling in ("first_last_avg", "last2_avg")
        output = self.backbone(input_ids, attention_mask, output_hidden_states=needs_states)
        return self.head(output, attention_mask)

