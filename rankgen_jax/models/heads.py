"""Heads that turn encoder hidden states into vectors, and the dual encoder built from them."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankgen_jax.models.configs import POOLER_POOLING, BertConfig, HeadConfig, ModelConfig
from rankgen_jax.models.bert import BertEncoder
from rankgen_jax.models.layers import DenseKernel
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
    """Pooling -> optional bias-free projection (`projection_layer`) -> optional L2 norm.

    num_perspectives > 1 (MPTS bi-encoder): P bias-free projections in one
    kernel (`perspective_projections`, [d_model, P * D]) give [B, P, D] vectors,
    each L2-normalised when the config says so.
    """

    config: HeadConfig
    d_model: int
    num_perspectives: int = 1

    @nn.compact
    def __call__(self, output: EncoderOutput, mask_BxL: jax.Array, pooled_BxD: jax.Array | None = None) -> jax.Array:
        """pooled_BxD: the vectors to project when the pooling is done outside (the BERT pooler)."""
        vectors_BxD = pool(output, mask_BxL, self.config.pooling) if pooled_BxD is None else pooled_BxD
        out_dim = self.config.output_dim(self.d_model)
        if self.num_perspectives > 1:
            flat_BxPD = DenseKernel(self.num_perspectives * out_dim, ("embed", "projection"), jnp.float32,
                                    name="perspective_projections")(vectors_BxD)
            vectors_BxPxD = flat_BxPD.reshape(-1, self.num_perspectives, out_dim)
            return l2_normalize(vectors_BxPxD) if self.config.l2_normalize else vectors_BxPxD
        if self.config.projection_dim != 0:
            vectors_BxD = DenseKernel(out_dim, ("embed", "projection"), jnp.float32, name="projection_layer")(vectors_BxD)
        return l2_normalize(vectors_BxD) if self.config.l2_normalize else vectors_BxD


def flatten_leading(input_ids, attention_mask, token_type_ids, pad_id: int):
    """[..., L] inputs -> [N, L] (mask from pad ids when absent) and the leading shape to restore."""
    lead_shape, length = input_ids.shape[:-1], input_ids.shape[-1]
    flat = lambda x: None if x is None else x.reshape(-1, length)  # noqa: E731
    ids_NxL = flat(input_ids)
    mask_NxL = flat(attention_mask) if attention_mask is not None else ids_NxL != pad_id
    return ids_NxL, mask_NxL, flat(token_type_ids), lead_shape


def build_backbone(encoder_config) -> nn.Module:
    """The encoder module for an encoder config: T5 or BERT family."""
    if isinstance(encoder_config, BertConfig):
        return BertEncoder(encoder_config)
    return T5Encoder(encoder_config)


def _pad_id(config: ModelConfig) -> int:
    return config.encoder.pad_id


def _needs_hidden_states(head: HeadConfig) -> bool:
    return head.pooling in ("first_last_avg", "last2_avg")


class VectorEncoder(nn.Module):
    """One tower: encoder + vector head in a single scope (T5X names: token_embedder, encoder, projection_layer)."""

    config: ModelConfig

    def setup(self):
        self.backbone = build_backbone(self.config.encoder)
        nn.share_scope(self, self.backbone)
        self.head = VectorHead(self.config.head, self.config.encoder.d_model, self.config.num_scores)
        nn.share_scope(self, self.head)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None) -> jax.Array:
        """Vectors [..., D] (or [..., P, D] with P perspectives) of [..., L] ids."""
        ids_NxL, mask_NxL, types_NxL, lead_shape = flatten_leading(input_ids, attention_mask, token_type_ids,
                                                                   _pad_id(self.config))
        output = self.backbone(ids_NxL, mask_NxL, token_type_ids=types_NxL,
                               output_hidden_states=_needs_hidden_states(self.config.head))
        vectors = self.head(output, mask_NxL)
        return vectors.reshape(*lead_shape, *vectors.shape[1:])


class DualEncoder(nn.Module):
    """Query and document vectors; score = dot product.

    Shared towers (RankGen): one encoder whose parameters sit at the top level
    (T5X's tree). Separate towers (DKMR^2, CL-DRD): `query_tower` and
    `document_tower`, each a full VectorEncoder.
    """

    config: ModelConfig

    def setup(self):
        if self.config.head is None:
            raise ValueError("DualEncoder needs a ModelConfig with a head")
        if self.config.shared_towers:
            self.shared = VectorEncoder(self.config)
            nn.share_scope(self, self.shared)
        else:
            self.query_tower = VectorEncoder(self.config)
            self.document_tower = VectorEncoder(self.config)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, tower: str = "query") -> jax.Array:
        """Vectors [N, D] of `tower` ("query" or "document"; the same encoder when shared)."""
        if self.config.shared_towers:
            return self.shared(input_ids, attention_mask, token_type_ids)
        if tower == "query":
            return self.query_tower(input_ids, attention_mask, token_type_ids)
        if tower == "document":
            return self.document_tower(input_ids, attention_mask, token_type_ids)
        raise ValueError(f"unknown tower {tower!r}: expected 'query' or 'document'")

    def initialize(self, input_ids) -> tuple[jax.Array, jax.Array]:
        """Touch every tower so `init` creates all parameters."""
        return self(input_ids, tower="query"), self(input_ids, tower="document")


class CrossEncoder(nn.Module):
    """Query and candidate read together; pooled -> optional projection -> linear to num_scores.

    Pooling `pooler` takes the BERT / RoBERTa encoder's pooler output, so the
    head without a projection is HF's Bert/RobertaForSequenceClassification head.

    Inputs are [..., L] (e.g. [B, C, L] candidate lists); outputs [...] scores,
    or [..., num_scores] with several outputs (multi-perspective).
    """

    config: ModelConfig

    def setup(self):
        self.backbone = build_backbone(self.config.encoder)
        nn.share_scope(self, self.backbone)
        self.head = VectorHead(dataclasses.replace(self.config.head, l2_normalize=False), self.config.encoder.d_model)
        nn.share_scope(self, self.head)
        self.score_head = DenseKernel(self.config.num_scores, ("embed", "scores"), jnp.float32, use_bias=True)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None) -> jax.Array:
        ids_NxL, mask_NxL, types_NxL, lead_shape = flatten_leading(input_ids, attention_mask, token_type_ids,
                                                                   _pad_id(self.config))
        output = self.backbone(ids_NxL, mask_NxL, token_type_ids=types_NxL,
                               output_hidden_states=_needs_hidden_states(self.config.head))
        pooled_NxD = None
        if self.config.head.pooling == POOLER_POOLING:
            pooled_NxD = self.backbone.pooled_output(output)
        scores_NxS = self.score_head(self.head(output, mask_NxL, pooled_NxD))
        if self.config.num_scores == 1:
            return scores_NxS[:, 0].reshape(lead_shape)
        return scores_NxS.reshape(*lead_shape, self.config.num_scores)
