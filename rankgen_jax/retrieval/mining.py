"""Hard-negative mining: rank the corpus for each training query, keep passages at depth ranges, write Tevatron
JSON lines.

Queries and their positives come from a Tevatron training file
(`{"query_id", "query", "positive_passages", ...}`; its negatives are
replaced), or from a queries file / BEIR folder and qrels (positives: the
passages judged at least `positive_level`, default 1). The corpus is any
passage file data/retrieval_files.py reads.

Retrievers:
- "bm25": bm25s with Pyserini's defaults (retrieval/bm25.py says how text is
  tokenised and scored). Only passages holding a query term (score > 0) are
  candidates, as in Lucene.
- dense: a dual encoder; passages through the document tower ("suffix"),
  queries through the query tower ("prefix"), inner product; either an index
  folder written by `rankgen-jax index` (its ids must all be in the corpus) or
  an exact flat index of the corpus encoded here.

Ranks are 1-based over the retriever's whole ranking, positives included:
a depth range "30-200" keeps ranks 30..200 (both ends), "200" is "1-200",
and "1-10,30-200" joins ranges. Equal scores rank by docid descending, the
order trec_eval and `search`'s runs use. From those candidates the query's
positives are dropped, and with drop_judged "relevant" every passage the qrels
judge above 0 for the query (relevant at any level, below positive_level
included), with "all" every judged passage (label 0 and negative ones too).
False negatives (FalseNegativeFilter, off by default): with an absolute
and / or a relative margin, a judge scores the query's positives and the
candidates left, and a candidate scoring too close to or above the (lowest)
positive is dropped, as sentence-transformers' mine_hard_negatives does
(absolute: s + m > p; relative: s > p - |p| r). The judge is the retriever
itself (its own scores; a dense model's positives are encoded for theirs) or
a teacher (judge "teacher": a cross encoder or a file of scores,
retrieval/teacher.py), whose scores the written passages then carry
(Tevatron's "score"). Each written query records `dropped_false_negatives`,
and the summary the drops by rule, the queries with drops and the most
dropped for one query.
Then `negatives` are kept: the first ones in rank order (pick "first"), or a
sample (pick "sample") drawn with random.Random(f"{seed}:{query_id}") and
written in rank order, so a query's negatives do not depend on batching or
resuming. Fewer candidates than `negatives`: all are written (counted).

Resuming (retrieval/resumable.py): the output is appended a batch of queries
at a time, each batch flushed to disk before `OUTPUT.progress.json` records
it, so a rerun with the same settings continues from the next query and an
interrupted run ends with the file an uninterrupted one writes. Other
settings or changed inputs are refused (overwrite starts over).

Skipped queries (not written, counted by reason in the summary): no positive
in the qrels, no judgement in the qrels, a positive missing from the corpus
(on_missing="skip"), no candidate at the depth range, every candidate a
positive or judged, every candidate dropped by the false-negative filter.
Ids missing from the corpus (a training file's positives, qrels passages) are a RankgenError naming the file and lines (on_missing
"error", the default) or skipped and counted by line ("skip"); no id is made up.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from tqdm import tqdm

from rankgen_jax.data import jsonl
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, TRAINING_SPLIT, Passage, Qrels, TextFile,
                                              TrainingQuery, check_qrels, is_beir_folder, iter_training_queries,
                                              read_passages, read_qrels, read_queries, training_query_record)
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval import resumable
from rankgen_jax.retrieval.bm25 import Bm25Params, Bm25Retriever, ranked_order
from rankgen_jax.retrieval.dense_index import build_faiss_index, encode_all, load_index, search_index

PICKS = ("first", "sample")
DROP_JUDGED = ("relevant", "all")
ON_MISSING = ("error", "skip")
DEFAULT_DEPTH = "30-200"
DEFAULT_NEGATIVES = 30
DEFAULT_QUERY_BATCH = 256
JUDGES = ("retriever", "teacher")
# Why a query is skipped. Qrels judge it, but none at positive_level:
NO_POSITIVE = "no positive passage in the qrels"
# A query of the queries file that the qrels never name:
NOT_JUDGED = "no judgement in the qrels"
# on_missing="skip" and a positive's id is not a corpus id (a training file's query; a qrels query losing them all):
POSITIVE_MISSING = "a positive passage not in the corpus"
# The retriever ranks fewer passages than the first depth range starts at (BM25: few share a query term):
NOTHING_RANKED = "the retriever ranks no passage in the depth range"
# Something is ranked in range, but only the query's positives (or, with drop_judged, judged passages):
ALL_DROPPED = "every passage in the depth range is a positive or judged"
# The false-negative filter dropped every candidate left:
ALL_FILTERED = "every candidate scores too close to or above the positive (the false-negative filter)"


def parse_depth(depth: str | Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """(first, last) rank ranges, 1-based and inclusive, sorted: "30-200", "200" (= 1-200), "1-10,30-200"."""
    if isinstance(depth, str):
        ranges = []
        for part in depth.split(","):
            first, dash, last = part.strip().partition("-")
            try:
                ranges.append((int(first), int(last)) if dash else (1, int(first)))
            except ValueError:
                raise RankgenError(f"depth {depth!r}: expected ranks FROM-TO (e.g. 30-200), TO, or such ranges "
                                   "joined by commas") from None
    else:
        ranges = [(int(a), int(b)) for a, b in depth]
    ranges.sort()
    if not ranges:
        raise RankgenError("no depth range")
    for first, last in ranges:
        if first < 1 or last < first:
            raise RankgenError(f"depth range {first}-{last}: ranks start at 1 and a range's end is not below its start")
    for (_, last), (first, end) in zip(ranges, ranges[1:]):
        if first <= last:
            raise RankgenError(f"depth ranges overlap ({first}-{end} starts at or before {last})")
    return tuple(ranges)


class DenseRetriever:
    """A dual encoder's query vectors searched in an index folder, or in a flat index of the corpus encoded here."""

    def __init__(self, model_dir: str, corpus: TextFile, index_dir: str | None = None,
                 title_join: str | None = DEFAULT_TITLE_JOIN, batch_size: int = 64, progress: bool = True,
                 conventions: dict | None = None):
        # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
        from rankgen_jax.inference.encoder import load_model

        self.model = load_model(model_dir, conventions=conventions)
        self.batch_size, self.corpus, self.title_join = batch_size, corpus, title_join
        if len(self.model.vector_shape) != 1:
            raise RankgenError(f"{model_dir}: a model with {self.model.vector_shape[0]} perspective heads gives "
                               "several vectors per text; mining needs one")
        print(self.model.conventions_note(), file=sys.stderr)
        self.ids = corpus.ids
        if index_dir is not None:
            loaded = load_index(index_dir)
            if loaded.index.d != self.model.dim:
                raise RankgenError(f"{model_dir}: the model gives {self.model.dim}-dimensional vectors but the index "
                                   f"in {index_dir} holds {loaded.index.d}-dimensional ones")
            missing = [(row, i) for row, i in enumerate(loaded.ids) if i not in corpus.rows]
            if missing:
                row, i = missing[0]
                raise RankgenError(f"{Path(index_dir) / 'ids.json'}: {len(missing)} indexed passages are not in the "
                                   f"corpus {corpus.path} (first: {i!r}, row {row}); index that corpus")
            self.index = loaded.index
            self.corpus_row_of_index_row = np.array([corpus.rows[i] for i in loaded.ids], np.int64)
        else:
            vectors_NxD = encode_all(self.model, corpus.joined(title_join), "suffix", None, batch_size, progress,
                                     "corpus")
            self.index = build_faiss_index(vectors_NxD, "flat")
            self.corpus_row_of_index_row = np.arange(len(corpus), dtype=np.int64)

    def passage_scores(self, queries: list[str], rows: list[list[int]]) -> list[np.ndarray]:
        """Dot products of each query's vector with the given corpus rows' vectors (encoded here)."""
        vectors_QxD = encode_all(self.model, queries, "prefix", None, self.batch_size, False, "queries")
        flat = [row for r in rows for row in r]
        texts = [self.corpus.passage(self.corpus.ids[row]).joined(self.title_join) for row in flat]
        passages_PxD = encode_all(self.model, texts, "suffix", None, self.batch_size, False, "passages")
        bounds = np.cumsum([0] + [len(r) for r in rows])
        return [passages_PxD[bounds[q] : bounds[q + 1]].astype(np.float64) @ vectors_QxD[q].astype(np.float64)
                for q in range(len(queries))]

    def rank(self, queries: list[str], depth: int) -> list[list[tuple[int, float]]]:
        vectors_QxD = encode_all(self.model, queries, "prefix", None, self.batch_size, False, "queries")
        scores_QxK, rows_QxK = search_index(self.index, vectors_QxD, depth)
        out = []
        for scores_K, rows_K in zip(scores_QxK, rows_QxK):
            found = rows_K >= 0  # FAISS pads with -1 when an approximate index finds fewer than k
            out.append(ranked_order(self.corpus_row_of_index_row[rows_K[found]], scores_K[found], self.ids, depth))
        return out


