"""BERT-family encoders (BERT/MiniLM, DistilBERT, RoBERTa) in flax.linen.

Post-LN transformer blocks with biased dense layers and LayerNorm, absolute
learned positions and (BERT, RoBERTa) token-type embeddings. One canonical
parameter tree serves all three variants; `rankgen_jax.checkpoints.hf.bert`
maps it to and from each variant's HuggingFace names:

    embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding
    embeddings/layer_norm/{scale,bias}
    encoder/layers_{i}/attention/{query,key,value,out}/{kernel,bias}
    encoder/layers_{i}/attention_layer_norm/{scale,bias}
    encoder/layers_{i}/mlp/{wi,wo}/{kernel,bias}
    encoder/layers_{i}/mlp_layer_norm/{scale,bias}
    pooler/dense/{kernel,bias}                      (has_pooler only)

Like the T5 encoder, activations stay 2-D ([tokens, features]) inside the dense
layers (XLA:CPU otherwise pays for large transposes in the weight gradients)
and carry logical sharding constraints at layer boundaries.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankgen_jax.models.configs import BertConfig
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.layers import ACTIVATION_AXES, DenseKernel, constrain, dropout, self_attention
from rankgen_jax.models.precision import PARAM_DTYPE, activation_dtype
from rankgen_jax.models.t5 import MASK_BIAS, EncoderOutput

# BERT's initializer_range: N(0, 0.02) for every kernel and embedding table.
bert_init = nn.initializers.normal(stddev=0.02)


def dense_with_bias(features: int, kernel_axes: tuple[str, str], dtype: jnp.dtype, name: str) -> DenseKernel:
    """BERT's dense layer: kernel [in, features] with BERT's N(0, 0.02) init, plus a bias [features]."""
    return DenseKernel(features, kernel_axes, dtype, bert_init, use_bias=True, name=name)


class LayerNorm(nn.Module):
    """LayerNorm with `scale` and `bias` (mean subtraction, biased variance); computed in float32."""

    eps: float = 1e-12
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (features,),
                           PARAM_DTYPE)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (features,),
                          PARAM_DTYPE)
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        return ((x32 - mean) * jax.lax.rsqrt(variance + self.eps) * scale + bias).astype(self.dtype)


class AxisEmbed(nn.Module):
    """Embedding table `embedding` [num_embeddings, features] with the given logical axis names."""

    num_embeddings: int
    features: int
    axes: tuple[str, str]
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        embedding = self.param(
            "embedding", nn.with_logical_partitioning(bert_init, self.axes), (self.num_embeddings, self.features),
            PARAM_DTYPE,
        )
        return jnp.take(embedding, ids, axis=0).astype(self.dtype)


def activation_fn(name: str):
    """HF hidden_act names: `gelu` is exact (erf) GELU, `gelu_new` the tanh approximation."""
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name == "gelu_new":
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown BERT activation {name!r}")


def position_ids(config: BertConfig, input_ids_BxL: jax.Array) -> jax.Array:
    """Absolute position of each token, as HF computes it for the variant.

    bert/distilbert: 0..L-1 plus position_offset. roberta: HF's
    create_position_ids_from_input_ids, counting non-pad tokens from pad_id + 1
    while padding tokens get pad_id (so a left-padded row starts at pad_id + 1).
    Like HF, the RoBERTa count uses input_ids != pad_id, not attention_mask.
    """
    batch, length = input_ids_BxL.shape
    if length + config.position_offset > config.max_position_embeddings:
        raise RankgenError(
            f"sequence length {length} is too long for a {config.variant} encoder with max_position_embeddings="
            f"{config.max_position_embeddings} (position_offset {config.position_offset})")
    if config.variant == "roberta":
        not_pad_BxL = (input_ids_BxL != config.pad_id).astype(jnp.int32)
        return jnp.cumsum(not_pad_BxL, axis=1) * not_pad_BxL + config.pad_id
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32) + config.position_offset, (batch, length))


class BertEmbeddings(nn.Module):
    """word + absolute position (+ token type) embeddings -> LayerNorm -> dropout."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids_BxL: jax.Array, token_type_ids_BxL: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        x_BxLxD = AxisEmbed(cfg.vocab_size, cfg.d_model, ("vocab", "embed"), dtype, name="word_embeddings")(
            input_ids_BxL)
        positions_BxL = position_ids(cfg, input_ids_BxL)
        x_BxLxD = x_BxLxD + AxisEmbed(cfg.max_position_embeddings, cfg.d_model, ("abspos_buckets", "embed"), dtype,
                                      name="position_embeddings")(positions_BxL)
        if cfg.type_vocab_size > 0:
            x_BxLxD = x_BxLxD + AxisEmbed(cfg.type_vocab_size, cfg.d_model, ("type_vocab", "embed"), dtype,
                                          name="token_type_embeddings")(token_type_ids_BxL)
        x_BxLxD = LayerNorm(cfg.layer_norm_eps, dtype, name="layer_norm")(x_BxLxD)
        return constrain(dropout(self, x_BxLxD, cfg.dropout_rate), ACTIVATION_AXES)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention, logits scaled by 1/sqrt(d_kv), softmax in float32."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_TxD: jax.Array, batch: int, mask_bias_Bx1x1xL: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)

        def make_dense(name: str, features: int, axes: tuple[str, str]) -> DenseKernel:
            return dense_with_bias(features, axes, dtype, name=name)

        return self_attention(self, x_TxD, batch, (cfg.num_heads, cfg.d_kv), make_dense, None, mask_bias_Bx1x1xL,
                              cfg.dropout_rate, dtype, query_scale=1.0 / math.sqrt(cfg.d_kv))


