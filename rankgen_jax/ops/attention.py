"""Softmax attention, two implementations of one function.

Both compute exp(logits - max) @ v and then divide by the row sums: the
division touches [B, L, H, K] instead of [B, H, L, L], and the backward pass
loses a full pass over the attention matrix (1.8x faster fwd+bwd on XLA:CPU
than softmax-then-matmul). Dropout multiplies the unnormalised weights by a
keep mask scaled by 1/keep_prob; it scales entries, not rows, so normalising
afterwards is the same function.

- `softmax_attention_autodiff`: plain jnp, differentiated by JAX. TPU and GPU.
- `softmax_attention_cpu`: the same forward with a hand-written VJP, used on CPU
  where the fused kernel (`kernels.fused_attention`) does not apply. Under
  autodiff XLA folds the surrounding transposes into the batched dots and picks
  transposed-operand forms that XLA:CPU runs at 36-58 GFLOP/s. Here the value
  product, dq, dk and dv are pinned (`optimization_barrier`) in faster forms
  that need no transpose of a [B, H, L, L] matrix, only of the cheap
  [B, L, H, K] operands: [L, L] x [L, K] (~220 GFLOP/s at tiny T5 shapes) for
  the value product and dq, [K, L] x [L, L] (~70) for dk and dv; q k^T and
  d_out v^T keep XLA's form. Tiny T5, length 256,
  fwd+bwd of this function: 67 -> 50 ms; train step 0.53 -> 0.49 s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_pin = jax.lax.optimization_barrier


def _heads_major(x_BxLxHxK: jax.Array) -> jax.Array:
    """[B, L, H, K] -> [B, H, L, K], materialised."""
    return _pin(jnp.transpose(x_BxLxHxK, (0, 2, 1, 3)))


def _heads_major_transposed(x_BxLxHxK: jax.Array) -> jax.Array:
    """[B, L, H, K] -> [B, H, K, L], materialised."""
    return _pin(jnp.transpose(x_BxLxHxK, (0, 2, 3, 1)))


def _sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sum a broadcast result back to `shape` (the gradient of a broadcast)."""
    x = jnp.sum(x, axis=tuple(range(x.ndim - len(shape))))
    axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _logits(q_BxLxHxK, k_BxLxHxK) -> jax.Array:
    """q k^T accumulated and returned in float32, whatever the activations' dtype."""
    return jnp.einsum("bqhd,bkhd->bhqk", q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32)


def _forward(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype):
    logits_BxHxLxL = _logits(q_BxLxHxK, k_BxLxHxK) + bias
    max_BxHxLx1 = jnp.max(logits_BxHxLxL, axis=-1, keepdims=True)
    unnormalized_BxHxLxL = jnp.exp(logits_BxHxLxL - max_BxHxLx1)
    row_sum_BxHxL = jnp.sum(unnormalized_BxHxLxL, axis=-1)
    weights_BxHxLxL = unnormalized_BxHxLxL.astype(dtype)
    if keep_BxHxLxL is not None:
        weights_BxHxLxL = weights_BxHxLxL * keep_BxHxLxL
    v_BxHxLxK = _heads_major(v_BxLxHxK)
    numerator_BxHxLxK = _pin(jnp.einsum("bhqk,bhkd->bhqd", weights_BxHxLxL, v_BxHxLxK))
    out_BxHxLxK = numerator_BxHxLxK * (1.0 / row_sum_BxHxL)[..., None].astype(dtype)
    return out_BxHxLxK, (unnormalized_BxHxLxL, weights_BxHxLxL, row_sum_BxHxL, v_BxHxLxK)


def softmax_attention_autodiff(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype) -> jax.Array:
    """softmax(q k^T + bias) v, [B, L, H, K] in and out; logits and softmax in float32.

    bias: float32, broadcastable to [B, H, L, L]; keep_BxHxLxL: dropout's keep mask
    scaled by 1/keep_prob, or None; dtype: the dtype of the value product.
    """
    logits_BxHxLxL = _logits(q_BxLxHxK, k_BxLxHxK) + bias
    # The max only keeps exp in range; it cancels in the ratio, so no gradient flows through it.
    max_BxHxLx1 = jax.lax.stop_gradient(jnp.max(logits_BxHxLxL, axis=-1, keepdims=True))
    unnormalized_BxHxLxL = jnp.exp(logits_BxHxLxL - max_BxHxLx1)
    row_sum_BxLxH = jnp.einsum("bhqk->bqh", unnormalized_BxHxLxL)
    weights_BxHxLxL = unnormalized_BxHxLxL.astype(dtype)
    if keep_BxHxLxL is not None:
        weights_BxHxLxL = weights_BxHxLxL * keep_BxHxLxL
    out_BxLxHxK = jnp.einsum("bhqk,bkhd->bqhd", weights_BxHxLxL, v_BxLxHxK)
    return out_BxLxHxK * (1.0 / row_sum_BxLxH)[..., None].astype(dtype)


def softmax_attention_cpu(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype) -> jax.Array:
    """`softmax_attention_autodiff` with a VJP laid out for XLA:CPU's matmuls."""
    return _attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, jnp.dtype(dtype), jnp.shape(bias))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype, bias_shape):
    out_BxHxLxK, _ = _forward(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype)
    return jnp.transpose(out_BxHxLxK, (0, 2, 1, 3))


def _attention_fwd(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype, bias_shape):
    out_BxHxLxK, saved = _forward(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias, keep_BxHxLxL, dtype)
    residuals = (q_BxLxHxK, k_BxLxHxK, keep_BxHxLxL, out_BxHxLxK, *saved)
    return jnp.transpose(out_BxHxLxK, (0, 2, 1, 3)), residuals


