"""Teacher scores for candidate passages: a cross encoder, or a file of scores; written into training files.

A teacher is
- a cross encoder: a rankgen_jax cross-encoder checkpoint, an HF
  `*ForSequenceClassification` folder or a sentence-transformers `CrossEncoder`
  folder (inference.encoder.load_model(kind="cross_encoder")), scoring
  `query + passage` read together;
- a bi-encoder: a sentence-transformers model folder (modules.json with a
  Pooling module), scored by sentence-transformers itself (its prompts, its
  max_seq_length, its similarity function), or a rankgen_jax dual-encoder
  checkpoint (its query and document towers and dot-product score); "mpnet"
  names all-mpnet-base-v2 (pretrained.resolve_model). With the corpus given, its
  passages are encoded once, in corpus order, and looked up;
- an ensemble: several teachers joined by " + " (e.g. "mpnet + runs/teacher"),
  scoring the mean of the members' scores standardised within each query's
  candidates (each member's z-scores), so members on other scales weigh the
  same (Hofstätter et al.'s teacher ensembles average their members' scores);
- or a file of scores: a Tevatron training file whose passages carry
  `"score"`, or a run (TREC `qid Q0 docid rank score tag`, or search's JSON
  lines) of a re-ranker. A pair the file does not hold has no score (NaN); its
  passage is left out and counted, never given a made-up score.

`score_candidates` writes a Tevatron training file whose every passage carries
its teacher `"score"` (Tevatron's distillation field; sentence-transformers'
MarginMSE / DistillKLDiv `label` lists are these scores in the order positive,
negatives), from either
- a Tevatron training file (its positives and negatives are scored), or
- a run with its queries, corpus and qrels: each query's first `depth`
  passages of the run are its candidates, in the run's order (trec_eval's:
  score descending, equal scores by docid descending), each keeping its
  1-based `"rank"`; those the qrels judge relevant (label >= positive_level)
  are its positives, with the relevant passages the run missed added
  (without a rank), the rest its negatives. A query the qrels judge nothing
  relevant for is skipped (counted).
The queries are scored `query_batch` at a time, in input order, and the output
is resumable (retrieval/resumable.py): a batch is scored in one call, so a
resumed run gives the same bytes. With num_shards N, shard I handles the
queries at positions p % N == I, into its own file; `merge_shards` joins the
shards' files back into input order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data import jsonl
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, TRAINING_SPLIT, Passage, TrainingQuery,
                                              is_beir_folder, read_numbered_training_queries, read_passages, read_qrels,
                                              read_queries, read_run, trec_eval_order, training_query_record)
from rankgen_jax.errors import RankgenError
from rankgen_jax.pretrained import resolve_model
from rankgen_jax.retrieval import resumable

DEFAULT_QUERY_BATCH = 64
# Why a passage or query is left out.
NO_TEACHER_SCORE = "passages the teacher's score file holds no score for"
NO_RELEVANT = "no passage the qrels judge relevant"
NO_SCORED_POSITIVE = "no positive passage with a teacher score"


class CrossEncoderTeacher:
    """A cross encoder's scores of (query, passage) pairs."""

    def __init__(self, model_dir: str, query_length: int | None = None, candidate_length: int | None = None,
                 batch_size: int = 64, conventions: dict | None = None):
        # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
        from rankgen_jax.inference.encoder import load_model

        self.model = load_model(model_dir, kind="cross_encoder", conventions=conventions)
        self.query_length, self.candidate_length, self.batch_size = query_length, candidate_length, batch_size
        self.stamp = {"teacher": str(Path(model_dir).resolve()), "query_length": query_length,
                      "candidate_length": candidate_length, "batch_size": batch_size}

    def score(self, query_ids: Sequence[str], queries: Sequence[str], candidates: Sequence[Sequence[Passage]],
              title_join: str | None = DEFAULT_TITLE_JOIN) -> list[np.ndarray]:
        """Scores [C_i] (float32) of each query's candidates, in one score_pairs call."""
        del query_ids
        texts = [[p.joined(title_join) for p in cands] for cands in candidates]
        return [np.asarray(s, np.float32).reshape(len(c)) for s, c in zip(
            self.model.score_pairs(list(queries), texts, self.query_length, self.candidate_length, self.batch_size),
            candidates)]