class BertMlp(nn.Module):
    """wi -> activation -> wo (no dropout inside: BERT drops out only after wo)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_TxD: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        h_TxF = activation_fn(cfg.hidden_act)(dense_with_bias(cfg.d_ff, ("embed", "mlp"), dtype, name="wi")(x_TxD))
        return dense_with_bias(cfg.d_model, ("mlp", "embed"), dtype, name="wo")(h_TxF)


class BertLayer(nn.Module):
    """Post-LN block: LN(x + drop(attn(x))), then LN(h + drop(mlp(h)))."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, mask_bias_Bx1x1xL: jax.Array) -> jax.Array:
        cfg = self.config
        dtype = activation_dtype(cfg.dtype)
        batch, length, d = x_BxLxD.shape
        x_TxD = x_BxLxD.reshape(batch * length, d)
        h_TxD = BertSelfAttention(cfg, name="attention")(x_TxD, batch, mask_bias_Bx1x1xL)
        x_TxD = LayerNorm(cfg.layer_norm_eps, dtype, name="attention_layer_norm")(
            x_TxD + dropout(self, h_TxD, cfg.dropout_rate))
        h_TxD = BertMlp(cfg, name="mlp")(x_TxD)
        x_TxD = LayerNorm(cfg.layer_norm_eps, dtype, name="mlp_layer_norm")(
            x_TxD + dropout(self, h_TxD, cfg.dropout_rate))
        return constrain(x_TxD.reshape(batch, length, d), ACTIVATION_AXES)


class BertStack(nn.Module):
    """The layers (`encoder/layers_{i}`); returns the last output and every layer's output."""

    config: BertConfig

    @nn.compact
    def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
        cfg = self.config
        mask_bias_Bx1x1xL = jnp.where(mask_BxL, 0.0, MASK_BIAS).astype(jnp.float32)[:, None, None, :]
        layer_cls = nn.remat(BertLayer) if cfg.remat else BertLayer
        outputs = []
        for i in range(cfg.num_layers):
            x_BxLxD = layer_cls(cfg, name=f"layers_{i}")(x_BxLxD, mask_bias_Bx1x1xL)
            outputs.append(x_BxLxD)
        return x_BxLxD, outputs


class BertPooler(nn.Module):
    """HF's pooler: tanh(dense(first token)). Kept so HF checkpoints round-trip; only the cross encoder's
    `pooler` head uses it."""

    config: BertConfig

    @nn.compact
    def __call__(self, last_BxLxD: jax.Array) -> jax.Array:
        first_BxD = last_BxLxD[:, 0].astype(jnp.float32)
        return jnp.tanh(dense_with_bias(self.config.d_model, ("embed", "projection"), jnp.float32, name="dense")(first_BxD))


class BertEncoder(nn.Module):
    """Embeddings + post-LN layers (+ pooler parameters); returns the last hidden states.

    output_hidden_states gives HF's tuple (embedding output, layer 1, ..., layer N);
    post-LN has no final norm, so the last entry is last_hidden_state itself.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        if cfg.scan_layers:
            raise RankgenError("BertEncoder does not support scan_layers")
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertStack(cfg)
        if cfg.has_pooler:
            self.pooler = BertPooler(cfg)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        cfg = self.config
        if attention_mask is None:
            attention_mask = input_ids != cfg.pad_id
        if token_type_ids is None or cfg.type_vocab_size == 0:
            token_type_ids = jnp.zeros_like(input_ids)
        embedded_BxLxD = self.embeddings(input_ids, token_type_ids)
        last_BxLxD, layer_outputs = self.encoder(embedded_BxLxD, attention_mask.astype(bool))
        if cfg.has_pooler and self.is_initializing():
            # Linen creates parameters on first use: touch the pooler so init makes its tree.
            self.pooler(last_BxLxD)
        if not output_hidden_states:
            return EncoderOutput(last_BxLxD)
        return EncoderOutput(last_BxLxD, (embedded_BxLxD, *layer_outputs))

    def pooled_output(self, output: EncoderOutput) -> jax.Array:
        """HF's `pooler_output` [batch, d] (float32); call with `apply(..., method=BertEncoder.pooled_output)`."""
        if not self.config.has_pooler:
            raise RankgenError("this BERT encoder has no pooler (has_pooler=False)")
        return self.pooler(output.last_hidden_state)

