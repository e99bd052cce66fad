"""Listwise, pairwise and distillation losses over per-query candidate lists (ranking models).

Same signature as `rankgen_jax.losses.contrastive`:

    loss_fn(outputs, batch, loss_params, **options) -> (loss, metrics)

- `outputs`: `"scores"` [B, C] (cross encoder), or `"query"` [B, D] with
  `"candidates"` [B, C, D] (dual encoder; scores are dot products), see
  `list_scores`. The multi-perspective loss reads `"query"` / `"positive"`
  [B, P, D] instead (P perspectives).
- `batch`: `"labels"` [B, C] (metric values, graded relevance or 0/1),
  `"teacher_scores"` [B, C], optional `"candidate_mask"` [B, C] (bool or int,
  default all valid), for ListMLE optional `"tie_break"` [B, C] noise, and
  for lambdarank_mrr with rank_source "retrieval" `"student_ranks"` [B, C].

Padding is marked by `candidate_mask` only, never by a label value: padded
scores / labels / teacher scores never reach the loss, the metrics or the
gradient (their gradient is exactly 0). A row with fewer than 2 valid
candidates, or with nothing to learn (see each loss), contributes 0 and is
left out of the mean; a batch of only such rows has loss 0 and zero
gradients. Every loss is a sum of per-query terms, so gradient accumulation
is exact up to the normaliser (the number of counted rows / pairs / entries
of each micro-batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses.contrastive import exact_einsum
from rankgen_jax.losses.spec import Array

# Where lambdarank_mrr's student ranks pi come from (see lambdarank_mrr_loss).
RANK_SOURCES = ("list", "retrieval")

# ----------------------------------------------------------------------------- helpers


def list_scores(outputs: dict[str, Array]) -> Array:
    """The [B, C] float32 scores of each query's candidate list (cross or dual encoder)."""
    if "scores" in outputs:
        scores_BxC = jnp.asarray(outputs["scores"], jnp.float32)
        if scores_BxC.ndim != 2:
            raise RankgenError(f"outputs['scores'] must be [B, C], got shape {scores_BxC.shape}")
        return scores_BxC
    if "query" not in outputs or "candidates" not in outputs:
        raise RankgenError(
            "list losses need outputs['scores'] [B, C] or outputs['query'] [B, D] with outputs['candidates'] [B, C, D]"
        )
    query_BxD = jnp.asarray(outputs["query"], jnp.float32)
    candidates_BxCxD = jnp.asarray(outputs["candidates"], jnp.float32)
    if query_BxD.ndim != 2 or candidates_BxCxD.ndim != 3 or candidates_BxCxD.shape[::2] != query_BxD.shape:
        raise RankgenError(
            f"outputs['query'] must be [B, D] and outputs['candidates'] [B, C, D], "
            f"got shapes {query_BxD.shape} and {candidates_BxCxD.shape}"
        )
    return exact_einsum(query_BxD, candidates_BxCxD, "bd,bcd->bc")


def _batch_array(batch: dict[str, Array], key: str, shape: tuple[int, ...]) -> Array:
    """`batch[key]` as float32, checked to have `shape`."""
    if key not in batch:
        raise RankgenError(f"this loss needs batch[{key!r}] of shape {shape}")
    value = jnp.asarray(batch[key], jnp.float32)
    if value.shape != shape:
        raise RankgenError(f"batch[{key!r}] must have shape {shape}, got {value.shape}")
    return value


def _mask(batch: dict[str, Array], key: str, shape: tuple[int, ...]) -> Array:
    """The bool validity mask `batch[key]` (default all valid), checked to have `shape`."""
    if key not in batch:
        return jnp.ones(shape, bool)
    mask = jnp.asarray(batch[key]).astype(bool)
    if mask.shape != shape:
        raise RankgenError(f"batch[{key!r}] must have shape {shape}, got {mask.shape}")
    return mask


