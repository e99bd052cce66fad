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
Then `negatives` are kept: the first ones in rank order (pick "first"), or a
sample (pick "sample") drawn with random.Random(f"{seed}:{query_id}") and
written in rank order, so a query's negatives do not depend on batching or
resuming. Fewer candidates than `negatives`: all are written (counted).

Resuming: the output is appended a batch of queries at a time, each batch
flushed to disk before `OUTPUT.progress.json` (replaced atomically) records
the output's size, the number of queries handled and the counts. A rerun
with the same settings cuts the output back to the recorded size (a batch
or partial line written after the last record goes) and continues from
the next query, so an interrupted run ends with the file an uninterrupted one
writes. Other settings or changed inputs are refused (overwrite starts over).

Skipped queries (not written, counted by reason in the summary): no positive
in the qrels, no judgement in the qrels, a positive missing from the corpus
(on_missing="skip"), no candidate at the depth range, every candidate a
positive or judged. Ids missing from the corpus (a training file's positives,
qrels passages) are a RankgenError naming the file and lines (on_missing
"error", the default) or skipped and counted by line ("skip"); no id is made up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from tqdm import tqdm

from rankgen_jax.data import jsonl
from rankgen_jax.data.retrieval_files import (BEIR_CORPUS, BEIR_QUERIES, DEFAULT_TITLE_JOIN, Passage, Qrels,
                                              TextFile, TrainingQuery, check_qrels, is_beir_folder,
                                              iter_training_queries, read_passages, read_qrels, read_queries,
                                              training_query_record)
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.bm25 import (DEFAULT_BM25_B, DEFAULT_BM25_K1, DEFAULT_STOPWORDS, Bm25Retriever,
                                       ranked_order)
from rankgen_jax.retrieval.dense_index import (CONFIG_FILE, IDS_FILE, INDEX_FILE, build_faiss_index, encode_all,
                                              load_index, search_index)

RETRIEVERS = ("bm25", "dense")
PICKS = ("first", "sample")
DROP_JUDGED = ("relevant", "all")
ON_MISSING = ("error", "skip")
DEFAULT_DEPTH = "30-200"
DEFAULT_NEGATIVES = 30
DEFAULT_QUERY_BATCH = 256
MINING_SPLIT = "train"
PROGRESS_SUFFIX = ".progress.json"
PROGRESS_VERSION = 1
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
        self.batch_size = batch_size
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
    split = MINING_SPLIT if split is None else split
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
        # Their negatives are what mining replaces.
        queries = [dataclasses.replace(q, negatives=()) for n, q in numbered if n not in dropped]
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


def mine_query(query: TrainingQuery, ranked: list[tuple[int, float]], corpus: TextFile,
               ranges: tuple[tuple[int, int], ...], negatives: int, pick: str, seed: int,
               judged: dict[str, int] | None, drop_judged: str | None) -> tuple[list[Passage] | None, str | None]:
    """(negative passages, None) of one query from its ranking, or (None, the skip reason)."""
    in_range = [row for rank, (row, _) in enumerate(ranked, start=1) if any(a <= rank <= b for a, b in ranges)]
    if not in_range:
        return None, NOTHING_RANKED
    drop = {p.id for p in query.positives}
    if drop_judged is not None and judged:
        drop |= {d for d, label in judged.items() if drop_judged == "all" or label > 0}
    candidates = [row for row in in_range if corpus.ids[row] not in drop]
    if not candidates:
        return None, ALL_DROPPED
    return [corpus.passage(corpus.ids[row]) for row in _pick(candidates, negatives, pick, seed, query.query_id)], None


def _input_stamp(path: str | None) -> dict | None:
    """The resolved path and size of an input (a folder: of the files read there), so a resume sees a changed input."""
    if path is None:
        return None
    p = Path(path)
    files = [p]
    if p.is_dir():
        # A BEIR folder's corpus, queries and qrels; an index folder's files. Not all its files: the output may be
        # written in the folder.
        files = [p / name for name in (BEIR_CORPUS, BEIR_QUERIES, CONFIG_FILE, IDS_FILE, INDEX_FILE)]
        files = [f for f in files if f.is_file()] + sorted((p / "qrels").glob("*.tsv"))
    return {"path": str(p.resolve()), "bytes": sum(f.stat().st_size for f in files)}


