"""Does distillation improve a real retriever here? CL-DRD and DKMR^2 on the bundled books, against their baselines.

1. collection: the books BEIR folder (data/beir_books.py): prefixes as queries, their gold continuations as
   passages; training, dev and test books apart. The dev queries choose CL-DRD's iteration; the test queries
   are only reported.
2. BM25 on dev and test.
3. the teacher (DistillationDemoConfig.teacher; members joined by " + " are an ensemble of standardised
   scores, retrieval/teacher.py): "trained" stands for a MiniLM dual encoder this job trains first with
   RankGen's in-batch objective on every example of the training books (never the dev or test books);
   "mpnet" is all-mpnet-base-v2. Each member and the teacher itself rank the whole corpus (a row each).
4. CL-DRD (experiments/cl_drd.py) from zero-shot MiniLM with that teacher, ClDrdConfig as gin binds it
   (gin_configs/distillation/books_cpu.gin); its iteration 0 is the zero-shot student.
5. standard distillation: KL to the teacher's scores over the zero-shot student's top N (CL-DRD's first
   teacher-scored candidates: N = ClDrdConfig.depth), in lists of CL-DRD's size drawn afresh from them each
   epoch (standard_lists "drawn"; "top": the student's top L only), as many steps as CL-DRD's iterations
   take in all.
6. DKMR^2 (experiments/pipeline.py) on its own task, the books analogue of CommonGen's retrieval:
   Retriever0, the metric-guided ranker (ListMLE over BLEU's order), Retriever1 distilled from it by KL.
7. the tables: each row's nDCG@10, RR@10, R@100 on test (dev beside), with standard errors over queries and
   the paired difference from the zero-shot student; DKMR^2's rows on its held-out queries against Retriever0.

Every stage resumes (stages.StageRun); results.json and distillation_table.md hold the outcome.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.beir_books import BooksCollectionConfig, book_slug, build_books_collection
from rankgen_jax.data.documents import Document
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.retrieval_files import DEFAULT_TITLE_JOIN, Passage, read_passages, read_queries, write_run
from rankgen_jax.data.source_configs import DataConfig, ExamplesData, ListsData
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.cl_drd import (ClDrdConfig, Job, QuerySet, evaluate_retriever, measure_run,
                                            paired_difference, run_cl_drd)
from rankgen_jax.experiments.pipeline import DKMR2_RETRIEVER1, PipelineConfig, run_pipeline
from rankgen_jax.experiments.retrieval_example import bundled_books
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import StageRun, is_done, log, mark_done, starting_checkpoint
from rankgen_jax.pretrained import MINILM
from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, index_written
from rankgen_jax.retrieval.mining import Bm25Retriever
from rankgen_jax.retrieval.teacher import ENSEMBLE_SEPARATOR, EnsembleTeacher, load_teacher, standardized
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

TABLE_FILE = "distillation_table.md"
TRAINED = "trained"  # the teacher member this job trains
# Standard distillation's lists: L drawn from the student's top N afresh each epoch, or its top L.
STANDARD_LISTS = ("drawn", "top")
SPLITS = ("dev", "test")
DKMR2_ROWS = (("tfidf", "TF-IDF"), ("zero_shot", "zero-shot MiniLM"), ("retriever0", "Retriever0"),
              ("ranker0_listmle", "Ranker0 (ListMLE over BLEU's order), re-ranking Retriever0's top 20"),
              (DKMR2_RETRIEVER1, "Retriever1 (KL from Ranker0)"))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DistillationDemoConfig:
    """The collection, the student, the teacher (its trained member's budget), the standard-distillation baseline
    and whether DKMR^2 runs; CL-DRD's settings are ClDrdConfig's, DKMR^2's PipelineConfig's."""

    passages_per_book: int = 250
    test_books: int = 2
    dev_books: int = 1
    prefix_words: int = 64
    min_continuation_words: int = 10
    max_continuation_words: int = 40
    student: str = MINILM
    teacher: str = f"{TRAINED} + mpnet"
    teacher_steps: int = 200
    teacher_batch_size: int = 32
    teacher_learning_rate: float = 5e-5
    teacher_logit_scale: float = 20.0
    standard_lists: str = "drawn"
    standard_learning_rate: float = 3.5e-5
    standard_temperature: float = 1.0
    bm25_depth: int = 100
    dkmr2: bool = True

    def __post_init__(self):
        if self.teacher_steps < 1 or self.teacher_batch_size < 1:
            raise RankgenError("DistillationDemoConfig.teacher_steps and teacher_batch_size must be >= 1")
        if self.standard_lists not in STANDARD_LISTS:
            raise RankgenError(f"DistillationDemoConfig.standard_lists must be one of {STANDARD_LISTS}, got "
                               f"{self.standard_lists!r}")


class DistillationFolder(JobFolder):
    """Where the demonstration keeps each of its outputs under `workdir`: the BEIR collection, BM25's and the
    teacher's runs, the teacher's training, CL-DRD's job, standard distillation's, DKMR^2's pipeline, the table."""

    @property
    def beir(self) -> Path:
        return self.root / "beir"

    def bm25_run(self, split: str) -> tuple[Path, Path]:
        """BM25's TREC run on a split's queries, and its measures."""
        return self.root / "bm25" / f"{split}.trec", self.root / "bm25" / f"{split}.json"

    def teacher_run(self, label: str, split: str) -> tuple[Path, Path]:
        """The teacher's (or an ensemble member's) TREC run over the whole corpus on a split's queries, and its
        measures."""
        folder = self.root / "teacher_rows" / label.replace("/", "_")
        return folder / f"{split}.trec", folder / f"{split}.json"

    @property
    def teacher_books(self) -> Path:
        """The books the trained teacher member trains on (the training and dev books)."""
        return self.root / "teacher_books"

    @property
    def cl_drd(self) -> Path:
        return self.root / "cl_drd"

    @property
    def standard_student(self) -> RunFolder:
        """Standard distillation's training run."""
        return RunFolder.at(self.root / "standard" / "student")

    @property
    def standard_lists(self) -> Path:
        return self.root / "standard" / "train_lists.jsonl"

    @property
    def standard_index(self) -> Path:
        return self.root / "standard" / "index"

    def standard_measures(self, queries: str) -> Path:
        """Standard distillation's measures on a query set (its TREC run beside, as .trec)."""
        return self.root / "standard" / "eval" / f"{queries}.json"

    @property
    def dkmr2_books(self) -> Path:
        """Every book as its own file, the corpus DKMR^2's pipeline reads."""
        return self.root / "dkmr2_books"

    @property
    def dkmr2(self) -> Path:
        return self.root / "dkmr2"

    @property
    def table(self) -> Path:
        return self.root / TABLE_FILE


def _log(message: str) -> None:
    log("distillation-demo", message)


def _query_sets(beir: Path) -> dict[str, QuerySet]:
    return {split: QuerySet(split, str(beir), str(beir), split) for split in SPLITS}


def _bm25(folder: DistillationFolder, cfg: DistillationDemoConfig, measures) -> dict:
    beir = folder.beir
    corpus = read_passages(str(beir))
    retriever = Bm25Retriever(corpus.joined(), corpus.ids, progress=False)
    out = {}
    for split, query_set in _query_sets(beir).items():
        queries = read_queries(str(beir), split=split)
        rankings = retriever.rank(queries.joined(), cfg.bm25_depth)
        run_file, measures_file = folder.bm25_run(split)
        run = write_run(run_file, [
            {"query_id": q, "ids": [corpus.ids[r] for r, _ in ranked], "scores": [s for _, s in ranked]}
            for q, ranked in zip(queries.ids, rankings)], "trec", "bm25")
        out[split] = measure_run(run, query_set, measures, measures_file)
    return out


def _train_teacher(folder: DistillationFolder, init: Path, books: list[Document], beir_summary: dict,
                   cfg: DistillationDemoConfig, cl_cfg: ClDrdConfig) -> str:
    """MiniLM trained with RankGen's in-batch objective (InBook negatives) on every example of the training books,
    reading text as the student will (ClDrdConfig's lengths, no markers)."""
    workdir = folder.model("teacher")
    if is_done(workdir):
        return str(workdir)
    books_folder = folder.teacher_books
    train_slugs = set(beir_summary["train_books"])
    kept = [d for d in books if book_slug(d.id) in train_slugs or book_slug(d.id) in beir_summary["dev_books"]]
    _write_books(kept, books_folder)
    # The dev book is the run's held-out document (never trained on); it has no test book in it.
    holdout = tuple(d.id for d in kept if book_slug(d.id) in beir_summary["dev_books"])
    data = DataConfig(
        ExamplesData(
            corpus=str(books_folder),
            continuation_length=cl_cfg.passage_length,
            prefix_keep=cl_cfg.query_keep,
            with_negative=False,
            holdout_ids=holdout,
            prefix_words=cfg.prefix_words,
            min_continuation_words=cfg.min_continuation_words,
            max_continuation_words=cfg.max_continuation_words,
            prefix_marker="",
            suffix_marker="",
        ),
        batch_size=cfg.teacher_batch_size,
        prefix_length=cl_cfg.query_length,
        seed=cl_cfg.seed,
    )
    trainer = TrainerConfig(num_steps=cfg.teacher_steps, log_every=10, eval_every=0,
                            checkpoint_every=min(100, cfg.teacher_steps), init_checkpoint=str(init),
                            async_checkpoints=False, seed=cl_cfg.seed)
    optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.teacher_learning_rate, warmup_steps=10,
                                weight_decay=0.01)
    train(workdir, trainer=trainer, data=data, loss=LossConfig(name="in_batch_softmax",
                                                                     logit_scale=cfg.teacher_logit_scale),
          optimizer=optimizer)
    mark_done(workdir)
    return str(workdir)


