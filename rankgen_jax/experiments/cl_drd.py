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
   loss of eq. (2) (lambdarank_mrr; pi from the student's retrieval ranks, or
   with rank_source "list" from its ranking of each list at the step, as the
   released code), through the one trainer and train_step, iter{t}/student;
5. indexes the corpus with the new student (iter{t}/index, which the next
   iteration retrieves from) and evaluates it on the held-out queries:
   iter{t}/eval/<split>.trec (a TREC run) and <split>.json (trec_eval's
   measures with standard errors over queries, and every query's values).

Stopping: after the configured stages, or (stop_when_no_gain) at the first
iteration whose held-out stop_metric is not above the best before it; the
best iteration's student is the result (Algorithm 1's theta*).

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

import gin
import numpy as np

from rankgen_jax.checkpoints import native
from rankgen_jax.data.curriculum import CL_DRD_STAGES, CurriculumStage, curriculum_groups
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, Passage, is_beir_folder, read_passages, read_qrels,
                                              read_queries, read_training_queries)
from rankgen_jax.data.sources import DataConfig
from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.eval.retrieval_metrics import evaluate_files
from rankgen_jax.experiments.stages import StageRun, is_done, log, mark_done, starting_checkpoint
from rankgen_jax.retrieval.dense_index import CONFIG_FILE, index_corpus, search_queries
from rankgen_jax.retrieval import teacher as teachers
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

PAPER_STAGES = tuple((s.k, s.k_prime, s.n_hard, s.n_rest) for s in CL_DRD_STAGES)
TOO_FEW_CANDIDATES = "fewer candidates with a teacher score than the stage's groups need"
STOPPED_MARKER = "stopped"
WAIT_SECONDS = 15.0

