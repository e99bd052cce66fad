"""The RankGen paper's generation grid (App. A.3) as a sweep: MAUVE and time per (rerank length, beams, samples).

A grid file (JSON; the shipped ones are in gin_configs/generation/):

    {"rerank_lengths": [5, 10, 20, 50, "max"],      # L: tokens between re-rankings; "max": the whole budget
     "samples": [[1, 1], [1, 5], [1, 10], [2, 5]],  # [B, N]: B beams of N samples, B x N samples a round
     "full_rerank_samples": [1, 5, 10, 20, 40],     # extra runs at L = max, B = 1: over-generate and re-rank
     "seeds": [0, 1, 2, 3, 4],                      # generation seeds: MAUVE's runs (mean +- std)
     "mauve_seeds": [25],                           # k-means seeds (mauve-text's default)
     "max_new_tokens": 128, "top_p": 0.9,           # optional; the paper's protocol by default
     "prefixes": 0}                                 # optional: the first N input records (0: all)

Every L with every [B, N] is one configuration, plus the full re-ranking
ones. B = N = 1 samples plainly (nothing to re-rank) at any L, so it runs once,
as L = max ("nucleus"); an L at or above the budget is "max". Each
configuration generates the input's prefixes once per seed
(WORKDIR/<name>/seed<k>.jsonl, `generate`'s output; a finished file is not
redone, so a rerun resumes), then its metrics (WORKDIR/<name>/metrics.json):
MAUVE of each seed's generations against the records' reference field at
every k-means seed, as `generation-metrics` computes it (cut at sentence
ends, mean and ddof-0 std), the words MAUVE read on both sides, the paper's
rep, and the mean seconds per generation (sampling plus re-ranking, as the
paper's Figure 7: per prefix, on this machine). The table of all
configurations is WORKDIR/generation_grid.md (and .json).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.generation_metrics import MAUVE_SEED, MauveSettings, generation_metrics, mauve_report
from rankgen_jax.lm.generation import (MAX_NEW_TOKENS, Decoding, RerankerSpec, SearchSettings, make_reranker,
                                       read_prefix_records, write_generations)
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.lm.scoring import load_causal_lm
from rankgen_jax.train.gin_parsing import read_grid_file

GRID_KEYS = {"rerank_lengths", "samples", "full_rerank_samples", "seeds", "mauve_seeds", "max_new_tokens", "top_p",
             "prefixes"}
MAX = "max"


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """One point of the grid: L tokens between re-rankings (None: the whole budget), B beams of N samples."""

    rerank_length: int | None
    beam_size: int
    num_samples: int

    @property
    def name(self) -> str:
        length = MAX if self.rerank_length is None else str(self.rerank_length)
        return f"L{length}_B{self.beam_size}_N{self.num_samples}"


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_generation_grid(path: str) -> dict:
    """The grid file (as given or a shipped one), checked: errors name the file and the key."""
    grid = read_grid_file(path)
    if not isinstance(grid, dict) or set(grid) - GRID_KEYS or "seeds" not in grid:
        raise RankgenError(f"{path}: expected an object with 'seeds' and keys among {sorted(GRID_KEYS)}")
    grid = {"rerank_lengths": [], "samples": [], "full_rerank_samples": [], "mauve_seeds": [MAUVE_SEED],
            "max_new_tokens": MAX_NEW_TOKENS, "top_p": 0.9, "prefixes": 0, **grid}
    problems = []
    if any(not (_positive_int(v) or v == MAX) for v in grid["rerank_lengths"]):
        problems.append("'rerank_lengths' must be positive integers or \"max\"")
    if any(not (isinstance(v, list) and len(v) == 2 and all(_positive_int(x) for x in v)) for v in grid["samples"]):
        problems.append("'samples' must be [B, N] pairs of positive integers")
    if bool(grid["rerank_lengths"]) != bool(grid["samples"]):
        problems.append("'rerank_lengths' and 'samples' go together")
    if any(not _positive_int(v) for v in grid["full_rerank_samples"]):
        problems.append("'full_rerank_samples' must be positive integers")
    for key in ("seeds", "mauve_seeds"):
        if not grid[key] or any(isinstance(v, bool) or not isinstance(v, int) for v in grid[key]):
            problems.append(f"'{key}' must be a non-empty list of integers")
    if not _positive_int(grid["max_new_tokens"]) or not isinstance(grid["prefixes"], int) or grid["prefixes"] < 0:
        problems.append("'max_new_tokens' must be a positive integer and 'prefixes' >= 0")
    if not grid["samples"] and not grid["full_rerank_samples"]:
        problems.append("no configuration: give 'rerank_lengths' with 'samples', or 'full_rerank_samples'")
    if problems:
        raise RankgenError(f"{path}: " + "; ".join(problems))
    return grid


def grid_configs(grid: dict) -> list[GenerationConfig]:
    """The distinct configurations of a grid, in grid order (see the module docstring)."""
    budget = grid["max_new_tokens"]
    configs: list[GenerationConfig] = []

    def add(length, beams: int, samples: int) -> None:
        length = None if length == MAX or length >= budget or beams == samples == 1 else length
        config = GenerationConfig(length, beams, samples)
        if config not in configs:
            configs.append(config)

    for length in grid["rerank_lengths"]:
        for beams, samples in grid["samples"]:
            add(length, beams, samples)
    for samples in grid["full_rerank_samples"]:
        add(MAX, 1, samples)
    return configs


class SweepFolder(JobFolder):
    """Where a sweep keeps its outputs under `workdir`: per configuration, each seed's generations and the
    metrics; then the grid's table (Markdown) and its rows (JSON)."""

    def generations(self, config: str, seed: int) -> Path:
        return self.root / config / f"seed{seed}.jsonl"

    def metrics(self, config: str) -> Path:
        return self.root / config / "metrics.json"

    @property
    def table(self) -> Path:
        return self.root / "generation_grid.md"

    @property
    def rows(self) -> Path:
        return self.root / "generation_grid.json"


