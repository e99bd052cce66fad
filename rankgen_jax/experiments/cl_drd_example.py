"""CL-DRD on the bundled books, sized for a CPU: a MiniLM student, a MiniLM cross encoder trained first as the teacher.

1. collection: the BEIR folder of data/beir_books.py with a dev split (train, dev and test books apart);
2. BM25 (bm25s, Pyserini's k1 / b) on the dev and test queries, the sparse baseline;
3. teacher: a cross encoder from all-MiniLM-L6-v2's encoder ([CLS] -> linear), trained on the training
   queries with a listwise softmax over the gold passage and BM25-mined negatives;
4. CL-DRD (experiments/cl_drd.py) from zero-shot MiniLM with that teacher, ClDrdConfig as gin binds it
   (gin_configs/cl_drd/books_cpu.gin);
5. the table: BM25, the teacher re-ranking the starting student's top `rerank_depth`, and the student at
   every iteration, nDCG@10 / RR@10 (R@100 on test) as mean +- standard error over queries, and each
   iteration's paired difference from the starting student on the test queries.

Every stage resumes (stages.StageRun); results.json and cl_drd_example_table.md hold the outcome.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.checkpoints import native
from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
from rankgen_jax.data.retrieval_files import read_passages, read_queries, read_run, write_run
from rankgen_jax.data.sources import DataConfig
from rankgen_jax.eval.retrieval_metrics import evaluate_files
from rankgen_jax.experiments.cl_drd import ClDrdConfig, run_cl_drd, with_standard_errors
from rankgen_jax.experiments.retrieval_example import bundled_books
from rankgen_jax.experiments.stages import MINILM, StageRun, is_done, mark_done, starting_checkpoint
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.retrieval.mining import Bm25Retriever, mine_negatives
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

TABLE_FILE = "cl_drd_example_table.md"
SPLITS = ("dev", "test")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ClDrdExampleConfig:
    """The collection, the starting student (an HF folder, "minilm" or a rankgen_jax checkpoint) and the teacher's
    training; CL-DRD's own settings are ClDrdConfig's."""

    passages_per_book: int = 50
    test_books: int = 2
    dev_books: int = 1
    prefix_words: int = 64
    min_continuation_words: int = 10
    max_continuation_words: int = 40
    student: str = MINILM
    teacher_steps: int = 60
    teacher_batch_size: int = 4
    teacher_list_size: int = 6
    teacher_learning_rate: float = 5e-5
    teacher_query_length: int = 96
    teacher_passage_length: int = 64
    mining_depth: str = "1-30"
    mined_negatives: int = 15
    rerank_depth: int = 10
    bm25_depth: int = 100
    measures: tuple[str, ...] = ("nDCG@10", "RR@10", "R@100")


def _bm25(beir: Path, root: Path, cfg: ClDrdExampleConfig) -> dict:
    corpus = read_passages(str(beir))
    retriever = Bm25Retriever(corpus.joined(), corpus.ids, progress=False)
    out = {}
    for split in SPLITS:
        queries = read_queries(str(beir), split=split)
        rankings = retriever.rank(queries.joined(), cfg.bm25_depth)
        run = write_run(root / "bm25" / f"{split}.trec", [
            {"query_id": q, "ids": [corpus.ids[r] for r, _ in ranked], "scores": [s for _, s in ranked]}
            for q, ranked in zip(queries.ids, rankings)], "trec", "bm25")
        out[split] = with_standard_errors(evaluate_files(str(run), str(beir), list(cfg.measures), split=split,
                                                         per_query=True), cfg.measures)
    return out


def _train_teacher(beir: Path, root: Path, init: Path, cfg: ClDrdExampleConfig) -> str:
    """A cross encoder from the student's encoder, trained on the training queries against BM25 negatives."""
    workdir = root / "teacher"
    if is_done(workdir):
        return str(workdir)
    mined = {}
    for split in ("train", "dev"):
        mined[split] = root / "teacher_data" / f"bm25_negatives_{split}.jsonl"
        mine_negatives(str(mined[split]), str(beir), queries_path=str(beir), qrels_path=str(beir), split=split,
                       retriever="bm25", depth=cfg.mining_depth, negatives=cfg.mined_negatives, pick="sample",
                       progress=False)
    data = DataConfig(source="retrieval", train_file=str(mined["train"]), eval_file=str(mined["dev"]),
                      qrels=str(beir), eval_qrels=str(beir), split="train", eval_split="dev",
                      hard_negatives=cfg.teacher_list_size - 1, list_size=cfg.teacher_list_size,
                      batch_size=cfg.teacher_batch_size, prefix_length=cfg.teacher_query_length,
                      continuation_length=cfg.teacher_passage_length, prefix_keep="end")
    ranker = ModelConfig(head=HeadConfig(pooling="first", projection_dim=0), kind="cross_encoder")
    trainer = TrainerConfig(num_steps=cfg.teacher_steps, log_every=10, eval_every=0,
                            checkpoint_every=min(50, cfg.teacher_steps), init_checkpoint=str(init),
                            async_checkpoints=False)
    optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.teacher_learning_rate, schedule="linear",
                                warmup_steps=max(1, cfg.teacher_steps // 10), total_steps=cfg.teacher_steps,
                                weight_decay=0.01, clip_grad_norm=1.0)
    train(str(workdir), trainer=trainer, model_config=ranker, data=data, loss=LossConfig(name="listwise_softmax"),
          optimizer=optimizer)
    mark_done(workdir)
    return str(workdir)


