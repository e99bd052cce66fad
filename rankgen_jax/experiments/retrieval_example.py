"""A small end-to-end retrieval example on the bundled books: BEIR folder -> train (in-batch) -> mine BM25 hard
negatives -> train with hard negatives -> for each model: index (2 shards) -> search (TREC run) -> evaluate.

The collection (data/beir_books.py) has prefixes as queries and their gold continuations as passages; the test
split's books are not trained on. Three models are compared on the test qrels: the starting model (zero-shot
MiniLM by default), the model trained with in-batch negatives only, and the model trained from the same start
with `hard_negatives` BM25-mined negatives per query as well. Each stage resumes from its output
(stages.StageRun); results.json and retrieval_table.md hold the table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from rankgen_jax.checkpoints.run_folder import RETRIEVAL_METRIC_PREFIX, RunFolder
from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
from rankgen_jax.data.documents import Document, require_documents
from rankgen_jax.data.source_configs import DataConfig, RetrievalData
from rankgen_jax.eval.retrieval_metrics import evaluate_files, evaluate_run
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.pretrained import MINILM
from rankgen_jax.experiments.ablations import paired_difference
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import StageRun, aligned_table, is_done, mark_done, starting_checkpoint
from rankgen_jax.resources import BUNDLED_CORPUS
from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, index_written, search_queries
from rankgen_jax.retrieval.mining import NegativePicking, TrainingQuerySource, mine_negatives
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.metric_writers import read_metrics
from rankgen_jax.train.retrieval_eval import EvalSet, RetrievalEvalConfig
from rankgen_jax.train.optimizers import OptimizerConfig

MEASURES = ("nDCG@10", "RR@10", "R@100")
MODELS = ("zero_shot", "in_batch", "hard_negatives")
# The third trained model, with a Matryoshka loss (RetrievalExampleConfig.matryoshka_dims).
MATRYOSHKA_MODEL = "in_batch_matryoshka"
NUM_SHARDS = 2
TABLE_FILE = "retrieval_table.md"


class RetrievalExampleFolder(JobFolder):
    """Where the example keeps each of its outputs under `workdir`: the BEIR collection, the mined negatives, the
    two training runs (train_in_batch, train_hard_negatives), and per evaluated model its index shards and run."""

    @property
    def beir(self) -> Path:
        return self.root / "beir"

    def mined(self, split: str) -> Path:
        """The BM25 negatives mined for a split's queries."""
        return self.root / f"bm25_negatives_{split}.jsonl"

    def index(self, model: str) -> Path:
        """The folder of the shards of the index `model` made (index_shard)."""
        return self.root / model / "index"

    def index_shard(self, model: str, shard: int) -> Path:
        return self.index(model) / f"shard{shard}"

    def run_file(self, model: str) -> Path:
        """`model`'s TREC run on the test queries."""
        return self.root / model / "test.trec"

    @property
    def table(self) -> Path:
        return self.root / TABLE_FILE


@dataclasses.dataclass(frozen=True)
class RetrievalExampleConfig:
    """init_from_hf: an HF folder or "minilm", imported once; init_checkpoint (a rankgen_jax checkpoint) wins
    when set. Both trained models start from it and take `train_steps` steps of `batch_size` queries."""

    init_from_hf: str = MINILM
    init_checkpoint: str = ""
    collection: BooksCollectionConfig = BooksCollectionConfig(dev_books=1)
    train_steps: int = 60
    batch_size: int = 16
    hard_negatives: int = 1
    mining_depth: str = "3-50"
    mined_negatives: int = 8
    prefix_length: int = 128
    continuation_length: int = 96
    learning_rate: float = 5e-5
    logit_scale: float = 20.0
    k: int = 100
    encode_batch_size: int = 64
    # Every this many steps both trained models are measured on the dev book's queries during training
    # (train/retrieval_eval.py); 0, or a collection without dev books, measures nothing.
    eval_every: int = 20
    # A third model, trained as the in-batch one but with a Matryoshka loss on these first dimensions (MiniLM's
    # 384, then halves), and every model's test nDCG@10 with its vectors cut to each; () trains no third model.
    matryoshka_dims: tuple[int, ...] = (384, 192, 96, 48, 24)


def _train(workdir: RunFolder, init: Path, config: RetrievalExampleConfig, data: DataConfig,
           dev: RetrievalEvalConfig, matryoshka_dims: tuple[int, ...] = ()) -> dict:
    if is_done(workdir):
        return {}
    trainer = TrainerConfig(num_steps=config.train_steps, log_every=10, eval_every=config.eval_every if dev.sets else 0,
                            checkpoint_every=config.train_steps, init_checkpoint=str(init), async_checkpoints=False)
    optimizer = OptimizerConfig(name="adamw", learning_rate=config.learning_rate, warmup_steps=5, weight_decay=0.01)
    loss = LossConfig(name="in_batch_softmax", logit_scale=config.logit_scale, matryoshka_dims=matryoshka_dims)
    metrics = train(workdir, trainer=trainer, data=data, loss=loss, optimizer=optimizer, retrieval=dev)
    mark_done(workdir)
    return metrics