def _masked_log_softmax(logits_BxC: Array, mask_BxC: Array) -> Array:
    """Row-wise log softmax over valid entries; 0 at masked entries and in rows without any."""
    shifted_BxC = jnp.where(mask_BxC, logits_BxC, -jnp.inf)
    # The max only stabilises; its gradient cancels. Empty rows would give -inf - -inf.
    max_Bx1 = jax.lax.stop_gradient(jnp.max(shifted_BxC, axis=-1, keepdims=True))
    max_Bx1 = jnp.where(jnp.isfinite(max_Bx1), max_Bx1, 0.0)
    shifted_BxC = shifted_BxC - max_Bx1
    sum_Bx1 = jnp.sum(jnp.exp(shifted_BxC), axis=-1, keepdims=True)
    # The max term contributes 1, so only empty rows have sum 0 (log would be -inf).
    sum_Bx1 = jnp.where(sum_Bx1 > 0, sum_Bx1, 1.0)
    return jnp.where(mask_BxC, shifted_BxC - jnp.log(sum_Bx1), 0.0)


def _top1_hit(scores_BxC: Array, labels_BxC: Array, mask_BxC: Array) -> Array:
    """[B] bool: the top-scored valid candidate has the row's highest valid label."""
    best_B = jnp.argmax(jnp.where(mask_BxC, scores_BxC, -jnp.inf), axis=-1)
    top_label_B = jnp.take_along_axis(labels_BxC, best_B[:, None], axis=-1)[:, 0]
    return top_label_B == jnp.max(jnp.where(mask_BxC, labels_BxC, -jnp.inf), axis=-1)


def _row_mean(values_B: Array, counted_B: Array) -> Array:
    """Mean of `values_B` over counted rows (0 when none is counted)."""
    return jnp.sum(jnp.where(counted_B, values_B, 0.0)) / jnp.maximum(jnp.sum(counted_B), 1)


def _has_distinct_labels(labels_BxC: Array, mask_BxC: Array) -> Array:
    """[B] bool: the row has two valid candidates with different labels (implies >= 2 valid)."""
    high_B = jnp.max(jnp.where(mask_BxC, labels_BxC, -jnp.inf), axis=-1)
    low_B = jnp.min(jnp.where(mask_BxC, labels_BxC, jnp.inf), axis=-1)
    # high > low already needs two valid entries (a lone or absent one gives high <= low).
    return high_B > low_B


def _reverse_cumulative_logsumexp(logits_BxC: Array, mask_BxC: Array) -> Array:
    """out[b, i] = logsumexp over valid j >= i of logits[b, j]; -inf where no such j.

    Masked entries are -inf and each suffix subtracts its own max (a
    (max, sum of exp) pair per element, combined by an associative scan), so
    padding adds exactly nothing and suffixes far below the row's max do not
    underflow to log(0).
    """
    # Masked logits are already sanitised by the caller; exp(x - stop_gradient(x)) is 1 with gradient 1.
    max_BxC = jnp.where(mask_BxC, jax.lax.stop_gradient(logits_BxC), -jnp.inf)
    sum_BxC = jnp.where(mask_BxC, jnp.exp(logits_BxC - jax.lax.stop_gradient(logits_BxC)), 0.0)

    def combine(left, right):
        max_a, sum_a = left
        max_b, sum_b = right
        max_ab = jnp.maximum(max_a, max_b)
        # An empty side (max -inf) contributes 0; the guard avoids exp(-inf - -inf) = nan.
        # The maxima carry no gradient, so these factors never feed nan into the backward pass.
        scale_a = jnp.where(max_a == -jnp.inf, 0.0, jnp.exp(max_a - max_ab))
        scale_b = jnp.where(max_b == -jnp.inf, 0.0, jnp.exp(max_b - max_ab))
        return max_ab, sum_a * scale_a + sum_b * scale_b

    suffix_max_BxC, suffix_sum_BxC = jax.lax.associative_scan(combine, (max_BxC, sum_BxC), reverse=True, axis=1)
    # A valid position's suffix holds its own max term (exp(0) = 1), so its sum is >= 1.
    safe_sum_BxC = jnp.where(mask_BxC, suffix_sum_BxC, 1.0)
    return jnp.where(mask_BxC, suffix_max_BxC + jnp.log(safe_sum_BxC), -jnp.inf)


def _plistmle_weights(num_valid_B: Array, num_candidates: int) -> Array:
    """[B, C] PListMLE weights (2^(n-i+1) - 1) / (2^n - 1) of sorted position i = 1..n; 0 beyond n.

    Computed as 2^(1-i) (1 - 2^-(n-i+1)) / (1 - 2^-n), which is the same
    number but never overflows for long lists.
    """
    position_C = jnp.arange(1, num_candidates + 1, dtype=jnp.float32)
    n_Bx1 = num_valid_B.astype(jnp.float32)[:, None]
    numerator_BxC = jnp.exp2(1.0 - position_C) * (1.0 - jnp.exp2(position_C - n_Bx1 - 1.0))
    denominator_Bx1 = jnp.maximum(1.0 - jnp.exp2(-n_Bx1), 0.5)  # n = 0 rows are masked out anyway
    return jnp.where(position_C <= n_Bx1, numerator_BxC / denominator_Bx1, 0.0)


