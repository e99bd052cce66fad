"""Suffix identification of a fine-tuned model against the best reading of its starting model, per genre.

Items are held-out prefixes with candidates, gold first (label 0): "vs 1"
scores the gold against the first negative alone, "vs K" against all K
negatives. An item is won when the gold scores highest (ranking.top1: a tie
among the top counts as a share). The starting model is read at several
prefix lengths; its best length per genre and measure is the one compared, so
that the comparison favours the starting model, never the fine-tuned one.

Standard errors: an accuracy's is the binomial sqrt(p (1 - p) / n); a gain's is
paired, the sample standard deviation (ddof 1) of the per-item differences
over sqrt(n), since both models score the same items. A gain is clear when it
exceeds two of its standard errors.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rankgen_jax.eval.ranking import top1
from rankgen_jax.errors import RankgenError

# How many standard errors a gain must exceed to count as clear.
CLEAR_GAIN_SE = 2.0


def top1_wins(score_lists: Sequence[np.ndarray], num_candidates: int | None = None) -> np.ndarray:
    """[N] per-item wins (1, 0, or a share on ties) of the gold (candidate 0) among the first num_candidates."""
    return np.array([top1(np.asarray(s)[:num_candidates], 0) for s in score_lists], np.float64)


def accuracy_and_se(wins_N: np.ndarray) -> tuple[float, float]:
    """(accuracy, its binomial standard error sqrt(p (1 - p) / n))."""
    wins_N = np.asarray(wins_N, np.float64)
    if wins_N.size == 0:
        raise RankgenError("accuracy of no items")
    p = float(wins_N.mean())
    return p, float(np.sqrt(p * (1.0 - p) / wins_N.size))


def paired_gain(new_N: np.ndarray, old_N: np.ndarray) -> tuple[float, float]:
    """(mean of new - old, its paired standard error std(new - old, ddof=1) / sqrt(n)); n >= 2."""
    if np.ndim(new_N) != 1 or np.shape(new_N) != np.shape(old_N) or np.size(new_N) < 2:
        raise RankgenError(f"a paired gain needs the same >= 2 items on both sides, got shapes "
                           f"{np.shape(new_N)} and {np.shape(old_N)}")
    diff_N = np.asarray(new_N, np.float64) - np.asarray(old_N, np.float64)
    return float(diff_N.mean()), float(diff_N.std(ddof=1) / np.sqrt(diff_N.size))


def measures(num_candidates: int) -> dict[str, int | None]:
    """Measure name -> candidates it reads: "vs 1" (gold and the first negative) and "vs K" (all)."""
    return {"vs 1": 2, f"vs {num_candidates - 1}": None}


def compare_by_genre(genres: Sequence[str], fine_tuned: Sequence[np.ndarray],
                    zero_shot: Mapping[int, Sequence[np.ndarray]]) -> dict:
    """Per genre and measure: the starting model's accuracy at each prefix length, its best, the
    fine-tuned model's, and the paired gain over the best with its standard error.

    genres: each item's genre; fine_tuned: each item's scores [C] (gold first);
    zero_shot: prefix length -> each item's scores by the starting model.
    Returns {genre: {"n", measure: {"zero_shot": {length: {"accuracy", "se"}}, "best_length",
    "best_zero_shot": {"accuracy", "se"}, "fine_tuned": {...}, "gain", "gain_se", "clear"}}}.
    """
    genres = list(genres)
    if len(fine_tuned) != len(genres) or any(len(s) != len(genres) for s in zero_shot.values()):
        raise RankgenError(f"compare_by_genre: {len(genres)} genres, {len(fine_tuned)} fine-tuned score lists, "
                           f"{ {k: len(v) for k, v in zero_shot.items()} } zero-shot ones by length")
    if not zero_shot:
        raise RankgenError("compare_by_genre needs the starting model's scores at one prefix length at least")
    num_candidates = len(fine_tuned[0])
    report = {}
    for genre in sorted(set(genres)):
        rows = [i for i, k in enumerate(genres) if k == genre]
        entry: dict = {"n": len(rows)}
        for name, candidates in measures(num_candidates).items():
            tuned_N = top1_wins([fine_tuned[i] for i in rows], candidates)
            base_N = {length: top1_wins([scores[i] for i in rows], candidates) for length, scores in zero_shot.items()}
            # Ties go to the shorter prefix (cheaper to read), by the order of the sorted lengths.
            best = max(sorted(base_N), key=lambda length: base_N[length].mean())
            gain, gain_se = paired_gain(tuned_N, base_N[best])
            entry[name] = {
                "zero_shot": {length: _accuracy(wins) for length, wins in sorted(base_N.items())},
                "best_length": best, "best_zero_shot": _accuracy(base_N[best]), "fine_tuned": _accuracy(tuned_N),
                "gain": gain, "gain_se": gain_se, "clear": bool(gain > CLEAR_GAIN_SE * gain_se),
            }
        report[genre] = entry
    return report


def _accuracy(wins_N: np.ndarray) -> dict:
    accuracy, se = accuracy_and_se(wins_N)
    return {"accuracy": accuracy, "se": se}


def comparison_table(report: Mapping, fine_tuned_length: int) -> str:
    """The report of compare_by_genre as a Markdown table: one row per genre and measure."""
    first = next(iter(report.values()))
    lengths = sorted(int(length) for length in next(v for k, v in first.items() if k != "n")["zero_shot"])
    head = (["genre", "n", "negatives"] + [f"zero-shot @{length}" for length in lengths]
            + ["best zero-shot", f"fine-tuned @{fine_tuned_length}", "gain", "> 2 SE"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for genre, entry in report.items():
        for name, row in entry.items():
            if name == "n":
                continue
            # Lengths are ints in memory and strings once read back from JSON.
            by_length = {int(length): value for length, value in row["zero_shot"].items()}
            cells = [genre, str(entry["n"]), name] + [_cell(by_length[length]) for length in lengths]
            cells += [f"{_cell(row['best_zero_shot'])} (@{row['best_length']})", _cell(row["fine_tuned"]),
                      f"{row['gain']:+.3f} ± {row['gain_se']:.3f}", "yes" if row["clear"] else "no"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Mapping) -> str:
    return f"{value['accuracy']:.3f} ± {value['se']:.3f}"
