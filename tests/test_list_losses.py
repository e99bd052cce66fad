"""List losses against plain NumPy references: padding, ties, degenerate rows, gradients, CL-DRD labels."""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.losses import listwise as list_losses
from rankgen_jax.losses import registry
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS
from rankgen_jax.errors import RankgenError

RTOL = 1e-5
ATOL = 1e-6

# Losses that read a [B, C] candidate list with candidate_mask (multi_perspective_bce reads [B, P, D] towers).
CANDIDATE_LIST_LOSSES = ("listmle", "kl_distillation", "lambdarank_mrr", "sigmoid_bce", "margin_mse")


# ----------------------------------------------------------------------------- fixtures


def make_list_batch(seed=0, num_candidates=7):
    """Scores, labels, teacher scores and a mask over 6 rows covering the awkward cases.

    Row 0 all valid with tied labels; row 1 trailing padding; row 2 padding in
    the middle; row 3 all-equal valid labels; row 4 a single valid
    candidate; row 5 fully masked. Padded entries hold large garbage (labels
    larger than any real one, so a pad that sorted by label would go first).
    """
    rng = np.random.RandomState(seed)
    shape = (6, num_candidates)
    mask = np.ones(shape, bool)
    mask[1, 4:] = False
    mask[2, [1, 4]] = False
    mask[3, 5:] = False
    mask[4, 1:] = False
    mask[5, :] = False
    scores = rng.normal(0, 1.5, shape).astype(np.float32)
    labels = rng.randint(0, 3, shape).astype(np.float32)
    labels[1] = rng.uniform(0, 1, num_candidates)  # metric-like continuous labels
    labels[3] = 2.0
    teacher = rng.normal(0, 2.0, shape).astype(np.float32)
    scores[~mask] = rng.choice([-1e4, 1e4], (~mask).sum())
    labels[~mask] = 100.0 + rng.uniform(0, 1, (~mask).sum())
    teacher[~mask] = rng.choice([-1e4, 1e4], (~mask).sum())
    tie_break = rng.uniform(0, 1, shape).astype(np.float32)
    batch = {"labels": labels, "teacher_scores": teacher, "candidate_mask": mask}
    return scores, batch, tie_break


def np_logsumexp(x):
    x = np.asarray(x, np.float64)
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def np_log_sigmoid(x):
    return -np.logaddexp(0.0, -np.asarray(x, np.float64))


def rows(scores, batch):
    """(scores, labels, teacher, valid index list) per row, in float64."""
    mask = np.asarray(batch.get("candidate_mask", np.ones(scores.shape, bool)), bool)
    for b in range(scores.shape[0]):
        valid = [j for j in range(scores.shape[1]) if mask[b, j]]
        teacher = batch.get("teacher_scores")
        yield (
            np.asarray(scores[b], np.float64),
            np.asarray(batch["labels"][b], np.float64) if "labels" in batch else None,
            None if teacher is None else np.asarray(teacher[b], np.float64),
            valid,
        )


def scalar(x):
    return float(np.asarray(x))


@functools.lru_cache(maxsize=None)
def compiled(name, options):
    """Jitted (loss and metrics, gradient wrt scores) of a loss: one compile per shape instead of one per op."""
    fn = registry.get_loss(name)
    loss = jax.jit(lambda outputs, batch: fn(outputs, batch, {}, **dict(options)))
    grad = jax.jit(jax.grad(lambda scores, batch: fn({"scores": scores}, batch, {}, **dict(options))[0]))
    return loss, grad


def run(name, outputs, batch, **options):
    return compiled(name, tuple(sorted(options.items())))[0](outputs, batch)


def grad_wrt_scores(name, scores, batch, **options):
    return np.asarray(compiled(name, tuple(sorted(options.items())))[1](jnp.asarray(scores), batch))


# ----------------------------------------------------------------------------- NumPy references


def ref_listmle(scores, batch, tie_break=None, temperature=1.0, position_weighting=False):
    total, count = 0.0, 0
    for b, (s, y, _, valid) in enumerate(rows(scores, batch)):
        if len(valid) < 2 or max(y[valid]) == min(y[valid]):
            continue
        tie = np.zeros(len(s)) if tie_break is None else np.asarray(tie_break[b], np.float64)
        order = sorted(valid, key=lambda j: (-y[j], -tie[j], j))
        z = s[order] / temperature
        n = len(order)
        row = 0.0
        for i in range(n):  # i is 0-based: position i + 1
            w = (2.0 ** (n - i) - 1.0) / (2.0**n - 1.0) if position_weighting else 1.0
            row -= w * (z[i] - np_logsumexp(z[i:]))
        total += row
        count += 1
    return total / max(count, 1)


