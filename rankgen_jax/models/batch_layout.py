"""The training batch of each model kind, declared once: the model calls of a step and the arrays they read.

A dual encoder embeds queries and candidates in separate calls, its towers
(one padded call for all would cost ~1.5x the token work; towers of one length
share a call, see train.step.TowerGroup). A cross encoder scores each
query-candidate pair as one sequence, in one call. What else a batch holds
depends on the batch form its loss reads (losses.registry.batch_form):

- triples: a positive and negatives per query. Dual encoder: `query_ids`
  [B, Lq], `positive_ids` [B, Lc] and, optionally, `negative_ids` [B, Lc] or
  [B, K, Lc].
- candidate lists: scored candidates per query, never split along C. Dual
  encoder: `query_ids` [B, Lq] and `candidate_ids` [B, C, Lc]; cross encoder:
  `pair_ids` [B, C, Lq + Lc] (with `pair_type_ids` for BERT).

Labelled pairs (DataConfig.source 'pairs') fill the same arrays with one
candidate per row: `query_ids` / `positive_ids` [B, L], or `pair_ids` [B, L].
Masks, labels and teacher scores sit beside the ids (rankgen_jax.data.lists).

The data layer builds the arrays of a BatchLayout (data.sources, data.lists),
the train step runs its towers (train.step), and `rankgen-jax compile` takes
its batch shapes from it (tpu.aot).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from rankgen_jax.errors import RankgenError

TRIPLES = "triples"
CANDIDATE_LISTS = "candidate lists"
BATCH_FORMS = (TRIPLES, CANDIDATE_LISTS)

# What sets the last axis of an ids array: the query length, the candidate length, or both (one joined pair).
QUERY, CANDIDATE, PAIR = "query", "candidate", "pair"


@dataclasses.dataclass(frozen=True)
class Tower:
    """One model call of a step: which batch arrays go in, which output comes out.

    tower: the DualEncoder tower ("query" / "document"); None for models without towers.
    """

    output: str
    ids_key: str
    tower: str | None = None

    @property
    def type_ids_key(self) -> str:
        return self.ids_key.removesuffix("_ids") + "_type_ids"


@dataclasses.dataclass(frozen=True)
class BatchArray:
    """One ids array of a batch: its key, what sets its length, and whether a batch may leave it out."""

    key: str
    length: str
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class KindLayout:
    """How one model kind trains.

    towers: every model call a step of this kind can make, in order (the order
      seeds each call's dropout); a step runs those whose ids are in its batch.
    arrays: batch form -> the ids arrays of a batch of that form.
    joint: query and candidate are one sequence (`pair_ids`), not inputs of separate towers.
    """

    towers: tuple[Tower, ...]
    arrays: Mapping[str, tuple[BatchArray, ...]]
    joint: bool = False


KINDS: dict[str, KindLayout] = {
    "dual_encoder": KindLayout(
        towers=(
            Tower("query", "query_ids", "query"),
            Tower("positive", "positive_ids", "document"),
            Tower("negative", "negative_ids", "document"),
            Tower("candidates", "candidate_ids", "document"),
        ),
        arrays={
            TRIPLES: (BatchArray("query_ids", QUERY), BatchArray("positive_ids", CANDIDATE),
                      BatchArray("negative_ids", CANDIDATE, optional=True)),
            CANDIDATE_LISTS: (BatchArray("query_ids", QUERY), BatchArray("candidate_ids", CANDIDATE)),
        },
    ),
    "cross_encoder": KindLayout(
        towers=(Tower("scores", "pair_ids"),),
        arrays={CANDIDATE_LISTS: (BatchArray("pair_ids", PAIR),)},
        joint=True,
    ),
}


# The towers of a ModelConfig with a head and no kind given (a dual encoder): StepOptions' default.
DEFAULT_TOWERS = KINDS["dual_encoder"].towers


def kind_layout(model_kind: str) -> KindLayout:
    """The table entry of a model kind; a RankgenError for a kind that does not train (a bare encoder)."""
    if model_kind not in KINDS:
        raise RankgenError(f"no training batch layout for model kind {model_kind!r}: expected one of {sorted(KINDS)}")
    return KINDS[model_kind]


def towers(model_kind: str) -> tuple[Tower, ...]:
    """The model calls a training step of this kind can make."""
    return kind_layout(model_kind).towers


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """The training batch of one model kind in the batch form its loss reads: what make_sources builds."""

    model_kind: str
    form: str

    def __post_init__(self):
        kind = kind_layout(self.model_kind)
        if self.form not in BATCH_FORMS:
            raise RankgenError(f"unknown batch form {self.form!r}: expected one of {list(BATCH_FORMS)}")
        if self.form not in kind.arrays:
            forms = " or ".join(kind.arrays)
            raise RankgenError(f"a {self.model_kind} trains on {forms}, not {self.form}: choose a loss that reads "
                               f"{forms} (LossConfig.name)")

    @property
    def towers(self) -> tuple[Tower, ...]:
        return KINDS[self.model_kind].towers

    @property
    def joint(self) -> bool:
        return KINDS[self.model_kind].joint

    @property
    def arrays(self) -> tuple[BatchArray, ...]:
        return KINDS[self.model_kind].arrays[self.form]

    def lengths(self, query_length: int, candidate_length: int, optional: bool = True) -> dict[str, int]:
        """{ids array: sequence length} in the table's order; optional=False leaves out the optional arrays."""
        length_of = {QUERY: query_length, CANDIDATE: candidate_length, PAIR: query_length + candidate_length}
        return {a.key: length_of[a.length] for a in self.arrays if optional or not a.optional}
