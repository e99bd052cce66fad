"""Metrics of generated continuations: the RankGen paper's rep, token overlap, length and MAUVE, and variants.

The paper's, as its released code defines them (docs/design/rankgen.md, 'RankGen
generation metrics'), each averaged over examples:

- rep: the words of prefix + generation (retrieval.sparse.normalized_words:
  lower case, no punctuation, no articles); the share of the generation's
  words that occur among the 20 words before them (the window reaches back
  into the prefix); 0 for an empty generation.
- token overlap: retrieval.sparse.token_overlap, the precision of the
  generation's words against the prefix's, stop words removed.
- length: words (whitespace-separated) of the generation.
- MAUVE (Pillutla et al. 2021, the mauve-text package) between prefix + " " +
  generation and prefix + " " + gold continuation: features are the
  last-layer hidden state at the last token of each text under a given HF
  causal LM (the paper used GPT-2 large), each text cut to its first 768
  tokens; mauve-text's defaults otherwise (its k-means seed 25 included).
  As the paper (App. D.1): generation and gold are each cut to end at a
  sentence boundary (`data.sentences.cut_at_last_sentence_end`, the released
  code's `truncate`), and MAUVE is the mean of several runs with its
  standard deviation (numpy's, ddof 0: the paper's five runs 0.803, 0.778,
  0.759, 0.785, 0.768 give its 0.015). A run is one generation file (one
  generation seed, as the paper's five runs of nucleus sampling) scored at
  one k-means seed; several files and several seeds give every pair. The
  mean words of the cut generations and references are reported beside it,
  since MAUVE is only comparable at equal lengths (the paper: 70-80 words).

Variants, under their own names:

- rep_pooled (after Welleck et al. 2020): the share of generated tokens that
  already occur among the 20 tokens before them, pooled over the corpus
  (repeated tokens / generated tokens); tokens are an HF tokenizer's or
  whitespace words, and the window looks back into the end of the prefix
  unless `with_prefix=False`.
- unigram overlap: F1 of the word sets of the prefix and the generation
  (retrieval.sparse.unigram_overlap_scores), averaged over generations.
- `mauve_score` on other texts, e.g. the generations and references alone
  (`--mauve_no_prefix`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.jsonl import collect_jsonl
from rankgen_jax.data.sentences import cut_at_last_sentence_end
from rankgen_jax.errors import RankgenError
from rankgen_jax.lm.scoring import load_causal_lm, pad_for_causal_lm
from rankgen_jax.retrieval.sparse import normalized_words, token_overlap, unigram_overlap_scores

REP_WINDOW = 20
# Tokens of each text MAUVE reads, as the RankGen paper's evaluation (mauve-text's own default is 1024).
MAUVE_MAX_LENGTH = 768
# mauve-text's default k-means seed, which the paper's runs kept (they varied the generations).
MAUVE_SEED = 25


def _check_window(window: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise RankgenError(f"repetition window must be a positive integer, got {window!r}")


def rep_statistic(prefix: str, generation: str, window: int = REP_WINDOW) -> float:
    """The RankGen paper's rep of one example: the share of the generation's words seen in the `window` words
    before them, prefix words included (words: retrieval.sparse.normalized_words); 0.0 for no generated word."""
    _check_window(window)
    prefix_words, generated = normalized_words(prefix), normalized_words(generation)
    if not generated:
        return 0.0
    words = prefix_words + generated
    start = len(prefix_words)
    repeated = sum(words[i] in words[max(0, i - window) : i] for i in range(start, len(words)))
    return repeated / len(generated)


def repeated_tokens(tokens: Sequence, window: int = REP_WINDOW, context: Sequence = ()) -> int:
    """How many of `tokens` occur among the `window` tokens before them (`context` precedes the first one)."""
    _check_window(window)
    history = list(context)[-window:]
    count = 0
    for token in tokens:
        count += token in history
        history.append(token)
        if len(history) > window:
            history.pop(0)
    return count


def repetition(token_lists: Sequence[Sequence], window: int = REP_WINDOW,
               contexts: Sequence[Sequence] | None = None) -> float:
    """rep_pooled: repeated tokens / generated tokens over all generations (NaN when nothing was generated).

    Not the paper's rep (`rep_statistic`, averaged per example over normalised words).
    """
    total = sum(len(tokens) for tokens in token_lists)
    if total == 0:
        return float("nan")
    contexts = contexts if contexts is not None else [()] * len(token_lists)
    return sum(repeated_tokens(t, window, c) for t, c in zip(token_lists, contexts)) / total


def unigram_overlap(prefixes: Sequence[str], generations: Sequence[str]) -> float:
    """Mean unigram-overlap F1 of each generation with its prefix (NaN for no generations); not the paper's
    token overlap (`paper_metrics`)."""
    if not generations:
        return float("nan")
    return float(np.mean([unigram_overlap_scores(p, [g])[0] for p, g in zip(prefixes, generations)]))


def paper_metrics(prefixes: Sequence[str], generations: Sequence[str], window: int = REP_WINDOW) -> dict:
    """The RankGen paper's rep, token overlap and length in words, each the mean over examples (NaN for none)."""
    if len(prefixes) != len(generations):
        raise RankgenError(f"{len(prefixes)} prefixes but {len(generations)} generations")
    _check_window(window)
    if not generations:
        return {"rep": float("nan"), "token_overlap": float("nan"), "length_words": float("nan")}
    pairs = list(zip(prefixes, generations))
    return {"rep": float(np.mean([rep_statistic(p, g, window) for p, g in pairs])),
            "token_overlap": float(np.mean([token_overlap(g, p) for p, g in pairs])),
            "length_words": float(np.mean([len(g.split()) for g in generations]))}