class ScoreFileTeacher:
    """Teacher scores read from a file (a scored Tevatron training file, or a run): qid -> {docid: score}."""

    def __init__(self, path: str):
        file = Path(path)
        if not file.is_file():
            raise RankgenError(f"{path}: no such teacher score file")
        first = next((line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()), "")
        self.table: dict[str, dict[str, float]] = {}
        if '"positive_passages"' in first:
            for _, query in read_numbered_training_queries(file):
                scores = {p.id: p.score for p in query.positives + query.negatives}
                if any(s is None for s in scores.values()):
                    raise RankgenError(f"{path}: query {query.query_id!r} has passages without a \"score\"; a "
                                       "teacher score file scores every passage")
                self.table[query.query_id] = scores
        else:
            self.table = read_run(file)
        self.stamp = resumable.input_stamp(path)

    def score(self, query_ids: Sequence[str], queries: Sequence[str], candidates: Sequence[Sequence[Passage]],
              title_join: str | None = DEFAULT_TITLE_JOIN) -> list[np.ndarray]:
        """Scores [C_i] of each query's candidates; NaN where the file holds none."""
        del queries, title_join
        return [np.array([self.table.get(q, {}).get(p.id, math.nan) for p in cands], np.float32)
                for q, cands in zip(query_ids, candidates)]


class BiEncoderTeacher:
    """A bi-encoder's similarity of (query, passage) pairs: a sentence-transformers model folder (scored by
    sentence-transformers: encode_query / encode_document, then its own similarity function) or a rankgen_jax dual
    encoder (its towers, dot products). Passages of the corpus are encoded once, in corpus order."""

    def __init__(self, model_dir: str, query_length: int | None = None, candidate_length: int | None = None,
                 batch_size: int = 64, conventions: dict | None = None, corpus: str | None = None,
                 title_join: str | None = DEFAULT_TITLE_JOIN):
        self.batch_size, self.corpus, self.title_join = batch_size, corpus, title_join
        self.sentence_transformer = is_sentence_transformer_bi_encoder(model_dir)
        if self.sentence_transformer:
            from sentence_transformers import SentenceTransformer  # an optional dependency (the 'st' extra)

            self.model = SentenceTransformer(model_dir, device="cpu")
            self.lengths = (None, None)
        else:
            from rankgen_jax.inference.encoder import load_model  # imports jax: see CrossEncoderTeacher

            self.model = load_model(model_dir, conventions=conventions)
            self.lengths = (query_length, candidate_length)
        self._passages: dict[str, np.ndarray] | None = None
        self.stamp = {"teacher": str(Path(model_dir).resolve()), "kind": "bi_encoder",
                      "query_length": self.lengths[0], "candidate_length": self.lengths[1],
                      "batch_size": batch_size, "corpus": resumable.input_stamp(corpus)}

    def encode(self, texts: Sequence[str], side: str) -> np.ndarray:
        """Vectors [N, D] (float32) of texts on the query ("prefix") or document ("suffix") side."""
        if not texts:
            return np.zeros((0, 0), np.float32)
        if self.sentence_transformer:
            encode = self.model.encode_query if side == "prefix" else self.model.encode_document
            return np.asarray(encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                     show_progress_bar=False), np.float32)
        length = self.lengths[0] if side == "prefix" else self.lengths[1]
        return self.model.encode(list(texts), side=side, max_length=length, batch_size=self.batch_size)

    def similarity(self, query_D: np.ndarray, passages_NxD: np.ndarray) -> np.ndarray:
        """The model's own score of one query against passages [N]."""
        if not self.sentence_transformer:
            return (passages_NxD.astype(np.float64) @ query_D.astype(np.float64)).astype(np.float32)
        import torch

        return self.model.similarity(torch.from_numpy(query_D[None]), torch.from_numpy(passages_NxD)).numpy()[0]

    def _corpus_vectors(self) -> dict[str, np.ndarray]:
        if self._passages is None:
            self._passages = {}
            if self.corpus:
                corpus = read_passages(self.corpus)
                vectors = self.encode(corpus.joined(self.title_join), "suffix")
                self._passages = dict(zip(corpus.ids, vectors))
        return self._passages

    def score(self, query_ids: Sequence[str], queries: Sequence[str], candidates: Sequence[Sequence[Passage]],
              title_join: str | None = DEFAULT_TITLE_JOIN) -> list[np.ndarray]:
        """Scores [C_i] (float32) of each query's candidates: corpus passages looked up, others encoded here."""
        del query_ids
        known = self._corpus_vectors()
        others = list(dict.fromkeys(p.id for cands in candidates for p in cands if p.id not in known))
        texts = {p.id: p.joined(title_join) for cands in candidates for p in cands}
        vectors = {**dict(zip(others, self.encode([texts[d] for d in others], "suffix"))), **known}
        query_vectors = self.encode(list(queries), "prefix")
        return [self.similarity(q, np.stack([vectors[p.id] for p in cands])) if cands else np.zeros(0, np.float32)
                for q, cands in zip(query_vectors, candidates)]