def _l2_normalize(x: Array, eps: float = 1e-6) -> Array:
    """x / ||x|| along the last axis."""
    # Clamping the squared norm (not adding eps) keeps unit vectors exact and a zero vector's gradient finite.
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps**2))


def _bce_loss_and_metrics(logits: Array, labels: Array, mask: Array) -> tuple[Array, dict[str, Array]]:
    """Masked mean of binary cross entropy with logits, plus the sign accuracy."""
    # log_sigmoid stays finite for any logit (no log(1 - sigmoid(x)) cancellation).
    per_entry = -(labels * jax.nn.log_sigmoid(logits) + (1.0 - labels) * jax.nn.log_sigmoid(-logits))
    num_valid = jnp.maximum(jnp.sum(mask), 1)
    loss = jnp.sum(jnp.where(mask, per_entry, 0.0)) / num_valid
    agree = (logits > 0) == (labels >= 0.5)
    metrics = {
        "loss": loss,
        "accuracy": jnp.sum(jnp.where(mask, agree, False)) / num_valid,
        "mean_score": jnp.sum(jnp.where(mask, logits, 0.0)) / num_valid,
    }
    return loss, metrics


# ----------------------------------------------------------------------------- losses


def listmle_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    temperature: float = 1.0,
    position_weighting: bool = False,
) -> tuple[Array, dict[str, Array]]:
    """ListMLE: negative log Plackett-Luce likelihood of each list's label ordering.

    Each row's valid candidates are sorted by label descending; tied labels
    by `batch["tie_break"]` descending when given (pass fresh uniform noise
    per step for random tie breaking), and remaining ties by candidate index
    ascending. Padded candidates sort to the end and are left out. With
    s = score / temperature and s_(i) the i-th valid score in that order,

        row loss = -sum_{i=1..n} w_i [ s_(i) - logsumexp_{j >= i} s_(j) ],

    w_i = 1 (plain ListMLE) or, with `position_weighting`, the PListMLE
    weights (Lan et al. 2014) w_i = (2^(n-i+1) - 1) / (2^n - 1) (w_1 = 1,
    decreasing), where n is the row's number of valid candidates. The loss is
    the mean over rows with two valid candidates of different labels: rows
    whose labels are all tied carry no ordering to learn.
    """
    del loss_params
    scores_BxC = list_scores(outputs)
    shape = scores_BxC.shape
    mask_BxC = _mask(batch, "candidate_mask", shape)
    # Sanitise padding first so garbage there (even inf / nan) reaches neither sort keys nor gradients.
    labels_BxC = jnp.where(mask_BxC, _batch_array(batch, "labels", shape), 0.0)
    logits_BxC = jnp.where(mask_BxC, scores_BxC, 0.0) / temperature
    tie_break_BxC = jnp.zeros(shape, jnp.float32)
    if "tie_break" in batch:
        tie_break_BxC = jnp.where(mask_BxC, _batch_array(batch, "tie_break", shape), 0.0)

    # Keys, primary first: valid before padding, label desc, tie_break desc, index asc.
    index_BxC = jnp.broadcast_to(jnp.arange(shape[1], dtype=jnp.int32), shape)
    *_, order_BxC = jax.lax.sort(
        ((~mask_BxC).astype(jnp.int32), -labels_BxC, -tie_break_BxC, index_BxC), dimension=-1, num_keys=4
    )
    sorted_logits_BxC = jnp.take_along_axis(logits_BxC, order_BxC, axis=-1)
    num_valid_B = jnp.sum(mask_BxC, axis=-1)
    sorted_mask_BxC = jnp.arange(shape[1])[None, :] < num_valid_B[:, None]

    log_denominator_BxC = _reverse_cumulative_logsumexp(sorted_logits_BxC, sorted_mask_BxC)
    log_prob_BxC = jnp.where(sorted_mask_BxC, sorted_logits_BxC - log_denominator_BxC, 0.0)
    if position_weighting:
        log_prob_BxC = log_prob_BxC * _plistmle_weights(num_valid_B, shape[1])
    row_loss_B = -jnp.sum(log_prob_BxC, axis=-1)

    counted_B = _has_distinct_labels(labels_BxC, mask_BxC)
    loss = _row_mean(row_loss_B, counted_B)
    metrics = {"loss": loss, "accuracy": _row_mean(_top1_hit(scores_BxC, labels_BxC, mask_BxC), counted_B)}
    return loss, metrics


