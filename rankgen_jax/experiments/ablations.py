"""Ablation results with their noise: each run's held-out suffix identification against a baseline run's.

Every run of a sweep scores the same held-out items (the main job draws them
with a fixed seed from the held-out documents), so a run is compared with the
baseline item by item: the paired difference d_i = correct_i(run) -
correct_i(baseline) has mean = the accuracy difference and standard error
std(d, ddof=1) / sqrt(n), much smaller than the two accuracies' own binomial
errors combined, since both models find the same items easy or hard. A
difference counts as larger than the noise when it exceeds NOISE_SE standard
errors.

Inputs are the per-item score files the main job writes
(experiments/demo.py, `suffix_eval_scores_{fine_tuned,zero_shot}.jsonl`);
outputs a markdown table with a sentence per axis, a PNG and JSON.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Sequence

import numpy as np

from rankgen_jax.data.jsonl import read_jsonl
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.ranking import top1
from rankgen_jax.experiments.demo_folder import DemoFolder

# A difference is reported as larger than the noise beyond this many standard errors (about a 95% interval).
NOISE_SE = 2.0
ZERO_SHOT_ROW = "zero-shot (starting model)"


def per_item_accuracy(score_lists: Sequence[Sequence[float]]) -> dict[str, np.ndarray]:
    """Per item: the gold (candidate 0) against the first negative, and against all candidates.

    Values are eval.ranking.top1's (1, 0, or 1/(t+1) for a t-way tie at the
    top), so their means are the job's accuracy_2way / accuracy_{C}way.
    """
    way = {len(s) for s in score_lists}
    if len(way) != 1:
        raise RankgenError(f"items have different numbers of candidates {sorted(way)}; expected one list size")
    (way,) = way
    return {"accuracy_2way": np.array([top1(s[:2], 0) for s in score_lists]),
            f"accuracy_{way}way": np.array([top1(s, 0) for s in score_lists])}


def accuracy_se(values_N: np.ndarray) -> tuple[float, float]:
    """(accuracy, binomial standard error sqrt(p(1-p)/n)) of per-item correctness."""
    n = len(values_N)
    if n == 0:
        raise RankgenError("no items to compute an accuracy over")
    p = float(np.mean(values_N))
    return p, float(np.sqrt(p * (1.0 - p) / n))


def paired_difference(run_N: np.ndarray, baseline_N: np.ndarray) -> tuple[float, float]:
    """(mean difference run - baseline, its standard error std(d, ddof=1) / sqrt(n)) over the same items."""
    if len(run_N) != len(baseline_N):
        raise RankgenError(f"paired difference needs the same items: {len(run_N)} against {len(baseline_N)}")
    if len(run_N) < 2:
        raise RankgenError(f"paired difference needs at least 2 items, got {len(run_N)}")
    d_N = np.asarray(run_N, np.float64) - np.asarray(baseline_N, np.float64)
    return float(np.mean(d_N)), float(np.std(d_N, ddof=1) / np.sqrt(len(d_N)))


def read_scored_items(path: Path) -> tuple[list[tuple], list[list[float]]]:
    """(item keys (prefix, candidates), scores) of a per-item score file the main job wrote."""
    records = read_jsonl(path)
    missing = [i for i, r in enumerate(records) if not {"prefix", "candidates", "scores"} <= set(r)]
    if missing:
        raise RankgenError(f"{path}: record {missing[0]} lacks prefix / candidates / scores")
    return [(r["prefix"], tuple(r["candidates"])) for r in records], [r["scores"] for r in records]


def _run_items(workdir: Path, model: str) -> tuple[list[tuple], dict[str, np.ndarray]]:
    path = DemoFolder(workdir).scores(model)
    if not path.is_file():
        raise RankgenError(f"{workdir}: no {path.name} (not a finished run of the main job with suffix_eval_examples > 0?)")
    keys, scores = read_scored_items(path)
    return keys, per_item_accuracy(scores)


def _steps(workdir: Path) -> int | None:
    results = DemoFolder(workdir).results_file
    if not results.is_file():
        return None
    steps = json.loads(results.read_text(encoding="utf-8")).get("train", {}).get("steps")
    return None if steps is None else int(steps)


def compare_runs(runs: Sequence[dict], baseline: str) -> dict:
    """The ablation results: each run's accuracies with SE and paired differences from the baseline.

    runs: {"name", "workdir", "changed" ({axis: value}, {} for the baseline)}.
    The zero-shot starting model, from the first run that evaluated it, is
    compared with the baseline too (does training help at all?).
    """
    by_name = {r["name"]: r for r in runs}
    if baseline not in by_name:
        raise RankgenError(f"baseline run {baseline!r} is not among the runs {sorted(by_name)}")
    base_keys, base_values = _run_items(Path(by_name[baseline]["workdir"]), "fine_tuned")
    metrics = list(base_values)
    rows = []
    entries = [(r["name"], Path(r["workdir"]), "fine_tuned", r.get("changed", {})) for r in runs]
    zero_shot_dir = next((Path(r["workdir"]) for r in runs
                          if DemoFolder(r["workdir"]).scores("zero_shot").is_file()), None)
    if zero_shot_dir is not None:
        entries.append((ZERO_SHOT_ROW, zero_shot_dir, "zero_shot", {}))
    for name, workdir, model, changed in entries:
        keys, values = _run_items(workdir, model)
        if keys != base_keys:
            raise RankgenError(f"{workdir}: its held-out items differ from the baseline's ({by_name[baseline]['workdir']}); "
                               "runs are compared item by item, so they must share the corpus and the eval settings")
        row = {"name": name, "workdir": str(workdir), "changed": changed,
               "steps": _steps(workdir) if model == "fine_tuned" else 0, "metrics": {}}
        for metric in metrics:
            value, se = accuracy_se(values[metric])
            diff, diff_se = paired_difference(values[metric], base_values[metric])
            row["metrics"][metric] = {"value": value, "se": se, "diff": diff, "diff_se": diff_se,
                                      "exceeds_noise": name != baseline and abs(diff) > NOISE_SE * diff_se}
        rows.append(row)
    return {"baseline": baseline, "n": len(base_keys), "metrics": metrics, "noise_se": NOISE_SE, "runs": rows}


def machine_note() -> str:
    """Where and when the report was made, for the table's header."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    # The load tells a reader whether the runs shared the CPUs (their step times, not their results, depend on it).
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
              if line.startswith("model name")]
    cpu = f" ({models[0]})" if models else ""
    return (f"{now}; {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs{cpu}, Python "
            f"{platform.python_version()}; load average {load} when the report was written")


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _changed(row: dict) -> str:
    return ", ".join(f"{k.split('.')[-1]}={_value(v)}" for k, v in row["changed"].items()) or "-"