def _by_dimension(model: str, beir: Path, config: RetrievalExampleConfig) -> dict[str, dict]:
    """Test nDCG@10 with the vectors cut to each of matryoshka_dims (the first: the model's whole vector):
    {dimension: {"mean", "per_query": {qid: value}}}."""
    full, *cuts = config.matryoshka_dims
    test = EvalSet.from_beir(beir, "test", "test")
    runs = test.runs(load_model(model), RetrievalEvalConfig(measures=("nDCG@10",), dims=tuple(cuts),
                                                            encode_batch_size=config.encode_batch_size))
    out = {}
    for dim, run in runs.items():
        measured = evaluate_run(run, test.qrels, ["nDCG@10"], per_query=True)
        out[str(dim or full)] = {"mean": measured["nDCG@10"],
                                 "per_query": {q: v["nDCG@10"] for q, v in measured["per_query"].items()}}
    return out



def dev_curve(workdir: RunFolder) -> dict:
    """The dev measures logged during training, by step, and the seconds they took."""
    rows = [r for r in read_metrics(workdir.metrics) if any(k.startswith(RETRIEVAL_METRIC_PREFIX) for k in r)]
    cut = len(RETRIEVAL_METRIC_PREFIX)
    return {int(r["step"]): {k[cut:]: v for k, v in r.items() if k.startswith(RETRIEVAL_METRIC_PREFIX)} for r in rows}


def _index_search_evaluate(model: str, folder: RetrievalExampleFolder, name: str,
                           config: RetrievalExampleConfig) -> dict:
    beir = folder.beir
    for shard in range(NUM_SHARDS):
        out = folder.index_shard(name, shard)
        if not index_written(out):
            index_corpus(
                model,
                str(beir),
                str(out),
                encoding=TextEncoding("suffix", batch_size=config.encode_batch_size),
                num_shards=NUM_SHARDS,
                shard_index=shard,
                overwrite=True,
                progress=False,
            )
    run = folder.run_file(name)
    search_queries(
        model,
        str(folder.index(name)),
        str(beir),
        config.k,
        encoding=TextEncoding("prefix", batch_size=config.encode_batch_size),
        split="test",
        out_path=str(run),
        out_format="trec",
        progress=False,
    )
    return {**evaluate_files(str(run), str(beir), list(MEASURES), split="test"), "run": str(run)}


def table_markdown(results: dict) -> str:
    lines = ["| model | " + " | ".join(MEASURES) + " |", "| --- |" + " ---: |" * len(MEASURES)]
    for name in (*MODELS, MATRYOSHKA_MODEL):
        if name in results.get("test", {}):
            row = results["test"][name]
            lines.append(f"| {name} | " + " | ".join(f"{row[m]:.3f}" for m in MEASURES) + " |")
    curves = results.get("dev_curve", {})
    if curves:
        steps = sorted({int(step) for curve in curves.values() for step in curve})
        lines += ["", "Dev nDCG@10 measured during training (the dev book's queries, the whole corpus):", "",
                  "| model | " + " | ".join(f"step {step}" for step in steps) + " |",
                  "| --- |" + " ---: |" * len(steps)]
        for name, curve in curves.items():
            by_step = {int(step): values for step, values in curve.items()}
            cells = [next(v for k, v in by_step[step].items() if k.endswith("/nDCG@10")) if step in by_step
                     else None for step in steps]
            lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
    by_dim = results.get("dimensions", {})
    if by_dim:
        dims = list(next(iter(by_dim.values())))
        lines += ["", "Test nDCG@10 with each vector cut to its first d dimensions (d = the whole vector first); "
                  "the Matryoshka model's paired difference from the in-batch one, ± its standard error over the "
                  "test queries:", "",
                  "| model | " + " | ".join(f"d = {d}" for d in dims) + " |", "| --- |" + " ---: |" * len(dims)]
        lines += [f"| {name} | " + " | ".join(f"{row[d]['mean']:.3f}" for d in dims) + " |"
                  for name, row in by_dim.items()]
        if MATRYOSHKA_MODEL in by_dim and "in_batch" in by_dim:
            cells = []
            for d in dims:
                ours, base = by_dim[MATRYOSHKA_MODEL][d]["per_query"], by_dim["in_batch"][d]["per_query"]
                queries = sorted(ours)  # both: every test query
                cells.append("{:+.3f} ± {:.3f}".format(*paired_difference(np.array([ours[q] for q in queries]),
                                                                          np.array([base[q] for q in queries]))))
            lines.append(f"| {MATRYOSHKA_MODEL} - in_batch | " + " | ".join(cells) + " |")
    for name, cost in results.get("dev_eval_cost", {}).items():
        lines.append(f"\n{name}: {cost['evaluations']} dev evaluations took {cost['seconds']:.1f} s, "
                     f"{cost['share']:.1%} of its {cost['train_seconds']:.0f} s of training.")
    return "\n".join(lines) + "\n"