def kl_distillation_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    temperature: float = 1.0,
    t_squared: bool = False,
    logit_scale: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
    """KL(softmax(teacher / T) || softmax(logit_scale * student / T)) over each query's valid candidates.

    Teacher scores are `batch["teacher_scores"]` and get no gradient. Rows
    with fewer than 2 valid candidates (KL identically 0) are left out of the
    mean. `t_squared` multiplies by T^2, which keeps gradient magnitudes
    comparable across temperatures (Hinton et al.); conventions differ.
    logit_scale scales the student's scores only (a student with unit
    vectors, cosine scores in [-1, 1], learns at its training scale, e.g. 20,
    whatever the teacher's scores span).
    """
    del loss_params
    scores_BxC = list_scores(outputs)
    shape = scores_BxC.shape
    mask_BxC = _mask(batch, "candidate_mask", shape)
    teacher_BxC = jax.lax.stop_gradient(jnp.where(mask_BxC, _batch_array(batch, "teacher_scores", shape), 0.0))
    student_log_probs_BxC = _masked_log_softmax(jnp.where(mask_BxC, scores_BxC, 0.0) * logit_scale / temperature,
                                                mask_BxC)
    teacher_log_probs_BxC = _masked_log_softmax(teacher_BxC / temperature, mask_BxC)
    teacher_probs_BxC = jnp.where(mask_BxC, jnp.exp(teacher_log_probs_BxC), 0.0)
    row_loss_B = jnp.sum(teacher_probs_BxC * (teacher_log_probs_BxC - student_log_probs_BxC), axis=-1)
    if t_squared:
        row_loss_B = row_loss_B * temperature**2

    counted_B = jnp.sum(mask_BxC, axis=-1) >= 2
    loss = _row_mean(row_loss_B, counted_B)
    metrics = {
        "loss": loss,
        # The student's top candidate is (one of) the teacher's top.
        "accuracy": _row_mean(_top1_hit(scores_BxC, teacher_BxC, mask_BxC), counted_B),
    }
    return loss, metrics


