"""CL-DRD's training lists (Zeng et al. 2022, Sec. 2.2.1): the teacher's ranking cut into three groups.

For each training query the teacher re-ranks the student's top N candidates.
Group 1 is the teacher's first K (all kept, label 1/r for teacher rank r);
group 2 the next K' ranks, from which N_h are drawn without replacement
(label 0); group 3 the ranks below, from which N_s are drawn without
replacement (label -1). The list size C = K + N_h + N_s stays constant while K
grows over the iterations. Only the labels' order matters to the loss (eq. 2
counts pairs with y(d) > y(d')); the released code uses -0.25 / -0.5 for the
two lower groups, which orders the same.

Stages of the paper's MS MARCO runs (`CL_DRD_STAGES`): K = 5, 10, 30 (Sec.
2.2.1); N_h / N_s = 12 / 13, 10 / 10, 0 / 0 (the released code's label modes
8, 9 and 6, C = 30). Neither the paper nor the released code gives K', the size
of group 2: here it is our choice, the ranks up to 50 (K' = 45, 40), named in
each stage so a run can set its own.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankgen_jax.errors import RankgenError

HARD_NEGATIVE_LABEL = 0.0
SAMPLED_NEGATIVE_LABEL = -1.0


@dataclasses.dataclass(frozen=True)
class CurriculumStage:
    """One iteration's groups: the teacher's top k; n_hard drawn from the next k_prime ranks; n_rest drawn from
    the ranks below those."""

    k: int
    k_prime: int
    n_hard: int
    n_rest: int

    def __post_init__(self):
        for name in ("k", "k_prime", "n_hard", "n_rest"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise RankgenError(f"curriculum stage {name} must be a non-negative integer, got {value!r}")
        if self.k < 1:
            raise RankgenError(f"curriculum stage k must be >= 1, got {self.k}")
        if self.n_hard > self.k_prime:
            raise RankgenError(f"curriculum stage draws n_hard={self.n_hard} from a group 2 of k_prime={self.k_prime}")

    @property
    def list_size(self) -> int:
        """C = K + N_h + N_s."""
        return self.k + self.n_hard + self.n_rest

    @property
    def min_candidates(self) -> int:
        """The fewest candidates a query needs: groups 1 and 2 whole, and n_rest below them."""
        return self.k + self.k_prime + self.n_rest

    @classmethod
    def of(cls, value) -> "CurriculumStage":
        """A stage from itself or a (k, k_prime, n_hard, n_rest) sequence (as gin gives it)."""
        if isinstance(value, cls):
            return value
        try:
            k, k_prime, n_hard, n_rest = value
        except (TypeError, ValueError):
            raise RankgenError(f"a curriculum stage is (k, k_prime, n_hard, n_rest), got {value!r}") from None
        return cls(k, k_prime, n_hard, n_rest)


CL_DRD_STAGES: tuple[CurriculumStage, ...] = (
    CurriculumStage(k=5, k_prime=45, n_hard=12, n_rest=13),
    CurriculumStage(k=10, k_prime=40, n_hard=10, n_rest=10),
    CurriculumStage(k=30, k_prime=0, n_hard=0, n_rest=0),
)


def curriculum_groups(teacher_scores_N: np.ndarray, stage: CurriculumStage,
                      rng: np.random.Generator | int | None) -> tuple[np.ndarray, np.ndarray]:
    """(candidate indices [C], labels [C]) of one query's CL-DRD list.

    The candidates are ranked by teacher score, descending, equal scores by
    index (the order they are given in: the student's ranking). Group 1 comes
    first in teacher order, then the n_hard drawn from group 2 and the n_rest
    drawn from group 3, each in teacher order. The draws are
    `rng.choice(len(group), n, replace=False)` for group 2, then for group 3
    (none when n is 0). rng: a Generator or a seed.
    """
    scores_N = np.asarray(teacher_scores_N, dtype=np.float64)
    if scores_N.ndim != 1:
        raise RankgenError(f"teacher scores must be 1-D, got shape {scores_N.shape}")
    if not np.all(np.isfinite(scores_N)):
        raise RankgenError("teacher scores must be finite")
    stage = CurriculumStage.of(stage)
    if len(scores_N) < stage.min_candidates:
        raise RankgenError(f"{len(scores_N)} candidates are too few for groups of {stage.k} + {stage.k_prime} and "
                           f"{stage.n_rest} drawn below them")
    rng = np.random.default_rng(rng)
    ranked_N = np.argsort(-scores_N, kind="stable")
    group2 = ranked_N[stage.k : stage.k + stage.k_prime]
    group3 = ranked_N[stage.k + stage.k_prime :]
    hard = group2[np.sort(rng.choice(len(group2), stage.n_hard, replace=False))] if stage.n_hard else group2[:0]
    rest = group3[np.sort(rng.choice(len(group3), stage.n_rest, replace=False))] if stage.n_rest else group3[:0]
    indices_C = np.concatenate([ranked_N[: stage.k], hard, rest]).astype(np.int64)
    labels_C = np.concatenate([1.0 / np.arange(1, stage.k + 1), np.full(stage.n_hard, HARD_NEGATIVE_LABEL),
                               np.full(stage.n_rest, SAMPLED_NEGATIVE_LABEL)]).astype(np.float32)
    return indices_C, labels_C