def ref_kl(scores, batch, temperature=1.0, t_squared=False, logit_scale=1.0):
    total, count = 0.0, 0
    for s, _, t, valid in rows(scores, batch):
        if len(valid) < 2:
            continue
        s = s * logit_scale
        log_q = s[valid] / temperature - np_logsumexp(s[valid] / temperature)
        log_p = t[valid] / temperature - np_logsumexp(t[valid] / temperature)
        total += np.sum(np.exp(log_p) * (log_p - log_q)) * (temperature**2 if t_squared else 1.0)
        count += 1
    return total / max(count, 1)


def ref_student_ranks(s, valid):
    ranked = sorted(valid, key=lambda j: (-s[j], j))
    return {j: r + 1 for r, j in enumerate(ranked)}


def ref_lambdarank(scores, batch, student_ranks=None):
    """Loss and its gradient wrt scores (ranks are piecewise constant, so weights are constants).

    student_ranks: pi from these [B, C] ranks (rank_source "retrieval"), else the student's ranking of each list.
    """
    total, num_pairs = 0.0, 0
    grad = np.zeros(scores.shape)
    for b, (s, y, _, valid) in enumerate(rows(scores, batch)):
        rank = ref_student_ranks(s, valid) if student_ranks is None else {j: student_ranks[b][j] for j in valid}
        for i in valid:
            for j in valid:
                if y[i] > y[j]:
                    w = abs(1.0 / rank[i] - 1.0 / rank[j])
                    total += w * np.logaddexp(0.0, -(s[i] - s[j]))
                    sig = 1.0 / (1.0 + np.exp(s[i] - s[j]))  # d softplus(s_j - s_i) / d s_j
                    grad[b, i] -= w * sig
                    grad[b, j] += w * sig
                    num_pairs += 1
    return total / max(num_pairs, 1), grad / max(num_pairs, 1)


def ref_bce(logits, labels, mask):
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    total, count = 0.0, 0
    for idx in zip(*np.nonzero(mask)):
        x, y = logits[idx], labels[idx]
        total -= y * np_log_sigmoid(x) + (1 - y) * np_log_sigmoid(-x)
        count += 1
    return total / max(count, 1)


def ref_margin_mse(scores, batch):
    total, count = 0.0, 0
    for s, _, t, valid in rows(scores, batch):
        if 0 not in valid:
            continue
        for j in valid:
            if j >= 1:
                total += ((s[0] - s[j]) - (t[0] - t[j])) ** 2
                count += 1
    return total / max(count, 1)


def ref_multi_perspective(a, b, labels, mask, tau):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    logits = np.zeros(labels.shape)
    for i in range(a.shape[0]):
        for n in range(a.shape[1]):
            cos = a[i, n] @ b[i, n] / (np.linalg.norm(a[i, n]) * np.linalg.norm(b[i, n]))
            logits[i, n] = 2.0 * cos / tau
    return ref_bce(logits, labels, mask)


# ----------------------------------------------------------------------------- list_scores


def test_list_scores_cross_and_dual_encoder():
    rng = np.random.RandomState(1)
    query = rng.normal(size=(3, 5)).astype(np.float32)
    candidates = rng.normal(size=(3, 4, 5)).astype(np.float32)
    got = np.asarray(list_losses.list_scores({"query": query, "candidates": candidates}))
    want = np.array([[query[b] @ candidates[b, j] for j in range(4)] for b in range(3)])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(list_losses.list_scores({"scores": want})), want.astype(np.float32))
    with pytest.raises(RankgenError, match="candidates"):
        list_losses.list_scores({"query": query})
    with pytest.raises(RankgenError, match=r"\[B, C, D\]"):
        list_losses.list_scores({"query": query, "candidates": candidates[:2]})


