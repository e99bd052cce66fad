"""Metrics of generated continuations: repetition, unigram overlap with the prefix, and MAUVE (optional).

- rep (the paper's repetition measure, after Welleck et al. 2020): the
  share of generated tokens that already occur among the 20 tokens before
  them. The window looks back across the start of the generation into the
  end of the prefix (copying the prefix's last words is repetition too);
  `with_prefix=False` looks at the generation only. Pooled over the corpus:
  repeated tokens / generated tokens. Tokens are an HF tokenizer's (pass the
  LM's to match the paper) or whitespace words.
- unigram overlap: F1 of the word sets of the prefix and the generation
  (retrieval.sparse.unigram_overlap_scores), averaged over generations.
- MAUVE (Pillutla et al. 2021) between generations and human continuations,
  when the optional `mauve-text` package is installed: features are the
  last-layer hidden state at the last token of each text under a given HF
  causal LM (the paper used GPT-2 large), each text cut to its first
  `max_length` tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.jsonl import collect_jsonl
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.sparse import unigram_overlap_scores
from rankgen_jax.lm.scoring import load_causal_lm, pad_for_causal_lm

REP_WINDOW = 20


def repeated_tokens(tokens: Sequence, window: int = REP_WINDOW, context: Sequence = ()) -> int:
    """How many of `tokens` occur among the `window` tokens before them (`context` precedes the first one)."""
    if window < 1:
        raise RankgenError(f"repetition window must be at least 1, got {window}")
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
    """rep: repeated tokens / generated tokens over all generations (NaN when nothing was generated)."""
    total = sum(len(tokens) for tokens in token_lists)
    if total == 0:
        return float("nan")
    contexts = contexts if contexts is not None else [()] * len(token_lists)
    return sum(repeated_tokens(t, window, c) for t, c in zip(token_lists, contexts)) / total


def unigram_overlap(prefixes: Sequence[str], generations: Sequence[str]) -> float:
    """Mean unigram-overlap F1 of each generation with its prefix (NaN for no generations)."""
    if not generations:
        return float("nan")
    return float(np.mean([unigram_overlap_scores(p, [g])[0] for p, g in zip(prefixes, generations)]))


def word_tokens(text: str) -> list[str]:
    """Whitespace-separated words (the tokeniser of rep when no HF tokenizer is given)."""
    return text.split()


def hf_tokens(tokenizer_dir: str) -> Callable[[str], list[int]]:
    """A function text -> token ids with the HF tokenizer in tokenizer_dir (no special tokens)."""
    from transformers import AutoTokenizer  # heavy and optional: only with --tokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"--tokenizer {tokenizer_dir}: not a usable HF tokenizer folder: {first}") from None
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


def last_token_features(lm, texts: Sequence[str], max_length: int = 1024, batch_size: int = 8,
                        progress: bool = False) -> np.ndarray:
    """[N, D] float32: last-layer hidden state at each text's last token (MAUVE's featurisation)."""
    import torch  # heavy and optional (the LM extra): only for MAUVE

    limit = max_length if lm.max_positions is None else min(max_length, lm.max_positions)
    seqs = [(lm.text_ids(t) or [lm.start_id])[:limit] for t in texts]
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


def mauve_score(references: Sequence[str], generations: Sequence[str], feature_lm, max_length: int = 1024,
                batch_size: int = 8, seed: int = 25, progress: bool = False) -> float:
    """MAUVE of generations against human references, with features from `feature_lm` (an lm.scoring.CausalLM)."""
    mauve = require_mauve()
    if not references or not generations:
        raise RankgenError("MAUVE needs at least one reference and one generation")
    p_features = last_token_features(feature_lm, references, max_length, batch_size, progress)
    q_features = last_token_features(feature_lm, generations, max_length, batch_size, progress)
    result = mauve.compute_mauve(p_features=p_features, q_features=q_features, verbose=False, seed=seed)
    return float(result.mauve)


def read_generations(path: str, reference_field: str | None = None) -> tuple[list[dict], int]:
    """Records with string "prefix" and "generation" (and the reference field, when asked); bad lines counted."""
    if not Path(path).is_file():
        raise RankgenError(f"--input {path} does not exist or is not a file")
    fields = ("prefix", "generation") + ((reference_field,) if reference_field else ())

    def check(record: dict) -> str | None:
        return None if all(isinstance(record.get(k), str) for k in fields) else "missing string fields"

    records, skipped = collect_jsonl(path, check)
    return records, skipped.count


def generation_metrics(records: Sequence[dict], tokenize: Callable[[str], list] = word_tokens,
                       window: int = REP_WINDOW, with_prefix: bool = True) -> dict:
    """rep, unigram overlap, mean new tokens and time split of `generate` output records."""
    prefixes = [r["prefix"] for r in records]
    generations = [r["generation"] for r in records]
    contexts = [tokenize(p) for p in prefixes] if with_prefix else None
    result = {
        "n": len(records),
        "rep": repetition([tokenize(g) for g in generations], window, contexts),
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


def run_generation_metrics(input_path: str, *, tokenizer: str | None = None, rep_window: int = REP_WINDOW,
                           with_prefix: bool = True, reference_field: str | None = None,
                           mauve_model: str | None = None, mauve_max_length: int = 1024, device: str = "cpu",
                           output_path: str | None = None) -> dict:
    """What `rankgen-jax generation-metrics` does: the metrics of a `generate` output file, printed as JSON.

    tokenizer: an HF tokenizer folder for rep (default: whitespace words).
    MAUVE against each record's reference_field when mauve_model (an HF
    causal LM folder, run on the torch device) is given.
    """
    if mauve_model:
        if not reference_field:
            raise RankgenError("--mauve_model needs --reference_field (the human continuations to compare with)")
        require_mauve()  # fail before loading the feature model
    records, bad = read_generations(input_path, reference_field)
    if not records:
        raise RankgenError(f"--input {input_path}: no line with string \"prefix\" and \"generation\" fields")
    tokenize = hf_tokens(tokenizer) if tokenizer else word_tokens
    result = generation_metrics(records, tokenize, rep_window, with_prefix=with_prefix)
    if mauve_model:
        feature_lm = load_causal_lm(mauve_model, device)
        result["mauve"] = mauve_score([r[reference_field] for r in records], [r["generation"] for r in records],
                                      feature_lm, mauve_max_length, progress=True)
    result["bad_lines"] = bad
    if bad:
        print(f"note: skipped {bad} line(s) of {input_path} without string prefix / generation fields", file=sys.stderr)
    if output_path:
        Path(output_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))
    return result
