"""RankGen's claim about generation, measured with a real LM (Sec. 3, Tables 3-4): nucleus sampling
against over-generating and re-ranking and against RankGen beam search, each re-ranked by the trained ranker, by
the zero-shot starting model and by the LM's own likelihood, scored by MAUVE against the human continuations.

It reads the held-out prefixes and the "both" ranker that `negatives-claim` leaves in its workdir, and runs
`generation-sweep` once per re-ranker (WORKDIR/<re-ranker>/, resumed seed by seed) on one grid: by default
nucleus (B = N = 1), full re-ranking of 20 samples, and beam search with B = 2, N = 10, L = 20, over three
generation seeds. The combined table (WORKDIR/generation_table.md) gives per re-ranker and configuration MAUVE
mean ± std over the seeds, its difference from nucleus sampling, the words generated against the gold's, and the
share of time spent re-ranking.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import gin

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.generation_metrics import MauveSettings
from rankgen_jax.experiments.generation_sweep import run_generation_sweep
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.negatives_claim import ClaimFolder
from rankgen_jax.experiments.stages import log, starting_checkpoint
from rankgen_jax.lm.generation import RerankerSpec
from rankgen_jax.pretrained import GEMMA

# The re-rankers: the ranker negatives-claim trained on both kinds of negatives, the model it started from, and
# the LM's mean log-likelihood (the paper's perplexity re-ranking baseline).
RERANKERS = ("trained", "zero_shot", "perplexity")
NUCLEUS = "Lmax_B1_N1"
TABLE_FILE = "generation_table.md"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GenerationClaimConfig:
    """Where the inputs are, the grid, and the LMs; see the module docstring."""

    claim_dir: str = "runs/negatives_claim"
    ranker: str = "ranker_both"
    grid: str = "generation/grid_claim.json"
    lm: str = GEMMA
    mauve_model: str = GEMMA
    init_from_hf: str = "minilm"
    init_checkpoint: str = ""
    prefix_batch: int = 4
    max_batch_rows: int = 64
    device: str = "cpu"  # the LMs' torch device, e.g. "cuda"
    rerankers: tuple[str, ...] = RERANKERS

    def __post_init__(self):
        unknown = [name for name in self.rerankers if name not in RERANKERS]
        if unknown or not self.rerankers:
            raise RankgenError(f"GenerationClaimConfig.rerankers must be some of {RERANKERS}, got {self.rerankers}")
        for name in ("prefix_batch", "max_batch_rows"):
            if getattr(self, name) < 1:
                raise RankgenError(f"GenerationClaimConfig.{name} must be at least 1, got {getattr(self, name)}")


class GenerationClaimFolder(JobFolder):
    """Where generation-claim keeps its outputs under `workdir`: a generation sweep per re-ranker, the table."""

    def sweep(self, reranker: str) -> Path:
        """The sweep re-ranked by `reranker` (experiments/generation_sweep.py's SweepFolder)."""
        return self.root / reranker

    @property
    def table(self) -> Path:
        return self.root / TABLE_FILE


def run_generation_claim(workdir: str, progress: bool = True) -> dict:
    """One generation sweep per re-ranker, then the combined table; returns results.json's content."""
    cfg = GenerationClaimConfig()
    claim = ClaimFolder(cfg.claim_dir)
    prefixes, ranker = claim.prefixes("eval"), claim.model(cfg.ranker).root
    for path, what in ((prefixes, "held-out prefixes"), (ranker, "trained ranker")):
        if not path.exists():
            raise RankgenError(f"{path}: no {what}; run `rankgen-jax negatives-claim --workdir {claim}` first "
                               "(or set GenerationClaimConfig.claim_dir)")
    folder = GenerationClaimFolder(workdir)
    folder.root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    models = {"trained": str(ranker), "perplexity": None}
    if "zero_shot" in cfg.rerankers:
        models["zero_shot"] = str(starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, folder))
    rows = {}
    for name in cfg.rerankers:
        log("generation-claim", f"generation sweep re-ranked by {name}")
        began = time.time()
        reranker = RerankerSpec("perplexity" if name == "perplexity" else "rankgen", models[name])
        mauve = MauveSettings(cfg.mauve_model, "continuation") if cfg.mauve_model else None
        sweep = run_generation_sweep(cfg.grid, cfg.lm, str(prefixes), str(folder.sweep(name)), reranker=reranker,
                                     mauve=mauve, device=cfg.device, prefix_batch=cfg.prefix_batch,
                                     max_batch_rows=cfg.max_batch_rows, progress=progress)
        rows[name] = {"rows": sweep["rows"], "seconds": time.time() - began}
    results = {"rerankers": rows, "ranker": str(ranker), "prefixes": str(prefixes), "grid": cfg.grid,
               "seconds": time.time() - started}
    results["table"] = table_markdown(rows)
    folder.table.write_text(results["table"], encoding="utf-8")
    folder.write_results(results)
    print(results["table"], flush=True)
    return results


def table_markdown(rerankers: dict[str, dict]) -> str:
    """One row per re-ranker and configuration (nucleus once: it re-ranks nothing): MAUVE mean ± std over the
    seeds, its difference from nucleus, whether that difference exceeds the larger of the two spreads, words
    generated / gold, seconds per generation and the re-ranking share."""
    head = ("| decoding | re-ranker | MAUVE (mean ± std, runs) | - nucleus | beyond the spread | words (gen / gold) | "
            "s / generation | re-rank share |\n|---|---|---:|---:|---|---:|---:|---:|")
    lines = [head]
    nucleus = next((r["rows"][NUCLEUS] for r in rerankers.values() if NUCLEUS in r["rows"]), None)
    if nucleus is not None:
        lines.append(_row("nucleus (p = 0.9)", "-", nucleus, None))
    for name, sweep in rerankers.items():
        for config, row in sweep["rows"].items():
            if config == NUCLEUS:
                continue
            lines.append(_row(_decoding(row), name.replace("_", "-"), row, nucleus))
    return "\n".join(lines) + "\n"


def _decoding(row: dict) -> str:
    if row["rerank_length"] == "max" and row["beam_size"] == 1:
        return f"over-generate {row['num_samples']}, re-rank"
    return f"beam B = {row['beam_size']}, N = {row['num_samples']}, L = {row['rerank_length']}"


def _row(decoding: str, reranker: str, row: dict, nucleus: dict | None) -> str:
    mauve = f"{row['mauve']:.3f} ± {row['mauve_std']:.3f} ({len(row['mauve_runs'])})"
    gain, beyond = "-", "-"
    if nucleus is not None:
        diff = row["mauve"] - nucleus["mauve"]
        gain = f"{diff:+.3f}"
        beyond = "yes" if abs(diff) > max(row["mauve_std"], nucleus["mauve_std"]) else "no"
    words = f"{row['mauve_generation_words']:.1f} / {row['mauve_reference_words']:.1f}"
    return (f"| {decoding} | {reranker} | {mauve} | {gain} | {beyond} | {words} | "
            f"{row['seconds_per_generation']:.2f} | {row['rerank_share']:.1%} |")