def test_dual_encoder_loss_equals_cross_encoder_loss_on_the_same_scores():
    rng = np.random.RandomState(2)
    query = rng.normal(size=(2, 4)).astype(np.float32)
    candidates = rng.normal(size=(2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = {"labels": rng.randint(0, 3, (2, 5)).astype(np.float32), "candidate_mask": mask}
    scores = np.einsum("bd,bld->bl", query.astype(np.float64), candidates)
    dual, _ = run("listmle", {"query": query, "candidates": candidates}, batch)
    np.testing.assert_allclose(scalar(dual), ref_listmle(scores, batch), rtol=RTOL)


# ----------------------------------------------------------------------------- ListMLE


@pytest.mark.parametrize("position_weighting", [False, True])
@pytest.mark.parametrize("use_tie_break", [False, True])
def test_listmle_matches_reference(position_weighting, use_tie_break):
    scores, batch, tie_break = make_list_batch(seed=3)
    if use_tie_break:
        batch = {**batch, "tie_break": tie_break}
    options = {"temperature": 0.7, "position_weighting": position_weighting}
    loss, metrics = run("listmle", {"scores": scores}, batch, **options)
    want = ref_listmle(scores, batch, tie_break if use_tie_break else None, **options)
    np.testing.assert_allclose(scalar(loss), want, rtol=RTOL)
    assert scalar(metrics["loss"]) == scalar(loss)
    assert 0.0 <= scalar(metrics["accuracy"]) <= 1.0


def test_listmle_tie_break_orders_tied_labels():
    scores = np.array([[0.3, -1.2, 2.0, 0.5, -0.4]], np.float32)
    batch = {"labels": np.array([[1.0, 1.0, 1.0, 0.0, 0.0]], np.float32)}
    noise_a = np.array([[0.9, 0.1, 0.5, 0.2, 0.8]], np.float32)
    noise_b = np.array([[0.1, 0.9, 0.5, 0.8, 0.2]], np.float32)
    loss_a, _ = run("listmle", {"scores": scores}, {**batch, "tie_break": noise_a})
    loss_b, _ = run("listmle", {"scores": scores}, {**batch, "tie_break": noise_b})
    loss_none, _ = run("listmle", {"scores": scores}, batch)
    np.testing.assert_allclose(scalar(loss_a), ref_listmle(scores, batch, noise_a), rtol=RTOL)
    np.testing.assert_allclose(scalar(loss_b), ref_listmle(scores, batch, noise_b), rtol=RTOL)
    assert abs(scalar(loss_a) - scalar(loss_b)) > 0.1
    # Without tie_break, ties keep index order: same as all-equal noise.
    zeros = np.zeros_like(noise_a)
    np.testing.assert_allclose(scalar(loss_none), ref_listmle(scores, batch, None), rtol=RTOL)
    loss_zeros, _ = run("listmle", {"scores": scores}, {**batch, "tie_break": zeros})
    assert scalar(loss_zeros) == scalar(loss_none)


def test_listmle_padding_adds_nothing_to_denominators():
    """A pad that reached the logsumexp with score ~0 would add ~1 to every denominator."""
    rng = np.random.RandomState(4)
    scores = rng.normal(0, 1, (3, 5)).astype(np.float32)
    labels = rng.uniform(0, 1, (3, 5)).astype(np.float32)
    plain, _ = run("listmle", {"scores": scores}, {"labels": labels})
    for pad_score in (0.0, 1e4, -1e4):
        padded_scores = np.concatenate([scores, np.full((3, 4), pad_score, np.float32)], axis=1)
        padded_labels = np.concatenate([labels, np.full((3, 4), 5.0, np.float32)], axis=1)
        mask = np.arange(9)[None, :].repeat(3, 0) < 5
        padded, _ = run("listmle", {"scores": padded_scores}, {"labels": padded_labels, "candidate_mask": mask})
        np.testing.assert_allclose(scalar(padded), scalar(plain), rtol=1e-6)
    # The buggy variant (pads at score 0 left in the denominators) differs by far more than the tolerance.
    buggy = 0.0
    for b in range(3):
        z = scores[b, np.argsort(-labels[b], kind="stable")].astype(np.float64)
        buggy -= sum(z[i] - np_logsumexp(np.concatenate([z[i:], np.zeros(4)])) for i in range(5))
    assert abs(buggy / 3 - scalar(plain)) > 0.5


def test_listmle_is_stable_for_widely_spread_scores():
    # The tail lies ~400 below the row max: one global max shift would underflow its denominators to log(0).
    scores = np.array([[400.0, 0.0, 1.0, -3.0], [-50.0, 350.0, 2.0, 0.5]], np.float32)
    batch = {"labels": np.array([[0.0, 3.0, 2.0, 1.0], [3.0, 2.0, 1.0, 0.0]], np.float32)}
    loss, _ = run("listmle", {"scores": scores}, batch)
    np.testing.assert_allclose(scalar(loss), ref_listmle(scores, batch), rtol=RTOL)
    assert np.all(np.isfinite(grad_wrt_scores("listmle", scores, batch)))


# ----------------------------------------------------------------------------- KL distillation


@pytest.mark.parametrize("t_squared,logit_scale", [(False, 1.0), (True, 1.0), (False, 20.0)])
def test_kl_distillation_matches_reference(t_squared, logit_scale):
    scores, batch, _ = make_list_batch(seed=5)
    loss, metrics = run("kl_distillation", {"scores": scores}, batch, temperature=2.0, t_squared=t_squared,
                        logit_scale=logit_scale)
    np.testing.assert_allclose(scalar(loss), ref_kl(scores, batch, 2.0, t_squared, logit_scale), rtol=RTOL)
    assert 0.0 <= scalar(metrics["accuracy"]) <= 1.0


def test_kl_distillation_has_no_teacher_gradient():
    scores, batch, _ = make_list_batch(seed=6)

    def loss_of_teacher(teacher):
        return run("kl_distillation", {"scores": scores}, {**batch, "teacher_scores": teacher})[0]

    grad = np.asarray(jax.grad(loss_of_teacher)(jnp.asarray(batch["teacher_scores"])))
    np.testing.assert_array_equal(grad, 0.0)


# ----------------------------------------------------------------------------- LambdaRank-MRR


def test_lambdarank_mrr_matches_reference_value_and_gradient():
    scores, batch, _ = make_list_batch(seed=7)
    loss, metrics = run("lambdarank_mrr", {"scores": scores}, batch)
    want_loss, want_grad = ref_lambdarank(scores, batch)
    np.testing.assert_allclose(scalar(loss), want_loss, rtol=RTOL)
    np.testing.assert_allclose(grad_wrt_scores("lambdarank_mrr", scores, batch), want_grad, rtol=1e-4, atol=1e-7)
    assert 0.0 <= scalar(metrics["pair_accuracy"]) <= 1.0


def test_lambdarank_weights_follow_the_students_ranks():
    batch = {"labels": np.array([[2.0, 1.0, 0.0]], np.float32)}
    agreeing = np.array([[0.3, 0.2, 0.1]], np.float32)  # student ranks 1, 2, 3
    swapped = np.array([[0.2, 0.3, 0.1]], np.float32)  # student ranks 2, 1, 3

    def softplus(x):
        return np.logaddexp(0.0, x)

    def expected(s, w01, w02, w12):
        s = s[0].astype(np.float64)
        return (w01 * softplus(s[1] - s[0]) + w02 * softplus(s[2] - s[0]) + w12 * softplus(s[2] - s[1])) / 3

    # |1/pi_i - 1/pi_j|: ranks (1, 2, 3) give (1/2, 2/3, 1/6); ranks (2, 1, 3) give (1/2, 1/6, 2/3).
    got_agreeing, _ = run("lambdarank_mrr", {"scores": agreeing}, batch)
    got_swapped, _ = run("lambdarank_mrr", {"scores": swapped}, batch)
    np.testing.assert_allclose(scalar(got_agreeing), expected(agreeing, 1 / 2, 2 / 3, 1 / 6), rtol=RTOL)
    np.testing.assert_allclose(scalar(got_swapped), expected(swapped, 1 / 2, 1 / 6, 2 / 3), rtol=RTOL)
    np.testing.assert_allclose(scalar(got_swapped), ref_lambdarank(swapped, batch)[0], rtol=RTOL)
    # Weights from the label order instead of the student's would give a clearly different loss.
    assert abs(scalar(got_swapped) - expected(swapped, 1 / 2, 2 / 3, 1 / 6)) > 1e-3


# ----------------------------------------------------------------------------- pointwise / margin / multi-perspective


def test_sigmoid_bce_matches_reference_and_is_stable():
    rng = np.random.RandomState(8)
    scores = rng.normal(0, 3, (4, 5)).astype(np.float32)
    scores[0, 0], scores[0, 1] = 200.0, -200.0  # log(1 - sigmoid) would be log(0) here
    labels = rng.uniform(0, 1, (4, 5)).astype(np.float32)
    labels[0, :2] = [0.0, 1.0]
    mask = rng.uniform(size=(4, 5)) > 0.3
    mask[0, :2] = True
    batch = {"labels": labels, "candidate_mask": mask}
    loss, metrics = run("sigmoid_bce", {"scores": scores}, batch, temperature=2.0)
    np.testing.assert_allclose(scalar(loss), ref_bce(scores / 2.0, labels, mask), rtol=RTOL)
    logits = scores.astype(np.float64) / 2.0
    want_accuracy = np.mean(((logits > 0) == (labels >= 0.5))[mask])
    np.testing.assert_allclose(scalar(metrics["accuracy"]), want_accuracy, rtol=RTOL)
    assert np.all(np.isfinite(grad_wrt_scores("sigmoid_bce", scores, batch)))


def test_margin_mse_matches_reference():
    scores, batch, _ = make_list_batch(seed=9)
    batch["candidate_mask"][2, 0] = False  # a row whose positive is masked has no pairs
    loss, metrics = run("margin_mse", {"scores": scores}, batch)
    np.testing.assert_allclose(scalar(loss), ref_margin_mse(scores, batch), rtol=RTOL)
    assert 0.0 <= scalar(metrics["accuracy"]) <= 1.0


def test_multi_perspective_bce_matches_reference():
    rng = np.random.RandomState(10)
    a = rng.normal(size=(3, 4, 6)).astype(np.float32)
    b = rng.normal(size=(3, 4, 6)).astype(np.float32)
    labels = rng.randint(0, 2, (3, 4)).astype(np.float32)
    mask = np.ones((3, 4), bool)
    mask[1, 2:] = False
    outputs = {"query": a, "positive": b}
    loss, metrics = run("multi_perspective_bce", outputs, {"labels": labels, "perspective_mask": mask})
    np.testing.assert_allclose(scalar(loss), ref_multi_perspective(a, b, labels, mask, 0.5), rtol=RTOL)
    unmasked, _ = run("multi_perspective_bce", outputs, {"labels": labels}, tau=0.25)
    want_unmasked = ref_multi_perspective(a, b, labels, np.ones_like(mask), 0.25)
    np.testing.assert_allclose(scalar(unmasked), want_unmasked, rtol=RTOL)
    assert -1.0 <= scalar(metrics["mean_cosine"]) <= 1.0
    # Masked perspectives get no gradient.
    masked_batch = {"labels": labels, "perspective_mask": mask}
    grad = jax.grad(lambda x: run("multi_perspective_bce", {"query": x, "positive": b}, masked_batch)[0])(a)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0.0)


# ----------------------------------------------------------------------------- shared properties


@pytest.mark.parametrize("name", CANDIDATE_LIST_LOSSES)
def test_padding_never_reaches_loss_or_gradient(name):
    scores, batch, tie_break = make_list_batch(seed=11)
    if name == "sigmoid_bce":
        batch["labels"] = np.where(batch["candidate_mask"], batch["labels"] / 2.0, batch["labels"])
    batch["tie_break"] = tie_break
    fn = registry.get_loss(name)
    mask = batch["candidate_mask"]
    loss, metrics = fn({"scores": scores}, batch, {})
    rng = np.random.RandomState(12)
    other_scores = np.where(mask, scores, rng.normal(0, 1e3, scores.shape)).astype(np.float32)
    other_batch = {
        key: np.where(mask, value, rng.normal(0, 50, value.shape)).astype(np.float32) for key, value in batch.items()
    }
    other_batch["candidate_mask"] = mask
    other_loss, other_metrics = fn({"scores": other_scores}, other_batch, {})
    assert scalar(other_loss) == scalar(loss)
    assert {k: scalar(v) for k, v in other_metrics.items()} == {k: scalar(v) for k, v in metrics.items()}
    grad = grad_wrt_scores(name, scores, batch)
    assert np.all(np.isfinite(grad))
    assert np.all(grad[~mask] == 0.0)
    assert np.any(grad[mask] != 0.0)


@pytest.mark.parametrize("name", CANDIDATE_LIST_LOSSES)
def test_batch_of_only_degenerate_rows_gives_zero_loss_and_gradient(name):
    scores = np.array([[1.0, 5.0, -2.0], [0.5, 9.0, 3.0], [2.0, -1.0, 4.0]], np.float32)
    mask = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 1]], bool)  # single valid, fully masked, all-equal labels
    if name == "sigmoid_bce":
        mask[0, 0] = mask[2, :] = False  # pointwise: only an empty mask has nothing to learn
    if name == "margin_mse":
        mask[2, :] = [False, True, True]  # no positive, so no pairs
    batch = {
        "labels": np.array([[1.0, 0.0, 2.0], [1.0, 2.0, 3.0], [2.0, 2.0, 2.0]], np.float32),
        "teacher_scores": np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]], np.float32),
        "candidate_mask": mask,
    }
    if name == "kl_distillation":
        mask[2, 1:] = False  # KL learns from any two valid candidates
    loss, metrics = run(name, {"scores": scores}, batch)
    assert scalar(loss) == 0.0
    assert all(np.isfinite(scalar(v)) for v in metrics.values())
    grad = grad_wrt_scores(name, scores, batch)
    np.testing.assert_array_equal(grad, 0.0)