# ---------------------------------------------------------------------------
# Training queries


def _missing_positives(queries: list[tuple[int, TrainingQuery]], corpus: TextFile) -> jsonl.SkippedLines:
    missing = jsonl.SkippedLines()
    for number, query in queries:
        for p in query.positives:
            if p.id not in corpus.rows:
                missing.add(f"positive {p.id!r} of query {query.query_id!r} not in the corpus", number)
                break
    return missing


def load_training_queries(corpus: TextFile, train_file: str | None = None, queries_path: str | None = None,
                          qrels_path: str | None = None, split: str | None = None, positive_level: int = 1,
                          on_missing: str = "error") -> tuple[list[TrainingQuery], Qrels | None, dict[str, int]]:
    """(queries to mine, the qrels or None, {skip reason: count}) from a Tevatron file or queries + qrels.

    With a training file, qrels (optional) only say what is judged. Ids missing
    from the corpus: see the module docstring.
    """
    if on_missing not in ON_MISSING:
        raise RankgenError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
    if (train_file is None) == (queries_path is None):
        raise RankgenError("give either a Tevatron training file or a queries file (or BEIR folder) with qrels")
    if isinstance(positive_level, bool) or not isinstance(positive_level, int) or positive_level < 1:
        raise RankgenError(f"positive_level must be an integer >= 1, got {positive_level!r}")
    skipped: dict[str, int] = {}
    # Mining is for training queries: a BEIR folder is read at its train split unless another is named.
    split = TRAINING_SPLIT if split is None else split
    if qrels_path is None and queries_path is not None and is_beir_folder(queries_path):
        qrels_path = queries_path
    qrels = None
    if qrels_path is not None:
        qrels = read_qrels(qrels_path, split=split if Path(qrels_path).is_dir() else None)
    if train_file is not None:
        if qrels is not None:
            qrels = check_qrels(qrels, passage_ids=corpus.rows, on_missing=on_missing)
        read = jsonl.SkippedLines()
        numbered, first_line = list(iter_training_queries(train_file, read)), {}
        if read.count:
            print(f"{train_file}: skipped {read.count} lines: {read.describe()}", file=sys.stderr)
        for number, query in numbered:
            previous = first_line.setdefault(query.query_id, number)
            if previous != number:
                raise RankgenError(f"{train_file}: query id {query.query_id!r} occurs twice (lines {previous} and "
                                   f"{number})")
        if not numbered:
            raise RankgenError(f"{train_file}: no usable training query" + (f" ({read.describe()})" if read.count
                                                                             else ""))
        missing = _missing_positives(numbered, corpus)
        if missing.count and on_missing == "error":
            raise RankgenError(f"{train_file}: {missing.count} queries have a positive passage missing from the "
                               f"corpus {corpus.path}: {missing.describe()}")
        if missing.count:
            print(f"{train_file}: skipped {missing.count} queries: {missing.describe()}", file=sys.stderr)
            skipped[POSITIVE_MISSING] = missing.count
        dropped = set(missing.numbers())
        # Their negatives are what mining replaces; scores and ranks went with the old negatives' list (a file
        # scores all its passages or none), so the positives' go too.
        queries = [dataclasses.replace(q, negatives=(), positives=tuple(
            dataclasses.replace(p, score=None, rank=None) for p in q.positives)) for n, q in numbered if n not in dropped]
        return queries, qrels, skipped
    if qrels is None:
        raise RankgenError(f"{queries_path}: a queries file needs qrels to say its positives")
    query_file = read_queries(queries_path, split=split if Path(queries_path).is_dir() else None)
    had_positive = {qid for qid, labels in qrels.labels.items() if max(labels.values()) >= positive_level}
    judged = set(qrels.labels)
    qrels = check_qrels(qrels, passage_ids=corpus.rows, query_ids=query_file.rows, on_missing=on_missing)
    texts = query_file.joined(DEFAULT_TITLE_JOIN)
    queries = []
    for row, qid in enumerate(query_file.ids):
        positives = tuple(corpus.passage(d) for d, label in qrels.labels.get(qid, {}).items()
                          if label >= positive_level)
        if positives:
            queries.append(TrainingQuery(qid, texts[row], positives, ()))
            continue
        # Its positives all named passages missing from the corpus (on_missing="skip"), or it had none.
        reason = POSITIVE_MISSING if qid in had_positive else NO_POSITIVE if qid in judged else NOT_JUDGED
        skipped[reason] = skipped.get(reason, 0) + 1
    return queries, qrels, skipped