def _attention_bwd(dtype, bias_shape, residuals, d_out_BxLxHxK):
    q_BxLxHxK, k_BxLxHxK, keep_BxHxLxL, out_BxHxLxK, unnormalized_BxHxLxL, weights_BxHxLxL, row_sum_BxHxL, v_BxHxLxK = residuals
    d_out_BxHxLxK = jnp.transpose(d_out_BxLxHxK, (0, 2, 1, 3))
    inv_sum_BxHxL = 1.0 / row_sum_BxHxL
    # out = numerator / row_sum: split the gradient between the two.
    d_numerator_BxHxLxK = d_out_BxHxLxK * inv_sum_BxHxL[..., None].astype(dtype)
    d_row_sum_BxHxL = -jnp.sum((d_out_BxHxLxK * out_BxHxLxK).astype(jnp.float32), axis=-1) * inv_sum_BxHxL
    d_weights_BxHxLxL = jnp.einsum("bhqd,bhkd->bhqk", d_numerator_BxHxLxK, v_BxHxLxK).astype(jnp.float32)
    if keep_BxHxLxL is not None:
        d_weights_BxHxLxL = d_weights_BxHxLxL * keep_BxHxLxL
    # exp's derivative is itself; the max is a constant shift (it cancels in the ratio).
    d_logits_BxHxLxL = unnormalized_BxHxLxL * (d_weights_BxHxLxL + d_row_sum_BxHxL[..., None])
    d_logits_c = d_logits_BxHxLxL.astype(dtype)
    d_q_BxHxLxK = _pin(jnp.einsum("bhqk,bhkd->bhqd", d_logits_c, _heads_major(k_BxLxHxK)))
    d_k_BxHxKxL = jnp.einsum("bhdq,bhqk->bhdk", _heads_major_transposed(q_BxLxHxK), d_logits_c)
    d_v_BxHxKxL = jnp.einsum("bhdq,bhqk->bhdk", _pin(jnp.swapaxes(d_numerator_BxHxLxK, 2, 3)), weights_BxHxLxL)
    d_q = jnp.transpose(d_q_BxHxLxK, (0, 2, 1, 3)).astype(q_BxLxHxK.dtype)
    d_k = jnp.transpose(d_k_BxHxKxL, (0, 3, 1, 2)).astype(k_BxLxHxK.dtype)
    d_v = jnp.transpose(d_v_BxHxKxL, (0, 3, 1, 2)).astype(v_BxHxLxK.dtype)
    d_bias = _sum_to_shape(d_logits_BxHxLxL, bias_shape)
    d_keep = None if keep_BxHxLxL is None else jnp.zeros_like(keep_BxHxLxL)
    return d_q, d_k, d_v, d_bias, d_keep


_attention.defvjp(_attention_fwd, _attention_bwd)


# cuDNN's flash attention as jax.nn.dot_product_attention calls it: half-precision inputs,
# head dim a multiple of 8 up to 128 (256 from Hopper on; 128 is safe on every GPU), and with
# a bias in training, even sequence lengths (jax._src.cudnn.fused_attention_stablehlo).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def cudnn_supports(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array) -> bool:
    """Whether cuDNN's fused attention takes these inputs (dtype, head dim, even lengths)."""
    head_dim = q_BxLxHxK.shape[-1]
    return (q_BxLxHxK.dtype in [jnp.dtype(d) for d in CUDNN_DTYPES]
            and head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM
            and q_BxLxHxK.shape[1] % 2 == 0 and k_BxLxHxK.shape[1] % 2 == 0)


def key_lengths(mask_bias_Bx1x1xL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(valid keys per row [B] int32, whether every row is right-padded with at least one valid key).

    A right-padded row's mask is its length; the fused kernel takes key padding only in that form.
    """
    valid_BxL = mask_bias_Bx1x1xL[:, 0, 0, :] == 0
    lengths_B = jnp.sum(valid_BxL, axis=-1, dtype=jnp.int32)
    prefix_BxL = jnp.arange(valid_BxL.shape[-1], dtype=jnp.int32)[None, :] < lengths_B[:, None]
    return lengths_B, jnp.all(valid_BxL == prefix_BxL) & jnp.all(lengths_B > 0)


def library_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL, dtype,
                      implementation: str) -> jax.Array:
    """`softmax_attention_autodiff` without dropout, by jax.nn.dot_product_attention (`cudnn` or `xla`).

    The logits are unscaled (T5; BERT folds its scale into q). Key padding goes in as
    lengths, so the fused kernel never reads a [B, H, L, L] mask; a batch with a row that
    is not right-padded (or has no valid key) takes `softmax_attention_autodiff` instead,
    chosen at run time by lax.cond, so any mask gives the reference's result.
    cuDNN adds the bias in the activations' dtype; the XLA implementation in float32.
    """
    lengths_B, right_padded = key_lengths(mask_bias_Bx1x1xL)
    bias = None
    if position_bias is not None:
        bias = position_bias.astype(q_BxLxHxK.dtype if implementation == "cudnn" else jnp.float32)

    def fused(q, k, v, bias):
        out = jax.nn.dot_product_attention(q, k, v, bias, key_value_seq_lengths=lengths_B, scale=1.0,
                                           implementation=implementation)
        return out.astype(dtype)

    def general(q, k, v, bias):
        full_bias = mask_bias_Bx1x1xL if bias is None else bias.astype(jnp.float32) + mask_bias_Bx1x1xL
        return softmax_attention_autodiff(q, k, v, full_bias, None, dtype).astype(dtype)

    return jax.lax.cond(right_padded, fused, general, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias)
