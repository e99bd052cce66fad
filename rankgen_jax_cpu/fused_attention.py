"""Fused softmax attention on CPU: the attention kernel of `cpu_kernels.cc` behind a custom VJP.

It computes what `attention.softmax_attention_autodiff` computes (float32, no
dropout, self-attention) with one task per (batch row, head) whose [L, L]
matrices never leave the cache; the backward pass recomputes the weights from
the saved log-normalisers, as flash attention does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax_cpu.build import require

FORWARD_TARGET = "rankgen_attention_forward"
BACKWARD_TARGET = "rankgen_attention_backward"


def _as_kernel_inputs(position_bias, mask_bias_Bx1x1xL):
    batch, length = mask_bias_Bx1x1xL.shape[0], mask_bias_Bx1x1xL.shape[-1]
    if position_bias is None:
        pos_HxLxL = jnp.zeros((0,), jnp.float32)
    else:
        if position_bias.shape[0] != 1:
            raise ValueError(f"fused attention takes one position bias for the batch, got shape {position_bias.shape}")
        pos_HxLxL = position_bias.reshape(position_bias.shape[1:]).astype(jnp.float32)
    # The mask bias comes from the input ids: no gradient is computed for it.
    mask_BxL = jax.lax.stop_gradient(mask_bias_Bx1x1xL.reshape(batch, length).astype(jnp.float32))
    return pos_HxLxL, mask_BxL


def fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, position_bias, mask_bias_Bx1x1xL) -> jax.Array:
    """softmax(q k^T + position_bias + mask_bias) v in float32, [B, L, H, K] in and out.

    position_bias: [1, H, L, L] or None; mask_bias_Bx1x1xL: additive, per key. No dropout.
    """
    require()
    pos_HxLxL, mask_BxL = _as_kernel_inputs(position_bias, mask_bias_Bx1x1xL)
    return _fused(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, pos_HxLxL, mask_BxL)


def _forward_call(q, k, v, pos_HxLxL, mask_BxL):
    batch, length, heads, _ = q.shape
    out_types = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32))
    return jax.ffi.ffi_call(FORWARD_TARGET, out_types)(q, k, v, pos_HxLxL, mask_BxL)


@jax.custom_vjp
def _fused(q, k, v, pos_HxLxL, mask_BxL):
    return _forward_call(q, k, v, pos_HxLxL, mask_BxL)[0]


def _fused_fwd(q, k, v, pos_HxLxL, mask_BxL):
    out, lse_BxHxL = _forward_call(q, k, v, pos_HxLxL, mask_BxL)
    return out, (q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL)


def _fused_bwd(residuals, d_out):
    q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL = residuals
    out_types = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v, pos_HxLxL))
    d_q, d_k, d_v, d_pos = jax.ffi.ffi_call(BACKWARD_TARGET, out_types)(
        q, k, v, pos_HxLxL, mask_BxL, out, lse_BxHxL, d_out.astype(jnp.float32)
    )
    # mask_BxL is under stop_gradient (fused_attention): its cotangent is never used.
    return d_q, d_k, d_v, d_pos, jnp.zeros_like(mask_BxL)


_fused.defvjp(_fused_fwd, _fused_bwd)
