"""T5 encoder (T5 1.0 and 1.1) in flax.linen with T5X parameter names.

The parameter tree is exactly T5X's (`token_embedder`, `encoder/relpos_bias`,
`encoder/layers_{i}/...`, `encoder/encoder_norm`), so T5X checkpoints load
without renames; HF checkpoints are converted by `rankgen_jax.checkpoints.hf.t5`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rankgen_jax.models.configs import T5Config
from rankgen_jax.models.layers import (
    ACTIVATION_AXES,
    DenseKernel,
    Embed,
    RMSNorm,
    constrain,
    dropout,
    dropout_active,
    self_attention,
)
from rankgen_jax.models.precision import PARAM_DTYPE, activation_dtype
from rankgen_jax.ops import dispatch

# Added to attention logits of padded keys; large but finite so that fully
# padded rows (padding queries) stay NaN-free.
MASK_BIAS = -1e10


@dataclasses.dataclass(frozen=True)
class EncoderOutput:
    """Encoder activations.

    hidden_states follows HuggingFace's convention when requested: (embedding
    output, output of layer 1, ..., output of layer N-1, final normed output).
    """

    last_hidden_state: jax.Array
    hidden_states: Optional[tuple[jax.Array, ...]] = None


jax.tree_util.register_dataclass(
    EncoderOutput, data_fields=["last_hidden_state", "hidden_states"], meta_fields=[]
)


def relative_position_buckets(
    query_len: int, key_len: int, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> np.ndarray:
    """Bucket index [query_len, key_len] of each relative position (T5's log-spaced buckets).

    Half the buckets hold exact small distances, the rest grow logarithmically
    up to max_distance; bidirectional splits the buckets by direction.
    """
    relative = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(np.int64) * num_buckets
        distance = np.abs(relative)
    else:
        distance = np.maximum(-relative, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.maximum(distance, 1).astype(np.float32) / max_exact) / np.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return (buckets + np.where(is_small, distance, large)).astype(np.int32)


class RelativePositionBiases(nn.Module):
    """Attention bias per head and relative distance; one table shared by all layers.

    Float32 whatever the activations: it is added to the float32 logits.
    """

    num_buckets: int
    max_distance: int
    num_heads: int

    @nn.compact
    def __call__(self, query_len: int, key_len: int) -> jax.Array:
        rel_embedding = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("heads", "relpos_buckets")
            ),
            (self.num_heads, self.num_buckets),
            PARAM_DTYPE,
        )
        buckets_QxK = relative_position_buckets(query_len, key_len, self.num_buckets, self.max_distance)
        # A one-hot matmul rather than a gather: its gradient is a matmul too, and the
        # bias comes out head-major like the logits it is added to. The gather's scatter
        # gradient summed the batch into a [Q*K, H] layout, 2-3x slower on XLA:CPU.
        # HIGHEST precision keeps the lookup exact where f32 matmuls default to bf16 (TPU).
        onehot_NxQK = jax.nn.one_hot(jnp.asarray(buckets_QxK.reshape(-1)), self.num_buckets, dtype=jnp.float32, axis=0)
        bias_HxQK = jnp.dot(rel_embedding, onehot_NxQK, precision=jax.lax.Precision.HIGHEST)
        return bias_HxQK.reshape(1, self.num_heads, query_len, key_len)


class SelfAttention(nn.Module):
    """Multi-head self-attention without scaling of the logits (T5)."""

    config: T5Config

    @nn.compact
    def __call__(self, x_TxD: jax.Array, batch: int, bias_1xHxLxL: jax.Array, mask_bias_Bx1x1xL: jax.Array):
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        # Scaling the query init replaces the missing 1/sqrt(d_kv) on the logits.
        query_init = nn.initializers.variance_scaling(1.0 / cfg.d_kv, "fan_in", "truncated_normal")

        def make_dense(name: str, features: int, axes: tuple[str, str]) -> DenseKernel:
            if name == "query":
                return DenseKernel(features, axes, dtype, query_init, name=name)
            return DenseKernel(features, axes, dtype, name=name)

        return self_attention(self, x_TxD, batch, (cfg.num_heads, cfg.d_kv), make_dense, bias_1xHxLxL,
                              mask_bias_Bx1x1xL, cfg.dropout_rate, dtype)


class MlpBlock(nn.Module):
    """T5 1.1 gated GELU (`wi_0`, `wi_1`, `wo`) or T5 1.0 ReLU (`wi`, `wo`)."""

    config: T5Config

    @nn.compact
    def __call__(self, x_TxD: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        wo = DenseKernel(cfg.d_model, ("mlp", "embed"), dtype, name="wo")
        if cfg.mlp_activation == "gated-gelu":
            # The weights alone: `ops.dispatch` may run the whole block as one fused kernel.
            d = x_TxD.shape[-1]
            wi_0 = DenseKernel(cfg.d_ff, ("embed", "mlp"), dtype, name="wi_0").weights(d)[0]
            wi_1 = DenseKernel(cfg.d_ff, ("embed", "mlp"), dtype, name="wi_1").weights(d)[0]
            hidden_dropout = None
            if dropout_active(self, cfg.dropout_rate):
                hidden_dropout = lambda h_TxF: dropout(self, h_TxF, cfg.dropout_rate)  # noqa: E731
            return dispatch.gated_gelu_mlp(x_TxD, wi_0, wi_1, wo.weights(cfg.d_ff)[0], dtype, hidden_dropout)
        h_TxF = jax.nn.relu(DenseKernel(cfg.d_ff, ("embed", "mlp"), dtype, name="wi")(x_TxD))
        h_TxF = dropout(self, h_TxF, cfg.dropout_rate)
        return wo(h_TxF)


class EncoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm MLP block, each with a residual.

    scan_carry: return (y, y or None) as nn.scan wants; the second is the
    per-layer output, kept only when hidden states are requested.
    """

    config: T5Config
    scan_carry: bool = False
    keep_outputs: bool = False

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, bias_1xHxLxL: jax.Array, mask_bias_Bx1x1xL: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        batch, length, d = x_BxLxD.shape
        x_TxD = x_BxLxD.reshape(batch * length, d)
        h = RMSNorm(cfg.layer_norm_eps, dtype, name="pre_attention_layer_norm")(x_TxD)
        h = SelfAttention(cfg, name="attention")(h, batch, bias_1xHxLxL, mask_bias_Bx1x1xL)
        x_TxD = x_TxD + dropout(self, h, cfg.dropout_rate)
        h = RMSNorm(cfg.layer_norm_eps, dtype, name="pre_mlp_layer_norm")(x_TxD)
        h = MlpBlock(cfg, name="mlp")(h)
        x_TxD = x_TxD + dropout(self, h, cfg.dropout_rate)
        y_BxLxD = constrain(x_TxD.reshape(batch, length, d), ACTIVATION_AXES)
        if self.scan_carry:
            return y_BxLxD, (y_BxLxD if self.keep_outputs else None)
        return y_BxLxD


class T5EncoderStack(nn.Module):
    """Relative position bias, the layers and the final norm: T5X's `encoder` subtree."""

    config: T5Config

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, output_hidden_states: bool = False) -> EncoderOutput:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        length = x_BxLxD.shape[1]
        bias_1xHxLxL = RelativePositionBiases(
            cfg.relpos_buckets, cfg.relpos_max_distance, cfg.num_heads, name="relpos_bias"
        )(length, length)
        mask_bias_Bx1x1xL = jnp.where(mask_BxL, 0.0, MASK_BIAS).astype(jnp.float32)[:, None, None, :]
        x_BxLxD = constrain(dropout(self, x_BxLxD, cfg.dropout_rate), ACTIVATION_AXES)

        embedded_BxLxD = x_BxLxD
        if cfg.scan_layers:
            layer_cls = nn.remat(EncoderLayer, prevent_cse=False) if cfg.remat else EncoderLayer
            scanned = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x_BxLxD, outputs_NxBxLxD = scanned(cfg, scan_carry=True, keep_outputs=output_hidden_states, name="layers")(
                x_BxLxD, bias_1xHxLxL, mask_bias_Bx1x1xL
            )
            layer_outputs = [outputs_NxBxLxD[i] for i in range(cfg.num_layers)] if output_hidden_states else []
        else:
            layer_cls = nn.remat(EncoderLayer) if cfg.remat else EncoderLayer
            layer_outputs = []
            for i in range(cfg.num_layers):
                x_BxLxD = layer_cls(cfg, name=f"layers_{i}")(x_BxLxD, bias_1xHxLxL, mask_bias_Bx1x1xL)
                layer_outputs.append(x_BxLxD)

        final_BxLxD = RMSNorm(cfg.layer_norm_eps, dtype, name="encoder_norm")(x_BxLxD)
        final_BxLxD = constrain(dropout(self, final_BxLxD, cfg.dropout_rate), ACTIVATION_AXES)
        if not output_hidden_states:
            return EncoderOutput(final_BxLxD)
        # HF's convention: the last layer's pre-norm output is replaced by the normed one.
        hidden_states = (embedded_BxLxD, *layer_outputs[:-1], final_BxLxD)
        return EncoderOutput(final_BxLxD, hidden_states)