def markdown_report(comparison: dict, note: str = "") -> str:
    """The table (accuracy ± SE, difference from the baseline ± paired SE, whether it exceeds the noise)
    and one sentence per changed axis."""
    metrics, baseline = comparison["metrics"], comparison["baseline"]
    header = ["run", "changed", "steps"]
    for m in metrics:
        header += [f"{m} ± SE", f"Δ {m} ± SE", f"> {comparison['noise_se']:g} SE"]
    lines = [f"Held-out suffix identification, n = {comparison['n']} items, every run against the baseline "
             f"`{baseline}` item by item (paired SE)." + (f" {note}" if note else ""), "",
             "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in comparison["runs"]:
        cells = [row["name"], _changed(row), "" if row["steps"] is None else str(row["steps"])]
        for m in metrics:
            r = row["metrics"][m]
            cells.append(f"{r['value']:.3f} ± {r['se']:.3f}")
            if row["name"] == baseline:
                cells += ["(baseline)", ""]
            else:
                cells += [f"{r['diff']:+.3f} ± {r['diff_se']:.3f}", "yes" if r["exceeds_noise"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *axis_sentences(comparison)]
    return "\n".join(lines) + "\n"


def axis_sentences(comparison: dict) -> list[str]:
    """One line per axis: each changed value's differences and whether any exceeds the noise."""
    axes: dict[str, list[dict]] = {}
    for row in comparison["runs"]:
        if row["name"] != comparison["baseline"]:
            for axis in row["changed"]:
                axes.setdefault(axis, []).append(row)
    lines = []
    for axis, rows in axes.items():
        parts, beyond = [], []
        for row in rows:
            shown = ", ".join(f"{m} {row['metrics'][m]['diff']:+.3f} ± {row['metrics'][m]['diff_se']:.3f}"
                              for m in comparison["metrics"])
            beyond += [f"{m} ({_value(row['changed'][axis])})" for m in comparison["metrics"]
                       if row["metrics"][m]["exceeds_noise"]]
            parts.append(f"{_value(row['changed'][axis])} ({shown})")
        verdict = (f"exceeds the noise on {', '.join(beyond)}" if beyond
                   else f"is within the noise (no difference beyond {comparison['noise_se']:g} SE)")
        lines.append(f"- `{axis}`: against the baseline, {'; '.join(parts)}: the effect {verdict}.")
    return lines


def plot_report(comparison: dict, path: str | Path) -> None:
    """Per metric, each run's difference from the baseline with a ±NOISE_SE·SE bar."""
    import matplotlib  # slow to import, needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in comparison["runs"] if r["name"] != comparison["baseline"]]
    metrics = comparison["metrics"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 0.5 * len(rows) + 2), squeeze=False)
    y = np.arange(len(rows))
    for ax, m in zip(axes[0], metrics):
        diffs = [r["metrics"][m]["diff"] for r in rows]
        errs = [comparison["noise_se"] * r["metrics"][m]["diff_se"] for r in rows]
        colors = ["tab:red" if r["metrics"][m]["exceeds_noise"] else "tab:gray" for r in rows]
        ax.barh(y, diffs, xerr=errs, color=colors, capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(y, [f"{r['name']}" for r in rows])
        ax.invert_yaxis()
        base = next(r for r in comparison["runs"] if r["name"] == comparison["baseline"])["metrics"][m]["value"]
        ax.set(title=f"{m}: run - baseline ({base:.3f}), ±{comparison['noise_se']:g} SE",
               xlabel=f"difference (n = {comparison['n']}, paired)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ReportFolder:
    """The report's files in the folder a caller names: ablations.md, .png (the plot) and .json."""

    def __init__(self, out_dir: str | Path):
        self.root = Path(out_dir)

    def file(self, suffix: str) -> Path:
        return self.root / f"ablations{suffix}"


def write_report(runs: Sequence[dict], baseline: str, out_dir: str | Path, note: str = "") -> dict:
    """out_dir/ablations.{md,png,json} for the runs; returns the comparison (as the JSON holds it)."""
    comparison = compare_runs(runs, baseline)
    comparison["machine"] = machine_note()
    report = ReportFolder(out_dir)
    report.root.mkdir(parents=True, exist_ok=True)
    report.file(".md").write_text(markdown_report(comparison, note or comparison["machine"]), encoding="utf-8")
    plot_report(comparison, report.file(".png"))
    report.file(".json").write_text(json.dumps(comparison, indent=2) + "\n", encoding="utf-8")
    return comparison
