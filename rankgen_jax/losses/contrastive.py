"""Contrastive losses for dual encoders: each prefix against in-batch or its own candidates.

Every loss has the same signature, so the step can pick one by name (`losses.registry`):

    loss_fn(outputs, batch, loss_params, **options) -> (loss, metrics)

- `outputs`: `"query"` [B, D] (prefix vectors), `"positive"` [B, D] (gold
  continuation vectors) and optionally `"negative"` [B, D] or [B, K, D]
  (K generative / hard negatives per example).
- `batch`: `"positive_ids"` [B, Lc] and, with negatives, `"negative_ids"`
  [B, Lc'] or [B, K, Lc'] (int32, right-padded with 0); used only to mask
  false negatives (candidates whose text equals the row's gold text).
- `loss_params`: learnable loss parameters (see `init_loss_params`).

The losses know nothing about meshes. Inside a jitted step whose batch axis is
sharded over `data`, they see global arrays, so `query @ candidates.T` spans
the whole global batch and labels are global indices; XLA inserts the
gathers. Scores are raw dot products (RankGen does not normalise vectors).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses.spec import Array

# Seeds of the two independent fingerprint hashes (arbitrary fixed constants).
_FINGERPRINT_SEEDS = (0x3C6EF372, 0xA54FF53A)


def _mix32(x: Array) -> Array:
    """A bijective avalanche mix of uint32 values (the MurmurHash3 finaliser)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def token_fingerprints(ids: Array) -> Array:
    """Two 32-bit hashes of each right-padded token sequence: [..., L] int32 -> [..., 2] int32.

    Each hash is sum_t code(id_t) * w(t) mod 2^32 with a pseudo-random odd
    weight per position and a pseudo-random code per token id. Padding (id 0)
    contributes nothing, so the same text padded to different lengths gets the
    same fingerprint; two different texts collide with probability ~2^-64.
    Weights come from hashing the position index, so any length works and
    nothing depends on a stored table.
    """
    ids_U = jnp.asarray(ids).astype(jnp.uint32)
    positions_L = jnp.arange(ids_U.shape[-1], dtype=jnp.uint32)
    hashes = []
    for seed in _FINGERPRINT_SEEDS:
        seed = jnp.uint32(seed)
        weights_L = _mix32(positions_L * jnp.uint32(0x9E3779B9) + seed) | jnp.uint32(1)
        codes_U = jnp.where(ids_U != 0, _mix32(ids_U ^ seed), jnp.uint32(0))
        # uint32 arithmetic wraps, which is exactly the mod 2^32 we want.
        hashes.append(jnp.sum(codes_U * weights_L, axis=-1, dtype=jnp.uint32))
    return jax.lax.bitcast_convert_type(jnp.stack(hashes, axis=-1), jnp.int32)


def _same_text(fingerprint_a: Array, fingerprint_b: Array) -> Array:
    """True where two broadcast fingerprints [..., 2] are equal."""
    return jnp.all(fingerprint_a == fingerprint_b, axis=-1)


def _logit_scale(loss_params: dict[str, Array], logit_scale: float, learn_logit_scale: bool) -> Array:
    """The multiplier applied to raw scores: learned (exp of a parameter) or fixed."""
    if learn_logit_scale:
        if "log_logit_scale" not in loss_params:
            raise RankgenError(
                "learn_logit_scale=True but loss_params has no 'log_logit_scale'; "
                "create them with losses.registry.init_loss_params(name, **options)"
            )
        return jnp.exp(jnp.asarray(loss_params["log_logit_scale"], jnp.float32))
    return jnp.asarray(logit_scale, jnp.float32)


def _negatives_BxKxD(outputs: dict[str, Array]) -> Array | None:
    """The negative vectors as [B, K, D] (a [B, D] input means K = 1), or None."""
    negative = outputs.get("negative")
    if negative is None:
        return None
    negative = jnp.asarray(negative, jnp.float32)
    if negative.ndim == 2:
        return negative[:, None, :]
    if negative.ndim == 3:
        return negative
    raise RankgenError(f"outputs['negative'] must be [B, D] or [B, K, D], got shape {negative.shape}")


