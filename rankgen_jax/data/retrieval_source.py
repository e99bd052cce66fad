"""Retrieval training data as a trainer batch source: queries with positive and hard-negative passages.

Where the queries come from (DataConfig.source "retrieval"):
- a Tevatron training file (`read_training_queries`): each query's positive
  and negative passages are the record's own;
- or queries + passages + qrels + optionally a run (a BEIR folder, or TSV /
  JSON-lines files): a query's positives are the passages its qrels judge
  relevant (label >= 1), its negative pool the run's passages for it in
  trec_eval's order minus every passage the qrels judge relevant. A query whose
  qrels judge nothing relevant has no positive and is skipped (counted).
Negatives listed as a positive of the same query (Tevatron), or judged relevant
by RetrievalData.qrels (either way), are never taken as negatives; they are
dropped and counted.

Sampling, for row r of batch `index` (the row's rng is seeded by (seed, index,
r), so a batch is a pure function of its index and row slices build exactly the
rows of the full batch): the query is the r-th of that batch in a seeded epoch
order (lists.RecordBatches); its positive is one of its positives drawn
uniformly ("sample") or always its first ("first"); its K = hard_negatives
negatives are drawn without replacement from its pool. With fewer than K in the
pool, too_few_negatives says what happens: "fill" (the default; Tevatron's
trainer also draws with replacement then) takes each negative once and draws
the rest with replacement from the pool, for triples; a list leaves those slots empty under its
candidate_mask instead; "skip" drops the query when the data are read
(counted). A query with no negative at all is always skipped when K > 0:
there is nothing to fill with. Nothing is ever padded with unrelated text.

Arrays (models.batch_layout), tokenised as the list source does (lists.ListEncoder):
- triples (in-batch softmax; the global batch's other positives and negatives are
  the in-batch negatives): `query_ids` [B, Lq], `positive_ids` [B, Lc] and, with
  K > 0, `negative_ids` [B, K, Lc];
- candidate lists (listwise losses, cross encoders): list_size candidates
  (default 1 + K): up to list_size - K positives (label 1, drawn without
  replacement), then the K negatives (label 0), `candidate_mask` 0 on empty
  slots, `labels` [B, C], `tie_break` [B, C]. When the training file's
  passages carry teacher scores (Tevatron's "score"), `teacher_scores` [B, C]
  too: KL and MarginMSE (candidate 0 the positive) distil from them, and with
  list_labels "teacher" the labels are those scores (ListMLE on the teacher's
  order). Every query must then carry them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np

from rankgen_jax.data import jsonl
from rankgen_jax.data.lists import ListEncoder, RecordBatches
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, Passage, Qrels, TextFile, TrainingQuery,
                                              check_qrels, read_numbered_training_queries, read_passages, read_qrels,
                                              read_queries, read_run, trec_eval_order)
from rankgen_jax.data.text import TokenWindows
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import TRIPLES, BatchLayout

POSITIVE_CHOICES = ("sample", "first")
TOO_FEW_NEGATIVES = ("fill", "skip")
# A list's labels: 1 / 0 by relevance, or the teacher's scores (ListMLE on the teacher's order).
LIST_LABELS = ("relevance", "teacher")


@dataclasses.dataclass(frozen=True)
class SamplingRules:
    """How each row picks its positive and negatives, and what labels a list gets (see the module docstring)."""

    hard_negatives: int = 1
    positive_choice: str = "sample"
    too_few_negatives: str = "fill"
    title_join: str | None = DEFAULT_TITLE_JOIN
    list_labels: str = "relevance"

    def __post_init__(self):
        if self.list_labels not in LIST_LABELS:
            raise RankgenError(f"RetrievalData.list_labels must be one of {LIST_LABELS}, got {self.list_labels!r}")
        if self.hard_negatives < 0:
            raise RankgenError(f"RetrievalData.hard_negatives must be >= 0, got {self.hard_negatives}")
        if self.positive_choice not in POSITIVE_CHOICES:
            raise RankgenError(f"RetrievalData.positive_choice must be one of {POSITIVE_CHOICES}, "
                               f"got {self.positive_choice!r}")
        if self.too_few_negatives not in TOO_FEW_NEGATIVES:
            raise RankgenError(f"RetrievalData.too_few_negatives must be one of {TOO_FEW_NEGATIVES}, "
                               f"got {self.too_few_negatives!r}")


# Skip and drop reasons, counted per query (SkippedLines numbers them by the query's file line).
NO_RELEVANT = "no passage the qrels judge relevant"
NO_NEGATIVE = "no negative passage"
TOO_FEW = "fewer negatives than hard_negatives (too_few_negatives='skip')"
NEGATIVE_IS_POSITIVE = "negatives that are also the query's positives or judged relevant, left out of its pool"


@dataclasses.dataclass
class QueryPool:
    """The training queries of one split and what was skipped or dropped reading them, by reason."""

    where: str
    queries: list[TrainingQuery]
    skipped: jsonl.SkippedLines
    dropped_negatives: int = 0

    @property
    def scored(self) -> bool:
        """Whether the queries' passages carry teacher scores (all of them do, or none: see check_scores)."""
        return bool(self.queries) and self.queries[0].positives[0].score is not None

    def check_scores(self) -> None:
        """RankgenError when some queries carry teacher scores and others do not (a record has them on every
        passage or none, retrieval_files checks)."""
        with_scores = [q.query_id for q in self.queries if q.positives[0].score is not None]
        if with_scores and len(with_scores) != len(self.queries):
            without = next(q.query_id for q in self.queries if q.positives[0].score is None)
            raise RankgenError(f"{self.where}: {len(with_scores)} of {len(self.queries)} queries carry teacher scores "
                               f"(e.g. {with_scores[0]!r}) and the others none (e.g. {without!r}); score them all")

    def summary(self) -> str:
        negatives = [len(q.negatives) for q in self.queries]
        parts = [f"{self.where}: {len(self.queries)} training queries, "
                 f"{sum(len(q.positives) for q in self.queries)} positives, negatives per query "
                 f"{min(negatives, default=0)}-{max(negatives, default=0)}"]
        if self.skipped.count:
            parts.append(f"skipped {self.skipped.count} queries: {self.skipped.describe()}")
        if self.dropped_negatives:
            parts.append(f"dropped {self.dropped_negatives} {NEGATIVE_IS_POSITIVE}")
        return "; ".join(parts)