def word_tokens(text: str) -> list[str]:
    """Whitespace-separated words (the tokeniser of rep_pooled when no HF tokenizer is given)."""
    return text.split()


def hf_tokens(tokenizer_dir: str) -> Callable[[str], list[int]]:
    """A function text -> token ids with the HF tokenizer in tokenizer_dir (no special tokens)."""
    from transformers import AutoTokenizer  # heavy and optional: only with --tokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"`tokenizer` {tokenizer_dir}: not a usable HF tokenizer folder: {first}",
                           names=("tokenizer",)) from None
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


def last_token_features(lm, texts: Sequence[str], max_length: int = MAUVE_MAX_LENGTH, batch_size: int = 8,
                        progress: bool = False) -> np.ndarray:
    """[N, D] float32: last-layer hidden state at each text's last token (MAUVE's featurisation).

    Each text is tokenised as mauve-text does (with the tokenizer's own
    special tokens, e.g. a BOS) and cut to its first max_length tokens.
    """
    import torch  # heavy and optional (the LM extra): only for MAUVE

    limit = max_length if lm.max_positions is None else min(max_length, lm.max_positions)
    seqs = [lm.prefix_ids(t)[:limit] for t in texts]
    features = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for start in tqdm(range(0, len(order), batch_size), desc="MAUVE features", unit="batch", disable=not progress,
                      file=sys.stderr):
        rows = order[start : start + batch_size]
        # Left padding puts every text's last token at the last position.
        ids, mask, positions = pad_for_causal_lm([seqs[i] for i in rows], lm.pad_id, "left")
        with torch.no_grad():
            out = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                           position_ids=positions.to(lm.device), output_hidden_states=True)
        last_BxD = out.hidden_states[-1][:, -1].float().cpu().numpy()
        for i, row in zip(rows, last_BxD):
            features[i] = row
    return np.stack(features).astype(np.float32)


def require_mauve():
    """The `mauve` module of mauve-text, or a RankgenError saying how to install it."""
    try:
        import mauve  # optional (mauve-text)
    except ImportError:
        raise RankgenError("MAUVE needs the optional package mauve-text (pip install mauve-text)") from None
    return mauve


def mauve_score(references: Sequence[str], generations: Sequence[str], feature_lm,
                max_length: int = MAUVE_MAX_LENGTH, batch_size: int = 8, seed: int = MAUVE_SEED,
                progress: bool = False) -> float:
    """MAUVE of generations against human references, with features from `feature_lm` (an lm.scoring.CausalLM).

    The texts are compared as given; the paper's MAUVE passes prefix + " " +
    text on both sides, each cut at a sentence end (`paper_mauve_texts`).
    Generations are mauve-text's P and references its Q, as in the paper's code.
    """
    return mauve_runs([(references, generations)], feature_lm, (seed,), max_length, batch_size, progress)[0]["mauve"]