def _teacher_reranking(beir: Path, root: Path, teacher: str, start_runs: Path, cfg: ClDrdExampleConfig) -> dict:
    """The teacher re-ranking the starting student's top rerank_depth (what the student could learn, at most)."""
    from rankgen_jax.inference.encoder import load_model

    ranker = load_model(teacher, kind="cross_encoder")
    corpus = read_passages(str(beir))
    texts = dict(zip(corpus.ids, corpus.joined()))
    out = {}
    for split in SPLITS:
        queries = read_queries(str(beir), split=split)
        run = read_run(start_runs / f"{split}.trec")
        heads = [[d for d, _ in sorted(run[q].items(), key=lambda x: (-x[1], x[0]))][: cfg.rerank_depth]
                 for q in queries.ids]
        scores = ranker.score_pairs(queries.joined(), [[texts[d] for d in head] for head in heads],
                                    cfg.teacher_query_length, cfg.teacher_passage_length)
        reranked = write_run(root / "teacher_rerank" / f"{split}.trec", [
            {"query_id": q, "ids": head, "scores": [float(s) for s in row]}
            for q, head, row in zip(queries.ids, heads, scores)], "trec", "teacher")
        out[split] = with_standard_errors(evaluate_files(str(reranked), str(beir), list(cfg.measures), split=split,
                                                         per_query=True), cfg.measures)
    return out


def paired_difference(a: dict, b: dict, measure: str) -> tuple[float, float]:
    """(mean of a - b, its standard error) over the queries both evaluated (the same qrels)."""
    diffs = np.array([a["per_query"][q][measure] - b["per_query"][q][measure] for q in a["per_query"]], np.float64)
    return float(diffs.mean()), float(diffs.std(ddof=1) / math.sqrt(len(diffs)))