def _write_progress(path: Path, record: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    partial.replace(path)


def _append(out: Path, lines: list[bytes]) -> int:
    """Append lines to out, flushed to disk; returns the file's new size."""
    with out.open("ab") as f:
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _start_or_resume(out: Path, progress_path: Path, settings: dict, overwrite: bool) -> dict:
    """The progress record to continue from (a fresh one when starting); the output cut to its recorded size."""
    fresh = {"version": PROGRESS_VERSION, "settings": settings, "bytes": 0, "handled": 0, "last_query_id": None,
             "written": 0, "negatives": 0, "short": 0, "skipped": {}}
    if overwrite:
        out.unlink(missing_ok=True)
        progress_path.unlink(missing_ok=True)
    if not progress_path.is_file():
        if out.exists():
            raise RankgenError(f"{out}: exists and has no {progress_path.name} (not a run of mine-negatives to "
                               "resume); choose another output or pass overwrite (--overwrite)")
        return fresh
    try:
        record = json.loads(progress_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RankgenError(f"{progress_path}: cannot read the progress record ({e}); pass overwrite to start over")
    if not isinstance(record, dict) or record.get("version") != PROGRESS_VERSION or set(record) != set(fresh):
        raise RankgenError(f"{progress_path}: not a progress record of this version; pass overwrite to start over")
    if record["settings"] != settings:
        changed = sorted(k for k in settings.keys() | record["settings"].keys()
                         if settings.get(k) != record["settings"].get(k))
        raise RankgenError(f"{out}: was started with other settings or inputs ({', '.join(changed)} differ); "
                           "rerun with those, or pass overwrite (--overwrite) to start over")
    size = out.stat().st_size if out.is_file() else 0
    if size < record["bytes"]:
        raise RankgenError(f"{out}: holds {size} bytes but {progress_path.name} records {record['bytes']} written; "
                           "the output was changed, pass overwrite to start over")
    if size > record["bytes"]:
        # A batch (or part of a line) written after the last progress record: it is mined again.
        with out.open("r+b") as f:
            f.truncate(record["bytes"])
    return record


def mine_negatives(
    out_path: str,
    corpus_path: str,
    train_file: str | None = None,
    queries_path: str | None = None,
    qrels_path: str | None = None,
    split: str | None = None,
    retriever: str = "bm25",
    model_dir: str | None = None,
    index_dir: str | None = None,
    depth: str = DEFAULT_DEPTH,
    negatives: int = DEFAULT_NEGATIVES,
    pick: str = "first",
    seed: int = 0,
    drop_judged: str | None = None,
    positive_level: int = 1,
    on_missing: str = "error",
    title_join: str | None = DEFAULT_TITLE_JOIN,
    bm25_k1: float = DEFAULT_BM25_K1,
    bm25_b: float = DEFAULT_BM25_B,
    bm25_stopwords: str | None = DEFAULT_STOPWORDS,
    batch_size: int = 64,
    query_batch: int = DEFAULT_QUERY_BATCH,
    overwrite: bool = False,
    progress: bool = True,
    conventions: dict | None = None,
) -> dict[str, Any]:
    """Mine hard negatives for each training query into a Tevatron JSON-lines file; returns the summary.

    See the module docstring for the retrievers, depth ranges, what is dropped,
    picking, resuming and bad input. The summary: output, queries written,
    negatives written, queries with fewer negatives than asked, queries
    skipped and their reasons, and how many queries this call mined.
    """
    if retriever not in RETRIEVERS:
        raise RankgenError(f"unknown retriever {retriever!r}: expected one of {RETRIEVERS}")
    if retriever == "dense" and model_dir is None:
        raise RankgenError("dense mining needs a model (--model)")
    if retriever == "bm25" and (model_dir is not None or index_dir is not None):
        raise RankgenError("BM25 mining takes no model or index")
    if pick not in PICKS:
        raise RankgenError(f"unknown pick {pick!r}: expected one of {PICKS}")
    if drop_judged is not None and drop_judged not in DROP_JUDGED:
        raise RankgenError(f"drop_judged must be None or one of {DROP_JUDGED}, got {drop_judged!r}")
    if drop_judged is not None and qrels_path is None and not (queries_path and is_beir_folder(queries_path)):
        raise RankgenError("drop_judged needs qrels (--qrels)")
    for name, value in (("negatives", negatives), ("query_batch", query_batch), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RankgenError(f"{name} must be a positive integer, got {value!r}")
    if bm25_stopwords not in (DEFAULT_STOPWORDS, None):
        raise RankgenError(f"bm25_stopwords must be {DEFAULT_STOPWORDS!r} (bm25s's English list) or None")
    ranges = parse_depth(depth)
    out = Path(out_path)
    for given in (corpus_path, train_file, queries_path, qrels_path):
        if given is not None and Path(given).resolve() == out.resolve():
            raise RankgenError(f"{out_path}: the output would overwrite an input")
    if out.is_dir():
        raise RankgenError(f"{out_path}: is a folder; the output is a JSON-lines file")
    settings = {
        "retriever": retriever, "model": str(Path(model_dir).resolve()) if model_dir else None,
        "index": _input_stamp(index_dir), "corpus": _input_stamp(corpus_path), "train_file": _input_stamp(train_file),
        "queries": _input_stamp(queries_path), "qrels": _input_stamp(qrels_path), "split": split,
        "depth": [list(r) for r in ranges], "negatives": negatives, "pick": pick, "seed": seed,
        "drop_judged": drop_judged, "positive_level": positive_level, "on_missing": on_missing,
        "title_join": title_join,
        "bm25": {"k1": bm25_k1, "b": bm25_b, "stopwords": bm25_stopwords} if retriever == "bm25" else None,
        "conventions": {k: v for k, v in (conventions or {}).items() if v is not None} or None,
    }
    corpus = read_passages(corpus_path)
    queries, qrels, load_skips = load_training_queries(corpus, train_file, queries_path, qrels_path, split,
                                                       positive_level, on_missing)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress_path = out.with_name(out.name + PROGRESS_SUFFIX)
    record = _start_or_resume(out, progress_path, settings, overwrite)
    start = record["handled"]
    if start > len(queries) or (start and queries[start - 1].query_id != record["last_query_id"]):
        raise RankgenError(f"{progress_path}: records {start} queries handled, last {record['last_query_id']!r}, "
                           "which the inputs no longer give; pass overwrite to start over")
    if start < len(queries):
        last_rank = ranges[-1][1]
        texts = corpus.joined(title_join)
        if retriever == "bm25":
            ranker = Bm25Retriever(texts, corpus.ids, bm25_k1, bm25_b, bm25_stopwords, progress)
        else:
            ranker = DenseRetriever(model_dir, corpus, index_dir, title_join, batch_size, progress, conventions)
        del texts
        with tqdm(total=len(queries), initial=start, unit="query", desc="mine-negatives", file=sys.stderr,
                  dynamic_ncols=True, disable=not progress) as bar:
            for batch_start in range(start, len(queries), query_batch):
                batch = queries[batch_start : batch_start + query_batch]
                rankings = ranker.rank([q.query for q in batch], last_rank)
                lines = []
                for query, ranked in zip(batch, rankings):
                    judged = qrels.labels.get(query.query_id) if qrels is not None else None
                    mined, reason = mine_query(query, ranked, corpus, ranges, negatives, pick, seed, judged,
                                               drop_judged)
                    if mined is None:
                        record["skipped"][reason] = record["skipped"].get(reason, 0) + 1
                        continue
                    written = dataclasses.replace(query, negatives=tuple(mined))
                    lines.append((json.dumps(training_query_record(written), ensure_ascii=False) + "\n")
                                 .encode("utf-8"))
                    record["written"] += 1
                    record["negatives"] += len(mined)
                    record["short"] += len(mined) < negatives
                record["bytes"] = _append(out, lines) if lines else record["bytes"]
                record["handled"] = batch_start + len(batch)
                record["last_query_id"] = batch[-1].query_id
                _write_progress(progress_path, record)
                bar.update(len(batch))
    if not out.exists():
        out.touch()  # every query skipped: an empty file, not a missing one
    skipped = dict(load_skips)
    for reason, count in record["skipped"].items():
        skipped[reason] = skipped.get(reason, 0) + count
    return {"output": str(out), "queries_written": record["written"], "negatives_written": record["negatives"],
            "queries_with_fewer_negatives": record["short"], "queries_skipped": sum(skipped.values()),
            "skipped": skipped, "mined_now": len(queries) - start}
