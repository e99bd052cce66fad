"""Ablation grids: expand gin overrides into runs (`sweep`) and gather their results into one table (`report`).

A grid file is JSON:

    {"gin_files": ["demo_minilm.gin"],          # shared by every run
     "bindings": ["TrainerConfig.max_minutes = 2"],
     "axes": {"DataConfig.batch_size": [8, 32, 128],
              "ExamplesData.same_document": [true, false]},
     "per_run": {"DataConfig.batch_size=128": ["TrainerConfig.num_chunks = 4"]},
     "job": true}                                 # evaluate with the main job (held-out suffix identification)

Every combination of the axes is one run named after its values, in
WORKDIR/<name>. With "baseline" (one value of every axis) the grid is one
factor at a time instead: the baseline run, then one run per other value of
each axis with the rest at the baseline (1 + sum(len(values) - 1) runs rather
than their product); per_run may also key bindings by "baseline". Locally the
runs go one after another in this process (a finished run is skipped, an
interrupted one resumes); with --tpu_name the command for each run is printed
as a TPU launch (tpu_scripts/tpu.py, dry run).
"""

from __future__ import annotations

import itertools
import json
import shlex
import sys
from pathlib import Path

import numpy as np

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.ablations import write_report
from rankgen_jax.experiments.demo_folder import DemoFolder
from rankgen_jax.experiments.gin_runs import train_from_gin
from rankgen_jax.train.gin_parsing import read_grid_file
from rankgen_jax.train.metric_writers import read_metrics

GRID_KEYS = {"gin_files", "bindings", "axes", "baseline", "per_run", "job"}
BASELINE_RUN = "baseline"


def _gin_value(value) -> str:
    """A JSON value as gin syntax (strings quoted, booleans capitalised)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "(" + ", ".join(_gin_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def read_grid(path: str) -> dict:
    """The grid file (as given or a shipped one, see gin_parsing.find_config_file), checked: errors name the file."""
    grid = read_grid_file(path)
    if not isinstance(grid, dict) or set(grid) - GRID_KEYS:
        raise RankgenError(f"{path}: expected an object with keys among {sorted(GRID_KEYS)}, "
                           f"got {sorted(grid) if isinstance(grid, dict) else type(grid).__name__}")
    axes = grid.get("axes", {})
    if not axes or any(not isinstance(v, list) or not v for v in axes.values()):
        raise RankgenError(f"{path}: 'axes' must map each gin parameter to a non-empty list of values")
    if "baseline" in grid:
        baseline = grid["baseline"]
        if not isinstance(baseline, dict) or set(baseline) != set(axes):
            raise RankgenError(f"{path}: 'baseline' must give one value for each axis {sorted(axes)}")
        for name, value in baseline.items():
            if value not in axes[name]:
                raise RankgenError(f"{path}: baseline {name}={value!r} is not one of the axis values {axes[name]}")
    return grid


def _combinations(grid: dict) -> list[dict]:
    """The axis values of each run: every combination, or the baseline and one change at a time from it."""
    axes = grid["axes"]
    if "baseline" not in grid:
        return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    baseline = grid["baseline"]
    return [dict(baseline)] + [{**baseline, name: value} for name, values in axes.items()
                               for value in values if value != baseline[name]]


def expand_grid(grid: dict) -> list[dict]:
    """One {name, bindings, changed} per run, in a stable order.

    changed: the axes whose value differs from the baseline ({} for the
    baseline run itself; every axis when the grid has no baseline).
    """
    baseline = grid.get("baseline")
    runs = []
    for combo in _combinations(grid):
        keys = [f"{n}={_gin_value(v)}" for n, v in combo.items()]
        bindings = list(grid.get("bindings", [])) + [f"{n} = {_gin_value(v)}" for n, v in combo.items()]
        changed = combo if baseline is None else {n: v for n, v in combo.items() if v != baseline[n]}
        if baseline is not None and not changed:
            keys.append(BASELINE_RUN)
        for key in keys:
            bindings += grid.get("per_run", {}).get(key.replace("'", ""), [])
        shown = combo if baseline is None else changed
        name = "__".join(f"{n.split('.')[-1]}-{str(v).lower()}" for n, v in shown.items()) or BASELINE_RUN
        runs.append({"name": name, "bindings": bindings, "changed": changed})
    return runs


# Written in a run's folder once it trained to the end: a rerun of the sweep skips it.
SWEEP_DONE_FILE = "sweep_done"


def run_workdir(workdir: str, run: dict) -> str:
    """The folder of one run under the sweep's workdir (which may be a gs:// URL: joined as a string)."""
    return f"{str(workdir).rstrip('/')}/{run['name']}"


def train_command(grid: dict, run: dict, workdir: str) -> list[str]:
    """The `rankgen-jax train` argv of one run."""
    argv = ["rankgen-jax", "train", "--workdir", run_workdir(workdir, run)]
    argv += [f"--gin_file={f}" for f in grid.get("gin_files", [])]
    argv += [f"--gin.{b.replace(' = ', '=')}" for b in run["bindings"]]
    return argv + (["--job"] if grid.get("job") else [])