def table_markdown(results: dict) -> str:
    """BM25, the teacher's re-ranking and each iteration's student on dev and test, with standard errors."""
    iterations = results["cl_drd"]["iterations"]
    start = iterations["0"]["eval"]
    rows = [("BM25", results["bm25"]), (f"teacher re-ranking the start's top {results['rerank_depth']}",
                                          results["teacher_rerank"])]
    for key in sorted(iterations, key=int):
        if "eval" in iterations[key]:
            stage = iterations[key].get("stage")
            name = "student, start (MiniLM)" if stage is None else (
                f"student, iteration {key} (K={stage['k']}, K'={stage['k_prime']}, N_h={stage['n_hard']}, "
                f"N_s={stage['n_rest']})")
            rows.append((name, iterations[key]["eval"]))
    header = ("| model | dev nDCG@10 | dev RR@10 | test nDCG@10 | test RR@10 | test R@100 | test nDCG@10 - start |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [header]
    for name, ev in rows:
        cells = [f"{ev[s][m]:.3f} ± {ev[s][m + '_se']:.3f}" for s, m in (("dev", "nDCG@10"), ("dev", "RR@10"),
                                                                           ("test", "nDCG@10"), ("test", "RR@10"),
                                                                           ("test", "R@100"))]
        if ev is start:
            cells.append("-")
        else:
            diff, se = paired_difference(ev["test"], start["test"], "nDCG@10")
            cells.append(f"{diff:+.3f} ± {se:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def measured_rates(cl_drd: dict, passages: int) -> dict:
    """Per-example rates of this run's stages (for the cost arithmetic at scale): teacher pairs/s, passages
    encoded/s, training lists/s."""
    seconds = cl_drd["seconds"]
    pairs = sum(s["passages_scored"] for t, row in cl_drd["iterations"].items() for s in row.get("teacher", []))
    teacher_seconds = sum(s["seconds"] for row in cl_drd["iterations"].values() for s in row.get("teacher", []))
    index_keys = [k for k in seconds if k.endswith("_index")]
    lists = sum(row["training"]["steps"] * cl_drd["config"]["batch_size"] for row in cl_drd["iterations"].values()
                if "training" in row and "train_seconds_this_run" in row["training"])
    train_seconds = sum(row["training"]["train_seconds_this_run"] for row in cl_drd["iterations"].values()
                        if "training" in row and "train_seconds_this_run" in row["training"])
    return {"teacher_pairs_per_second": pairs / teacher_seconds if teacher_seconds else None,
            "passages_encoded_per_second": passages * len(index_keys) / sum(seconds[k] for k in index_keys)
            if index_keys else None,
            "training_lists_per_second": lists / train_seconds if train_seconds else None}


def run_cl_drd_example(workdir: str, cfg: ClDrdExampleConfig | None = None,
                       cl_drd_config: ClDrdConfig | None = None, corpus=None) -> dict:
    """Run (or resume) the example in workdir; returns results.json's contents."""
    cfg = cfg or ClDrdExampleConfig()
    # Read before the teacher trains: a training run refuses gin bindings that nothing has read yet.
    cl_drd_config = cl_drd_config or ClDrdConfig()
    job = StageRun(workdir, "cl-drd-example")
    root, results = job.root, job.results
    beir = root / "beir"
    if "collection" not in results:
        collection = BooksCollectionConfig(passages_per_book=cfg.passages_per_book, test_books=cfg.test_books,
                                           dev_books=cfg.dev_books, prefix_words=cfg.prefix_words,
                                           min_continuation_words=cfg.min_continuation_words,
                                           max_continuation_words=cfg.max_continuation_words)
        results["collection"] = job.stage("collection", build_books_collection,
                                          bundled_books() if corpus is None else corpus, beir, collection)
    init = Path(cfg.student) if native.is_checkpoint_dir(cfg.student) else starting_checkpoint(
        "", cfg.student, root, "ClDrdExampleConfig.student")
    if "bm25" not in results:
        results["bm25"] = job.stage("bm25", _bm25, beir, root, cfg)
    teacher = job.stage("teacher", _train_teacher, beir, root, init, cfg)
    cl_cfg = dataclasses.replace(cl_drd_config, corpus=str(beir), student=str(init),
                                 teacher=teacher, eval_split="dev", report_splits=("test",),
                                 measures=tuple(cfg.measures))
    results["cl_drd"] = job.stage("cl_drd", run_cl_drd, str(root / "cl_drd"), cl_cfg)
    results["rerank_depth"] = cfg.rerank_depth
    if "teacher_rerank" not in results:
        results["teacher_rerank"] = job.stage("teacher_rerank", _teacher_reranking, beir, root, teacher,
                                              root / "cl_drd" / "iter0" / "eval", cfg)
    results["rates"] = measured_rates(results["cl_drd"], results["collection"]["passages"])
    (root / TABLE_FILE).write_text(table_markdown(results), encoding="utf-8")
    results = job.finish()
    print(table_markdown(results))
    return results