# The example's collection: the bundled novels it was built and measured on, not the corpus's other kinds.
BOOK_FOLDERS = ("austen/", "botchan/")


def bundled_books() -> list[Document]:
    """The documents of BOOK_FOLDERS in the bundled corpus, with their corpus ids ("austen/emma.txt")."""
    documents, _ = require_documents(BUNDLED_CORPUS)
    return [d for d in documents if d.id.startswith(BOOK_FOLDERS)]


def run_retrieval_example(workdir: str, config: RetrievalExampleConfig = RetrievalExampleConfig(),
                          corpus: str | Path | None = None) -> dict:
    """Run (or resume) the example in workdir on `corpus` (default: bundled_books()); returns results.json's
    contents."""
    folder = RetrievalExampleFolder(workdir)
    job = StageRun(folder, "retrieval-example")
    results, beir = job.results, folder.beir
    if "collection" not in results:
        results["collection"] = job.stage("collection", build_books_collection,
                                          bundled_books() if corpus is None else corpus, beir, config.collection)
    init = starting_checkpoint(config.init_checkpoint, config.init_from_hf, folder)
    shared = dict(batch_size=config.batch_size, prefix_length=config.prefix_length)
    dev = RetrievalEvalConfig(sets=(f"{beir}@dev",) if config.eval_every and config.collection.dev_books else (),
                              encode_batch_size=config.encode_batch_size)
    # The held-out loss, logged beside the dev measures, is the dev split's too: nothing in training reads test.
    held_out = "dev" if dev.sets else "test"
    reading = dict(continuation_length=config.continuation_length, prefix_keep="end", split="train",
                   eval_split=held_out)
    trained = {}
    in_batch = DataConfig(RetrievalData(**reading, retrieval_corpus=str(beir), hard_negatives=0), **shared)
    trained["in_batch"] = job.stage("train_in_batch", _train, folder.model("train_in_batch"), init, config, in_batch,
                                    dev)
    mined = {}
    for split in ("train", held_out):
        mined[split] = folder.mined(split)
        if f"mining_{split}" not in results:
            results[f"mining_{split}"] = job.stage(
                f"mine_{split}",
                lambda out, s: mine_negatives(
                    out,
                    str(beir),
                    TrainingQuerySource(queries=str(beir), qrels=str(beir), split=s),
                    picking=NegativePicking(config.mining_depth, config.mined_negatives),
                    progress=False,
                ),
                str(mined[split]),
                split,
            )
    hard = DataConfig(RetrievalData(**reading, train_file=str(mined["train"]), eval_file=str(mined[held_out]),
                                    qrels=str(beir), hard_negatives=config.hard_negatives), **shared)
    trained["hard_negatives"] = job.stage("train_hard_negatives", _train, folder.model("train_hard_negatives"), init,
                                          config, hard, dev)
    if config.matryoshka_dims:
        trained["in_batch_matryoshka"] = job.stage(
            "train_in_batch_matryoshka", _train, folder.model("train_in_batch_matryoshka"), init, config, in_batch,
            dev, config.matryoshka_dims)
    if dev.sets:
        for name in trained:
            curve = dev_curve(folder.model(f"train_{name}"))
            results.setdefault("dev_curve", {})[name] = curve
            seconds = trained[name].get("seconds")
            if seconds:  # this run trained it (not an earlier one): the evaluation's cost
                spent = sum(row["seconds"] for row in curve.values())
                results.setdefault("dev_eval_cost", {})[name] = {
                    "evaluations": len(curve), "seconds": spent, "train_seconds": seconds,
                    "share": spent / seconds}
    models = {"zero_shot": str(init), **{name: str(folder.model(f"train_{name}")) for name in trained}}
    table = results.setdefault("test", {})
    for name, model in models.items():
        job.evaluate(table, name, _index_search_evaluate, model, folder, name, config,
                     describe=lambda r: ", ".join(f"{m} {r[m]:.3f}" for m in MEASURES))
    if config.matryoshka_dims:
        by_dim = results.setdefault("dimensions", {})
        for name in ("zero_shot", "in_batch", "in_batch_matryoshka"):
            job.evaluate(by_dim, name, _by_dimension, models[name], beir, config,
                         describe=lambda r: ", ".join(f"{d}: {v['mean']:.3f}" for d, v in r.items()))
    folder.table.write_text(table_markdown(results), encoding="utf-8")
    results = job.finish()
    print(aligned_table({n: [table[n][m] for m in MEASURES] for n in models}, MEASURES, name_width=20))
    print(f"(test split: {results['collection']['test_queries']} queries over {results['collection']['passages']} "
          f"passages; {folder.table})")
    return results
