"""The main job: fine-tune an encoder with RankGen's objective, compare it with its zero-shot self
and the word-overlap baselines on held-out books, plot, and export (what `rankgen-jax train` runs by default)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import gin
import numpy as np
from tqdm import tqdm

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.documents import document_genre
from rankgen_jax.data.example_source import build_examples
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.source_configs import DataConfig
from rankgen_jax.data.sources import corpus_split, example_config_of, training_conventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.ranking import accuracy, mrr, pairwise_accuracy
from rankgen_jax.eval.suffix_comparison import compare_by_genre, comparison_table
from rankgen_jax.experiments.demo_folder import DemoFolder
from rankgen_jax.experiments.stages import log, starting_checkpoint
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.retrieval.sparse import token_overlap_scores, unigram_overlap_scores
from rankgen_jax.train.config import TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.metric_writers import read_metrics


# Word-overlap baselines of suffix identification: this project's F1 and the RankGen paper's precision.
BASELINES = ("unigram", "token_overlap")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What happens around training.

    init_from_hf: an HF folder (or "minilm") imported into WORKDIR/init and
      trained from; "" trains TrainerConfig's model as configured.
    suffix_eval_examples: held-out examples per genre (a document's
      genre is the first folder of its id) for suffix identification (gold vs
      1 and vs `suffix_eval_negatives` InBook negatives); 0 skips it.
    zero_shot: also evaluate the starting model; runs that share it and its
      held-out items (a sweep) need it evaluated once.
    zero_shot_prefix_lengths: the starting model is read with prefixes cut to
      each of these lengths (tokens, keeping the end as training does), and
      the fine-tuned model, read as it was trained, is compared per genre with
      the best of them (eval.suffix_comparison).
    """

    init_from_hf: str = ""
    suffix_eval_examples: int = 150
    suffix_eval_negatives: int = 10
    zero_shot: bool = True
    zero_shot_prefix_lengths: tuple[int, ...] = (32, 64, 128, 256)
    plot: bool = True
    export: bool = True


def held_out_suffix_sets(data: DataConfig, num_examples: int, num_negatives: int, seed: int = 1234) -> list[dict]:
    """Suffix identification items {prefix, candidates (gold first), doc_id, genre} from the held-out
    documents: up to num_examples per genre, drawn from all the examples of that genre's documents."""
    if data.source.kind != "examples":
        raise RankgenError("the job's held-out suffix items are cut from the held-out documents as RankGen examples: "
                           f"DataConfig.source = @ExamplesData(), not @{type(data.source).__name__}()")
    (_, held), _ = corpus_split(data.source)
    examples, _ = build_examples(held, example_config_of(data, num_negatives, seed))
    rng = np.random.default_rng(seed)
    genres = np.array([document_genre(e.doc_id) for e in examples])
    chosen = []
    for genre in sorted(set(genres)):
        rows = np.flatnonzero(genres == genre)
        chosen.extend(rng.choice(rows, size=min(num_examples, len(rows)), replace=False))
    return [{"prefix": examples[i].prefix, "candidates": [examples[i].continuation, *examples[i].negatives],
             "doc_id": examples[i].doc_id, "genre": str(genres[i])} for i in sorted(chosen)]


def suffix_identification(score_lists: list[np.ndarray]) -> dict:
    """Accuracy vs 1 negative (gold = candidate 0, first negative = candidate 1), accuracy / MRR vs all, and the
    RankGen paper's pairwise average (gold vs each negative alone, averaged over the negatives; ties lose)."""
    gold = [0] * len(score_lists)
    two_way = [s[:2] for s in score_lists]
    way = len(score_lists[0])
    return {"n": len(score_lists), "accuracy_2way": accuracy(two_way, gold),
            f"accuracy_{way}way": accuracy(score_lists, gold), f"mrr_{way}way": mrr(score_lists, gold),
            "accuracy_pairwise": pairwise_accuracy(score_lists, gold)}


def read_scores(path: Path) -> list[np.ndarray]:
    """Each item's scores from a file write_scores wrote (a resumed job reads its zero-shot scores back)."""
    return [np.asarray(r["scores"], np.float64) for r in read_jsonl(path)]


def evaluate_model(path: str, items: list[dict], conventions: InputConventions | None = None,
                   scores_out: Path | None = None, step: int | None = None) -> tuple[dict, list[np.ndarray]]:
    """Suffix identification of the model at `path` (a checkpoint folder's latest step, or `step`), read with
    its recorded input conventions (or `conventions`), and its scores; scores_out gets each item with its
    "scores", as `rankgen-jax score` writes them."""
    scores = score_at_prefix_lengths(path, items, conventions, [None], step)[None]
    if scores_out is not None:
        write_scores(scores_out, items, scores)
    return suffix_identification(scores), scores


