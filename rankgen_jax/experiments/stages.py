"""What the experiment jobs share: the checkpoint they start from, results.json, and stages that resume.

A job (demo.py, pipeline.py, perspectives.py) writes everything under one
workdir. A stage is skipped when its output is there: a file written whole
(data/jsonl.py's write_jsonl renames it into place), or a training folder
marked done (mark_done). The results so far are in WORKDIR/results.json,
saved after every stage, so a rerun resumes where the last one stopped.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import import_checkpoint
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.pretrained import MODEL_IDS, resolve_model

DONE_MARKER = "stage_done"


def starting_checkpoint(init_checkpoint: str, init_from_hf: str, folder: JobFolder,
                        what: str = "init_checkpoint") -> Path:
    """The checkpoint a job starts from: init_checkpoint as given, or init_from_hf imported once into the job's
    folder."""
    if init_checkpoint:
        if not native.is_checkpoint_dir(init_checkpoint):
            raise RankgenError(f"{what}={init_checkpoint!r} is not a rankgen_jax checkpoint "
                               "(make one with `rankgen-jax import`)")
        return Path(init_checkpoint)
    init = folder.init
    if not native.is_checkpoint_dir(init):
        print(f"[job] importing {init_from_hf} -> {init}", file=sys.stderr, flush=True)
        import_checkpoint("hf", resolve_model(init_from_hf), str(init), overwrite=True,
                          model_id=MODEL_IDS.get(init_from_hf))
    return init


def log(tag: str, message: str) -> None:
    """One progress line on stderr, `[tag] message`."""
    print(f"[{tag}] {message}", file=sys.stderr, flush=True)


def is_done(workdir: Path) -> bool:
    """Whether a training stage in workdir finished (mark_done)."""
    return RunFolder.at(workdir).file(DONE_MARKER).is_file()


def mark_done(workdir: Path) -> None:
    RunFolder.at(workdir).file(DONE_MARKER).write_text("done\n")


class StageRun:
    """A resumable job in its folder: its results (results.json), the seconds of each stage, its log lines."""

    def __init__(self, folder: JobFolder, tag: str):
        self.folder = folder
        folder.root.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self.started = time.time()
        self.results = folder.read_results()
        self.seconds = self.results.setdefault("seconds", {})

    def log(self, message: str) -> None:
        log(self.tag, message)

    def save(self) -> None:
        self.folder.write_results(self.results)

    def timed(self, name: str, fn: Callable, *args) -> Any:
        """fn(*args), its seconds added to results["seconds"][name] (a resumed stage adds to its earlier time)."""
        t0 = time.time()
        self.log(f"stage {name}")
        value = fn(*args)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0
        return value

    def stage(self, name: str, fn: Callable, *args) -> Any:
        """timed, then the results saved."""
        value = self.timed(name, fn, *args)
        self.save()
        return value

    def evaluate(self, table: dict, row: str, fn: Callable, *args, describe: Callable[[Any], str] = str) -> None:
        """table[row] = fn(*args) unless the row is there from an earlier run; saved at once."""
        if row in table:
            return
        table[row] = self.timed(f"eval_{row}", fn, *args)
        self.log(f"{row}: {describe(table[row])}")
        self.save()

    def finish(self) -> dict:
        """Record this run's wall time and save; returns the results."""
        self.results["wall_seconds_this_run"] = time.time() - self.started
        self.save()
        return self.results


def _cell(value: Any, width: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}.3f}" if isinstance(value, float) else f"{value:>{width}}"


def aligned_table(rows: dict[str, Sequence[Any]], headers: Sequence[str], name_width: int = 20,
                 cell_width: int = 11) -> str:
    """An aligned text table, one row per model: floats with 3 decimals, None and NaN as '-'."""
    lines = [f"{'model':<{name_width}}" + "".join(f"{h:>{cell_width}}" for h in headers)]
    for name, values in rows.items():
        lines.append(f"{name:<{name_width}}" + "".join(_cell(v, cell_width) for v in values))
    return "\n".join(lines)