_log = functools.partial(log, "cl-drd")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ClDrdConfig:
    """Inputs, the paper's procedure and its settings (defaults: the paper's MS MARCO runs, see
    gin_configs/cl_drd/msmarco_paper.gin).

    Data: corpus (passages: TSV, JSON lines or a BEIR folder); training
      queries from train_file (Tevatron JSONL: its queries, its positives
      relevant) or train_queries + train_qrels (files, or a BEIR folder read
      at train_split; both default to corpus when it is a BEIR folder);
      held-out queries eval_queries + eval_qrels (likewise, at eval_split),
      whose stop_metric stops the job; report_splits: more splits of a BEIR
      folder evaluated each iteration, never used to stop.
    student: a rankgen_jax dual-encoder checkpoint, an HF / sentence-
      transformers folder, or "minilm"; teacher: a cross-encoder checkpoint,
      an HF sequence-classification / CrossEncoder folder, or a file of
      teacher scores.
    stages: (K, K', N_h, N_s) per iteration (data/curriculum.py); epochs and
      learning_rates: per iteration (the released code's 4 / 2 / 2 epochs at
      7e-6 / 3e-6 / 3e-6, batch 8, warmup 4000 steps, weight decay 0.01,
      gradient norm clipped at 1, queries of 30 and passages of 256 tokens).
    markers: (query, passage) texts the student reads before each; () keeps
      the student's own recorded ones.
    rank_source: pi of eq. (2): "retrieval" (the student's retrieved list,
      as the paper defines it) or "list" (its ranking of the training list at
      each step, as the released code computes it).
    logit_scale: multiplies the student's scores in eq. (2): 1 for the
      paper's dot-product students; larger for a student with unit vectors
      (cosine scores), such as all-MiniLM-L6-v2.
    """

    corpus: str = ""
    train_file: str = ""
    train_queries: str = ""
    train_qrels: str = ""
    train_split: str = "train"
    eval_queries: str = ""
    eval_qrels: str = ""
    eval_split: str = "dev"
    report_splits: tuple[str, ...] = ()
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
    rank_source: str = "retrieval"
    logit_scale: float = 1.0
    teacher_query_length: int = 30
    teacher_passage_length: int = 256
    teacher_batch_size: int = 64
    stop_metric: str = "RR@10"
    stop_when_no_gain: bool = False
    measures: tuple[str, ...] = ("nDCG@10", "RR@10", "R@100")
    eval_depth: int = 100
    num_shards: int = 1
    shard_workers: bool = False
    index_factory: str = ""
    encode_batch_size: int = 64
    query_batch: int = 64
    checkpoint_every: int = 1000
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
        if self.stop_metric not in self.measures:
            raise RankgenError(f"ClDrdConfig.stop_metric={self.stop_metric!r} is not among measures {self.measures}")
        for name in ("batch_size", "num_shards", "depth", "eval_depth", "query_batch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise RankgenError(f"ClDrdConfig.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def curriculum(self) -> list[CurriculumStage]:
        return [CurriculumStage.of(s) for s in self.stages]


def _folder_or(path: str, fallback: str) -> str:
    return path or (fallback if fallback and is_beir_folder(fallback) else "")


class Job:
    """A CL-DRD workdir: where each iteration's artefacts go, and the stages that make them."""

    def __init__(self, workdir: str | Path, cfg: ClDrdConfig):
        self.cfg = cfg
        self.root = Path(workdir)
        self.data = self.root / "data"

    # --- paths -------------------------------------------------------------------------------

    def iteration(self, t: int) -> Path:
        return self.root / f"iter{t}"

    def student(self, t: int) -> Path:
        return self.root / "student0" if t == 0 else self.iteration(t) / "student"

    def index_shard(self, t: int, i: int) -> Path:
        return self.iteration(t) / "index" / f"shard{i}"

    def queries_shard(self, i: int) -> Path:
        return self.data / f"train_queries.shard{i}of{self.cfg.num_shards}.jsonl"

    def retrieved(self, t: int, i: int) -> Path:
        return self.iteration(t) / "retrieved" / f"shard{i}.jsonl"

    def scored(self, t: int, i: int) -> Path:
        return self.iteration(t) / "teacher" / f"shard{i}.jsonl"

    # --- data --------------------------------------------------------------------------------

    def prepare_data(self) -> dict:
        """The training queries and their qrels as plain files (data/train_queries.jsonl, data/train_qrels.tsv),
        and the query shards."""
        cfg = self.cfg
        if not cfg.corpus:
            raise RankgenError("ClDrdConfig.corpus is required (passages, or a BEIR folder)")
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
        if not pairs:
            raise RankgenError("no training query has a relevant passage")
        self.data.mkdir(parents=True, exist_ok=True)
        write_jsonl(self.data / "train_queries.jsonl", [{"id": q, "text": t} for q, t in pairs])
        qrels_file = self.data / "train_qrels.tsv"
        partial = qrels_file.with_name(qrels_file.name + ".partial")
        partial.write_text("".join(f"{q} 0 {d} {label}\n" for q, d, label in judged), encoding="utf-8")
        partial.replace(qrels_file)
        for i in range(cfg.num_shards):
            write_jsonl(self.queries_shard(i), [{"id": q, "text": t} for q, t in teachers.shard_of(
                pairs, i, cfg.num_shards)])
        return {"train_queries": len(pairs), "train_judgements": len(judged)}

    def train_query_ids(self) -> list[str]:
        return [r["id"] for r in read_jsonl(self.data / "train_queries.jsonl")]

    # --- sharded stages ----------------------------------------------------------------------

    def index(self, t: int, i: int) -> None:
        """Shard i of the corpus encoded by the iteration-t student."""
        out = self.index_shard(t, i)
        if (out / CONFIG_FILE).is_file():
            return
        index_corpus(str(self.student(t)), self.cfg.corpus, str(out), batch_size=self.cfg.encode_batch_size,
                     overwrite=True, num_shards=self.cfg.num_shards, shard_index=i, title_join=self.cfg.title_join,
                     index_factory=self.cfg.index_factory or None)

    def index_done(self, t: int) -> list[Path]:
        return [self.index_shard(t, i) / CONFIG_FILE for i in range(self.cfg.num_shards)]

    def retrieve(self, t: int, i: int) -> None:
        """The iteration-(t-1) student's top `depth` for shard i of the training queries (a search JSONL run)."""
        out = self.retrieved(t, i)
        if out.is_file():
            return
        search_queries(str(self.student(t - 1)), str(self.iteration(t - 1) / "index"), str(self.queries_shard(i)),
                       self.cfg.depth, out_path=str(out), batch_size=self.cfg.encode_batch_size)

    def score(self, t: int, i: int, teacher) -> dict:
        """Shard i's candidates scored by the teacher (resumable), then marked done."""
        out = self.scored(t, i)
        done = out.with_name(out.name + ".done")
        if done.is_file():
            return json.loads(done.read_text(encoding="utf-8"))
        started = time.time()
        summary = teachers.score_candidates(
            str(out), teacher, run_path=str(self.retrieved(t, i)), queries_path=str(self.data / "train_queries.jsonl"),
            corpus_path=self.cfg.corpus, qrels_path=str(self.data / "train_qrels.tsv"), depth=self.cfg.depth,
            positive_level=self.cfg.positive_level, title_join=self.cfg.title_join, query_batch=self.cfg.query_batch)
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
        out = self.iteration(t) / "candidates.jsonl"
        if not out.is_file():
            teachers.merge_shards([self.scored(t, i) for i in range(self.cfg.num_shards)], out,
                                  self.train_query_ids())
        return out

    def training_lists(self, t: int) -> tuple[Path, dict]:
        """Iteration t's CL-DRD lists (groups, labels, the student's ranks) from its candidates."""
        out = self.iteration(t) / "train_lists.jsonl"
        summary_file = self.iteration(t) / "train_lists.json"
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
        markers = tuple(cfg.markers) or self._student_markers(t - 1)
        data = DataConfig(source="lists", train_file=str(lists), eval_file=str(lists), batch_size=cfg.batch_size,
                          prefix_length=cfg.query_length, continuation_length=cfg.passage_length,
                          list_size=cfg.curriculum[t - 1].list_size, prefix_keep=cfg.query_keep, seed=cfg.seed + t,
                          prefix_marker=markers[0], suffix_marker=markers[1])
        warmup = min(cfg.warmup_steps, steps - 1)
        optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.learning_rates[t - 1], schedule="linear",
                                    warmup_steps=warmup, total_steps=steps, weight_decay=cfg.weight_decay,
                                    clip_grad_norm=cfg.clip_grad_norm)
        trainer = TrainerConfig(num_steps=steps, log_every=max(1, min(50, steps // 10)), eval_every=0,
                                checkpoint_every=min(cfg.checkpoint_every, steps), keep_checkpoints=2,
                                init_checkpoint=str(self.student(t - 1)), seed=cfg.seed + t, async_checkpoints=False)
        started = time.time()
        metrics = train(str(workdir), trainer=trainer, data=data,
                        loss=LossConfig(name="lambdarank_mrr", rank_source=cfg.rank_source,
                                        logit_scale=cfg.logit_scale), optimizer=optimizer)
        if metrics.get("preempted"):
            raise RankgenError(f"{workdir}: training was stopped before its end (SIGTERM); rerun to resume")
        mark_done(workdir)
        return {**info, "train_seconds_this_run": time.time() - started, "final_loss": metrics.get("loss")}

    def _student_markers(self, t: int) -> tuple[str, str]:
        # Imports jax: only a running job gets here.
        from rankgen_jax.inference.encoder import load_model

        conventions = load_model(str(self.student(t))).conventions
        return conventions.prefix_marker, conventions.suffix_marker

    # --- evaluation --------------------------------------------------------------------------

    def evaluate(self, t: int) -> dict:
        """The iteration-t student on the held-out split (and report_splits): TREC runs and measures with SEs."""
        cfg = self.cfg
        queries = _folder_or(cfg.eval_queries, cfg.corpus)
        qrels = _folder_or(cfg.eval_qrels, queries)
        if not queries or not qrels:
            raise RankgenError("ClDrdConfig needs held-out queries: eval_queries and eval_qrels (default: the corpus "
                               "when it is a BEIR folder)")
        results = {}
        for split in (cfg.eval_split, *cfg.report_splits):
            out = self.iteration(t) / "eval" / f"{split}.json"
            if out.is_file():
                results[split] = json.loads(out.read_text(encoding="utf-8"))
                continue
            run = self.iteration(t) / "eval" / f"{split}.trec"
            beir = Path(queries).is_dir()
            if not beir and split != cfg.eval_split:
                raise RankgenError(f"ClDrdConfig.report_splits names split {split!r}, but the eval queries "
                                   f"({queries}) are a file, not a BEIR folder")
            search_queries(str(self.student(t)), str(self.iteration(t) / "index"), queries, cfg.eval_depth,
                           out_path=str(run), split=split if beir else None, out_format="trec",
                           run_tag=f"cl_drd_iter{t}", batch_size=cfg.encode_batch_size)
            measured = evaluate_files(str(run), qrels, list(cfg.measures),
                                      split=split if Path(qrels).is_dir() else None, per_query=True)
            results[split] = with_standard_errors(measured, cfg.measures)
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_name(out.name + ".partial")
            partial.write_text(json.dumps(results[split], indent=1) + "\n", encoding="utf-8")
            partial.replace(out)
        return results


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


def run_cl_drd(workdir: str, cfg: ClDrdConfig | None = None) -> dict:
    """Run (or resume) CL-DRD in workdir; returns results.json's contents (the per-iteration table too)."""
    cfg = cfg or ClDrdConfig()
    job = Job(workdir, cfg)
    run = StageRun(workdir, "cl-drd")
    results = run.results
    results["config"] = {k: v for k, v in dataclasses.asdict(cfg).items()}
    if "data" not in results:
        results["data"] = run.stage("data", job.prepare_data)
    if not cfg.student:
        raise RankgenError("ClDrdConfig.student is required (a checkpoint, an HF / sentence-transformers folder, "
                           "or 'minilm')")
    if native.is_checkpoint_dir(cfg.student):
        start = Path(cfg.student)
        if not job.student(0).exists():
            job.student(0).symlink_to(start.resolve(), target_is_directory=True)
    else:
        start = starting_checkpoint("", cfg.student, job.root, "ClDrdConfig.student")
        if not job.student(0).exists():
            job.student(0).symlink_to(start.resolve().name, target_is_directory=True)
    if not cfg.teacher:
        raise RankgenError("ClDrdConfig.teacher is required (a cross encoder, or a file of teacher scores)")
    teacher = None
    shards = [] if cfg.shard_workers else list(range(cfg.num_shards))
    iterations = results.setdefault("iterations", {})
    best = None
    for t in range(len(cfg.curriculum) + 1):
        key = str(t)
        row = iterations.setdefault(key, {"iteration": t})
        if t > 0:
            if (job.root / STOPPED_MARKER).is_file():
                break
            row["stage"] = dataclasses.asdict(cfg.curriculum[t - 1])
            if not is_done(job.student(t)):
                if teacher is None and shards:
                    teacher = teachers.load_teacher(cfg.teacher, cfg.teacher_query_length or None,
                                                    cfg.teacher_passage_length or None, cfg.teacher_batch_size)
                run.timed(f"iter{t}_retrieve_and_score", job.shard_stages, t, shards, teacher)
                _wait_for(job.scored_done(t), f"iteration {t}'s teacher scores from the shard workers")
                lists, row["lists"] = run.timed(f"iter{t}_lists", job.training_lists, t)
            else:
                lists, row["lists"] = job.training_lists(t)
            row["teacher"] = [json.loads(p.read_text(encoding="utf-8")) for p in job.scored_done(t)]
            if "training" not in row or not is_done(job.student(t)):
                row["training"] = run.timed(f"iter{t}_train", job.train_student, t, lists, row["lists"]["lists"])
            run.save()
        for i in shards:
            run.timed(f"iter{t}_index", job.index, t, i)
        _wait_for(job.index_done(t), f"iteration {t}'s index shards from the shard workers")
        row["eval"] = run.timed(f"iter{t}_eval", job.evaluate, t)
        run.save()
        value = row["eval"][cfg.eval_split][cfg.stop_metric]
        _log(f"iteration {t}: " + ", ".join(f"{m} {row['eval'][cfg.eval_split][m]:.4f}" for m in cfg.measures))
        if t > 0 and cfg.stop_when_no_gain and best is not None and value <= best[1]:
            _log(f"iteration {t}: {cfg.stop_metric} {value:.4f} is not above iteration {best[0]}'s {best[1]:.4f}: "
                 "stopping")
            (job.root / STOPPED_MARKER).write_text(f"{t}\n")
            break
        if best is None or value > best[1]:
            best = (t, value)
    results["best_iteration"] = best[0]
    results["best_student"] = str(job.student(best[0]))
    (job.root / "cl_drd_table.md").write_text(table_markdown(results, cfg), encoding="utf-8")
    return run.finish()


def run_shard_worker(workdir: str, shard_index: int, cfg: ClDrdConfig | None = None) -> None:
    """Shard `shard_index`'s part of every iteration (index shards, retrieval, the teacher's scores), waiting for
    the coordinator's students; for a coordinator run with shard_workers."""
    cfg = cfg or ClDrdConfig()
    if not 0 <= shard_index < cfg.num_shards:
        raise RankgenError(f"shard_index {shard_index} is outside 0..{cfg.num_shards - 1}")
    job = Job(workdir, cfg)
    stop = job.root / STOPPED_MARKER
    teacher = None
    for t in range(len(cfg.curriculum) + 1):
        if not _wait_for([job.student(t) / ("" if t == 0 else "stage_done"), job.data / "train_queries.jsonl"],
                         f"the iteration-{t} student", stop):
            return
        job.index(t, shard_index)
        if t == len(cfg.curriculum):
            return
        if not _wait_for(job.index_done(t), f"iteration {t}'s index shards", stop):
            return
        teacher = teacher or teachers.load_teacher(cfg.teacher, cfg.teacher_query_length or None,
                                                   cfg.teacher_passage_length or None, cfg.teacher_batch_size)
        job.shard_stages(t + 1, [shard_index], teacher)


def table_markdown(results: dict, cfg: ClDrdConfig) -> str:
    """The per-iteration table: each split's measures as mean +- standard error, and each iteration's stage."""
    splits = (cfg.eval_split, *cfg.report_splits)
    header = ["iteration", "K, K', N_h, N_s", "lists", "steps"]
    for split in splits:
        header += [f"{m} ({split})" for m in cfg.measures if m != "R@100"] + (
            [f"R@100 ({split})"] if "R@100" in cfg.measures else [])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for key in sorted(results.get("iterations", {}), key=int):
        row = results["iterations"][key]
        if "eval" not in row:
            continue
        stage = row.get("stage")
        cells = [key, "start" if stage is None else f"{stage['k']}, {stage['k_prime']}, {stage['n_hard']}, "
                 f"{stage['n_rest']}", str(row.get("lists", {}).get("lists", "")),
                 str(row.get("training", {}).get("steps", ""))]
        for split in splits:
            ev = row["eval"][split]
            ordered = [m for m in cfg.measures if m != "R@100"] + (["R@100"] if "R@100" in cfg.measures else [])
            cells += [f"{ev[m]:.3f} ± {ev[m + '_se']:.3f}" for m in ordered]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