class T5Encoder(nn.Module):
    """Token embedding + T5 encoder stack; returns the final hidden states."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = Embed(cfg.vocab_size, cfg.d_model, activation_dtype(cfg.dtype), name="token_embedder")
        self.encoder = T5EncoderStack(cfg, name="encoder")

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        """token_type_ids: accepted for a uniform encoder interface; T5 has no token types."""
        del token_type_ids
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_id
        embedded_BxLxD = self.token_embedder(input_ids)
        return self.encoder(embedded_BxLxD, attention_mask.astype(bool), output_hidden_states)


def to_scanned_layout(params: dict, num_layers: int) -> dict:
    """Stack `encoder/layers_{i}` into `encoder/layers` (leading layer axis) for scan_layers=True."""
    encoder = dict(params["encoder"])
    per_layer = [encoder.pop(f"layers_{i}") for i in range(num_layers)]
    encoder["layers"] = jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *per_layer)
    return {**params, "encoder": encoder}


def to_unscanned_layout(params: dict) -> dict:
    """Inverse of to_scanned_layout: the canonical T5X tree with `layers_{i}`."""
    encoder = dict(params["encoder"])
    stacked = encoder.pop("layers")
    num_layers = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    for i in range(num_layers):
        encoder[f"layers_{i}"] = jax.tree_util.tree_map(lambda x: np.asarray(x)[i], stacked)
    return {**params, "encoder": encoder}