def _finished(path: Path, count: int) -> bool:
    """Whether a seed's file holds all `count` records (a killed run leaves a .partial file instead)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip()) == count


def run_generation_sweep(grid_path: str, lm_path: str, input_path: str, workdir: str, *,
                         reranker: RerankerSpec = RerankerSpec(), mauve: MauveSettings | None = None,
                         device: str = "cpu", prefix_batch: int = 8, max_batch_rows: int = 64,
                         progress: bool = True) -> dict:
    """Generate every configuration of the grid with every seed, then its metrics and the table (see above);
    MAUVE with `mauve` (at the grid's k-means seeds)."""
    grid = read_generation_grid(grid_path)
    reranker.check()
    if mauve is not None:
        mauve.check()
    reference_field = mauve.reference_field if mauve is not None else None
    records, bad = read_prefix_records(input_path)
    if grid["prefixes"]:
        records = records[: grid["prefixes"]]
    if reference_field and any(not isinstance(r.get(reference_field), str) for r in records):
        raise RankgenError(f"input {input_path}: every record needs a string {reference_field!r} for MAUVE")
    if not records:
        raise RankgenError(f"input {input_path}: no record with a prefix")
    folder = SweepFolder(workdir)
    configs = grid_configs(grid)
    print(f"generation-sweep: {len(configs)} configurations x {len(grid['seeds'])} seeds on {len(records)} "
          f"prefixes ({bad} bad lines skipped) -> {folder}", file=sys.stderr)
    lm = load_causal_lm(lm_path, device)
    scorer = make_reranker(reranker, lm)
    # The generating LM doubles as MAUVE's feature model when named for both (one load, not two).
    feature_lm = None if mauve is None else lm if mauve.model == lm_path else load_causal_lm(mauve.model, device)
    decoding = Decoding("nucleus", top_p=grid["top_p"])
    rows = {}
    for config in configs:
        runs = []
        for seed in grid["seeds"]:
            path = folder.generations(config.name, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            if not _finished(path, len(records)):
                partial = path.with_name(path.name + ".partial")
                print(f"[generation-sweep] {config.name} seed {seed}", file=sys.stderr, flush=True)
                # One sample has nothing to re-rank: plain nucleus sampling (the same text as beam with B = N = 1).
                plain = config.beam_size == config.num_samples == 1
                settings = SearchSettings(config.beam_size, config.num_samples,
                                          config.rerank_length or grid["max_new_tokens"], grid["max_new_tokens"],
                                          decoding, seed=seed, max_batch_rows=max_batch_rows)
                write_generations(lm, records, partial, "nucleus" if plain else "beam", settings, reranker=scorer,
                                  reranker_name=None if plain else reranker.name, prefix_batch=prefix_batch,
                                  progress=progress)
                partial.replace(path)
            runs.append([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()])
        row = config_metrics(config, runs, [str(folder.generations(config.name, s)) for s in grid["seeds"]], mauve,
                             feature_lm, grid["mauve_seeds"])
        folder.metrics(config.name).write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")
        rows[config.name] = row
    table = markdown_table(rows)
    folder.table.write_text(table, encoding="utf-8")
    folder.rows.write_text(json.dumps({"grid": grid, "input": input_path, "prefixes": len(records),
                                                           "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(table)
    return {"configs": len(configs), "rows": rows}


def config_metrics(config: GenerationConfig, runs: Sequence[Sequence[dict]], names: Sequence[str],
                   mauve: MauveSettings | None, feature_lm, mauve_seeds: Sequence[int]) -> dict:
    """One configuration's row: its settings, MAUVE over the seeds' runs (with a feature LM), rep, words, time."""
    pooled = [r for records in runs for r in records]
    metrics = generation_metrics(pooled)
    seconds = [r.get("seconds_generate", 0.0) + r.get("seconds_rerank", 0.0) for r in pooled]
    row = {"rerank_length": config.rerank_length or MAX, "beam_size": config.beam_size,
           "num_samples": config.num_samples, "samples_per_round": config.beam_size * config.num_samples,
           "seeds": len(runs), "rep": metrics["rep"], "length_words": metrics["length_words"],
           "mean_new_tokens": metrics.get("mean_new_tokens"), "seconds_per_generation": float(np.mean(seconds)),
           "rerank_share": metrics.get("rerank_share", 0.0)}
    if feature_lm is not None:
        row.update(mauve_report(runs, mauve, feature_lm, mauve_seeds, names=names))
    return row


def _number(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(rows: dict[str, dict]) -> str:
    """The grid's rows as a Markdown table."""
    head = ["config", "L", "B", "N", "B x N", "MAUVE (mean ± std, runs)", "words (gen / ref)", "rep",
            "s / generation", "re-rank share"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows.items():
        mauve = "-"
        if "mauve" in row:
            mauve = f"{row['mauve']:.3f} ± {row['mauve_std']:.3f} ({len(row['mauve_runs'])})"
        words = _number(row["length_words"], 1)
        if "mauve_reference_words" in row:
            words = f"{row['mauve_generation_words']:.1f} / {row['mauve_reference_words']:.1f}"
        cells = [name, str(row["rerank_length"]), str(row["beam_size"]), str(row["num_samples"]),
                 str(row["samples_per_round"]), mauve, words, _number(row["rep"]),
                 _number(row["seconds_per_generation"], 2), f"{row['rerank_share']:.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