def score_at_prefix_lengths(path: str, items: list[dict], conventions: InputConventions | None,
                            prefix_lengths: list[int | None], step: int | None = None
                            ) -> dict[int | None, list[np.ndarray]]:
    """Prefix length -> each item's scores by the model at `path` (`step` of a checkpoint folder; None: the
    latest) with prefixes cut to that length (None: its conventions' length). Each distinct candidate is
    encoded once: candidates read the same at every prefix length."""
    model = load_model(path, conventions=None if conventions is None else dataclasses.asdict(conventions), step=step)
    log("job", f"{path}{'' if step is None else f' step {step}'}: {model.conventions_note()}")
    flat = [c for it in items for c in it["candidates"]]
    distinct = list(dict.fromkeys(flat))
    with tqdm(total=len(distinct), desc="encoding candidates", unit="text", file=sys.stderr) as bar:
        distinct_UxD = model.encode(distinct, "suffix", on_batch=bar.update)
    row_of = {text: i for i, text in enumerate(distinct)}
    cand_MxD = distinct_UxD[[row_of[text] for text in flat]]
    bounds = np.cumsum([0] + [len(it["candidates"]) for it in items])
    scores = {}
    for length in prefix_lengths:
        with tqdm(total=len(items), desc=f"encoding prefixes ({length or 'recorded'} tokens)", unit="text",
                  file=sys.stderr) as bar:
            prefix_NxD = model.encode([it["prefix"] for it in items], "prefix", length, on_batch=bar.update)
        # Summed over the last axis as LoadedModel.score does, so perspective heads score per perspective.
        scores[length] = [(cand_MxD[bounds[i] : bounds[i + 1]] * prefix_NxD[i]).sum(-1) for i in range(len(items))]
    return scores


def write_scores(path: Path, items: list[dict], scores: list[np.ndarray]) -> None:
    write_jsonl(path, ({**it, "scores": [float(x) for x in s]} for it, s in zip(items, scores)))


def evaluate_unigram(items: list[dict]) -> dict:
    """This project's unigram-overlap F1 baseline (retrieval.sparse.unigram_overlap_scores)."""
    return suffix_identification([unigram_overlap_scores(it["prefix"], it["candidates"]) for it in items])


def evaluate_token_overlap(items: list[dict]) -> dict:
    """The RankGen paper's token-overlap baseline (retrieval.sparse.token_overlap_scores)."""
    return suffix_identification([token_overlap_scores(it["prefix"], it["candidates"]) for it in items])