def test_losses_run_eagerly_as_under_jit():
    # Every other test jits (one compile per shape, fast); the trainer may also call a loss eagerly.
    scores, batch, _ = make_list_batch(seed=13)
    eager, eager_metrics = list_losses.margin_mse_loss({"scores": scores}, batch, {})
    jitted, jitted_metrics = run("margin_mse", {"scores": scores}, batch)
    np.testing.assert_allclose(scalar(eager), scalar(jitted), rtol=RTOL)
    np.testing.assert_allclose(scalar(eager_metrics["accuracy"]), scalar(jitted_metrics["accuracy"]), rtol=RTOL)


def test_registries_and_signatures():
    names = {"listwise_softmax", "listmle", "kl_distillation", "lambdarank_mrr", "sigmoid_bce", "margin_mse",
             "multi_perspective_bce"}
    assert {name for name, spec in registry.LOSS_SPECS.items() if spec.batch_form == CANDIDATE_LISTS} == names
    assert {name: registry.needs_full_batch(name) for name in names} == {name: False for name in names}
    assert all(registry.get_loss(name) is getattr(list_losses, f"{name}_loss") for name in names)
    for fn in (registry.get_loss(name) for name in registry.LOSS_SPECS):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:3]] == ["outputs", "batch", "loss_params"]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:])


