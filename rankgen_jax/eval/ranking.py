"""Score prefix / candidate lists from JSONL files: a dual encoder, or the RankGen paper's baselines.

Methods: `model` (dual encoder dot product), `token_overlap` (the RankGen
paper's baseline: precision of the candidate's words against the prefix's,
stop words removed), `unigram` (this project's unigram-overlap F1 of word
sets with the prefix), and for any HF causal LM (`--lm DIR`) `lm_loglik` (mean
log-likelihood of the candidate given the prefix), `pmi` (log p(c | x) -
log p(c), per token by default) and `avg_ull` (log p(x + c) / (|x| + |c|),
the paper's average unconditional log-likelihood); see lm/scoring.py for the
exact definitions.

Input lines are `{"prefix": str, "candidates": [str, ...], "label": int}`,
`label` (optional) being the index of the gold candidate. Metrics are
accuracy@1 and MRR over the labelled lines, and the RankGen paper's pairwise
suffix identification: for each line the share of the negatives the gold
scores strictly above, averaged over lines.

Ties are resolved by the expected value under a uniformly random order of the
tied candidates: a gold candidate tied with t others (and beaten by g) has
rank g+1 ... g+t+1 with equal probability. So a scorer that gives every
candidate the same score gets exactly chance level (1/C accuracy for C
candidates), neither 0 nor 100%. The pairwise average follows the paper's
code instead: a negative tied with the gold counts as a loss.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.jsonl import SkippedLines, iter_jsonl
from rankgen_jax.errors import RankgenError, require_input_file, require_output_file
from rankgen_jax.lm.scoring import LM_METHODS, CausalLM, load_causal_lm, score_lists
from rankgen_jax.retrieval.sparse import token_overlap_scores, unigram_overlap_scores

if TYPE_CHECKING:
    # For annotations only: inference.encoder imports jax, and the CLI imports this module before it
    # sets XLA's flags.
    from rankgen_jax.inference.encoder import LoadedModel

METHODS = ("model", "unigram", "token_overlap") + LM_METHODS
# The word-overlap baselines: prefix and candidates -> scores [C], no model.
LEXICAL_SCORERS = {"unigram": unigram_overlap_scores, "token_overlap": token_overlap_scores}
# Lines scored together: enough for length bucketing to pay off, small enough to bound memory.
CHUNK_LINES = 2048
# LM scoring is slow per line: smaller chunks keep the progress bar moving.
LM_CHUNK_LINES = 64


# ---------------------------------------------------------------------------
# Metrics


def gold_rank_range(scores: Sequence[float], label: int) -> tuple[int, int]:
    """(g, t): how many candidates score strictly above the gold, and how many others tie with it.

    NaN scores count as the lowest possible score.
    """
    scores_C = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    if not 0 <= label < len(scores_C):
        raise ValueError(f"label {label} out of range for {len(scores_C)} candidates")
    gold = scores_C[label]
    greater = int(np.sum(scores_C > gold))
    tied = int(np.sum(scores_C == gold)) - 1
    return greater, tied


def reciprocal_rank(scores: Sequence[float], label: int) -> float:
    """1 / rank of the gold candidate, averaged over random orders of its ties."""
    greater, tied = gold_rank_range(scores, label)
    ranks = np.arange(greater + 1, greater + tied + 2, dtype=np.float64)
    return float(np.mean(1.0 / ranks))


def top1(scores: Sequence[float], label: int) -> float:
    """1 if the gold scores highest, 1/(t+1) if it shares the top with t others, else 0."""
    greater, tied = gold_rank_range(scores, label)
    return 0.0 if greater else 1.0 / (tied + 1)


def accuracy(scores_per_query: Sequence[Sequence[float]], gold_index: Sequence[int]) -> float:
    """Mean accuracy@1 over queries (NaN when there are none)."""
    _check_lengths(scores_per_query, gold_index)
    if not gold_index:
        return float("nan")
    return float(np.mean([top1(s, g) for s, g in zip(scores_per_query, gold_index)]))


def mrr(scores_per_query: Sequence[Sequence[float]], gold_index: Sequence[int]) -> float:
    """Mean reciprocal rank of the gold over queries (NaN when there are none)."""
    _check_lengths(scores_per_query, gold_index)
    if not gold_index:
        return float("nan")
    return float(np.mean([reciprocal_rank(s, g) for s, g in zip(scores_per_query, gold_index)]))


def gold_beats(scores: Sequence[float], label: int) -> float | None:
    """The share of the other candidates the gold scores strictly above (None without another candidate).

    The RankGen paper's pairwise suffix identification of one query: the
    mean over negatives of the gold-vs-that-negative accuracy, ties counting
    as losses as in its code. NaN scores count as the lowest possible score.
    """
    scores_C = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    if not 0 <= label < len(scores_C):
        raise ValueError(f"label {label} out of range for {len(scores_C)} candidates")
    if len(scores_C) < 2:
        return None
    negatives = np.delete(scores_C, label)
    return float(np.mean(scores_C[label] > negatives))


def pairwise_accuracy(scores_per_query: Sequence[Sequence[float]], gold_index: Sequence[int]) -> float:
    """The RankGen paper's pairwise suffix identification: `gold_beats` averaged over the queries that have a
    negative (NaN when none has)."""
    _check_lengths(scores_per_query, gold_index)
    shares = [gold_beats(s, g) for s, g in zip(scores_per_query, gold_index)]
    shares = [share for share in shares if share is not None]
    return float(np.mean(shares)) if shares else float("nan")


def _check_lengths(scores_per_query, gold_index) -> None:
    if len(scores_per_query) != len(gold_index):
        raise ValueError(f"{len(scores_per_query)} score lists but {len(gold_index)} gold indices")


# ---------------------------------------------------------------------------
# JSONL scoring


def check_scoring_record(record: dict[str, Any]) -> str | None:
    """None for a well-formed scoring record, else why not (a `data.jsonl` check).

    Well-formed: a string `prefix`, a non-empty list of string `candidates`,
    and `label` absent, null, or an integer index into candidates.
    """
    if not isinstance(record.get("prefix"), str):
        return "no string prefix"
    candidates = record.get("candidates")
    if not isinstance(candidates, list) or not candidates or not all(isinstance(c, str) for c in candidates):
        return "candidates not a non-empty list of strings"
    label = record.get("label")
    if label is not None:
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(candidates):
            return "label not an index into the candidates"
    return None


def _chunks(records: Iterator[dict[str, Any]], size: int = CHUNK_LINES) -> Iterator[list[dict[str, Any]]]:
    chunk = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass(frozen=True)
class LmScoring:
    """How the LM methods score a candidate: its token log-probabilities' `reduce` ("mean" per token, or "sum"),
    `batch_size` sequences per forward pass."""

    reduce: str = "mean"
    batch_size: int = 16

    def check(self) -> None:
        """Raise RankgenError naming the first bad setting."""
        if self.batch_size < 1:
            raise RankgenError(f"the LM's `lm_batch_size` must be >= 1, got {self.batch_size}", names=("lm_batch_size",))


def score_file(
    model: LoadedModel | None,
    input_path: str,
    output_path: str | None = None,
    method: str = "model",
    batch_size: int = 64,
    lm: CausalLM | None = None,
    lm_scoring: LmScoring = LmScoring(),
    progress: bool = False,
) -> dict[str, Any]:
    """Score every well-formed line of a JSONL file; metrics over the labelled ones.

    Writes each well-formed line with an added `"scores": [float, ...]` to
    output_path (when given); malformed lines are left out there and counted.
    The LM methods need `lm` (lm.scoring.load_causal_lm), which scores as `lm_scoring` says.
    Returns {"n": labelled lines, "accuracy", "mrr" (None when n is 0),
    "pairwise_accuracy" (the paper's pairwise average over the labelled lines
    with at least two candidates; None when there is none), "scored": lines
    scored, "skipped": malformed lines, "skipped_lines": their 1-based line
    numbers, "skipped_reasons": each reason with its count and first line numbers}.
    """
    if method not in METHODS:
        raise RankgenError(f"unknown scoring method {method!r}: expected one of {METHODS}")
    if method == "model" and model is None:
        raise RankgenError("scoring method 'model' needs a `model`, or use the `method` token_overlap or unigram",
                           names=("model", "method"))
    if method in LM_METHODS and lm is None:
        raise RankgenError(f"scoring method {method!r} needs a causal LM (`lm`)", names=("lm",))
    require_input_file(input_path, "`input_path`")
    source = Path(input_path)
    if output_path is not None:
        require_output_file(output_path, "`output_path`")
        if Path(output_path).resolve() == source.resolve():
            raise RankgenError(f"{output_path}: the output would overwrite the input file")
    skipped = SkippedLines()
    records = (record for _, record in iter_jsonl(source, check_scoring_record, skipped.add))
    all_scores, labels, scored = [], [], 0
    out = open(output_path, "w", encoding="utf-8") if output_path is not None else None
    bar = tqdm(unit="line", desc=f"score ({method})", dynamic_ncols=True, disable=not progress, file=sys.stderr)
    try:
        for chunk in _chunks(records, LM_CHUNK_LINES if method in LM_METHODS else CHUNK_LINES):
            prefixes = [r["prefix"] for r in chunk]
            candidates = [r["candidates"] for r in chunk]
            if method == "model":
                chunk_scores = model.score(prefixes, candidates, batch_size=batch_size)
            elif method in LM_METHODS:
                chunk_scores = score_lists(lm, prefixes, candidates, method, lm_scoring.reduce,
                                            lm_scoring.batch_size)
            else:
                scorer = LEXICAL_SCORERS[method]
                chunk_scores = [scorer(p, c) for p, c in zip(prefixes, candidates)]
            for record, scores_C in zip(chunk, chunk_scores):
                scored += 1
                if record.get("label") is not None:
                    all_scores.append(scores_C)
                    labels.append(record["label"])
                if out is not None:
                    line = json.dumps({**record, "scores": [float(s) for s in scores_C]}, ensure_ascii=False)
                    out.write(line + "\n")
            bar.update(len(chunk))
    finally:
        bar.close()
        if out is not None:
            out.close()
    n = len(labels)
    pairwise = pairwise_accuracy(all_scores, labels) if n else float("nan")
    return {
        "n": n,
        "accuracy": accuracy(all_scores, labels) if n else None,
        "mrr": mrr(all_scores, labels) if n else None,
        "pairwise_accuracy": None if np.isnan(pairwise) else pairwise,
        "scored": scored,
        "skipped": skipped.count,
        "skipped_lines": skipped.numbers(),
        "skipped_reasons": skipped.describe(),
    }


# ---------------------------------------------------------------------------
# Files of lists, models named by path


def run_score(input_path: str, output_path: str | None = None, *, method: str = "model",
              model_path: str | None = None, batch_size: int = 64, lm_path: str | None = None,
              lm_scoring: LmScoring = LmScoring(), device: str = "cpu", progress: bool = True,
              conventions: dict | None = None) -> dict:
    """What `rankgen-jax score` does: load the model or LM a method needs, score_file, print a summary.

    The model reads text with its recorded input conventions, `conventions`
    ({InputConventions field: value}) on top; one stderr line names them.

    Returns score_file's result. A file with no well-formed line is an
    error (and leaves no output behind).
    """
    if batch_size < 1:
        raise RankgenError(f"`batch_size` must be >= 1, got {batch_size}", names=("batch_size",))
    lm_scoring.check()
    # Before loading a model or a possibly large LM.
    require_input_file(input_path, "`input_path`")
    if output_path is not None:
        require_output_file(output_path, "`output_path`")
    model = lm = None
    if method == "model":
        if not model_path:
            raise RankgenError("the `method` model needs `model_path`", names=("method", "model_path"))
        # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
        from rankgen_jax.inference.encoder import load_model

        model = load_model(model_path, conventions=conventions)
        print(model.conventions_note(), file=sys.stderr)
    elif model_path:
        print(f"note: the model {model_path} is not used by the scoring method {method}", file=sys.stderr)
    if method in LM_METHODS:
        if not lm_path:
            raise RankgenError(f"the `method` {method} needs `lm_path`", names=("method", "lm_path"))
        lm = load_causal_lm(lm_path, device)
    elif lm_path:
        print(f"note: the LM {lm_path} is not used by the scoring method {method}", file=sys.stderr)
    result = score_file(model, input_path, output_path, method=method, batch_size=batch_size, lm=lm,
                        lm_scoring=lm_scoring,
                        progress=progress and method not in LEXICAL_SCORERS)
    if result["skipped"]:
        print(f"note: skipped {result['skipped']} line(s) of {input_path}: {result['skipped_reasons']}",
              file=sys.stderr)
    if not result["scored"]:
        # Nothing to show for the run: fail (exit 2) rather than report success over an empty output.
        if output_path:
            Path(output_path).unlink(missing_ok=True)
        why = f"all {result['skipped']} line(s) are malformed" if result["skipped"] else "the file has no lines"
        raise RankgenError(f"{input_path}: nothing to score ({why}); expected JSONL lines "
                           '{"prefix": str, "candidates": [str, ...], "label": int (optional)}')
    where = f" to {output_path}" if output_path else ""
    print(f"scored {result['scored']} line(s){where}")
    if result["n"]:
        print(json.dumps({"n": result["n"], "accuracy": result["accuracy"], "mrr": result["mrr"],
                          "pairwise_accuracy": result["pairwise_accuracy"]}))
    else:
        print("no labelled lines: no metrics", file=sys.stderr)
    return result
