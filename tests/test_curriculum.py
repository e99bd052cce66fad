"""CL-DRD's groups (Sec. 2.2.1) against a plain NumPy reference: sizes, which ranks each group draws from, labels,
uniform sampling, and the lists feeding the loss."""

import numpy as np
import pytest

from rankgen_jax.data.curriculum import CL_DRD_STAGES, CurriculumStage, curriculum_groups
from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import listwise


def reference_groups(teacher, k, k_prime, n_hard, n_rest, rng):
    """Sec. 2.2.1 written out: rank by teacher (ties: given order), top k kept with label 1/r, n_hard drawn from the
    next k_prime (label 0), n_rest from the remaining ranks (label -1); each group in teacher order."""
    order = sorted(range(len(teacher)), key=lambda i: (-teacher[i], i))
    group1, group2, group3 = order[:k], order[k : k + k_prime], order[k + k_prime :]
    hard = [group2[i] for i in sorted(rng.choice(len(group2), n_hard, replace=False))] if n_hard else []
    rest = [group3[i] for i in sorted(rng.choice(len(group3), n_rest, replace=False))] if n_rest else []
    labels = [1.0 / r for r in range(1, k + 1)] + [0.0] * n_hard + [-1.0] * n_rest
    return group1 + hard + rest, labels


@pytest.mark.parametrize("stage", CL_DRD_STAGES)
def test_groups_equal_the_reference(stage):
    teacher = np.random.RandomState(14).normal(size=200)
    teacher[[3, 40, 77]] = teacher[5]  # ties break by the given (retrieval) order
    for seed in range(5):
        indices, labels = curriculum_groups(teacher, stage, np.random.default_rng(seed))
        want_indices, want_labels = reference_groups(teacher, stage.k, stage.k_prime, stage.n_hard, stage.n_rest,
                                                     np.random.default_rng(seed))
        assert indices.tolist() == want_indices
        np.testing.assert_allclose(labels, want_labels, rtol=1e-7)
        assert len(indices) == stage.list_size == 30 and len(set(indices.tolist())) == 30
        ranks = {c: r for r, c in enumerate(np.argsort(-teacher, kind="stable"))}
        group_ranks = [ranks[c] for c in indices]
        assert group_ranks[: stage.k] == list(range(stage.k))
        assert all(stage.k <= r < stage.k + stage.k_prime for r in group_ranks[stage.k : stage.k + stage.n_hard])
        assert all(r >= stage.k + stage.k_prime for r in group_ranks[stage.k + stage.n_hard :])


def test_groups_two_and_three_are_uniform_samples():
    """Every member of group 2 is drawn with probability N_h / K', of group 3 with N_s / (N - K - K')."""
    stage = CurriculumStage(k=2, k_prime=8, n_hard=3, n_rest=4)
    teacher = -np.arange(30.0)  # teacher rank = index
    counts = np.zeros(30)
    draws = 4000
    rng = np.random.default_rng(0)
    for _ in range(draws):
        indices, _ = curriculum_groups(teacher, stage, rng)
        counts[indices] += 1
    np.testing.assert_array_equal(counts[:2], draws)
    for members, p in ((slice(2, 10), 3 / 8), (slice(10, 30), 4 / 20)):
        freq = counts[members] / draws
        assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / draws)), freq


def test_the_last_stage_is_the_teachers_whole_top_l():
    teacher = np.random.RandomState(3).normal(size=50)
    indices, labels = curriculum_groups(teacher, CL_DRD_STAGES[-1], 0)
    assert indices.tolist() == np.argsort(-teacher, kind="stable")[:30].tolist()
    np.testing.assert_allclose(labels, 1.0 / np.arange(1, 31), rtol=1e-7)


def test_labels_order_the_groups_as_the_loss_needs():
    """y(d) > y(d') exactly for the pair types 1-4 of Sec. 2.2.1, so eq. 2 counts K(K-1)/2 + K N_h + K N_s + N_h N_s."""
    stage = CL_DRD_STAGES[0]
    _, labels = curriculum_groups(np.random.RandomState(5).normal(size=200), stage, 1)
    pairs = int(np.sum(labels[:, None] > labels[None, :]))
    k, h, s = stage.k, stage.n_hard, stage.n_rest
    assert pairs == k * (k - 1) // 2 + k * h + k * s + h * s


def test_curriculum_lists_feed_lambdarank():
    stage = CL_DRD_STAGES[0]
    teacher = np.random.RandomState(15).normal(size=(2, 200))
    labels = np.stack([curriculum_groups(t, stage, b)[1] for b, t in enumerate(teacher)])
    scores = np.random.RandomState(16).normal(size=labels.shape).astype(np.float32)
    loss, metrics = listwise.lambdarank_mrr_loss({"scores": scores}, {"labels": labels}, {})
    assert np.isfinite(float(loss)) and float(loss) > 0 and 0.0 <= float(metrics["pair_accuracy"]) <= 1.0


@pytest.mark.parametrize(
    "teacher, stage, match",
    [
        (np.zeros(20), (5, 45, 12, 13), "too few"),
        (np.zeros(40), (0, 10, 0, 10), "k must be >= 1"),
        (np.zeros((2, 100)), (5, 45, 12, 13), "1-D"),
        (np.zeros(100), (5, 12), r"\(k, k_prime, n_hard, n_rest\)"),
        (np.zeros(100), (5, 10, 12, 13), "draws n_hard=12 from a group 2 of k_prime=10"),
        (np.zeros(100), (5, -1, 0, 13), "non-negative"),
        (np.array([np.nan] * 100), (5, 45, 12, 13), "finite"),
    ],
)
def test_bad_input_is_refused(teacher, stage, match):
    with pytest.raises(RankgenError, match=match):
        curriculum_groups(teacher, stage, 0)