def plot_run(workdir: Path, results: dict) -> Path:
    """Training loss and held-out in-batch accuracy over steps; suffix identification of each model as bars."""
    # Heavy, and only needed to plot: imported here.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(RunFolder.at(workdir).metrics)
    train = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    if train:
        steps, values = zip(*train)
        axes[0].plot(steps, values, lw=0.8, alpha=0.5, label="per step")
        window = len(values) // 25
        if window > 1:
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            axes[0].plot(steps[window - 1 :], smooth, lw=2, label=f"mean of {window} steps")
        axes[0].legend()
    axes[0].set(title="training loss (in-batch softmax)", xlabel="step")
    if evals:
        steps, values = zip(*evals)
        axes[1].plot(steps, values, marker="o")
        axes[1].axhline(values[0], ls="--", color="gray", label="step 0 (zero-shot)")
        axes[1].legend()
    axes[1].set(title="held-out in-batch top-1 accuracy", xlabel="step", ylim=(0, 1))
    names = [n for n in BASELINES + ("zero_shot", "fine_tuned") if n in results]
    keys = [k for k in results.get("fine_tuned", results.get("zero_shot", {})) if k.startswith(("accuracy", "mrr"))]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        # .get: results.json of an older run may lack a newer metric.
        axes[2].bar(np.arange(len(keys)) + i * width, [results[name].get(k, np.nan) for k in keys], width, label=name)
    axes[2].set_xticks(np.arange(len(keys)) + width * (len(names) - 1) / 2, keys)
    axes[2].set(title="held-out suffix identification", ylim=(0, 1))
    axes[2].legend()
    fig.tight_layout()
    out = RunFolder.at(workdir).file("demo_results.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_job(workdir: str) -> dict:
    """Import (optional), zero-shot eval, train, fine-tuned eval, plot, export; returns the results."""
    job, trainer, data = JobConfig(), TrainerConfig(), DataConfig()
    folder = DemoFolder(workdir)
    root = folder.root
    if root.exists() and not root.is_dir():
        raise RankgenError(f"`workdir` {workdir}: is a file; the job's workdir is a folder (created when missing)",
                           names=("workdir",))
    root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = folder.read_results()

    if job.init_from_hf:
        init = starting_checkpoint("", job.init_from_hf, folder)
        trainer = dataclasses.replace(trainer, init_checkpoint=str(init))

    items = []
    if job.suffix_eval_examples:
        items = held_out_suffix_sets(data, job.suffix_eval_examples, job.suffix_eval_negatives)
        write_jsonl(folder.items, ({**it, "label": 0} for it in items))
        print(f"[job] {len(items)} held-out suffix identification items ({folder.items})", flush=True)
        results.setdefault("unigram", evaluate_unigram(items))
        results.setdefault("token_overlap", evaluate_token_overlap(items))
        if trainer.init_checkpoint and job.zero_shot and "zero_shot" not in results:
            print("[job] evaluating the starting model (zero-shot) at prefix lengths "
                  f"{list(job.zero_shot_prefix_lengths)}", flush=True)
            # Read as training reads text (which the fine-tuned model records), so the two compare like for like;
            # then also at other prefix lengths, for its best reading.
            lengths = sorted(set(job.zero_shot_prefix_lengths) | {data.prefix_length})
            by_length = score_at_prefix_lengths(trainer.init_checkpoint, items, training_conventions(data), lengths)
            write_scores(folder.scores("zero_shot"), items, by_length[data.prefix_length])
            for length in job.zero_shot_prefix_lengths:
                write_scores(folder.scores(f"zero_shot_{length}"), items, by_length[length])
            results["zero_shot"] = suffix_identification(by_length[data.prefix_length])
        folder.write_results(results)

    print("[job] training", flush=True)
    results["train"] = train(folder.train, trainer=trainer, data=data)
    if results["train"].get("preempted"):
        # A partly trained model is not the job's result: evaluate, plot and export once training has ended.
        folder.write_results(results)
        print(f"[job] stopped by SIGTERM at step {int(results['train']['steps'])} (saved): the same command "
              "resumes training, then evaluates, plots and exports", flush=True)
        return {**results, "preempted": True}
    if items:
        print("[job] evaluating the fine-tuned model", flush=True)
        results["fine_tuned"], tuned = evaluate_model(str(folder.train), items, scores_out=folder.scores("fine_tuned"))
        base_files = {length: folder.scores(f"zero_shot_{length}") for length in job.zero_shot_prefix_lengths}
        # A job resumed from a results.json of an older version may lack the per-length scores.
        if "zero_shot" in results and base_files and all(f.is_file() for f in base_files.values()):
            base = {length: read_scores(f) for length, f in base_files.items()}
            results["by_genre"] = compare_by_genre([it["genre"] for it in items], tuned, base)
            results["by_genre_table"] = comparison_table(results["by_genre"], data.prefix_length)
            folder.comparison_table.write_text(results["by_genre_table"], encoding="utf-8")
    if job.plot:
        results["plot"] = str(plot_run(folder.train, results))
    # Saved before the export, whose model card reports them.
    folder.write_results(results)
    if job.export:
        export_hf(str(folder.train), str(folder.hf), overwrite=True)
        results["export"] = str(folder.hf)
    results["job_seconds"] = time.time() - started
    folder.write_results(results)
    _print_summary(results, root)
    return results


def _print_summary(results: dict, root: Path) -> None:
    lines = ["", "held-out suffix identification (gold continuation vs InBook negatives):"]
    for name in BASELINES + ("zero_shot", "fine_tuned"):
        if name in results:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in results[name].items() if k != "n")
            lines.append(f"  {name:<13} {shown}  (n={results[name]['n']})")
    if "by_genre" in results:
        lines += ["", "per genre: fine-tuned against the starting model's best prefix length "
                  "(accuracy ± standard error; gain ± paired standard error):",
                  results["by_genre_table"].rstrip()]
    lines.append(f"outputs: {root}/ (train/ = checkpoints, metrics.jsonl, tensorboard/; results.json; "
                 f"{results.get('plot', 'no plot')}; HF export {results.get('export', 'skipped')})")
    print("\n".join(lines), file=sys.stdout, flush=True)
