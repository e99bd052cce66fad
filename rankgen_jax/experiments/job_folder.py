"""An experiment job's workdir as one object: its results.json, the checkpoint it imported, its trained models.

Each job names the rest of its outputs on a subclass of JobFolder (DemoFolder, ClaimFolder, PipelineFolder, ...),
so the job's functions ask the folder for a file and never join paths themselves. Apart from stages.py because
the ablation report reads a job's files without jax.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rankgen_jax.checkpoints.run_folder import JOB_RESULTS_FILE, RunFolder

# The starting checkpoint a job imported from HF (experiments/stages.py's starting_checkpoint).
INIT_DIR = "init"


class JobFolder:
    """Where a job keeps its outputs under `workdir`; a path-like, so it goes wherever a folder path does."""

    def __init__(self, workdir: str | os.PathLike):
        self.root = Path(workdir)

    def __str__(self) -> str:
        return str(self.root)

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    @property
    def results_file(self) -> Path:
        return self.root / JOB_RESULTS_FILE

    def read_results(self) -> dict:
        """results.json, or {} before the first stage."""
        path = self.results_file
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def write_results(self, results: dict) -> None:
        self.results_file.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    @property
    def init(self) -> Path:
        """The starting checkpoint, when the job imported it from HF."""
        return self.root / INIT_DIR

    def model(self, name: str) -> RunFolder:
        """The training run (its checkpoints and records) of the model the job calls `name`."""
        return RunFolder.at(self.root / name)