# ---------------------------------------------------------------------------
# Mining


def _pick(candidates: list[int], negatives: int, pick: str, seed: int, query_id: str) -> list[int]:
    if pick == "first" or len(candidates) <= negatives:
        return candidates[:negatives]
    chosen = sorted(random.Random(f"{seed}:{query_id}").sample(range(len(candidates)), negatives))
    return [candidates[i] for i in chosen]


def query_candidates(query: TrainingQuery, ranked: list[tuple[int, float]], corpus: TextFile,
                     ranges: tuple[tuple[int, int], ...], judged: dict[str, int] | None,
                     drop_judged: str | None) -> tuple[list[tuple[int, float]] | None, str | None]:
    """((row, retriever score) of each candidate in rank order, None) of one query, or (None, the skip reason)."""
    in_range = [(row, score) for rank, (row, score) in enumerate(ranked, start=1)
                if any(a <= rank <= b for a, b in ranges)]
    if not in_range:
        return None, NOTHING_RANKED
    drop = {p.id for p in query.positives}
    if drop_judged is not None and judged:
        drop |= {d for d, label in judged.items() if drop_judged == "all" or label > 0}
    candidates = [(row, score) for row, score in in_range if corpus.ids[row] not in drop]
    if not candidates:
        return None, ALL_DROPPED
    return candidates, None