def _write_books(books: list[Document], folder: Path) -> None:
    """Each book as a file under folder, by its corpus id (a corpus folder that require_documents reads)."""
    for doc in books:
        path = folder / doc.id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc.text, encoding="utf-8")


def teacher_spec(teacher: str, trained: str | None) -> str:
    """The teacher as load_teacher reads it: TRAINED replaced by the trained member's folder."""
    members = [m.strip() for m in teacher.split(ENSEMBLE_SEPARATOR)]
    return ENSEMBLE_SEPARATOR.join(trained if m == TRAINED else m for m in members)


def _rank_corpus(spec: str, labels: list[str], folder: DistillationFolder, cl_cfg: ClDrdConfig, measures) -> dict:
    """The teacher, and each member of an ensemble, scoring the whole corpus for every dev and test query: TREC runs
    and measures by row ({label: {split: measures}}, the teacher itself under "teacher"). Each member scores once;
    the ensemble's row combines those scores as EnsembleTeacher does."""
    beir = folder.beir
    teacher = load_teacher(spec, cl_cfg.query_length, cl_cfg.passage_length, cl_cfg.teacher_batch_size,
                           corpus=str(beir))
    members = teacher.members if isinstance(teacher, EnsembleTeacher) else []
    corpus = read_passages(str(beir))
    passages = [corpus.passage(d) for d in corpus.ids]
    rows: dict[str, dict] = {label: {} for label in [*(labels if members else []), "teacher"]}
    for split, query_set in _query_sets(beir).items():
        queries = read_queries(str(beir), split=split)
        candidates = [passages] * len(queries.ids)
        scored = {label: m.score(queries.ids, queries.joined(), candidates) for label, m in zip(labels, members)}
        scored["teacher"] = ([np.mean([standardized(scored[label][i]) for label in labels], axis=0)
                              for i in range(len(queries.ids))] if members
                             else teacher.score(queries.ids, queries.joined(), candidates))
        for label, scores in scored.items():
            run_file, measures_file = folder.teacher_run(label, split)
            results = []
            for qid, row in zip(queries.ids, scores):
                top = np.argsort(-np.asarray(row), kind="stable")[: cl_cfg.eval_depth]
                results.append({"query_id": qid, "ids": [corpus.ids[j] for j in top],
                                "scores": [float(row[j]) for j in top]})
            run = write_run(run_file, results, "trec", label.replace(" ", "_"))
            rows[label][split] = measure_run(run, query_set, measures, measures_file)
    return rows