def run_sweep(grid_path: str, workdir: str, tpu_name: str = "", tpu_args: list[str] | None = None,
              report_dir: str = "") -> list[dict]:
    """Run every combination locally (sequentially), or print TPU launch commands.

    report_dir: afterwards, the runs against the baseline run (the grid's, else
    the first) with standard errors, as experiments.ablations.write_report writes them.
    """
    grid = read_grid(grid_path)
    if report_dir and tpu_name:
        raise RankgenError("`report_dir` needs the runs' results here; with a `tpu_name` they run elsewhere",
                           names=("report_dir", "tpu_name"))
    runs = expand_grid(grid)
    print(f"{len(runs)} runs from {grid_path}", file=sys.stderr)
    for run in runs:
        argv = train_command(grid, run, workdir)
        if tpu_name:
            launch = ["python3", "tpu_scripts/tpu.py", "launch", "--dry_run", "--name", tpu_name,
                      *(tpu_args or []), "--", *argv[1:]]
            print(shlex.join(launch))
            continue
        done = RunFolder.at(run_workdir(workdir, run)).file(SWEEP_DONE_FILE)
        if done.is_file():
            print(f"[sweep] {run['name']}: done earlier", file=sys.stderr)
            continue
        print(f"[sweep] {run['name']}: {shlex.join(argv)}", file=sys.stderr, flush=True)
        try:
            result = train_from_gin(grid.get("gin_files", []), run["bindings"], run_workdir(workdir, run),
                                    job=bool(grid.get("job")))
        except RankgenError as e:
            # gin appends "In call to configurable ..." lines to errors raised inside configurables.
            reason = str(e).strip().splitlines()[0]
            raise RankgenError(f"run {run['name']} failed: {reason}; rerun the sweep to resume it") from None
        if result.get("preempted"):
            # Not done: the rerun resumes this run from its checkpoint, and the report waits for every run.
            print(f"[sweep] {run['name']}: stopped by SIGTERM; rerun the sweep to resume it", file=sys.stderr)
            return runs
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(shlex.join(argv) + "\n")
    if report_dir:
        baseline = BASELINE_RUN if "baseline" in grid else runs[0]["name"]
        write_report([{**run, "workdir": run_workdir(workdir, run)} for run in runs], baseline, report_dir)
        print(f"[sweep] report: {report_dir}/ablations.md, .png, .json", file=sys.stderr)
    return runs


def _last(records: list[dict], prefix: str) -> dict:
    """The last value of every `prefix`-ed metric in a metrics.jsonl."""
    out = {}
    for r in records:
        out.update({k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)})
    return out


def collect(workdir: str) -> dict:
    """A run's final numbers: held-out suffix identification (main job) if present, else the last eval metrics."""
    results = DemoFolder(workdir).results_file
    if results.is_file():
        data = json.loads(results.read_text())
        row = {f"{k}": v for k, v in data.get("fine_tuned", {}).items() if k != "n"}
        row.update({f"zero_shot_{k}": v for k, v in data.get("zero_shot", {}).items() if k.startswith("accuracy_2")})
        train = data.get("train", {})
        row.update(steps=train.get("steps"), train_loss=train.get("loss"))
        return {k: v for k, v in row.items() if v is not None}
    metrics = RunFolder.at(workdir).metrics
    if not metrics.is_file():
        raise RankgenError(f"{workdir}: no results.json or metrics.jsonl (not a training workdir?)")
    records = read_metrics(metrics)
    row = {f"eval_{k}": v for k, v in _last(records, "eval/").items() if k in ("loss", "accuracy")}
    row.update(steps=max((r["step"] for r in records), default=0), train_loss=_last(records, "train/").get("loss"))
    return {k: v for k, v in row.items() if v is not None}


def _cell(value) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 1 else f"{value:.3f}"
    return str(value)


def markdown_table(rows: dict[str, dict]) -> str:
    columns = sorted({k for row in rows.values() for k in row}, key=lambda c: (not c.startswith("acc"), c))
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in rows.items():
        cells = [_cell(row.get(c, "")) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(workdirs: list[str], out: str = "", plot: str = "") -> str:
    """One markdown table (and optionally a bar plot of the accuracy columns) over the runs."""
    rows = {Path(w).name or w: collect(w) for w in workdirs}
    table = markdown_table(rows)
    if out:
        Path(out).write_text(table + "\n", encoding="utf-8")
    if plot:
        _plot(rows, plot)
    return table


def _plot(rows: dict[str, dict], path: str) -> None:
    import matplotlib  # only --plot needs matplotlib, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({k for row in rows.values() for k in row if k.startswith(("accuracy", "mrr", "eval_accuracy"))})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) * max(1, len(metrics))), 4))
    width = 0.8 / max(1, len(metrics))
    for i, m in enumerate(metrics):
        ax.bar(np.arange(len(rows)) + i * width, [row.get(m, np.nan) for row in rows.values()], width, label=m)
    ax.set_xticks(np.arange(len(rows)) + width * (len(metrics) - 1) / 2, list(rows), rotation=20, ha="right")
    ax.set(ylim=(0, 1), title="ablation grid")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
