"""Building blocks shared by the encoders: dense kernels, RMS norm, embedding, attention.

Every parameter carries logical axis names (T5X vocabulary: `embed`, `mlp`,
`heads`, `kv`, `joined_kv`, `vocab`, `relpos_buckets`) so one rules table maps
any model onto any mesh. The computations go through `ops.dispatch`, which
picks XLA or an enabled kernel plug-in.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankgen_jax.models.precision import PARAM_DTYPE
from rankgen_jax.ops import dispatch

Initializer = Callable[..., jax.Array]

# Activations at layer boundaries: [batch, length, embed].
ACTIVATION_AXES = ("batch", "length", "embed")

default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def constrain(x: jax.Array, axes: Sequence[str]) -> jax.Array:
    """Logical sharding constraint; a no-op outside a mesh with axis rules."""
    return nn.with_logical_constraint(x, tuple(axes))


class DenseKernel(nn.Module):
    """Dense layer over the last axis: float32 `kernel`, and a `bias` when use_bias (T5 has none).

    Inputs are kept 2-D ([tokens, features]) by the callers: on XLA:CPU a 3-D
    dot makes the weight gradient pay for large transposes. Where a kernel plug-in
    applies (`ops.dispatch.dense`; the CPU plug-in's `rankgen_jax_cpu/dense.py`), x w
    and d_x come from it, and with the CPU plug-in the gradient of weights up to 512 x 512.
    """

    features: int
    kernel_axes: tuple[str, str]
    dtype: jnp.dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    use_bias: bool = False

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel, bias = self.weights(x.shape[-1])
        y = dispatch.dense(x, kernel, self.dtype)
        if bias is not None:
            y = y + bias.astype(self.dtype)
        return y

    @nn.compact
    def weights(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
        """The `kernel` [in_features, features] and the `bias` (None without use_bias), for fused callers."""
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
            (in_features, self.features),
            PARAM_DTYPE,
        )
        if not self.use_bias:
            return kernel, None
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, self.kernel_axes[1:]), (self.features,), PARAM_DTYPE
        )
        return kernel, bias


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no bias, no mean subtraction; computed in float32."""

    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],), PARAM_DTYPE
        )
        return dispatch.rms_norm(x, scale, self.eps, self.dtype)


class Embed(nn.Module):
    """Token embedding table `embedding` [vocab, embed]."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(self.embedding_init, ("vocab", "embed")),
            (self.num_embeddings, self.features),
            PARAM_DTYPE,
        )
        return jnp.take(embedding, ids, axis=0).astype(self.dtype)


def dropout_active(module: nn.Module, rate: float) -> bool:
    """Whether dropout at `rate` changes anything in this call: a rate above 0 and a `dropout` rng (training)."""
    return rate > 0.0 and module.has_rng("dropout")


def dropout(module: nn.Module, x: jax.Array, rate: float) -> jax.Array:
    """Dropout that is active only when the caller provides a `dropout` rng (training)."""
    if rate == 0.0:
        return x
    return nn.Dropout(rate)(x, deterministic=not module.has_rng("dropout"))


def attend(module: nn.Module, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL,
           dropout_rate: float, dtype) -> jax.Array:
    """Softmax attention (logits and softmax in float32) -> [B*L, H*K] for the output projection.

    position_bias: [1, H, L, L] added to the logits (T5's relative positions), or None;
    mask_bias_Bx1x1xL: additive key mask. Any logit scaling is folded into q by the caller.

    The dropout keep mask is drawn here (from the module's `dropout` rng);
    `ops.dispatch.attention` picks the implementation.
    """
    batch, length, heads, head_dim = q_BxLxHxK.shape
    keep_BxHxLxL = None
    if dropout_active(module, dropout_rate):
        ones_BxHxLxL = jnp.ones((batch, heads, length, k_BxLxHxK.shape[1]), dtype)
        keep_BxHxLxL = dropout(module, ones_BxHxLxL, dropout_rate)
    out_BxLxHxK = dispatch.attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL,
                                     keep_BxHxLxL, dtype)
    return out_BxLxHxK.reshape(batch * length, heads * head_dim)


# A projection of the attention block: (name, output features, kernel axes) -> the dense layer.
MakeDense = Callable[[str, int, tuple[str, str]], DenseKernel]


def self_attention(module: nn.Module, x_TxD: jax.Array, batch: int, heads_and_dim: tuple[int, int],
                   make_dense: MakeDense, position_bias, mask_bias_Bx1x1xL, dropout_rate: float, dtype,
                   query_scale: float = 1.0) -> jax.Array:
    """Multi-head self-attention over `batch` rows of equal length flattened to [T, D]; returns [T, D].

    The `query`, `key`, `value` and `out` projections come from make_dense (each
    encoder's own dense layer and init); q is scaled by query_scale (BERT's
    1/sqrt(d_kv); T5 has none), then `attend`.
    """
    num_heads, d_kv = heads_and_dim
    d_model, length = x_TxD.shape[1], x_TxD.shape[0] // batch
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (
        make_dense(name, num_heads * d_kv, ("embed", "joined_kv"))(x_TxD).reshape(batch, length, num_heads, d_kv)
        for name in ("query", "key", "value"))
    if query_scale != 1.0:
        # Scale q rather than the [B, H, L, L] logits: same result, less work.
        q_BxLxHxK = q_BxLxHxK * jnp.asarray(query_scale, q_BxLxHxK.dtype)
    out_TxI = attend(module, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL, dropout_rate, dtype)
    return make_dense("out", d_model, ("joined_kv", "embed"))(out_TxI)