def _filtered(queries: Sequence[tuple[int, TrainingQuery]], rules: SamplingRules, where: str,
              qrels: Qrels | None = None, skipped: jsonl.SkippedLines | None = None) -> QueryPool:
    """Queries whose negative pools leave out their positives (and qrels-relevant passages), minus those to skip.

    Each query comes with the file line naming it in skip counts (its record in
    a Tevatron file, its first judgement in qrels).
    """
    skipped, dropped, kept = skipped if skipped is not None else jsonl.SkippedLines(), 0, []
    for number, query in queries:
        not_negative = {p.id for p in query.positives}
        if qrels is not None:
            not_negative |= qrels.relevant(query.query_id)
        negatives = tuple(p for p in query.negatives if p.id not in not_negative)
        dropped += len(query.negatives) - len(negatives)
        if rules.hard_negatives and not negatives:
            skipped.add(NO_NEGATIVE, number)
        elif len(negatives) < rules.hard_negatives and rules.too_few_negatives == "skip":
            skipped.add(TOO_FEW, number)
        else:
            kept.append(dataclasses.replace(query, negatives=negatives))
    return QueryPool(where, kept, skipped, dropped)


def tevatron_queries(path: str, rules: SamplingRules, qrels: Qrels | None = None) -> QueryPool:
    """The queries of a Tevatron training file, filtered by the rules (qrels: passages never to take as negatives)."""
    return _filtered(read_numbered_training_queries(path), rules, str(path), qrels)


@dataclasses.dataclass(frozen=True)
class QrelsFiles:
    """Where the qrels route reads: passages, queries, one split's qrels, and a run as the negative pool.

    split names the qrels/<split>.tsv of whichever of queries and qrels is a BEIR folder.
    """

    corpus: str
    queries: str
    qrels: str
    split: str
    negatives_run: str = ""


def qrels_queries(files: QrelsFiles, rules: SamplingRules, passages: TextFile | None = None) -> QueryPool:
    """Training queries built from passages + queries + qrels (+ a run): see the module docstring.

    passages: the corpus already read (train and eval splits share it).
    A judged query the queries lack is a RankgenError; a judged passage missing
    from the corpus is dropped and counted (as read_beir does); a run passage
    missing from the corpus is a RankgenError (the run is of another corpus).
    """
    if rules.hard_negatives and not files.negatives_run:
        raise RankgenError(f"RetrievalData.hard_negatives={rules.hard_negatives} with qrels needs a run to draw them "
                           "from (RetrievalData.negatives_run); set hard_negatives=0 for in-batch negatives only")
    passages = passages if passages is not None else read_passages(files.corpus)
    queries = read_queries(files.queries, split=files.split if Path(files.queries).is_dir() else None)
    qrels = read_qrels(files.qrels, split=files.split if Path(files.qrels).is_dir() else None)
    check_qrels(qrels, query_ids=queries.rows)
    qrels = check_qrels(qrels, passage_ids=passages.rows, on_missing="skip")
    run = read_run(files.negatives_run) if files.negatives_run else {}
    missing = sorted({d for scores in run.values() for d in scores if d not in passages.rows})
    if missing:
        raise RankgenError(f"{files.negatives_run}: {len(missing)} passages of the run are not in {files.corpus} "
                           f"(first: {missing[:3]}); is the run of another corpus?")
    built, skipped = [], jsonl.SkippedLines()
    for qid, labels in qrels.labels.items():
        number = min(qrels.lines[(qid, d)] for d in labels)
        relevant = qrels.relevant(qid)
        if not relevant:
            skipped.add(NO_RELEVANT, number)
            continue
        positives = tuple(passages.passage(d) for d in labels if d in relevant)  # in qrels order
        negatives = tuple(passages.passage(d) for d, _ in trec_eval_order(run.get(qid, {})))
        query = queries.passage(qid)
        built.append((number, TrainingQuery(qid, query.joined(rules.title_join), positives, negatives)))
    where = str(Path(files.qrels) / "qrels" / f"{files.split}.tsv") if Path(files.qrels).is_dir() else files.qrels
    return _filtered(built, rules, where, qrels, skipped)