def _negative_ids_BxKxL(batch: dict[str, Array]) -> Array:
    """The negative token ids as [B, K, L] (a [B, L] input means K = 1)."""
    if "negative_ids" not in batch:
        raise RankgenError("mask_duplicates needs batch['negative_ids'] when outputs has 'negative'")
    ids = jnp.asarray(batch["negative_ids"])
    return ids[:, None, :] if ids.ndim == 2 else ids


def _positive_ids(batch: dict[str, Array]) -> Array:
    if "positive_ids" not in batch:
        raise RankgenError("mask_duplicates needs batch['positive_ids'] (or pass mask_duplicates=False)")
    return jnp.asarray(batch["positive_ids"])


def exact_einsum(a: Array, b: Array, spec: str) -> Array:
    """jnp.einsum in float32 at HIGHEST precision, for scores."""
    # HIGHEST keeps the float32 scores exact on TPU (default there is one bf16 pass);
    # the cost is nothing next to the encoder.
    return jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _softmax_loss_and_metrics(
    scores_BxC: Array, valid_BxC: Array, gold_BxC: Array, scale: Array, margin: float
) -> tuple[Array, dict[str, Array]]:
    """Masked softmax cross entropy of each row's single gold column, plus the shared metrics.

    `scores_BxC` are raw dot products; the margin is subtracted from the gold
    score before scaling. Masked columns get -inf before the logsumexp, and the
    max is subtracted first, so masking and large scales stay finite. The gold
    column is never masked, so every row keeps a finite normaliser.
    """
    logits_BxC = scale * (scores_BxC - margin * gold_BxC.astype(jnp.float32))
    logits_BxC = jnp.where(valid_BxC, logits_BxC, -jnp.inf)
    # The max only stabilises the sum; its gradient cancels, so stop it.
    max_Bx1 = jax.lax.stop_gradient(jnp.max(logits_BxC, axis=-1, keepdims=True))
    logsumexp_B = max_Bx1[:, 0] + jnp.log(jnp.sum(jnp.exp(logits_BxC - max_Bx1), axis=-1))
    gold_logit_B = jnp.sum(jnp.where(gold_BxC, logits_BxC, 0.0), axis=-1)
    loss = jnp.mean(logsumexp_B - gold_logit_B)

    # Accuracy on raw scores: the ranking the model gives at inference (no margin).
    masked_scores_BxC = jnp.where(valid_BxC, scores_BxC, -jnp.inf)
    best_B = jnp.argmax(masked_scores_BxC, axis=-1)
    gold_index_B = jnp.argmax(gold_BxC, axis=-1)
    negatives_BxC = valid_BxC & ~gold_BxC
    num_negatives = jnp.sum(negatives_BxC)
    metrics = {
        "loss": loss,
        "accuracy": jnp.mean((best_B == gold_index_B).astype(jnp.float32)),
        "positive_score": jnp.mean(jnp.sum(jnp.where(gold_BxC, scores_BxC, 0.0), axis=-1)),
        "negative_score": jnp.sum(jnp.where(negatives_BxC, scores_BxC, 0.0)) / jnp.maximum(num_negatives, 1),
        "logit_scale": scale,
    }
    return loss, metrics