def paper_mauve_texts(records: Sequence[dict], reference_field: str, cut: bool = True,
                      with_prefix: bool = True) -> tuple[list[str], list[str]]:
    """(references, generations) as the paper's MAUVE reads them: prefix + " " + gold and prefix + " " +
    generation, gold and generation each cut to end at a sentence boundary (`cut`); without the prefix when
    with_prefix is False (a variant)."""
    def text(record: dict, field: str) -> str:
        body = cut_at_last_sentence_end(record[field]) if cut else record[field]
        return record["prefix"] + " " + body if with_prefix else body

    return [text(r, reference_field) for r in records], [text(r, "generation") for r in records]


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard deviation (ddof 0, as the paper reports MAUVE over its runs) of a non-empty list."""
    if not len(values):
        raise RankgenError("mean and standard deviation of no runs")
    array = np.asarray(values, np.float64)
    return float(array.mean()), float(array.std())


def mauve_runs(runs: Sequence[tuple[Sequence[str], Sequence[str]]], feature_lm, seeds: Sequence[int] = (MAUVE_SEED,),
               max_length: int = MAUVE_MAX_LENGTH, batch_size: int = 8, progress: bool = False) -> list[dict]:
    """MAUVE of every (references, generations) run at every k-means seed: [{"run", "seed", "mauve"}].

    Each distinct list of texts is featurised once (runs of one evaluation set share their references).
    """
    mauve = require_mauve()
    if not runs or not seeds:
        raise RankgenError("MAUVE needs at least one run and one seed")
    cache: dict[tuple[str, ...], np.ndarray] = {}

    def features(texts: Sequence[str]) -> np.ndarray:
        key = tuple(texts)
        if not key:
            raise RankgenError("MAUVE needs at least one reference and one generation")
        if key not in cache:
            cache[key] = last_token_features(feature_lm, texts, max_length, batch_size, progress)
        return cache[key]

    out = []
    for k, (references, generations) in enumerate(runs):
        q_features, p_features = features(references), features(generations)
        for seed in seeds:
            result = mauve.compute_mauve(p_features=p_features, q_features=q_features, verbose=False, seed=seed)
            out.append({"run": k, "seed": int(seed), "mauve": float(result.mauve)})
    return out


def mauve_report(runs: Sequence[Sequence[dict]], mauve: MauveSettings, feature_lm,
                 seeds: Sequence[int] = (MAUVE_SEED,), *, names: Sequence[str] | None = None,
                 progress: bool = False) -> dict:
    """MAUVE over runs of generation records (one per generation seed) and k-means seeds, as the paper reports it:
    {"mauve": mean, "mauve_std", "mauve_runs": [{"input", "seed", "mauve"}], "mauve_generation_words",
    "mauve_reference_words"} (the words of the texts MAUVE read after the prefix)."""
    texts = [paper_mauve_texts(records, mauve.reference_field, mauve.cut, mauve.with_prefix) for records in runs]
    scores = mauve_runs(texts, feature_lm, seeds, mauve.max_length, progress=progress)
    names = list(names) if names is not None else [str(k) for k in range(len(runs))]
    mean, std = mean_and_std([s["mauve"] for s in scores])
    # MAUVE compares at equal lengths only.
    alone = [paper_mauve_texts(records, mauve.reference_field, mauve.cut, with_prefix=False) for records in runs]
    return {"mauve": mean, "mauve_std": std,
            "mauve_runs": [{"input": names[s["run"]], "seed": s["seed"], "mauve": s["mauve"]} for s in scores],
            "mauve_generation_words": float(np.mean([len(g.split()) for _, gens in alone for g in gens])),
            "mauve_reference_words": float(np.mean([len(r.split()) for refs, _ in alone for r in refs]))}


def read_generations(path: str, reference_field: str | None = None) -> tuple[list[dict], int]:
    """Records with string "prefix" and "generation" (and the reference field, when asked); bad lines counted."""
    if not Path(path).is_file():
        raise RankgenError(f"input {path} does not exist or is not a file")
    fields = ("prefix", "generation") + ((reference_field,) if reference_field else ())

    def check(record: dict) -> str | None:
        return None if all(isinstance(record.get(k), str) for k in fields) else "missing string fields"

    records, skipped = collect_jsonl(path, check)
    return records, skipped.count


def generation_metrics(records: Sequence[dict], tokenize: Callable[[str], list] = word_tokens,
                       window: int = REP_WINDOW, with_prefix: bool = True) -> dict:
    """The paper's rep, token overlap and length (`paper_metrics`), then the variants rep_pooled (with
    `tokenize`; `with_prefix` looks back into the prefix) and unigram overlap, mean new tokens and time split
    of `generate` output records."""
    prefixes = [r["prefix"] for r in records]
    generations = [r["generation"] for r in records]
    contexts = [tokenize(p) for p in prefixes] if with_prefix else None
    result = {
        "n": len(records),
        **paper_metrics(prefixes, generations, window),
        "rep_pooled": repetition([tokenize(g) for g in generations], window, contexts),
        "unigram_overlap": unigram_overlap(prefixes, generations),
    }
    for key in ("new_tokens", "seconds_generate", "seconds_rerank"):
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        if values:
            result[f"mean_{key}"] = float(np.mean(values))
    spent = result.get("mean_seconds_generate", 0.0) + result.get("mean_seconds_rerank", 0.0)
    if "mean_seconds_rerank" in result and spent > 0:
        result["rerank_share"] = result["mean_seconds_rerank"] / spent
    return result


@dataclass(frozen=True)
class MauveSettings:
    """MAUVE against each record's `reference_field`, with the features of the causal LM `model` (a folder, a GGUF
    file or gemma3-270m; the paper: gpt2-large): the paper's prefix + " " + text on both sides (the texts alone
    without `with_prefix`), each cut at its last sentence end (uncut without `cut`), `max_length` tokens read."""

    model: str
    reference_field: str
    max_length: int = MAUVE_MAX_LENGTH
    with_prefix: bool = True
    cut: bool = True

    def check(self) -> None:
        """Raise RankgenError naming the first bad setting, and unless mauve-text is installed."""
        if not self.reference_field:
            raise RankgenError("MAUVE needs a `reference_field` (the human continuations to compare with)",
                               names=("reference_field",))
        length = self.max_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise RankgenError(f"MAUVE's `max_length` must be a positive integer, got {length!r}",
                               names=("max_length",))
        require_mauve()


def run_generation_metrics(input_path: str | Sequence[str], *, tokenizer: str | None = None,
                           rep_window: int = REP_WINDOW, with_prefix: bool = True, mauve: MauveSettings | None = None,
                           mauve_seeds: Sequence[int] = (MAUVE_SEED,), device: str = "cpu",
                           output_path: str | None = None) -> dict:
    """What `rankgen-jax generation-metrics` does: the metrics of `generate` output files, printed as JSON.

    input_path: one file, or several (one per generation seed: MAUVE's runs);
    the other metrics are over all their records together.
    tokenizer: an HF tokenizer folder for rep_pooled (default: whitespace
    words); with_prefix: rep_pooled's window looks back into the prefix.
    With `mauve`, MAUVE (its feature LM run on the torch device): one run per input file and seed of
    `mauve_seeds`, reported as `mauve` (the mean), `mauve_std` and `mauve_runs`.
    """
    paths = [input_path] if isinstance(input_path, str) else list(input_path)
    if not paths:
        raise RankgenError("`input_path` needs at least one file", names=("input_path",))
    _check_window(rep_window)
    if mauve is not None:
        if not mauve_seeds:
            raise RankgenError("`mauve_seeds` needs at least one seed", names=("mauve_seeds",))
        mauve.check()  # fail before loading the feature model
    reference_field = mauve.reference_field if mauve is not None else None
    runs, bad = [], 0
    for path in paths:
        records, skipped = read_generations(path, reference_field)
        if not records:
            raise RankgenError(f"input {path}: no line with string \"prefix\" and \"generation\" fields")
        runs.append(records)
        bad += skipped
        if skipped:
            fields = "prefix / generation" + (f" / {reference_field}" if reference_field else "")
            print(f"note: skipped {skipped} line(s) of {path} without string {fields} fields", file=sys.stderr)
    tokenize = hf_tokens(tokenizer) if tokenizer else word_tokens
    result = generation_metrics([r for records in runs for r in records], tokenize, rep_window,
                                with_prefix=with_prefix)
    if mauve is not None:
        feature_lm = load_causal_lm(mauve.model, device)
        result.update(mauve_report(runs, mauve, feature_lm, mauve_seeds, names=paths, progress=True))
    result["bad_lines"] = bad
    if output_path:
        Path(output_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return result
