"""CL-DRD (Zeng et al., SIGIR 2022), Algorithm 1 as one resumable job on any retrieval dataset the project reads.

Iteration 0 indexes the corpus with the starting student and evaluates it.
Each iteration t = 1, 2, ... then, with the stage (K, K', N_h, N_s) of
iteration t:

1. retrieves the top `depth` passages (the paper's 200) of every training
   query with the current student, from the index of its corpus encoding
   (iter{t-1}/index, a sharded index: retrieval/dense_index.py);
2. scores those candidates with the teacher (a cross encoder or a file of
   scores; retrieval/teacher.py), in batches of queries, resumable; the
   teacher-scored candidate lists are iter{t}/candidates.jsonl, Tevatron
   records whose passages carry the teacher's "score" and the student's
   "rank" (the qrels' positives the student missed are in them too, unranked:
   the file also trains KL / MarginMSE, but only ranked candidates form the
   groups);
3. cuts the teacher's ranking of each query's candidates into the three
   groups of Sec. 2.2.1 (data/curriculum.py; N_h and N_s drawn with a
   generator seeded by (seed, t, the query's position)) with their labels,
   iter{t}/train_lists.jsonl;
4. trains the student from where it is for a fixed number of epochs with the
   loss of eq. (2) (lambdarank_mrr; pi from the current student's ranking of
   each list at every step, as the released code computes the paper's pi;
   rank_source "retrieval" keeps the ranks of the iteration's retrieval
   instead), through the one trainer and train_step, iter{t}/student;
5. indexes the corpus with the new student (iter{t}/index, which the next
   iteration retrieves from) and evaluates it on the selection and reported
   queries: iter{t}/eval/<name>.trec (a TREC run) and <name>.json (trec_eval's
   measures with standard errors over queries, and every query's values).

Every iteration, the start included, reads queries and passages with the same
input conventions (reading_conventions: the training lengths, query_keep and
the markers), so the rows of the table differ by the student only.

Model selection: the iteration kept (Algorithm 1's theta*) is the best on
selection queries that are never reported: a split of the BEIR folder (dev),
named files, or a held-out slice of the training queries (select_holdout; for
MS MARCO, whose dev.small is what the paper reports). The reported splits
(eval_split, report_splits) are evaluated every iteration and never read to
choose. Without selection queries the last iteration is the result.
stop_when_no_gain stops at the first iteration whose selection measure is not
above the best before it.

Watching (watch_every > 0, an addition to the paper's procedure that changes no
result): each student's training measures retrieval every watch_every steps,
and at its start and end, on the training mesh (train/retrieval_eval.py), on a
nano set of the selection queries (retrieval/nano.py: watch_queries of them,
their judged passages and watch_distractors BM25 distractors each, written once
as data/nano), never of the reported ones. It keeps no checkpoint: the
iteration's end is what Algorithm 1 keeps, chosen by the full evaluation.

Resuming: every stage's output is written whole or marked done, and is
skipped when there; training resumes from its last checkpoint (the trainer's
batches are a function of the step), the teacher's scoring from its last
batch of queries. A rerun of an interrupted job gives the artefacts of an
uninterrupted one.

Scale: with num_shards N, the corpus encoding (index shards), the retrieval
(training queries at positions p % N == i) and the teacher's scoring split
into N shards, merged exactly (search_shards' merge; shard files joined in
query order). One process runs every shard by default; `rankgen-jax cl-drd
--shard_index I` runs shard I's part of every iteration as a worker on
another host, waiting for its inputs, while the coordinator (shard_workers)
waits for the workers' shards and trains.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import gin
import numpy as np

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.checkpoints import native
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.curriculum import CL_DRD_STAGES, CurriculumStage, curriculum_groups
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, Passage, is_beir_folder, read_qrels,
                                              read_queries, read_training_queries)
from rankgen_jax.data.source_configs import DataConfig, ListsData
from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.eval.retrieval_metrics import check_run_depth, evaluate_files
from rankgen_jax.experiments import ablations
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import DONE_MARKER, StageRun, is_done, log, mark_done, starting_checkpoint
from rankgen_jax.retrieval.dense_index import CONFIG_FILE, IndexSpec, TextEncoding, index_corpus, search_queries
from rankgen_jax.retrieval import teacher as teachers
from rankgen_jax.retrieval.nano import NanoSpec, build_nano_set
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.retrieval_eval import RetrievalEvalConfig
from rankgen_jax.train.optimizers import OptimizerConfig

if TYPE_CHECKING:
    from rankgen_jax.inference.encoder import LoadedModel  # imports jax: for annotations only

PAPER_STAGES = tuple((s.k, s.k_prime, s.n_hard, s.n_rest) for s in CL_DRD_STAGES)
TOO_FEW_CANDIDATES = "fewer candidates with a teacher score than the stage's groups need"
STOPPED_MARKER = "stopped"
WAIT_SECONDS = 15.0

_log = functools.partial(log, "cl-drd")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ClDrdConfig:
    """Inputs, the paper's procedure and its settings (defaults: the paper's MS MARCO runs, see
    gin_configs/cl_drd/msmarco_paper.gin). docs/retrieval_distillation.md shows how to feed each input.

    corpus: the passages: MS MARCO's collection.tsv (id, text), JSON lines, or a BEIR folder.
    train_file: training queries as a Tevatron JSON-lines file (its queries; its positives are the relevant
      passages); or else train_queries + train_qrels.
    train_queries / train_qrels: training queries and their qrels as files (MS MARCO's queries.train.tsv,
      qrels.train.tsv), or a BEIR folder read at train_split; both default to corpus when it is a BEIR folder.
    train_split: the BEIR split of the training queries.
    eval_queries / eval_qrels: the reported held-out queries and qrels (files, or a BEIR folder at eval_split;
      default the corpus when it is a BEIR folder); never read to choose an iteration.
    eval_split: the reported BEIR split.
    report_splits: more reported splits of the BEIR folder.
    select_queries / select_qrels: the selection queries (Algorithm 1's theta* and the stopping rule, by
      select_metric): files, or a BEIR folder at select_split; default the corpus's select_split when its
      folder has one. Never the reported queries.
    select_split: the BEIR split the iteration is chosen on.
    select_holdout: > 0: this many training queries, drawn with `seed`, are held out of training as the
      selection queries (MS MARCO, whose dev.small the paper reports). No selection queries at all: the last
      iteration is the result.
    positive_level: the qrels label a relevant passage has at least.
    title_join: joins a passage's title to its text (None: titles dropped).
    student: the starting dual encoder: a rankgen_jax checkpoint, an HF / sentence-transformers folder, or
      "minilm".
    teacher: a cross-encoder checkpoint, an HF sequence-classification / CrossEncoder folder, a
      sentence-transformers bi-encoder folder or rankgen_jax dual encoder (scored by its similarity), "mpnet",
      a file of teacher scores, or several of these joined by " + " (an ensemble): retrieval/teacher.py's
      load_teacher.
    stages: (K, K', N_h, N_s) per iteration (data/curriculum.py).
    depth: the student's top N each training query's candidates come from (the paper's 200).
    epochs / learning_rates: per iteration (the released code's 4 / 2 / 2 epochs at 7e-6 / 3e-6 / 3e-6).
    warmup_steps / weight_decay / clip_grad_norm / batch_size: AdamW's (the released code's 4000 warmup steps,
      0.01, 1, lists of batch 8); linear decay to the end of each iteration.
    query_length / passage_length: tokens the student reads (30 and 256 in the released code), in training and
      in every iteration's encoding.
    query_keep: which end of an over-long query stays ("start" or "end").
    markers: (query, passage) texts the student reads before each; () keeps the starting student's own.
    rank_source: pi of eq. (2), the rank in the result list of the student being trained: "list" (the
      current student's ranking of the training list at each step, as the released code computes it) or
      "retrieval" (frozen: the ranks of the iteration's retrieval, for a whole iteration).
    logit_scale: multiplies the student's scores in eq. (2): 1 for the paper's dot-product students; larger
      for a student with unit vectors (cosine scores), such as all-MiniLM-L6-v2.
    teacher_query_length / teacher_passage_length / teacher_batch_size: how a rankgen_jax teacher reads
      (a sentence-transformers bi-encoder reads with its own max_seq_length).
    select_metric: the measure that chooses the iteration and stops the job.
    stop_when_no_gain: stop at the first iteration whose select_metric is not above the best before it.
    measures / eval_depth: trec_eval's measures computed each iteration, on runs of this depth.
    num_shards / shard_workers: corpus encoding, retrieval and teacher scoring split this many ways; with
      shard_workers, `cl-drd --shard_index I` workers run them (module docstring).
    index_factory: a FAISS factory string for each index shard ("": exact, flat).
    encode_batch_size / query_batch: texts per encoding batch; queries per teacher-scoring batch.
    checkpoint_every: training steps between checkpoints.
    watch_every: > 0: each student's training measures `measures` on a nano set of the selection queries every
      this many steps, and at its start and end (changing no result); 0: not at all.
    watch_queries: how many selection queries the nano set samples (all when fewer).
    watch_distractors: BM25 distractors the nano set keeps per sampled query.
    seed: the draws of N_h and N_s, select_holdout, training and the nano set's queries.
    """

    corpus: str = ""
    train_file: str = ""
    train_queries: str = ""
    train_qrels: str = ""
    train_split: str = "train"
    eval_queries: str = ""
    eval_qrels: str = ""
    eval_split: str = "test"
    report_splits: tuple[str, ...] = ()
    select_queries: str = ""
    select_qrels: str = ""
    select_split: str = "dev"
    select_holdout: int = 0
    positive_level: int = 1
    title_join: str | None = DEFAULT_TITLE_JOIN
    student: str = ""
    teacher: str = ""
    stages: tuple = PAPER_STAGES
    depth: int = 200
    epochs: tuple[int, ...] = (4, 2, 2)
    learning_rates: tuple[float, ...] = (7e-6, 3e-6, 3e-6)
    warmup_steps: int = 4000
    weight_decay: float = 0.01
    clip_grad_norm: float = 1.0
    batch_size: int = 8
    query_length: int = 30
    passage_length: int = 256
    query_keep: str = "start"
    markers: tuple[str, ...] = ()
    rank_source: str = "list"
    logit_scale: float = 1.0
    teacher_query_length: int = 30
    teacher_passage_length: int = 256
    teacher_batch_size: int = 64
    select_metric: str = "RR@10"
    stop_when_no_gain: bool = False
    measures: tuple[str, ...] = ("nDCG@10", "RR@10", "R@100")
    eval_depth: int = 100
    num_shards: int = 1
    shard_workers: bool = False
    index_factory: str = ""
    encode_batch_size: int = 64
    query_batch: int = 64
    checkpoint_every: int = 1000
    watch_every: int = 0
    watch_queries: int = 50
    watch_distractors: int = 50
    seed: int = 0

    def __post_init__(self):
        check_field_types(self)
        stages = [CurriculumStage.of(s) for s in self.stages]
        if not stages:
            raise RankgenError("ClDrdConfig.stages is empty: give (K, K', N_h, N_s) per iteration")
        for name in ("epochs", "learning_rates"):
            if len(getattr(self, name)) != len(stages):
                raise RankgenError(f"ClDrdConfig.{name} has {len(getattr(self, name))} entries for "
                                   f"{len(stages)} stages: give one per iteration")
        if any(e < 1 for e in self.epochs) or any(not lr > 0 for lr in self.learning_rates):
            raise RankgenError("ClDrdConfig.epochs must be >= 1 and learning_rates > 0")
        needed = max(s.min_candidates for s in stages)
        if self.depth < needed:
            raise RankgenError(f"ClDrdConfig.depth={self.depth} retrieves too few candidates for the stages, which "
                               f"need {needed}")
        if self.rank_source not in ("retrieval", "list"):
            raise RankgenError(f"ClDrdConfig.rank_source must be 'retrieval' or 'list', got {self.rank_source!r}")
        if self.markers and len(self.markers) != 2:
            raise RankgenError(f"ClDrdConfig.markers must be () or (query marker, passage marker), got "
                               f"{self.markers!r}")
        check_run_depth(self.eval_depth, self.measures, "ClDrdConfig.eval_depth")
        if self.select_metric not in self.measures:
            raise RankgenError(f"ClDrdConfig.select_metric={self.select_metric!r} is not among measures "
                               f"{self.measures}")
        for name in ("batch_size", "num_shards", "depth", "eval_depth", "query_batch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise RankgenError(f"ClDrdConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.watch_every < 0 or self.watch_queries < 1 or self.watch_distractors < 0:
            raise RankgenError(f"ClDrdConfig: watch_every and watch_distractors must be >= 0 and watch_queries >= 1, "
                               f"got {self.watch_every}, {self.watch_distractors} and {self.watch_queries}")
        if self.select_holdout < 0:
            raise RankgenError(f"ClDrdConfig.select_holdout must be >= 0, got {self.select_holdout}")
        if self.select_holdout and (self.select_queries or self.select_qrels):
            raise RankgenError("ClDrdConfig: give selection queries (select_queries / select_qrels) or "
                               "select_holdout, not both")

    @property
    def curriculum(self) -> list[CurriculumStage]:
        return [CurriculumStage.of(s) for s in self.stages]


def _folder_or(path: str, fallback: str) -> str:
    return path or (fallback if fallback and is_beir_folder(fallback) else "")


@dataclasses.dataclass(frozen=True)
class QuerySet:
    """Held-out queries and their qrels (files, or a BEIR folder at `split`); `name` names their files and column."""

    name: str
    queries: str
    qrels: str
    split: str | None

    def key(self) -> tuple[str, str, str | None]:
        return str(Path(self.queries).resolve()), str(Path(self.qrels).resolve()), self.split

    def describe(self) -> str:
        return f"{self.queries}" + (f" at split {self.split!r}" if self.split else "")


HOLDOUT = "holdout"
NO_RELEVANT_PASSAGE = "no passage the qrels judge relevant"


class Job(JobFolder):
    """A CL-DRD workdir: where each iteration's artefacts go, and the stages that make them."""

    def __init__(self, workdir: str | Path, cfg: ClDrdConfig):
        super().__init__(workdir)
        self.cfg = cfg
        self._conventions: dict | None = None
        self._loaded: dict[int, LoadedModel] = {}  # iteration -> its student, loaded once per process

    # --- paths -------------------------------------------------------------------------------

    @property
    def data(self) -> Path:
        """The training (and selection) queries and qrels as the job reads them."""
        return self.root / "data"

    @property
    def train_queries(self) -> Path:
        return self.data / "train_queries.jsonl"

    @property
    def train_qrels(self) -> Path:
        return self.data / "train_qrels.tsv"

    @property
    def stopped_marker(self) -> Path:
        """Written when selection stopped the curriculum early (stop_when_no_gain): the shard workers stop too."""
        return self.root / STOPPED_MARKER

    @property
    def table(self) -> Path:
        return self.root / "cl_drd_table.md"

    def iteration(self, t: int) -> Path:
        return self.root / f"iter{t}"

    def student(self, t: int) -> RunFolder:
        """Iteration t's student: a training run's folder (t = 0: a link to the starting checkpoint)."""
        return RunFolder.at(self.root / "student0" if t == 0 else self.iteration(t) / "student")

    def loaded_student(self, t: int) -> LoadedModel:
        """Iteration t's trained student as a loaded model, read from its folder once: its index shards, the
        next iteration's retrieval and its evaluation all use it. Only iterations t - 1 and t stay in memory."""
        # Imports jax: only a running job gets here.
        from rankgen_jax.inference.encoder import load_model

        if t not in self._loaded:
            self._loaded = {k: v for k, v in self._loaded.items() if k >= t - 1}
            self._loaded[t] = load_model(str(self.student(t)))
        return self._loaded[t]

    def index_folder(self, t: int) -> Path:
        """Iteration t's student's index of the corpus, in shards (index_shard)."""
        return self.iteration(t) / "index"

    def index_shard(self, t: int, i: int) -> Path:
        return self.index_folder(t) / f"shard{i}"

    def eval_measures(self, t: int, queries: str) -> Path:
        """Iteration t's measures on a query set (evaluate_retriever; its TREC run beside, as .trec)."""
        return self.iteration(t) / "eval" / f"{queries}.json"

    def candidates_file(self, t: int) -> Path:
        """Iteration t's teacher-scored candidate lists, the shards joined (candidates)."""
        return self.iteration(t) / "candidates.jsonl"

    def lists_files(self, t: int) -> tuple[Path, Path]:
        """Iteration t's training lists and their summary (training_lists)."""
        return self.iteration(t) / "train_lists.jsonl", self.iteration(t) / "train_lists.json"

    def select_files(self) -> tuple[Path, Path]:
        """The held-out training queries (select_holdout) and their qrels."""
        return self.data / "select_queries.jsonl", self.data / "select_qrels.tsv"

    @property
    def watch_folder(self) -> Path:
        """The nano set of the selection queries each student's training measures (watch_every)."""
        return self.data / "nano"

    def queries_shard(self, i: int) -> Path:
        return self.data / f"train_queries.shard{i}of{self.cfg.num_shards}.jsonl"

    def retrieved(self, t: int, i: int) -> Path:
        return self.iteration(t) / "retrieved" / f"shard{i}.jsonl"

    def scored(self, t: int, i: int) -> Path:
        return self.iteration(t) / "teacher" / f"shard{i}.jsonl"

    # --- data --------------------------------------------------------------------------------

    def prepare_data(self) -> dict:
        """The training queries and their qrels as plain files (data/train_queries.jsonl, data/train_qrels.tsv),
        the held-out selection queries (select_holdout) and the query shards."""
        cfg = self.cfg
        if not cfg.corpus:
            raise RankgenError("ClDrdConfig.corpus is required (passages, or a BEIR folder)")
        skipped = 0
        if cfg.train_file:
            queries = read_training_queries(cfg.train_file)
            pairs = [(q.query_id, q.query) for q in queries]
            judged = [(q.query_id, p.id, 1) for q in queries for p in q.positives]
        else:
            source = _folder_or(cfg.train_queries, cfg.corpus)
            qrels_source = _folder_or(cfg.train_qrels, cfg.corpus)
            if not source or not qrels_source:
                raise RankgenError("ClDrdConfig needs training queries: train_file, or train_queries and train_qrels "
                                   "(default: the corpus when it is a BEIR folder)")
            query_file = read_queries(source, split=cfg.train_split if Path(source).is_dir() else None)
            qrels = read_qrels(qrels_source, split=cfg.train_split if Path(qrels_source).is_dir() else None)
            texts = query_file.joined(cfg.title_join)
            pairs, judged = [], []
            for row, qid in enumerate(query_file.ids):
                relevant = {d: label for d, label in qrels.labels.get(qid, {}).items() if label >= cfg.positive_level}
                if relevant:
                    pairs.append((qid, texts[row]))
                    judged.extend((qid, d, label) for d, label in relevant.items())
                else:
                    skipped += 1
        if not pairs:
            raise RankgenError("no training query has a relevant passage")
        self.data.mkdir(parents=True, exist_ok=True)
        counts = {"train_queries_read": len(pairs) + skipped}
        if skipped:
            counts["skipped"] = {NO_RELEVANT_PASSAGE: skipped}
            _log(f"{skipped} training queries skipped: {NO_RELEVANT_PASSAGE} (label >= {cfg.positive_level})")
        if cfg.select_holdout:
            if cfg.select_holdout > len(pairs) - cfg.batch_size:
                raise RankgenError(f"ClDrdConfig.select_holdout={cfg.select_holdout} leaves fewer than one batch of "
                                   f"the {len(pairs)} training queries")
            rows = np.random.default_rng([cfg.seed, len(pairs)]).choice(len(pairs), cfg.select_holdout, replace=False)
            held = {pairs[r][0] for r in rows}
            query_file, qrels_file = self.select_files()
            write_jsonl(query_file, [{"id": q, "text": t} for q, t in pairs if q in held])
            _write_qrels(qrels_file, [j for j in judged if j[0] in held])
            pairs = [(q, t) for q, t in pairs if q not in held]
            judged = [j for j in judged if j[0] not in held]
            counts["select_holdout"] = len(held)
        write_jsonl(self.train_queries, [{"id": q, "text": t} for q, t in pairs])
        _write_qrels(self.train_qrels, judged)
        for i in range(cfg.num_shards):
            write_jsonl(self.queries_shard(i), [{"id": q, "text": t} for q, t in teachers.shard_of(
                pairs, i, cfg.num_shards)])
        return {"train_queries": len(pairs), "train_judgements": len(judged), **counts}

    def reported_sets(self) -> list[QuerySet]:
        """The reported held-out queries: eval_split and report_splits (never read to choose an iteration)."""
        cfg = self.cfg
        queries = _folder_or(cfg.eval_queries, cfg.corpus)
        qrels = _folder_or(cfg.eval_qrels, queries)
        if not queries or not qrels:
            raise RankgenError("ClDrdConfig needs held-out queries: eval_queries and eval_qrels (default: the corpus "
                               "when it is a BEIR folder)")
        beir = Path(queries).is_dir()
        for split in cfg.report_splits:
            if not beir:
                raise RankgenError(f"ClDrdConfig.report_splits names split {split!r}, but the eval queries "
                                   f"({queries}) are a file, not a BEIR folder")
        return [QuerySet(split, queries, qrels, split if beir else None)
                for split in dict.fromkeys((cfg.eval_split, *cfg.report_splits))]

    def selection_set(self) -> QuerySet | None:
        """The queries that choose the iteration kept and stop the job (never a reported set), or None."""
        cfg = self.cfg
        if cfg.select_holdout:
            queries, qrels = self.select_files()
            chosen = QuerySet(HOLDOUT, str(queries), str(qrels), None)
        elif cfg.select_queries:
            qrels = _folder_or(cfg.select_qrels, cfg.select_queries)
            if not qrels:
                raise RankgenError("ClDrdConfig.select_queries is a file: give select_qrels too")
            beir = Path(cfg.select_queries).is_dir()
            chosen = QuerySet(cfg.select_split if beir else "select", cfg.select_queries, qrels,
                              cfg.select_split if beir else None)
        elif is_beir_folder(cfg.corpus) and (Path(cfg.corpus) / "qrels" / f"{cfg.select_split}.tsv").is_file():
            chosen = QuerySet(cfg.select_split, cfg.corpus, cfg.corpus, cfg.select_split)
        else:
            return None
        for reported in self.reported_sets():
            if reported.key() == chosen.key() or reported.name == chosen.name:
                raise RankgenError(f"the selection queries ({chosen.describe()}) are also reported "
                                   f"({reported.describe()}): choosing an iteration on the reported queries is "
                                   "model selection on the evaluation data; select on a dev split, other files or "
                                   "ClDrdConfig.select_holdout")
        return chosen

    def reading_conventions(self) -> dict:
        """How every iteration's student, the start included, reads text: the training lengths, query_keep, and
        the markers (ClDrdConfig.markers, or the starting student's)."""
        if self._conventions is None:
            cfg = self.cfg
            markers = tuple(cfg.markers) or self._student_markers(0)
            self._conventions = dataclasses.asdict(InputConventions(
                prefix_marker=markers[0], suffix_marker=markers[1], prefix_length=cfg.query_length,
                suffix_length=cfg.passage_length, prefix_keep=cfg.query_keep, suffix_keep="start",
                truncation="clean"))
        return self._conventions

    def train_query_ids(self) -> list[str]:
        return [r["id"] for r in read_jsonl(self.train_queries)]

    def watched_set(self) -> RetrievalEvalConfig:
        """What each student's training measures (watch_every): the nano set of the selection queries, read from
        the corpus as the job reads it (title_join), built once."""
        cfg, selection = self.cfg, self.selection_set()
        _require_selection(selection, "watch_every", "the reported queries are never read during training")
        build_nano_set(cfg.corpus, selection.name, self.watch_folder,
                       NanoSpec(cfg.watch_queries, cfg.watch_distractors, cfg.seed), queries=selection.queries,
                       qrels=selection.qrels, title_join=cfg.title_join)
        return RetrievalEvalConfig(sets=(f"{self.watch_folder}@{selection.name}",), measures=cfg.measures,
                                   depth=cfg.eval_depth, encode_batch_size=cfg.encode_batch_size)

    # --- sharded stages ----------------------------------------------------------------------

    def index(self, t: int, i: int) -> None:
        """Shard i of the corpus encoded by the iteration-t student."""
        out = self.index_shard(t, i)
        if (out / CONFIG_FILE).is_file():
            return
        index_corpus(
            self.loaded_student(t),
            self.cfg.corpus,
            str(out),
            index=IndexSpec(index_factory=self.cfg.index_factory or None),
            encoding=TextEncoding(
                "suffix", batch_size=self.cfg.encode_batch_size, conventions=self.reading_conventions()
            ),
            title_join=self.cfg.title_join,
            num_shards=self.cfg.num_shards,
            shard_index=i,
            overwrite=True,
        )

    def index_done(self, t: int) -> list[Path]:
        return [self.index_shard(t, i) / CONFIG_FILE for i in range(self.cfg.num_shards)]

    def retrieve(self, t: int, i: int) -> None:
        """The iteration-(t-1) student's top `depth` for shard i of the training queries (a search JSONL run)."""
        out = self.retrieved(t, i)
        if out.is_file():
            return
        search_queries(
            self.loaded_student(t - 1),
            str(self.index_folder(t - 1)),
            str(self.queries_shard(i)),
            self.cfg.depth,
            encoding=TextEncoding(
                "prefix", batch_size=self.cfg.encode_batch_size, conventions=self.reading_conventions()
            ),
            out_path=str(out),
        )

    def score(self, t: int, i: int, teacher) -> dict:
        """Shard i's candidates scored by the teacher (resumable), then marked done."""
        out = self.scored(t, i)
        done = out.with_name(out.name + ".done")
        if done.is_file():
            return json.loads(done.read_text(encoding="utf-8"))
        started = time.time()
        candidates = teachers.CandidateSource(
            run_file=str(self.retrieved(t, i)), queries=str(self.train_queries), corpus=self.cfg.corpus,
            qrels=str(self.train_qrels), depth=self.cfg.depth, positive_level=self.cfg.positive_level)
        summary = teachers.score_candidates(str(out), teacher, candidates, title_join=self.cfg.title_join,
                                            query_batch=self.cfg.query_batch)
        summary["seconds"] = time.time() - started
        done.write_text(json.dumps(summary) + "\n", encoding="utf-8")
        return summary

    def scored_done(self, t: int) -> list[Path]:
        return [self.scored(t, i).with_name(self.scored(t, i).name + ".done") for i in range(self.cfg.num_shards)]

    def shard_stages(self, t: int, shards, teacher) -> None:
        """Iteration t's sharded data stages for these shards: retrieval, then the teacher's scores."""
        for i in shards:
            self.retrieve(t, i)
            self.score(t, i, teacher)

    # --- the iteration's data and training ---------------------------------------------------

    def candidates(self, t: int) -> Path:
        """The teacher-scored candidate lists of iteration t, the shards joined in training-query order."""
        out = self.candidates_file(t)
        if not out.is_file():
            teachers.merge_shards([self.scored(t, i) for i in range(self.cfg.num_shards)], out,
                                  self.train_query_ids())
        return out

    def training_lists(self, t: int) -> tuple[Path, dict]:
        """Iteration t's CL-DRD lists (groups, labels, the student's ranks) from its candidates."""
        out, summary_file = self.lists_files(t)
        if out.is_file() and summary_file.is_file():
            return out, json.loads(summary_file.read_text(encoding="utf-8"))
        stage = self.cfg.curriculum[t - 1]
        position = {q: p for p, q in enumerate(self.train_query_ids())}
        records, skipped = [], 0
        for record in read_jsonl(self.candidates(t)):
            ranked = sorted((p for p in record["positive_passages"] + record["negative_passages"] if "rank" in p),
                            key=lambda p: p["rank"])
            if len(ranked) < stage.min_candidates:
                skipped += 1
                continue
            scores = np.array([p["score"] for p in ranked], np.float64)
            rng = np.random.default_rng([self.cfg.seed, t, position[record["query_id"]]])
            indices, labels = curriculum_groups(scores, stage, rng)
            chosen = [ranked[i] for i in indices]
            records.append({
                "query_id": record["query_id"], "query": record["query"], "docids": [p["docid"] for p in chosen],
                "candidates": [Passage(p["docid"], p["text"], p.get("title", "")).joined(self.cfg.title_join)
                               for p in chosen],
                "labels": [float(x) for x in labels], "student_ranks": [float(p["rank"]) for p in chosen],
                "teacher_scores": [float(p["score"]) for p in chosen]})
        if len(records) < self.cfg.batch_size:
            raise RankgenError(f"iteration {t}: {len(records)} training lists ({skipped} queries with "
                               f"{TOO_FEW_CANDIDATES}), fewer than one batch of {self.cfg.batch_size}")
        summary = {"stage": dataclasses.asdict(stage), "lists": len(records), "list_size": stage.list_size,
                   "skipped": {TOO_FEW_CANDIDATES: skipped} if skipped else {}}
        write_jsonl(out, records)
        summary_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return out, summary

    def train_student(self, t: int, lists: Path, num_lists: int) -> dict:
        """Iteration t's fixed epochs of eq. (2) from the previous student, through the one trainer."""
        cfg = self.cfg
        workdir = self.student(t)
        steps_per_epoch = num_lists // cfg.batch_size
        steps = cfg.epochs[t - 1] * steps_per_epoch
        info = {"steps": steps, "steps_per_epoch": steps_per_epoch, "epochs": cfg.epochs[t - 1],
                "learning_rate": cfg.learning_rates[t - 1]}
        if is_done(workdir):
            return info
        conventions = self.reading_conventions()
        markers = conventions["prefix_marker"], conventions["suffix_marker"]
        data = DataConfig(
            ListsData(
                train_file=str(lists),
                continuation_length=cfg.passage_length,
                list_size=cfg.curriculum[t - 1].list_size,
                prefix_keep=cfg.query_keep,
                prefix_marker=markers[0],
                suffix_marker=markers[1],
            ),
            batch_size=cfg.batch_size,
            prefix_length=cfg.query_length,
            seed=cfg.seed + t,
        )
        warmup = min(cfg.warmup_steps, steps - 1)
        optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.learning_rates[t - 1], schedule="linear",
                                    warmup_steps=warmup, total_steps=steps, weight_decay=cfg.weight_decay,
                                    clip_grad_norm=cfg.clip_grad_norm)
        trainer = TrainerConfig(num_steps=steps, log_every=max(1, min(50, steps // 10)), eval_every=cfg.watch_every,
                                checkpoint_every=min(cfg.checkpoint_every, steps), keep_checkpoints=2,
                                init_checkpoint=str(self.student(t - 1)), seed=cfg.seed + t, async_checkpoints=False)
        started = time.time()
        metrics = train(workdir, trainer=trainer, data=data,
                        loss=LossConfig(name="lambdarank_mrr", rank_source=cfg.rank_source,
                                        logit_scale=cfg.logit_scale), optimizer=optimizer,
                        retrieval=self.watched_set() if cfg.watch_every else None)
        if metrics.get("preempted"):
            raise RankgenError(f"{workdir}: training was stopped before its end (SIGTERM); rerun to resume")
        mark_done(workdir)
        watched = {"watch_seconds_this_run": metrics["retrieval_eval_seconds"]} if cfg.watch_every else {}
        return {**info, "train_seconds_this_run": time.time() - started, "final_loss": metrics.get("loss"), **watched}

    def _student_markers(self, t: int) -> tuple[str, str]:
        conventions = self.loaded_student(t).conventions
        return conventions.prefix_marker, conventions.suffix_marker

    # --- evaluation --------------------------------------------------------------------------

    def evaluate(self, t: int) -> dict:
        """The iteration-t student on the selection queries ("select", when there are any) and the reported ones
        ("eval": split -> measures): TREC runs and measures with standard errors over queries."""
        selection = self.selection_set()
        out = {"eval": {q.name: self._evaluate_on(t, q) for q in self.reported_sets()}}
        if selection is not None:
            out["select"] = self._evaluate_on(t, selection)
        return out

    def _evaluate_on(self, t: int, query_set: QuerySet) -> dict:
        return evaluate_retriever(self.loaded_student(t), self.index_folder(t), query_set,
                                  self.eval_measures(t, query_set.name), self.cfg, self.reading_conventions(),
                                  f"cl_drd_iter{t}")


def evaluate_retriever(model: str | LoadedModel, index: Path, query_set: QuerySet, out: Path, cfg: ClDrdConfig,
                       conventions: dict, run_tag: str) -> dict:
    """A dual encoder's TREC run of the query set from its index (`out` as .trec) and trec_eval's measures with
    standard errors (`out`, a .json written whole; read back when there)."""
    if out.is_file():
        return json.loads(out.read_text(encoding="utf-8"))
    run = out.with_suffix(".trec")
    search_queries(
        model,
        str(index),
        query_set.queries,
        cfg.eval_depth,
        encoding=TextEncoding("prefix", batch_size=cfg.encode_batch_size, conventions=conventions),
        split=query_set.split,
        out_path=str(run),
        out_format="trec",
        run_tag=run_tag,
    )
    return measure_run(run, query_set, cfg.measures, out)


def measure_run(run: Path, query_set: QuerySet, measures, out: Path) -> dict:
    """trec_eval's measures of a run on the query set's qrels, with standard errors and every query's values,
    written to `out` whole."""
    measured = evaluate_files(str(run), query_set.qrels, list(measures),
                              split=query_set.split if Path(query_set.qrels).is_dir() else None, per_query=True)
    result = with_standard_errors(measured, measures)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    partial.replace(out)
    return result


def _write_qrels(path: Path, judged) -> None:
    """(query, passage, label) triples as a TREC qrels file, written whole."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{q} 0 {d} {label}\n" for q, d, label in judged), encoding="utf-8")
    partial.replace(path)


def paired_difference(a: dict, b: dict, measure: str) -> tuple[float, float]:
    """(mean of a - b, its standard error) over the queries of a (both evaluated on the same qrels); the error is
    NaN for a single query."""
    queries = list(a["per_query"])
    run_N, baseline_N = (np.array([m["per_query"][q][measure] for q in queries], np.float64) for m in (a, b))
    if len(queries) < 2:
        return float(np.mean(run_N - baseline_N)), float("nan")
    return ablations.paired_difference(run_N, baseline_N)


def with_standard_errors(measured: dict, measures) -> dict:
    """evaluate_run's result plus "<measure>_se": the standard error of each mean over queries (sample sd / sqrt n)."""
    per_query = measured["per_query"]
    out = dict(measured)
    for name in measures:
        values = np.array([v[name] for v in per_query.values()], np.float64)
        out[f"{name}_se"] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return out


def _wait_for(paths: list[Path], what: str, stop: Path | None = None) -> bool:
    """Block until every path exists (polling); False when `stop` appears first."""
    announced = False
    while not all(p.exists() for p in paths):
        if stop is not None and stop.exists():
            return False
        if not announced:
            _log(f"waiting for {what} ({sum(not p.exists() for p in paths)} of {len(paths)} missing)")
            announced = True
        time.sleep(WAIT_SECONDS)
    return True


def _log_skips(t: int, row: dict) -> None:
    """Every training query and list iteration t left out, with its reason and count, on the console."""
    unscored = sum(summary.get("passages_without_teacher_score", 0) for summary in row.get("teacher", []))
    if unscored:
        _log(f"iteration {t}: {unscored} candidate passages left out: {teachers.NO_TEACHER_SCORE}")
    reasons: dict[str, int] = {}
    for summary in row.get("teacher", []):
        for reason, count in summary.get("skipped", {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
    for reason, count in reasons.items():
        _log(f"iteration {t}: {count} training queries skipped: {reason}")
    for reason, count in row.get("lists", {}).get("skipped", {}).items():
        _log(f"iteration {t}: {count} training lists skipped: {reason}")


def choose_iteration(iterations: dict, metric: str, selected: bool) -> dict:
    """Algorithm 1's theta*: the iteration best on the selection queries by `metric` (the earliest of equals), or,
    with no selection queries, the last one; with why, and its paired difference from the start on those queries."""
    evaluated = sorted((int(t) for t, row in iterations.items() if "eval" in row))
    if not selected:
        last = evaluated[-1]
        return {"iteration": last, "metric": metric, "why": "no selection queries: the last iteration is the result"}
    values = {t: iterations[str(t)]["select"][metric] for t in evaluated}
    best = max(evaluated, key=lambda t: (values[t], -t))
    diff, se = paired_difference(iterations[str(best)]["select"], iterations["0"]["select"], metric)
    chosen = {"iteration": best, "metric": metric, "value": values[best],
              "why": f"highest {metric} on the selection queries ({values[best]:.4f}; "
                     + ", ".join(f"iteration {t} {v:.4f}" for t, v in values.items()) + ")",
              "difference_from_start": diff, "difference_from_start_se": se}
    if not abs(diff) > se:
        chosen["warning"] = (f"iteration {best} differs from the start by {diff:+.4f} ± {se:.4f} {metric} on the "
                             "selection queries, less than one standard error: the choice is within noise")
    return chosen


def _require_selection(selection: QuerySet | None, setting: str, why: str) -> None:
    if selection is None:
        raise RankgenError(f"ClDrdConfig.{setting} needs selection queries (a dev split of the BEIR folder, "
                           f"select_queries, or select_holdout): {why}")


def run_cl_drd(workdir: str, cfg: ClDrdConfig | None = None) -> dict:
    """Run (or resume) CL-DRD in workdir; returns results.json's contents (the per-iteration table too)."""
    cfg = cfg or ClDrdConfig()
    job = Job(workdir, cfg)
    run = StageRun(job, "cl-drd")
    results = run.results
    results["config"] = {k: v for k, v in dataclasses.asdict(cfg).items()}
    if not cfg.corpus:
        raise RankgenError("ClDrdConfig.corpus is required (passages, or a BEIR folder)")
    # Before anything runs: refuses selection queries that are also reported.
    selection = job.selection_set()
    if cfg.stop_when_no_gain:
        _require_selection(selection, "stop_when_no_gain", "the reported queries never stop the job")
    if cfg.watch_every:
        _require_selection(selection, "watch_every", "the reported queries are never read during training")
    if "data" not in results:
        results["data"] = run.stage("data", job.prepare_data)
    if not cfg.student:
        raise RankgenError("ClDrdConfig.student is required (a checkpoint, an HF / sentence-transformers folder, "
                           "or 'minilm')")
    if native.is_checkpoint_dir(cfg.student):
        start = Path(cfg.student)
        if not job.student(0).root.exists():
            Path(job.student(0)).symlink_to(start.resolve(), target_is_directory=True)
    else:
        start = starting_checkpoint("", cfg.student, job, "ClDrdConfig.student")
        if not job.student(0).root.exists():
            Path(job.student(0)).symlink_to(start.resolve().name, target_is_directory=True)
    if not cfg.teacher:
        raise RankgenError("ClDrdConfig.teacher is required (a cross encoder, a bi-encoder, or a file of teacher "
                           "scores)")
    results["selection_queries"] = selection.describe() if selection else None
    results["reading_conventions"] = job.reading_conventions()
    teacher = None
    shards = [] if cfg.shard_workers else list(range(cfg.num_shards))
    iterations = results.setdefault("iterations", {})
    best_value = None
    for t in range(len(cfg.curriculum) + 1):
        key = str(t)
        row = iterations.setdefault(key, {"iteration": t})
        if t > 0:
            if job.stopped_marker.is_file():
                break
            row["stage"] = dataclasses.asdict(cfg.curriculum[t - 1])
            if not is_done(job.student(t)):
                if teacher is None and shards:
                    teacher = teachers.load_teacher(cfg.teacher, cfg.teacher_query_length or None,
                                                    cfg.teacher_passage_length or None, cfg.teacher_batch_size,
                                                    corpus=cfg.corpus, title_join=cfg.title_join)
                run.timed(f"iter{t}_retrieve_and_score", job.shard_stages, t, shards, teacher)
                _wait_for(job.scored_done(t), f"iteration {t}'s teacher scores from the shard workers")
                lists, row["lists"] = run.timed(f"iter{t}_lists", job.training_lists, t)
            else:
                lists, row["lists"] = job.training_lists(t)
            row["teacher"] = [json.loads(p.read_text(encoding="utf-8")) for p in job.scored_done(t)]
            _log_skips(t, row)
            if "training" not in row or not is_done(job.student(t)):
                row["training"] = run.timed(f"iter{t}_train", job.train_student, t, lists, row["lists"]["lists"])
            run.save()
        for i in shards:
            run.timed(f"iter{t}_index", job.index, t, i)
        _wait_for(job.index_done(t), f"iteration {t}'s index shards from the shard workers")
        evaluated = run.timed(f"iter{t}_eval", job.evaluate, t)
        row.update(evaluated)
        run.save()
        shown = [f"{q} {m} {ev[m]:.4f}" for q, ev in ([("selection", row["select"])] if selection else [])
                 + list(row["eval"].items()) for m in cfg.measures]
        _log(f"iteration {t}: " + ", ".join(shown))
        if selection is None:
            continue
        value = row["select"][cfg.select_metric]
        if t > 0 and cfg.stop_when_no_gain and best_value is not None and value <= best_value:
            _log(f"iteration {t}: selection {cfg.select_metric} {value:.4f} is not above the best before it, "
                 f"{best_value:.4f}: stopping")
            job.stopped_marker.write_text(f"{t}\n")
            break
        best_value = value if best_value is None else max(best_value, value)
    chosen = choose_iteration(iterations, cfg.select_metric, selection is not None)
    results["selection"] = chosen
    results["best_iteration"] = chosen["iteration"]
    results["best_student"] = str(job.student(chosen["iteration"]))
    _log(f"kept iteration {chosen['iteration']}: {chosen['why']}")
    if "warning" in chosen:
        _log(f"warning: {chosen['warning']}")
    job.table.write_text(table_markdown(results, cfg), encoding="utf-8")
    return run.finish()


def run_shard_worker(workdir: str, shard_index: int, cfg: ClDrdConfig | None = None) -> None:
    """Shard `shard_index`'s part of every iteration (index shards, retrieval, the teacher's scores), waiting for
    the coordinator's students; for a coordinator run with shard_workers."""
    cfg = cfg or ClDrdConfig()
    if not 0 <= shard_index < cfg.num_shards:
        raise RankgenError(f"shard_index {shard_index} is outside 0..{cfg.num_shards - 1}")
    job = Job(workdir, cfg)
    stop = job.stopped_marker
    teacher = None
    for t in range(len(cfg.curriculum) + 1):
        student = job.student(t)
        if not _wait_for([student.root if t == 0 else student.file(DONE_MARKER), job.train_queries],
                         f"the iteration-{t} student", stop):
            return
        job.index(t, shard_index)
        if t == len(cfg.curriculum):
            return
        if not _wait_for(job.index_done(t), f"iteration {t}'s index shards", stop):
            return
        teacher = teacher or teachers.load_teacher(cfg.teacher, cfg.teacher_query_length or None,
                                                   cfg.teacher_passage_length or None, cfg.teacher_batch_size,
                                                   corpus=cfg.corpus, title_join=cfg.title_join)
        job.shard_stages(t + 1, [shard_index], teacher)


def table_markdown(results: dict, cfg: ClDrdConfig) -> str:
    """The per-iteration table: the selection queries' and each reported split's measures as mean +- standard
    error, each iteration's stage, and which iteration was kept."""
    ordered = [m for m in cfg.measures if m != "R@100"] + (["R@100"] if "R@100" in cfg.measures else [])
    iterations = results.get("iterations", {})
    names = list(next((row["eval"] for row in iterations.values() if "eval" in row), {}))
    selected = any("select" in row for row in iterations.values())
    header = ["iteration", "K, K', N_h, N_s", "lists", "steps"] + (
        [f"{cfg.select_metric} (selection)"] if selected else []) + [f"{m} ({n})" for n in names for m in ordered]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    kept = results.get("best_iteration")
    for key in sorted(iterations, key=int):
        row = iterations[key]
        if "eval" not in row:
            continue
        stage = row.get("stage")
        cells = [key + (" (kept)" if kept is not None and int(key) == kept else ""),
                 "start" if stage is None else f"{stage['k']}, {stage['k_prime']}, {stage['n_hard']}, "
                 f"{stage['n_rest']}", str(row.get("lists", {}).get("lists", "")),
                 str(row.get("training", {}).get("steps", ""))]
        if selected:
            ev = row["select"]
            cells.append(f"{ev[cfg.select_metric]:.3f} ± {ev[cfg.select_metric + '_se']:.3f}")
        for name in names:
            ev = row["eval"][name]
            cells += [f"{ev[m]:.3f} ± {ev[m + '_se']:.3f}" for m in ordered]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