def in_batch_softmax_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    logit_scale: float = 1.0,
    learn_logit_scale: bool = False,
    margin: float = 0.0,
    mask_duplicates: bool = True,
) -> tuple[Array, dict[str, Array]]:
    """RankGen / DPR in-batch softmax: each query against every candidate of the global batch.

    Columns are all B positives, then all B*K negatives (example b's k-th
    negative is column B + b*K + k); row i's target is column i. With
    `mask_duplicates`, a column j != i whose token ids equal row i's gold ids
    (same text, any padding) is left out of row i's softmax: it is not a
    negative. This loss has cross-example terms, so gradient accumulation
    over micro-batches is not equivalent to one large batch.
    """
    query_BxD = jnp.asarray(outputs["query"], jnp.float32)
    positive_BxD = jnp.asarray(outputs["positive"], jnp.float32)
    negative_BxKxD = _negatives_BxKxD(outputs)
    num_examples = query_BxD.shape[0]

    candidates_CxD = positive_BxD
    if negative_BxKxD is not None:
        candidates_CxD = jnp.concatenate([positive_BxD, negative_BxKxD.reshape(-1, negative_BxKxD.shape[-1])], axis=0)
    num_candidates = candidates_CxD.shape[0]
    scores_BxC = exact_einsum(query_BxD, candidates_CxD, "bd,cd->bc")

    # Global labels: row i's gold is column i of the global candidate list.
    gold_BxC = jnp.arange(num_examples)[:, None] == jnp.arange(num_candidates)[None, :]
    valid_BxC = jnp.ones_like(gold_BxC)
    if mask_duplicates:
        gold_fp_Bx2 = token_fingerprints(_positive_ids(batch))
        candidate_fp_Cx2 = gold_fp_Bx2
        if negative_BxKxD is not None:
            negative_fp_BxKx2 = token_fingerprints(_negative_ids_BxKxL(batch))
            candidate_fp_Cx2 = jnp.concatenate([gold_fp_Bx2, negative_fp_BxKx2.reshape(-1, 2)], axis=0)
        duplicate_BxC = _same_text(gold_fp_Bx2[:, None, :], candidate_fp_Cx2[None, :, :])
        valid_BxC = gold_BxC | ~duplicate_BxC

    scale = _logit_scale(loss_params, logit_scale, learn_logit_scale)
    return _softmax_loss_and_metrics(scores_BxC, valid_BxC, gold_BxC, scale, margin)


def per_example_softmax_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    logit_scale: float = 1.0,
    learn_logit_scale: bool = False,
    margin: float = 0.0,
    mask_duplicates: bool = True,
) -> tuple[Array, dict[str, Array]]:
    """Softmax of each query over only its own positive and its own K negatives.

    No cross-example terms: the loss is the mean over examples of a
    per-example loss, so gradient accumulation over equal micro-batches is
    exact. Needs negatives (with only the positive the loss is identically 0).
    With `mask_duplicates`, a negative whose ids equal its own gold ids is
    left out of that example's softmax.
    """
    query_BxD = jnp.asarray(outputs["query"], jnp.float32)
    positive_BxD = jnp.asarray(outputs["positive"], jnp.float32)
    negative_BxKxD = _negatives_BxKxD(outputs)
    if negative_BxKxD is None:
        raise RankgenError("per_example_softmax needs outputs['negative'] (one or more negatives per example)")

    # Column 0 is the example's own positive, columns 1..K its own negatives.
    candidates_BxCxD = jnp.concatenate([positive_BxD[:, None, :], negative_BxKxD], axis=1)
    scores_BxC = exact_einsum(query_BxD, candidates_BxCxD, "bd,bcd->bc")
    num_columns = scores_BxC.shape[1]
    gold_BxC = jnp.broadcast_to(jnp.arange(num_columns)[None, :] == 0, scores_BxC.shape)
    valid_BxC = jnp.ones_like(gold_BxC)
    if mask_duplicates:
        gold_fp_Bx2 = token_fingerprints(_positive_ids(batch))
        negative_fp_BxKx2 = token_fingerprints(_negative_ids_BxKxL(batch))
        duplicate_BxK = _same_text(gold_fp_Bx2[:, None, :], negative_fp_BxKx2)
        valid_BxC = jnp.concatenate([jnp.ones_like(duplicate_BxK[:, :1]), ~duplicate_BxK], axis=1)

    scale = _logit_scale(loss_params, logit_scale, learn_logit_scale)
    return _softmax_loss_and_metrics(scores_BxC, valid_BxC, gold_BxC, scale, margin)