def standard_lists(candidates: list[dict], size: int, epochs: int, mode: str, seed: int,
                   title_join: str | None = DEFAULT_TITLE_JOIN) -> list[dict]:
    """Standard distillation's training lists, epoch after epoch: each query's `size` candidates with their teacher
    scores, from its ranked candidates (the zero-shot student's top N): drawn without replacement, afresh each
    epoch ("drawn", generator seeded by (seed, epoch, the query's position)), or its top `size` ("top")."""
    records = []
    for epoch in range(epochs):
        for position, record in enumerate(candidates):
            ranked = sorted((p for p in record["positive_passages"] + record["negative_passages"] if "rank" in p),
                            key=lambda p: p["rank"])
            if mode == "drawn" and len(ranked) > size:
                rows = np.sort(np.random.default_rng([seed, epoch, position]).choice(len(ranked), size,
                                                                                     replace=False))
                ranked = [ranked[r] for r in rows]
            ranked = ranked[:size]
            if len(ranked) >= 2:
                records.append({"query": record["query"], "docids": [p["docid"] for p in ranked],
                                "candidates": [Passage(p["docid"], p["text"], p.get("title", "")).joined(title_join)
                                               for p in ranked],
                                "teacher_scores": [float(p["score"]) for p in ranked]})
    return records