def lambdarank_mrr_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    rank_source: str = "list",
    logit_scale: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
    """CL-DRD's loss (eq. 2): LambdaRank with MRR deltas, a weighted pairwise logistic loss over label-ordered pairs.

    Pairs (i, j) of valid candidates with label_i > label_j; weight
    |1/pi_i - 1/pi_j|, pi the student's 1-based rank of the candidate (no
    gradient); pair loss softplus(s_j - s_i). rank_source says where pi comes
    from: "list", the student's ordering of the row's valid candidates at this
    step (score desc, ties by index asc; as the authors' released code does),
    or "retrieval", `batch["student_ranks"]` [B, C]: each candidate's rank in
    the list the student retrieved (the result list the paper names; >= 1 on
    valid candidates). The loss is the sum of weighted pair losses divided by
    the number of such pairs in the whole batch (a per-batch mean over valid
    pairs, as the released code's mean, so lists with more pairs weigh more).
    logit_scale multiplies the scores first (1 in the paper, whose student
    scores are unbounded dot products; a student with unit vectors, cosine
    scores in [-1, 1], needs a larger one, as in-batch softmax does).
    """
    del loss_params
    if rank_source not in RANK_SOURCES:
        raise RankgenError(f"lambdarank_mrr: rank_source must be one of {RANK_SOURCES}, got {rank_source!r}")
    scores_BxC = list_scores(outputs)
    shape = scores_BxC.shape
    mask_BxC = _mask(batch, "candidate_mask", shape)
    labels_BxC = jnp.where(mask_BxC, _batch_array(batch, "labels", shape), 0.0)
    scores_BxC = jnp.where(mask_BxC, scores_BxC, 0.0) * logit_scale

    if rank_source == "retrieval":
        rank_BxC = jnp.where(mask_BxC, _batch_array(batch, "student_ranks", shape), 1.0)
    else:
        # Student ranks: 1 + number of valid candidates ahead (higher score, or equal score and lower index).
        ranking_BxC = jax.lax.stop_gradient(scores_BxC)
        index_C = jnp.arange(shape[1])
        ahead_BxCxC = (ranking_BxC[:, None, :] > ranking_BxC[:, :, None]) | (
            (ranking_BxC[:, None, :] == ranking_BxC[:, :, None]) & (index_C[None, :] < index_C[:, None])
        )
        rank_BxC = 1 + jnp.sum(ahead_BxCxC & mask_BxC[:, None, :], axis=-1)
    reciprocal_BxC = jax.lax.stop_gradient(1.0 / rank_BxC.astype(jnp.float32))

    # pair [b, i, j]: i should be above j.
    pair_BxCxC = (labels_BxC[:, :, None] > labels_BxC[:, None, :]) & mask_BxC[:, :, None] & mask_BxC[:, None, :]
    weight_BxCxC = jnp.abs(reciprocal_BxC[:, :, None] - reciprocal_BxC[:, None, :])
    pair_loss_BxCxC = jax.nn.softplus(scores_BxC[:, None, :] - scores_BxC[:, :, None])
    num_pairs = jnp.sum(pair_BxCxC)
    loss = jnp.sum(jnp.where(pair_BxCxC, weight_BxCxC * pair_loss_BxCxC, 0.0)) / jnp.maximum(num_pairs, 1)

    counted_B = jnp.any(pair_BxCxC, axis=(1, 2))
    correct_pairs = jnp.sum(pair_BxCxC & (scores_BxC[:, :, None] > scores_BxC[:, None, :]))
    metrics = {
        "loss": loss,
        "accuracy": _row_mean(_top1_hit(scores_BxC, labels_BxC, mask_BxC), counted_B),
        "pair_accuracy": correct_pairs / jnp.maximum(num_pairs, 1),
    }
    return loss, metrics


def sigmoid_bce_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    temperature: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
    """Binary cross entropy with logits scores / temperature, averaged over valid entries.

    `outputs["scores"]` is any [B, C] candidate list (pointwise ranker
    baseline) or [B, P] perspective outputs of a multi-perspective cross
    encoder; `batch["labels"]` in [0, 1] and the optional
    `batch["candidate_mask"]` have the same shape.
    """
    del loss_params
    if "scores" not in outputs:
        raise RankgenError("sigmoid_bce needs outputs['scores'] (logits)")
    scores = jnp.asarray(outputs["scores"], jnp.float32)
    mask = _mask(batch, "candidate_mask", scores.shape)
    labels = jnp.where(mask, _batch_array(batch, "labels", scores.shape), 0.0)
    logits = jnp.where(mask, scores, 0.0) / temperature
    return _bce_loss_and_metrics(logits, labels, mask)


def margin_mse_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
) -> tuple[Array, dict[str, Array]]:
    """Margin-MSE distillation: ((s_0 - s_j) - (t_0 - t_j))^2 with candidate 0 the positive.

    Averaged over valid (row, j >= 1) pairs; a row whose candidate 0 is
    masked has no pairs. Teacher scores get no gradient.
    """
    del loss_params
    scores_BxC = list_scores(outputs)
    shape = scores_BxC.shape
    mask_BxC = _mask(batch, "candidate_mask", shape)
    teacher_BxC = jax.lax.stop_gradient(jnp.where(mask_BxC, _batch_array(batch, "teacher_scores", shape), 0.0))
    scores_BxC = jnp.where(mask_BxC, scores_BxC, 0.0)
    is_negative_C = jnp.arange(shape[1]) >= 1
    pair_BxC = mask_BxC & mask_BxC[:, :1] & is_negative_C[None, :]
    student_margin_BxC = scores_BxC[:, :1] - scores_BxC
    teacher_margin_BxC = teacher_BxC[:, :1] - teacher_BxC
    squared_BxC = jnp.square(student_margin_BxC - teacher_margin_BxC)
    num_pairs = jnp.maximum(jnp.sum(pair_BxC), 1)
    loss = jnp.sum(jnp.where(pair_BxC, squared_BxC, 0.0)) / num_pairs

    counted_B = jnp.any(pair_BxC, axis=-1)
    best_negative_B = jnp.max(jnp.where(pair_BxC, scores_BxC, -jnp.inf), axis=-1)
    metrics = {
        "loss": loss,
        # The positive outscores every valid negative of its row.
        "accuracy": _row_mean(scores_BxC[:, 0] > best_negative_B, counted_B),
    }
    return loss, metrics