ENSEMBLE_SEPARATOR = " + "


def standardized(scores_C: np.ndarray) -> np.ndarray:
    """Scores as z-scores over the finite ones (mean 0, standard deviation 1; all 0 when they are equal); NaN stays
    NaN."""
    scores = np.asarray(scores_C, np.float64)
    finite = np.isfinite(scores)
    if not finite.any():
        return scores
    centred = scores - scores[finite].mean()
    spread = scores[finite].std()
    return centred / spread if spread > 0 else np.where(finite, 0.0, np.nan)


class EnsembleTeacher:
    """The mean of several teachers' scores, each standardised within a query's candidates (standardized): a pair
    any member cannot score (NaN) has no ensemble score."""

    def __init__(self, members: Sequence[Any]):
        if len(members) < 2:
            raise RankgenError("an ensemble teacher needs at least two members")
        self.members = list(members)
        self.stamp = {"kind": "ensemble", "members": [m.stamp for m in self.members]}

    def score(self, query_ids: Sequence[str], queries: Sequence[str], candidates: Sequence[Sequence[Passage]],
              title_join: str | None = DEFAULT_TITLE_JOIN) -> list[np.ndarray]:
        by_member = [m.score(query_ids, queries, candidates, title_join) for m in self.members]
        return [np.mean([standardized(scores[i]) for scores in by_member], axis=0).astype(np.float32)
                for i in range(len(candidates))]


def is_sentence_transformer_bi_encoder(folder: str | Path) -> bool:
    """A sentence-transformers model folder whose modules pool token vectors (a bi-encoder, not a CrossEncoder)."""
    modules = Path(folder) / "modules.json"
    if not modules.is_file():
        return False
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RankgenError(f"{modules}: not valid JSON") from None
    return any(isinstance(e, dict) and str(e.get("type", "")).endswith(".Pooling") for e in entries)


def teacher_kind(teacher: str) -> str:
    """"scores", "bi_encoder" or "cross_encoder": what load_teacher makes of a path."""
    folder = Path(teacher)
    if not folder.is_dir():
        return "scores"
    if is_sentence_transformer_bi_encoder(folder):
        return "bi_encoder"
    from rankgen_jax.checkpoints import native  # imports jax: see CrossEncoderTeacher

    if native.is_checkpoint_dir(folder) and native.load_model_config(folder).kind == "dual_encoder":
        return "bi_encoder"
    return "cross_encoder"


def load_teacher(teacher: str, query_length: int | None = None, candidate_length: int | None = None,
                 batch_size: int = 64, conventions: dict | None = None, corpus: str | None = None,
                 title_join: str | None = DEFAULT_TITLE_JOIN):
    """A teacher by what `teacher` is (teacher_kind): a file of scores, a bi-encoder or a cross encoder; "mpnet"
    is all-mpnet-base-v2; teachers joined by " + " are an EnsembleTeacher. corpus: the passages a bi-encoder
    encodes once."""
    if ENSEMBLE_SEPARATOR in teacher:
        return EnsembleTeacher([load_teacher(part.strip(), query_length, candidate_length, batch_size, conventions,
                                             corpus, title_join) for part in teacher.split(ENSEMBLE_SEPARATOR)])
    teacher = resolve_model(teacher)
    kind = teacher_kind(teacher)
    if kind == "bi_encoder":
        return BiEncoderTeacher(teacher, query_length, candidate_length, batch_size, conventions, corpus, title_join)
    if kind == "cross_encoder":
        return CrossEncoderTeacher(teacher, query_length, candidate_length, batch_size, conventions)
    return ScoreFileTeacher(teacher)


# ---------------------------------------------------------------------------
# Scored training files