class RetrievalBatches:
    """Batches of (query, one positive, K hard negatives), or candidate lists of them, from a QueryPool."""

    def __init__(self, pool: QueryPool, windows: TokenWindows, batch_size: int, layout: BatchLayout,
                 rules: SamplingRules, list_size: int = 0, seed: int = 0):
        if not pool.queries:
            raise RankgenError(f"{pool.where}: no usable training query ({pool.skipped.describe() or 'none read'})")
        pool.check_scores()
        if rules.list_labels == "teacher" and not pool.scored:
            raise RankgenError(f"{pool.where}: RetrievalData.list_labels='teacher' needs teacher scores on the passages "
                               "(Tevatron's \"score\" field; `rankgen-jax score-candidates` writes them)")
        self.pool, self.rules, self.layout, self.text = pool, rules, layout, windows.text
        self.triples = layout.form == TRIPLES
        k = rules.hard_negatives
        if self.triples:
            if list_size:
                raise RankgenError("RetrievalData.list_size is for candidate lists; triples take 1 positive and "
                                   "hard_negatives negatives")
            size = 1 + k
        else:
            size = list_size or 1 + k
            if size < 1 + k:
                raise RankgenError(f"RetrievalData.list_size={list_size} cannot hold one positive and "
                                   f"hard_negatives={k} negatives")
        self.list_size = size
        float_keys = () if self.triples else ("labels", "teacher_scores") if pool.scored else ("labels",)
        self.encoder = ListEncoder(windows, layout, size, float_keys, seed)
        self.batches = RecordBatches(pool.queries, batch_size, seed, pool.where)
        self.batch_size, self.seed = batch_size, seed

    def _passage(self, passage: Passage) -> str:
        return passage.joined(self.rules.title_join)

    def _negatives(self, query: TrainingQuery, rng: np.random.Generator) -> list[Passage]:
        pool, k = query.negatives, self.rules.hard_negatives
        if len(pool) >= k:
            return [pool[i] for i in rng.choice(len(pool), k, replace=False)] if k else []
        picks = list(rng.permutation(len(pool)))
        if self.triples:  # each once, the rest with replacement; a list masks its empty slots instead
            picks += list(rng.integers(0, len(pool), k - len(pool)))
        return [pool[i] for i in picks]

    def record(self, query: TrainingQuery, index: int, row: int) -> dict:
        """The row's list record {"query", "candidates", "labels"} (and "teacher_scores" when the passages carry
        them): positives first, then negatives."""
        rng = np.random.default_rng([self.seed, index, row])
        positives = query.positives
        if self.triples:
            count = 1
        else:
            count = min(len(positives), self.list_size - self.rules.hard_negatives)
        if self.rules.positive_choice == "first":
            chosen = list(positives[:count])
        else:
            chosen = [positives[i] for i in rng.choice(len(positives), count, replace=False)]
        negatives = self._negatives(query, rng)
        record = {"query": query.query, "candidates": [self._passage(p) for p in chosen + negatives],
                  "labels": [1.0] * len(chosen) + [0.0] * len(negatives)}
        if self.pool.scored:
            record["teacher_scores"] = [p.score for p in chosen + negatives]
            if self.rules.list_labels == "teacher":
                record["labels"] = record["teacher_scores"]
        return record

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        queries, row_numbers = self.batches.members(index, rows)
        records = [self.record(q, index, r) for q, r in zip(queries, row_numbers)]
        out = self.encoder.encode(records, row_numbers, index)
        if self.triples:
            out = {k: v for k, v in out.items() if k.endswith("_ids")}
        return out