def test_missing_or_misshapen_inputs_raise():
    scores = np.zeros((2, 3), np.float32)
    with pytest.raises(RankgenError, match="labels"):
        list_losses.listmle_loss({"scores": scores}, {}, {})
    with pytest.raises(RankgenError, match="teacher_scores"):
        list_losses.kl_distillation_loss({"scores": scores}, {"labels": scores}, {})
    with pytest.raises(RankgenError, match="candidate_mask"):
        bad_mask = {"teacher_scores": scores, "candidate_mask": np.ones((2, 4))}
        list_losses.margin_mse_loss({"scores": scores}, bad_mask, {})


def test_lambdarank_with_retrieval_ranks_matches_reference_value_and_gradient():
    """rank_source="retrieval": pi is the candidate's rank in the student's retrieved list, given by the batch."""
    scores, batch, _ = make_list_batch(seed=21)
    ranks = np.random.RandomState(22).permutation(200)[: scores.size].reshape(scores.shape).astype(np.float32) + 1
    with_ranks = {**batch, "student_ranks": ranks}
    loss, _ = run("lambdarank_mrr", {"scores": scores}, with_ranks, rank_source="retrieval")
    want_loss, want_grad = ref_lambdarank(scores, with_ranks, student_ranks=ranks)
    np.testing.assert_allclose(scalar(loss), want_loss, rtol=RTOL, atol=ATOL)
    got_grad = grad_wrt_scores("lambdarank_mrr", scores, with_ranks, rank_source="retrieval")
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-7)
    # logit_scale multiplies the scores before the pair losses (ranks do not change).
    scaled, _ = run("lambdarank_mrr", {"scores": scores}, with_ranks, rank_source="retrieval", logit_scale=20.0)
    np.testing.assert_allclose(scalar(scaled), ref_lambdarank(20.0 * scores, with_ranks, student_ranks=ranks)[0],
                               rtol=RTOL, atol=ATOL)
    # The list's own ranks give another loss: the source of pi matters.
    list_loss, _ = run("lambdarank_mrr", {"scores": scores}, with_ranks)
    assert abs(scalar(list_loss) - want_loss) > 1e-3
    with pytest.raises(RankgenError, match="rank_source"):
        list_losses.lambdarank_mrr_loss({"scores": scores}, with_ranks, {}, rank_source="corpus")
    with pytest.raises(RankgenError, match="student_ranks"):
        list_losses.lambdarank_mrr_loss({"scores": scores}, batch, {}, rank_source="retrieval")