def candidates_from_run(run_path: str, queries_path: str, corpus_path: str, qrels_path: str, split: str | None,
                        depth: int, positive_level: int = 1,
                        title_join: str | None = DEFAULT_TITLE_JOIN) -> tuple[list[TrainingQuery], dict[str, int]]:
    """(training queries with ranked candidates, {skip reason: count}) of a run's first `depth` passages.

    The queries are those of the qrels (in the queries file's order) that the
    run ranks; see the module docstring for positives and ranks.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise RankgenError(f"depth must be a positive integer, got {depth!r}")
    corpus = read_passages(corpus_path)
    # The output is training data: a BEIR folder is read at its train split unless another is named.
    split = TRAINING_SPLIT if split is None else split
    beir = is_beir_folder(queries_path)
    query_file = read_queries(queries_path, split=split if beir else None)
    qrels = read_qrels(qrels_path, split=split if Path(qrels_path).is_dir() else None)
    run = read_run(run_path)
    missing = sorted({d for scores in run.values() for d in scores if d not in corpus.rows})
    if missing:
        raise RankgenError(f"{run_path}: {len(missing)} passages of the run are not in {corpus_path} (first: "
                           f"{missing[:3]}); is the run of another corpus?")
    texts = query_file.joined(title_join)
    queries, skipped = [], {}
    for row, qid in enumerate(query_file.ids):
        if qid not in run:
            continue
        relevant = qrels.relevant(qid, positive_level)
        if not any(d in corpus.rows for d in relevant):
            skipped[NO_RELEVANT] = skipped.get(NO_RELEVANT, 0) + 1
            continue
        ranked = [d for d, _ in trec_eval_order(run[qid])][:depth]
        rank_of = {d: r for r, d in enumerate(ranked, start=1)}
        positives = [dataclasses.replace(corpus.passage(d), rank=rank_of.get(d)) for d in
                     sorted(relevant & set(corpus.rows), key=lambda d: (rank_of.get(d, depth + 1), d))]
        negatives = [dataclasses.replace(corpus.passage(d), rank=rank_of[d]) for d in ranked if d not in relevant]
        queries.append(TrainingQuery(qid, texts[row], tuple(positives), tuple(negatives)))
    if not queries:
        raise RankgenError(f"{run_path}: no query of the run has a relevant passage in {qrels_path}")
    return queries, skipped


def _scored(query: TrainingQuery, scores: np.ndarray) -> tuple[TrainingQuery, int]:
    """(the query with each passage's teacher score, how many passages were left out for want of one)."""
    passages = query.positives + query.negatives
    kept = [(i, dataclasses.replace(p, score=float(s))) for i, (p, s) in enumerate(zip(passages, scores))
            if np.isfinite(s)]
    positives = tuple(p for i, p in kept if i < len(query.positives))
    negatives = tuple(p for i, p in kept if i >= len(query.positives))
    return dataclasses.replace(query, positives=positives, negatives=negatives), len(passages) - len(kept)


def score_queries(teacher, queries: list[TrainingQuery], title_join: str | None) -> list[tuple[TrainingQuery, int]]:
    """Each query with its passages' teacher scores (one teacher call for all), and the count left unscored."""
    scores = teacher.score([q.query_id for q in queries], [q.query for q in queries],
                           [q.positives + q.negatives for q in queries], title_join)
    return [_scored(q, s) for q, s in zip(queries, scores)]


def shard_of(items: list, shard_index: int, num_shards: int) -> list:
    """The items at positions p % num_shards == shard_index, in order."""
    for name, value, low in (("num_shards", num_shards, 1), ("shard_index", shard_index, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise RankgenError(f"{name} must be an integer >= {low}, got {value!r}")
    if shard_index >= num_shards:
        raise RankgenError(f"shard_index {shard_index} is not below num_shards {num_shards} (shards count from 0)")
    return items[shard_index::num_shards]


@dataclasses.dataclass(frozen=True)
class CandidateSource:
    """What a teacher scores: a Tevatron training file's passages, or a run's first `depth` passages per query, with
    the run's queries and corpus, and qrels (a BEIR queries folder's own when None) whose passages judged at least
    positive_level are the positives."""

    train_file: str | None = None
    run_file: str | None = None
    queries: str | None = None
    corpus: str | None = None
    qrels: str | None = None
    split: str | None = None
    depth: int = 200
    positive_level: int = 1


def score_candidates(
    out_path: str,
    teacher: Any,
    candidates: CandidateSource,
    title_join: str | None = DEFAULT_TITLE_JOIN,
    num_shards: int = 1,
    shard_index: int = 0,
    query_batch: int = DEFAULT_QUERY_BATCH,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Score a training file's or a run's candidates with a teacher into a scored Tevatron file; returns a summary.

    teacher: a teacher object (load_teacher) or a path for load_teacher.
    See the module docstring. The summary: output, queries written, passages
    scored, passages without a teacher score (file teachers), queries skipped
    by reason, and how many queries this call scored.
    """
    train_file, run_path, queries_path, corpus_path, qrels_path = (candidates.train_file, candidates.run_file,
                                                                   candidates.queries, candidates.corpus,
                                                                   candidates.qrels)
    split, depth, positive_level = candidates.split, candidates.depth, candidates.positive_level
    if (train_file is None) == (run_path is None):
        raise RankgenError("give a Tevatron training file (`train_file`) or a run (`run_file`, with its queries, "
                           "corpus and qrels) to score", names=("train_file", "run_file"))
    if run_path is not None and (queries_path is None or corpus_path is None):
        raise RankgenError("scoring a run needs its `queries` and `corpus`", names=("queries", "corpus"))
    if isinstance(query_batch, bool) or not isinstance(query_batch, int) or query_batch < 1:
        raise RankgenError(f"query_batch must be a positive integer, got {query_batch!r}")
    if isinstance(teacher, str):
        teacher = load_teacher(teacher)
    out = Path(out_path)
    for given in (train_file, run_path, queries_path, corpus_path, qrels_path):
        if given is not None and Path(given).resolve() == out.resolve():
            raise RankgenError(f"{out_path}: the output would overwrite an input")
    if run_path is not None and qrels_path is None:
        if not is_beir_folder(queries_path):
            raise RankgenError("scoring a run needs `qrels` to tell its positives", names=("qrels",))
        qrels_path = queries_path
    settings = {"teacher": teacher.stamp, "train_file": resumable.input_stamp(train_file),
                "run": resumable.input_stamp(run_path), "queries": resumable.input_stamp(queries_path),
                "corpus": resumable.input_stamp(corpus_path), "qrels": resumable.input_stamp(qrels_path),
                "split": split, "depth": depth if run_path else None, "positive_level": positive_level,
                "title_join": title_join, "num_shards": num_shards, "shard_index": shard_index,
                "query_batch": query_batch}
    if train_file is not None:
        queries, skipped = [q for _, q in read_numbered_training_queries(train_file)], {}
    else:
        queries, skipped = candidates_from_run(run_path, queries_path, corpus_path, qrels_path, split, depth,
                                               positive_level, title_join)
    queries = shard_of(queries, shard_index, num_shards)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = resumable.start_or_resume(out, settings, {"written": 0, "scored": 0, "unscored": 0, "skipped": {}},
                                       overwrite, "score-candidates")
    start = resumable.check_resume_point(out, record, [q.query_id for q in queries])
    with tqdm(total=len(queries), initial=start, unit="query", desc="score-candidates", file=sys.stderr,
              dynamic_ncols=True, disable=not progress) as bar:
        for batch_start in range(start, len(queries), query_batch):
            batch = queries[batch_start : batch_start + query_batch]
            lines = []
            for query, unscored in score_queries(teacher, batch, title_join):
                record["unscored"] += unscored
                if not query.positives:
                    record["skipped"][NO_SCORED_POSITIVE] = record["skipped"].get(NO_SCORED_POSITIVE, 0) + 1
                    continue
                lines.append((json.dumps(training_query_record(query), ensure_ascii=False) + "\n").encode("utf-8"))
                record["written"] += 1
                record["scored"] += len(query.positives) + len(query.negatives)
            resumable.save_batch(out, record, lines, batch_start + len(batch), batch[-1].query_id)
            bar.update(len(batch))
    if not out.exists():
        out.touch()
    for reason, count in record["skipped"].items():
        skipped[reason] = skipped.get(reason, 0) + count
    return {"output": str(out), "queries_written": record["written"], "passages_scored": record["scored"],
            "passages_without_teacher_score": record["unscored"], "queries_skipped": sum(skipped.values()),
            "skipped": skipped, "scored_now": len(queries) - start}


def merge_shards(shard_paths: Sequence[str | Path], out_path: str | Path, query_ids: Sequence[str]) -> Path:
    """Join shard files of Tevatron records into one, in the order of query_ids (queries no shard wrote are
    absent); written whole through a side file. A query in two shards is a RankgenError."""
    by_id: dict[str, bytes] = {}
    for path in shard_paths:
        def fail(reason: str, number: int, path=path) -> None:
            raise RankgenError(f"{path}:{number}: {reason}")

        for number, record in jsonl.iter_jsonl(path, lambda r: None if "query_id" in r else "no query_id", fail):
            qid = str(record["query_id"])
            if qid in by_id:
                raise RankgenError(f"{path}:{number}: query {qid!r} is also in another shard")
            by_id[qid] = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    out = Path(out_path)
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(b"".join(by_id[q] for q in query_ids if q in by_id))
    partial.replace(out)
    return out