def _standard_distillation(folder: DistillationFolder, cl_cfg: ClDrdConfig, cfg: DistillationDemoConfig,
                           steps: int) -> dict:
    """KL to the teacher's scores over the zero-shot student's top N (standard_lists), from the zero-shot
    student, for `steps` steps (as many as CL-DRD's); then indexed and evaluated as CL-DRD's iterations are."""
    job = Job(folder.cl_drd, cl_cfg)
    workdir = folder.standard_student
    size = cl_cfg.curriculum[0].list_size
    if not is_done(workdir):
        epochs = max(1, -(-steps * cl_cfg.batch_size // len(job.train_query_ids())))
        records = standard_lists(read_jsonl(job.candidates_file(1)), size, epochs, cfg.standard_lists, cl_cfg.seed,
                                 cl_cfg.title_join)
        lists = write_jsonl(folder.standard_lists, records)
        conventions = job.reading_conventions()
        data = DataConfig(
            ListsData(
                train_file=str(lists),
                eval_file=str(lists),
                continuation_length=cl_cfg.passage_length,
                list_size=size,
                prefix_keep=cl_cfg.query_keep,
                prefix_marker=conventions["prefix_marker"],
                suffix_marker=conventions["suffix_marker"],
            ),
            batch_size=cl_cfg.batch_size,
            prefix_length=cl_cfg.query_length,
            seed=cl_cfg.seed + 1,
        )
        optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.standard_learning_rate, schedule="linear",
                                    warmup_steps=min(cl_cfg.warmup_steps, steps - 1), total_steps=steps,
                                    weight_decay=cl_cfg.weight_decay, clip_grad_norm=cl_cfg.clip_grad_norm)
        trainer = TrainerConfig(num_steps=steps, log_every=max(1, min(50, steps // 10)), eval_every=0,
                                checkpoint_every=min(cl_cfg.checkpoint_every, steps), keep_checkpoints=2,
                                init_checkpoint=str(job.student(0)), seed=cl_cfg.seed + 1, async_checkpoints=False)
        train(workdir, trainer=trainer, data=data, optimizer=optimizer,
              loss=LossConfig(name="kl_distillation", temperature=cfg.standard_temperature,
                              logit_scale=cl_cfg.logit_scale))
        mark_done(workdir)
    index = folder.standard_index
    if not index_written(index):
        index_corpus(
            str(workdir),
            cl_cfg.corpus,
            str(index),
            encoding=TextEncoding("suffix", batch_size=cl_cfg.encode_batch_size, conventions=job.reading_conventions()),
            title_join=cl_cfg.title_join,
            overwrite=True,
            progress=False,
        )
    return {q.name: evaluate_retriever(str(workdir), index, q, folder.standard_measures(q.name), cl_cfg,
                                       job.reading_conventions(), "standard_kl")
            for q in _query_sets(Path(cl_cfg.corpus)).values()}


def _cell(ev: dict, measure: str) -> str:
    return f"{ev[measure]:.3f} ± {ev[measure + '_se']:.3f}"


def retrieval_rows(results: dict) -> list[tuple[str, dict]]:
    """(name, {split: measures}) of every row of the books table, in order."""
    cl = results["cl_drd"]["iterations"]
    rows = [("BM25", results["bm25"])]
    for name, ev in results.get("teacher_members", {}).items():
        rows.append((f"teacher member: {name}", ev))
    rows.append((f"teacher ({results['teacher_spec']})", results["teacher"]))
    rows.append(("zero-shot student (MiniLM)", {"dev": cl["0"]["select"], "test": cl["0"]["eval"]["test"]}))
    if "standard" in results:
        rows.append((f"standard distillation (KL, {results['standard_steps']} steps)", results["standard"]))
    for key in sorted(cl, key=int):
        if key != "0" and "eval" in cl[key]:
            stage = cl[key]["stage"]
            kept = " (kept)" if results["cl_drd"].get("best_iteration") == int(key) else ""
            rows.append((f"CL-DRD iteration {key}{kept} (K={stage['k']}, N_h={stage['n_hard']}, "
                         f"N_s={stage['n_rest']})", {"dev": cl[key]["select"], "test": cl[key]["eval"]["test"]}))
    return rows


def table_markdown(results: dict) -> str:
    """The books table (test measures, dev nDCG@10 beside, paired differences from the zero-shot student), then
    DKMR^2's rows on its own held-out queries (paired differences from Retriever0)."""
    rows = retrieval_rows(results)
    start = results["cl_drd"]["iterations"]["0"]
    lines = ["| model | test nDCG@10 | test RR@10 | test R@100 | test nDCG@10 - zero-shot | test RR@10 - zero-shot | "
             "dev nDCG@10 |", "| --- |" + " ---: |" * 6]
    for name, ev in rows:
        cells = [_cell(ev["test"], m) for m in ("nDCG@10", "RR@10", "R@100")]
        for measure in ("nDCG@10", "RR@10"):
            if ev["test"] is start["eval"]["test"]:
                cells.append("-")
            else:
                diff, se = paired_difference(ev["test"], start["eval"]["test"], measure)
                cells.append(f"{diff:+.3f} ± {se:.3f}")
        cells.append(_cell(ev["dev"], "nDCG@10"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if "dkmr2" in results:
        table = results["dkmr2"]["table"]
        lines += ["", "| DKMR^2 model (its held-out queries) | MRR@10 | R@10 | BLEU of top 1 | MRR@10 - Retriever0 |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for key, name in DKMR2_ROWS:
            if key not in table:
                continue
            row = table[key]
            diff = "-" if key == "retriever0" else "{:+.3f} ± {:.3f}".format(
                *paired_difference(row, table["retriever0"], "mrr@10"))
            lines.append(f"| {name} | {row['mrr@10']:.3f} ± {row['mrr@10_se']:.3f} | "
                         f"{row['recall@10']:.3f} ± {row['recall@10_se']:.3f} | {row['bleu_top1']:.1f} | {diff} |")
    return "\n".join(lines) + "\n"


def targets(results: dict) -> dict:
    """The issue's three targets, read off the results: CL-DRD's kept student against the zero-shot one (more
    than 2 paired standard errors on test nDCG@10), against standard distillation, and Retriever1 against
    Retriever0."""
    cl = results["cl_drd"]
    start = cl["iterations"]["0"]["eval"]["test"]
    kept = cl["iterations"][str(cl["best_iteration"])]["eval"]["test"]
    out = {"kept_iteration": cl["best_iteration"]}
    diff, se = paired_difference(kept, start, "nDCG@10")
    out["cl_drd_vs_zero_shot"] = {"difference": diff, "se": se, "met": diff > 2 * se}
    if "standard" in results:
        diff, se = paired_difference(kept, results["standard"]["test"], "nDCG@10")
        out["cl_drd_vs_standard"] = {"difference": diff, "se": se, "met": diff >= 0}
    if "dkmr2" in results:
        table = results["dkmr2"]["table"]
        diff, se = paired_difference(table[DKMR2_RETRIEVER1], table["retriever0"], "mrr@10")
        out["retriever1_vs_retriever0"] = {"difference": diff, "se": se, "met": diff > 0}
    return out


def run_distillation_demo(workdir: str, cfg: DistillationDemoConfig | None = None,
                          cl_drd_config: ClDrdConfig | None = None, pipeline_config: PipelineConfig | None = None,
                          books: list[Document] | None = None) -> dict:
    """Run (or resume) the demonstration in workdir; returns results.json's contents."""
    cfg = cfg or DistillationDemoConfig()
    # Read before anything trains: a training run refuses gin bindings that nothing has read yet.
    cl_drd_config = cl_drd_config or ClDrdConfig()
    pipeline_config = pipeline_config or (PipelineConfig() if cfg.dkmr2 else None)
    folder = DistillationFolder(workdir)
    job = StageRun(folder, "distillation-demo")
    results = job.results
    books = bundled_books() if books is None else books
    beir = folder.beir
    if "collection" not in results:
        collection = BooksCollectionConfig(passages_per_book=cfg.passages_per_book, test_books=cfg.test_books,
                                           dev_books=cfg.dev_books, prefix_words=cfg.prefix_words,
                                           min_continuation_words=cfg.min_continuation_words,
                                           max_continuation_words=cfg.max_continuation_words)
        results["collection"] = job.stage("collection", build_books_collection, books, beir, collection)
        job.save()
    measures = tuple(cl_drd_config.measures)
    if "bm25" not in results:
        results["bm25"] = job.stage("bm25", _bm25, folder, cfg, measures)
        job.save()
    init = Path(cfg.student) if native.is_checkpoint_dir(cfg.student) else starting_checkpoint(
        "", cfg.student, folder, "DistillationDemoConfig.student")
    cl_cfg = dataclasses.replace(cl_drd_config, corpus=str(beir), student=str(init), eval_split="test",
                                 report_splits=(), select_split="dev")
    trained = None
    if TRAINED in [m.strip() for m in cfg.teacher.split(ENSEMBLE_SEPARATOR)]:
        trained = job.stage("teacher_training", _train_teacher, folder, init, books, results["collection"], cfg,
                            cl_cfg)
    spec = teacher_spec(cfg.teacher, trained)
    results["teacher_spec"] = cfg.teacher
    cl_cfg = dataclasses.replace(cl_cfg, teacher=spec)
    if "teacher" not in results:
        labels = [m.strip() for m in cfg.teacher.split(ENSEMBLE_SEPARATOR)]
        rows = job.stage("teacher", _rank_corpus, spec, labels, folder, cl_cfg, measures)
        results["teacher"] = rows.pop("teacher")
        results["teacher_members"] = rows
        job.save()
    results["cl_drd"] = job.stage("cl_drd", run_cl_drd, str(folder.cl_drd), cl_cfg)
    job.save()
    steps = sum(row.get("training", {}).get("steps", 0) for row in results["cl_drd"]["iterations"].values())
    results["standard_steps"] = steps
    if "standard" not in results:
        results["standard"] = job.stage("standard", _standard_distillation, folder, cl_cfg, cfg, steps)
        job.save()
    if cfg.dkmr2:
        _write_books(books, folder.dkmr2_books)
        dkmr2_cfg = dataclasses.replace(pipeline_config, corpus=str(folder.dkmr2_books))
        results["dkmr2"] = job.stage("dkmr2", run_pipeline, str(folder.dkmr2), dkmr2_cfg)
        job.save()
    results["targets"] = targets(results)
    table = table_markdown(results)
    folder.table.write_text(table, encoding="utf-8")
    results = job.finish()
    print(table)
    for name, target in results["targets"].items():
        if isinstance(target, dict):
            _log(f"target {name}: {target['difference']:+.4f} ± {target['se']:.4f} -> "
                 f"{'met' if target['met'] else 'missed'}")
    return results
