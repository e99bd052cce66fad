"""Held-out suffix identification against minutes of training (`rankgen-jax demo-curve`).

Reads a finished demo job's folder (`rankgen-jax train`: its held-out items, the
starting model's scores at each prefix length, the training run's saved steps
and metrics), scores the items with every saved step, read as it was trained,
and compares each step per genre with the best zero-shot reading of the
starting model, as the job's own report does for its last step
(eval.suffix_comparison). A step's minutes are the training time the trainer
logged at it (`train/elapsed_seconds`, counted as the time budget counts it),
so a row reads as "a demo with this budget": the schedule is constant after
warm-up and the data order is fixed by the seed, so a shorter run is the
longer one's prefix.

Writes WORKDIR/curve/: scores of each step (a rerun reads them back instead of
scoring again), curve.json, curve.md and curve.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rankgen_jax.checkpoints import native
from rankgen_jax.data.jsonl import read_jsonl
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.suffix_comparison import compare_by_genre
from rankgen_jax.experiments.demo import evaluate_model, read_scores
from rankgen_jax.experiments.demo_folder import DemoFolder
from rankgen_jax.train.metric_writers import read_metrics


def zero_shot_scores(folder: DemoFolder) -> dict[int, list[np.ndarray]]:
    """Prefix length -> the starting model's scores of each item, from the job's files."""
    found = folder.zero_shot_scores()
    if not found:
        raise RankgenError(f"{folder}: no {folder.scores('zero_shot_<length>').name} files: the curve compares with "
                           "the starting model's readings, which a job writes when it starts from a pretrained "
                           "model (JobConfig.zero_shot) with zero_shot_prefix_lengths")
    return {length: read_scores(found[length]) for length in sorted(found)}


def elapsed_minutes(metrics_path: Path) -> dict[int, float]:
    """Step -> minutes of training the trainer logged at it (the last record of a step wins: a resumed run
    logs its steps again)."""
    return {r["step"]: r["train/elapsed_seconds"] / 60.0 for r in read_metrics(metrics_path)
            if "train/elapsed_seconds" in r}


def run_curve(workdir: str, steps: list[int] | None = None) -> dict:
    """Score the job's held-out items with each saved step (or `steps`) and compare per genre; returns and
    writes {"points": [{"step", "minutes", "clear", "rows", "by_genre"}], "first_all_clear": step or None}."""
    folder = DemoFolder(workdir)
    items_path, train_dir = folder.items, folder.train
    if not items_path.is_file():
        raise RankgenError(f"{items_path}: no held-out items; run the demo job (rankgen-jax train --job) first")
    if not native.is_checkpoint_dir(train_dir):
        raise RankgenError(f"{train_dir}: not a training run's checkpoint folder")
    items = [{k: v for k, v in it.items() if k != "label"} for it in read_jsonl(items_path)]
    # Items written by earlier versions name the genre "kind".
    genres = [it["genre"] if "genre" in it else it["kind"] for it in items]
    base = zero_shot_scores(folder)
    saved = sorted(native.step_manager(train_dir).all_steps())
    if steps is None:
        steps = saved
    missing = sorted(set(steps) - set(saved))
    if missing:
        raise RankgenError(f"{train_dir}: no saved steps {missing} (saved: {saved}); keep more with "
                           "TrainerConfig.keep_checkpoints")
    minutes = elapsed_minutes(train_dir.metrics)
    folder.curve.mkdir(exist_ok=True)
    points = []
    for step in sorted(steps):
        scores_path = folder.curve_scores(step)
        tuned = read_scores(scores_path) if scores_path.is_file() else None
        if tuned is None or len(tuned) != len(items):
            print(f"[curve] scoring {len(items)} items with step {step}", file=sys.stderr, flush=True)
            _, tuned = evaluate_model(str(train_dir), items, scores_out=scores_path, step=step)
        report = compare_by_genre(genres, tuned, base)
        rows = [row for entry in report.values() for name, row in entry.items() if name != "n"]
        points.append({"step": step, "minutes": minutes.get(step), "clear": sum(r["clear"] for r in rows),
                       "rows": len(rows), "by_genre": report})
    first = next((p["step"] for p in points if p["clear"] == p["rows"]), None)
    result = {"points": points, "first_all_clear": first}
    folder.curve_report(".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    table = curve_table(result)
    folder.curve_report(".md").write_text(table, encoding="utf-8")
    plot_curve(result, folder.curve_report(".png"))
    print(table, flush=True)
    return result


def curve_table(result: dict) -> str:
    """Markdown: one row per step; per genre and measure the fine-tuned accuracy and its gain over the best
    zero-shot reading ± paired standard error, starred where the gain exceeds two of them."""
    points = result["points"]
    columns = [(genre, name) for genre, entry in points[0]["by_genre"].items() for name in entry if name != "n"]
    head = ["step", "minutes"] + [f"{genre} {name}" for genre, name in columns] + ["> 2 SE"]
    best = ["best zero-shot", ""] + [
        f"{row['best_zero_shot']['accuracy']:.3f} (@{row['best_length']})"
        for row in (points[0]["by_genre"][genre][name] for genre, name in columns)] + [""]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(best) + " |"]
    for p in points:
        cells = [str(p["step"]), "" if p["minutes"] is None else f"{p['minutes']:.1f}"]
        for genre, name in columns:
            row = p["by_genre"][genre][name]
            cells.append(f"{row['fine_tuned']['accuracy']:.3f} ({row['gain']:+.3f} ± {row['gain_se']:.3f})"
                         + (" *" if row["clear"] else ""))
        cells.append(f"{p['clear']}/{p['rows']}")
        lines.append("| " + " | ".join(cells) + " |")
    first = result["first_all_clear"]
    if first is None:
        lines += ["", "No saved step has every row's gain over two standard errors.", ""]
    else:
        lines += ["", f"Every row's gain is over two standard errors first at step {first}.", ""]
    return "\n".join(lines)


def plot_curve(result: dict, path: Path) -> None:
    """Fine-tuned accuracy ± SE against minutes (steps where minutes are unknown), one line per genre, and each
    genre's best zero-shot reading as a dashed line; one panel per measure."""
    # Heavy, and only needed to plot: imported here.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    first = points[0]["by_genre"]
    names = [name for name in next(iter(first.values())) if name != "n"]
    by_time = all(p["minutes"] is not None for p in points)
    x = [p["minutes"] if by_time else p["step"] for p in points]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        for i, genre in enumerate(first):
            color = f"C{i}"
            rows = [p["by_genre"][genre][name] for p in points]
            ax.errorbar(x, [r["fine_tuned"]["accuracy"] for r in rows], yerr=[r["fine_tuned"]["se"] for r in rows],
                        marker="o", ms=3, capsize=2, color=color, label=f"{genre} fine-tuned")
            ax.axhline(rows[0]["best_zero_shot"]["accuracy"], ls="--", lw=1, color=color,
                       label=f"{genre} best zero-shot (@{rows[0]['best_length']})")
        ax.set(title=f"held-out suffix identification, {name}", xlabel="minutes of training" if by_time else "step",
               ylabel="accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