def multi_perspective_bce_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    tau: float = 0.5,
) -> tuple[Array, dict[str, Array]]:
    """MPTS bi-encoder: BCE of sigmoid(2 cos(a_p, b_p) / tau) against each perspective's label.

    `outputs["query"]` and `outputs["positive"]` are [B, P, D] (passage a and
    b, one vector per perspective); `batch["labels"]` [B, P] in [0, 1];
    optional `batch["perspective_mask"]` [B, P]. Mean over valid (b, p).
    """
    del loss_params
    if "query" not in outputs or "positive" not in outputs:
        raise RankgenError("multi_perspective_bce needs outputs['query'] and outputs['positive'] of shape [B, P, D]")
    a_BxPxD = jnp.asarray(outputs["query"], jnp.float32)
    b_BxPxD = jnp.asarray(outputs["positive"], jnp.float32)
    if a_BxPxD.ndim != 3 or a_BxPxD.shape != b_BxPxD.shape:
        raise RankgenError(
            f"outputs['query'] and outputs['positive'] must both be [B, P, D], got {a_BxPxD.shape} and {b_BxPxD.shape}"
        )
    shape = a_BxPxD.shape[:2]
    mask_BxP = _mask(batch, "perspective_mask", shape)
    labels_BxP = jnp.where(mask_BxP, _batch_array(batch, "labels", shape), 0.0)
    cosine_BxP = exact_einsum(_l2_normalize(a_BxPxD), _l2_normalize(b_BxPxD), "bpd,bpd->bp")
    # s = cos / tau, p = sigmoid(2 s) (docs/design/losses.md, 'Multi-perspective (MPTS)').
    logits_BxP = jnp.where(mask_BxP, 2.0 * cosine_BxP / tau, 0.0)
    loss, metrics = _bce_loss_and_metrics(logits_BxP, labels_BxP, mask_BxP)
    metrics["mean_cosine"] = jnp.sum(jnp.where(mask_BxP, cosine_BxP, 0.0)) / jnp.maximum(jnp.sum(mask_BxP), 1)
    return loss, metrics


def listwise_softmax_loss(
    outputs: dict[str, Array],
    batch: dict[str, Array],
    loss_params: dict[str, Array],
    *,
    temperature: float = 1.0,
) -> tuple[Array, dict[str, Array]]:
    """Cross entropy of a candidate list's softmax against its normalised labels.

    Scores [B, C] as `list_scores` reads them (a cross encoder's, or a dual
    encoder's dot products); `batch["labels"]` [B, C] (graded relevance >= 0,
    e.g. one-hot gold); optional `batch["candidate_mask"]` [B, C] marks real
    candidates (padding gets -inf before the logsumexp). Rows without any
    positive label are left out of the mean. Per-query terms only: gradient
    accumulation is exact when every microbatch has as many such rows.
    """
    del loss_params
    scores_BxC = list_scores(outputs)
    shape = scores_BxC.shape
    mask_BxC = _mask(batch, "candidate_mask", shape)
    labels_BxC = jnp.where(mask_BxC, jnp.maximum(_batch_array(batch, "labels", shape), 0.0), 0.0)
    label_sum_B = jnp.sum(labels_BxC, axis=-1)
    has_positive_B = label_sum_B > 0
    target_BxC = labels_BxC / jnp.maximum(label_sum_B, 1e-12)[:, None]
    log_probs_BxC = _masked_log_softmax(jnp.where(mask_BxC, scores_BxC, 0.0) / temperature, mask_BxC)
    row_loss_B = -jnp.sum(target_BxC * log_probs_BxC, axis=-1)
    loss = _row_mean(row_loss_B, has_positive_B)
    metrics = {
        "loss": loss,
        # The top-scored candidate has the list's highest label.
        "accuracy": _row_mean(_top1_hit(scores_BxC, labels_BxC, mask_BxC), has_positive_B),
        "mean_score": jnp.sum(jnp.where(mask_BxC, scores_BxC, 0.0)) / jnp.maximum(jnp.sum(mask_BxC), 1),
    }
    return loss, metrics
