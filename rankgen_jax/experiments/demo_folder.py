"""The main job's workdir, by name: its held-out items, each model's scores of them, the training run, the
comparison table, the curve, the HF export and results.json.

Apart from experiments.demo because that module imports jax, and the ablation report, which reads these
files, runs without it.
"""

from __future__ import annotations

import re
from pathlib import Path

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.experiments.job_folder import JobFolder

# The held-out items (gold candidate first: label 0), and each model's scores of them, as `score` reads and writes.
SUFFIX_ITEMS_FILE = "suffix_eval_items.jsonl"
SCORES_PREFIX = "suffix_eval_scores_"
# The per-genre comparison of the fine-tuned model with the starting model's best prefix length, as Markdown.
COMPARISON_TABLE_FILE = "suffix_eval_by_genre.md"


class DemoFolder(JobFolder):
    """Where the main job keeps each of its outputs under `workdir`."""

    @property
    def items(self) -> Path:
        return self.root / SUFFIX_ITEMS_FILE

    def scores(self, model: str) -> Path:
        """A model's scores of the items: "zero_shot", "zero_shot_<prefix length>", "fine_tuned"."""
        return self.root / f"{SCORES_PREFIX}{model}.jsonl"

    def zero_shot_scores(self) -> dict[int, Path]:
        """Prefix length -> the starting model's scores at it, as the job wrote them."""
        named = re.compile(rf"{SCORES_PREFIX}zero_shot_(\d+)\.jsonl$")
        return {int(m.group(1)): path for path in self.root.iterdir() if (m := named.search(path.name))}

    @property
    def train(self) -> RunFolder:
        return self.model("train")

    @property
    def comparison_table(self) -> Path:
        return self.root / COMPARISON_TABLE_FILE

    @property
    def curve(self) -> Path:
        """The curve's folder: scores per step, curve.{json,md,png}."""
        return self.root / "curve"

    def curve_scores(self, step: int) -> Path:
        """The fine-tuned model's scores of the items at a saved step."""
        return self.curve / f"scores_step{step}.jsonl"

    def curve_report(self, suffix: str) -> Path:
        """The curve as ".json", ".md" or ".png"."""
        return self.curve / f"curve{suffix}"

    @property
    def hf(self) -> Path:
        return self.root / "hf"