def mine_query(query: TrainingQuery, ranked: list[tuple[int, float]], corpus: TextFile,
               ranges: tuple[tuple[int, int], ...], negatives: int, pick: str, seed: int,
               judged: dict[str, int] | None, drop_judged: str | None) -> tuple[list[Passage] | None, str | None]:
    """(negative passages, None) of one query from its ranking, or (None, the skip reason); no filter."""
    candidates, reason = query_candidates(query, ranked, corpus, ranges, judged, drop_judged)
    if candidates is None:
        return None, reason
    rows = [row for row, _ in candidates]
    return [corpus.passage(corpus.ids[row]) for row in _pick(rows, negatives, pick, seed, query.query_id)], None


@dataclasses.dataclass(frozen=True)
class FalseNegativeFilter:
    """Drops candidates that score too close to or above the query's positive, as sentence-transformers'
    mine_hard_negatives does.

    With p the lowest score among the query's positives (the harder
    positive, when there are several) and s a candidate's score, both by the
    judge: absolute_margin m drops the candidate when s + m > p; then
    relative_margin r drops it when s > p - |p| r (|p|, so a negative p does
    not raise the bar). None turns a rule off; the margins must be >= 0.

    judge: whose scores the margins compare, the retriever's own or the
    teacher's (a cross encoder's folder, a file of scores, or a loaded
    teacher, retrieval/teacher.py), whose scores the written passages then
    carry.
    """

    absolute_margin: float | None = None
    relative_margin: float | None = None
    judge: str = "retriever"
    teacher: Any = None

    def __post_init__(self):
        for name in ("absolute_margin", "relative_margin"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise RankgenError(f"`{name}` must be a finite number >= 0 or None, got {value!r}", names=(name,))
        if self.judge not in JUDGES:
            raise RankgenError(f"unknown `judge` {self.judge!r}: expected one of {JUDGES}", names=("judge",))
        if self.judge == "teacher" and self.teacher is None:
            raise RankgenError("`judge` 'teacher' needs a `teacher` (a cross encoder or a file of scores)",
                               names=("judge", "teacher"))
        if self.teacher is not None and not self.active:
            raise RankgenError("a `teacher` judges the false-negative filter: give `absolute_margin` or "
                               "`relative_margin`", names=("teacher", "absolute_margin", "relative_margin"))
        if self.teacher is not None and self.judge != "teacher":
            raise RankgenError("a `teacher` is given but the `judge` is the retriever (judge 'teacher')",
                               names=("teacher", "judge"))

    @property
    def active(self) -> bool:
        return self.absolute_margin is not None or self.relative_margin is not None

    def drops(self, positive_scores: np.ndarray, candidate_scores: np.ndarray) -> list[str | None]:
        """Per candidate the rule that drops it ("absolute_margin", "relative_margin") or None (kept)."""
        p = float(np.min(positive_scores))
        out: list[str | None] = []
        for s in np.asarray(candidate_scores, np.float64):
            if self.absolute_margin is not None and s + self.absolute_margin > p:
                out.append("absolute_margin")
            elif self.relative_margin is not None and s > p - abs(p) * self.relative_margin:
                out.append("relative_margin")
            else:
                out.append(None)
        return out


def _judge_scores(judge: str, ranker, teacher, batch: list[TrainingQuery], candidates: list[list[tuple[int, float]]],
                  corpus: TextFile, title_join: str | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(positive scores, candidate scores) of each query by the judge: the retriever's own scores (the positives'
    computed alike), or the teacher's (one call for the batch)."""
    if judge == "teacher":
        lists = [list(q.positives) + [corpus.passage(corpus.ids[row]) for row, _ in c]
                 for q, c in zip(batch, candidates)]
        scores = teacher.score([q.query_id for q in batch], [q.query for q in batch], lists, title_join)
        return [(s[: len(q.positives)], s[len(q.positives):]) for q, s in zip(batch, scores)]
    positive_rows = [[corpus.rows[p.id] for p in q.positives] for q in batch]
    positive_scores = ranker.passage_scores([q.query for q in batch], positive_rows)
    return [(p, np.array([score for _, score in c], np.float64)) for p, c in zip(positive_scores, candidates)]


@dataclasses.dataclass(frozen=True)
class TrainingQuerySource:
    """The training queries and their positives: a Tevatron training file (its negatives are replaced), or queries
    (a file or BEIR folder) with qrels (positives: passages judged at least positive_level; a BEIR folder's own
    qrels at `split` when qrels is None)."""

    train_file: str | None = None
    queries: str | None = None
    qrels: str | None = None
    split: str | None = None
    positive_level: int = 1
    on_missing: str = "error"  # a positive or qrels passage missing from the corpus: "error" or "skip" (counted)


@dataclasses.dataclass(frozen=True)
class MiningRetriever:
    """Who ranks the corpus: BM25 (no model; `bm25`'s settings) or a dual encoder (`model`, with its `index` folder
    or an exact index encoded here, `batch_size` texts per encoder call, reading text by `conventions`)."""

    model: str | None = None
    index: str | None = None
    bm25: Bm25Params = Bm25Params()
    batch_size: int = 64
    conventions: dict | None = None

    @property
    def kind(self) -> str:
        return "bm25" if self.model is None else "dense"


@dataclasses.dataclass(frozen=True)
class NegativePicking:
    """Which candidates become negatives: ranks in `depth`, less the positives (and with drop_judged what the qrels
    judge), then `negatives` of them, the first ones or a seeded sample (`pick`)."""

    depth: str = DEFAULT_DEPTH
    negatives: int = DEFAULT_NEGATIVES
    pick: str = "first"
    seed: int = 0
    drop_judged: str | None = None


def mine_negatives(
    out_path: str,
    corpus_path: str,
    queries: TrainingQuerySource,
    retriever: MiningRetriever = MiningRetriever(),
    picking: NegativePicking = NegativePicking(),
    false_negatives: FalseNegativeFilter = FalseNegativeFilter(),
    title_join: str | None = DEFAULT_TITLE_JOIN,
    query_batch: int = DEFAULT_QUERY_BATCH,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Mine hard negatives for each training query into a Tevatron JSON-lines file; returns the summary.

    See the module docstring for the retrievers, depth ranges, what is dropped,
    the false-negative filter, picking, resuming and bad input. The summary:
    output, queries written, negatives written, queries with fewer negatives
    than asked, queries skipped and their reasons, how many queries this call
    mined, and with a filter what it dropped.
    """
    source, fn_filter = queries, false_negatives
    teacher, judge = fn_filter.teacher, fn_filter.judge
    if isinstance(teacher, str):
        from rankgen_jax.retrieval.teacher import load_teacher

        teacher = load_teacher(teacher, batch_size=retriever.batch_size, conventions=retriever.conventions)
    if retriever.kind == "bm25" and retriever.index is not None:
        raise RankgenError("BM25 mining takes no `index` (it is a dense `model`'s)", names=("index", "model"))
    if picking.pick not in PICKS:
        raise RankgenError(f"unknown `pick` {picking.pick!r}: expected one of {PICKS}", names=("pick",))
    if picking.drop_judged is not None and picking.drop_judged not in DROP_JUDGED:
        raise RankgenError(f"`drop_judged` must be None or one of {DROP_JUDGED}, got {picking.drop_judged!r}",
                           names=("drop_judged",))
    if picking.drop_judged is not None and source.qrels is None and not (source.queries
                                                                         and is_beir_folder(source.queries)):
        raise RankgenError("`drop_judged` needs `qrels`", names=("drop_judged", "qrels"))
    for name, value in (("negatives", picking.negatives), ("query_batch", query_batch),
                        ("batch_size", retriever.batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RankgenError(f"`{name}` must be a positive integer, got {value!r}", names=(name,))
    ranges = parse_depth(picking.depth)
    out = Path(out_path)
    for given in (corpus_path, source.train_file, source.queries, source.qrels):
        if given is not None and Path(given).resolve() == out.resolve():
            raise RankgenError(f"{out_path}: the output would overwrite an input")
    if out.is_dir():
        raise RankgenError(f"{out_path}: is a folder; the output is a JSON-lines file")
    settings = {
        "retriever": retriever.kind, "model": str(Path(retriever.model).resolve()) if retriever.model else None,
        "index": resumable.input_stamp(retriever.index), "corpus": resumable.input_stamp(corpus_path),
        "train_file": resumable.input_stamp(source.train_file), "queries": resumable.input_stamp(source.queries),
        "qrels": resumable.input_stamp(source.qrels), "split": source.split,
        "depth": [list(r) for r in ranges], "negatives": picking.negatives, "pick": picking.pick,
        "seed": picking.seed, "drop_judged": picking.drop_judged, "positive_level": source.positive_level,
        "on_missing": source.on_missing, "title_join": title_join,
        "bm25": dataclasses.asdict(retriever.bm25) if retriever.kind == "bm25" else None,
        "conventions": {k: v for k, v in (retriever.conventions or {}).items() if v is not None} or None,
        "filter": {"absolute_margin": fn_filter.absolute_margin, "relative_margin": fn_filter.relative_margin,
                   "judge": judge, "teacher": None if teacher is None else teacher.stamp}
        if fn_filter.active else None,
    }
    corpus = read_passages(corpus_path)
    queries, qrels, load_skips = load_training_queries(corpus, source.train_file, source.queries, source.qrels,
                                                       source.split, source.positive_level, source.on_missing)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = {"written": 0, "negatives": 0, "short": 0, "skipped": {}, "judged": 0,
              "dropped": {"absolute_margin": 0, "relative_margin": 0}, "queries_with_drops": 0, "most_dropped": 0}
    record = resumable.start_or_resume(out, settings, counts, overwrite, "mine-negatives")
    start = resumable.check_resume_point(out, record, [q.query_id for q in queries])
    if start < len(queries):
        last_rank = ranges[-1][1]
        texts = corpus.joined(title_join)
        if retriever.kind == "bm25":
            ranker = Bm25Retriever(texts, corpus.ids, retriever.bm25, progress)
        else:
            ranker = DenseRetriever(retriever.model, corpus, retriever.index, title_join, retriever.batch_size,
                                    progress, retriever.conventions)
        del texts
        with tqdm(total=len(queries), initial=start, unit="query", desc="mine-negatives", file=sys.stderr,
                  dynamic_ncols=True, disable=not progress) as bar:
            for batch_start in range(start, len(queries), query_batch):
                batch = queries[batch_start : batch_start + query_batch]
                rankings = ranker.rank([q.query for q in batch], last_rank)
                found = []
                for query, ranked in zip(batch, rankings):
                    judged = qrels.labels.get(query.query_id) if qrels is not None else None
                    candidates, reason = query_candidates(query, ranked, corpus, ranges, judged, picking.drop_judged)
                    if candidates is None:
                        record["skipped"][reason] = record["skipped"].get(reason, 0) + 1
                    else:
                        found.append((query, candidates))
                scores = _judge_scores(judge, ranker, teacher, [q for q, _ in found], [c for _, c in found], corpus,
                                       title_join) if fn_filter.active and found else [None] * len(found)
                lines = []
                for (query, candidates), judged_scores in zip(found, scores):
                    extra = {}
                    score_of = None
                    if judged_scores is not None:
                        positive_scores, candidate_scores = judged_scores
                        rules = fn_filter.drops(positive_scores, candidate_scores)
                        dropped = sum(rule is not None for rule in rules)
                        record["judged"] += len(rules)
                        for rule in rules:
                            if rule is not None:
                                record["dropped"][rule] += 1
                        record["queries_with_drops"] += dropped > 0
                        record["most_dropped"] = max(record["most_dropped"], dropped)
                        extra["dropped_false_negatives"] = dropped
                        if judge == "teacher":
                            score_of = {row: float(s) for (row, _), s in zip(candidates, candidate_scores)}
                            query = dataclasses.replace(query, positives=tuple(
                                dataclasses.replace(p, score=float(s)) for p, s in zip(query.positives,
                                                                                        positive_scores)))
                        candidates = [c for c, rule in zip(candidates, rules) if rule is None]
                        if not candidates:
                            record["skipped"][ALL_FILTERED] = record["skipped"].get(ALL_FILTERED, 0) + 1
                            continue
                    rows = _pick([row for row, _ in candidates], picking.negatives, picking.pick, picking.seed,
                                 query.query_id)
                    mined = [dataclasses.replace(corpus.passage(corpus.ids[row]),
                                                 score=None if score_of is None else score_of[row]) for row in rows]
                    written = dataclasses.replace(query, negatives=tuple(mined))
                    lines.append((json.dumps({**training_query_record(written), **extra}, ensure_ascii=False) + "\n")
                                 .encode("utf-8"))
                    record["written"] += 1
                    record["negatives"] += len(mined)
                    record["short"] += len(mined) < picking.negatives
                resumable.save_batch(out, record, lines, batch_start + len(batch), batch[-1].query_id)
                bar.update(len(batch))
    if not out.exists():
        out.touch()  # every query skipped: an empty file, not a missing one
    skipped = dict(load_skips)
    for reason, count in record["skipped"].items():
        skipped[reason] = skipped.get(reason, 0) + count
    summary = {"output": str(out), "queries_written": record["written"], "negatives_written": record["negatives"],
               "queries_with_fewer_negatives": record["short"], "queries_skipped": sum(skipped.values()),
               "skipped": skipped, "mined_now": len(queries) - start}
    if fn_filter.active:
        summary["false_negative_filter"] = {
            "judge": judge, "absolute_margin": fn_filter.absolute_margin, "relative_margin": fn_filter.relative_margin,
            "candidates_judged": record["judged"], "dropped": dict(record["dropped"]),
            "dropped_total": sum(record["dropped"].values()), "queries_with_drops": record["queries_with_drops"],
            "most_dropped_in_one_query": record["most_dropped"]}
    return summary
