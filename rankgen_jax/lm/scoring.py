"""LM-likelihood baselines of the RankGen paper for any local HuggingFace causal LM (PyTorch).

Two scores of a continuation c (a candidate suffix) given a prefix x:

- `lm_loglik`: the mean over c's tokens of log p(c_t | x, c_<t), i.e. the
  average conditional log-likelihood (minus log-perplexity) of the suffix
  given the prefix, the LM baseline of the paper's suffix identification
  table (its table 1).
- `pmi`: pointwise mutual information, log p(c | x) - log p(c), with the
  unconditional term computed after the LM's start token (BOS, or EOS for
  GPT-2 style models that use it as the document separator). With the
  default `reduce="mean"` both terms are divided by c's token count, i.e.
  the mean per-token PMI, which keeps long and short candidates comparable;
  `reduce="sum"` gives the unnormalised log-ratio (Holtzman et al. 2021).
- `avg_ull`: the average unconditional log-likelihood of the paper's
  Appendix C.6, log p(x + c) / (|x| + |c|): every token of the joined text
  (prefix and candidate, each stripped, joined by one space, as the
  released scoring code joins them) after the LM's start token, averaged
  over the joined text's tokens; `reduce="sum"` gives log p(x + c). A joined
  text longer than the LM's context drops the beginning of the prefix.

`reduce="sum"` turns `lm_loglik` into the total log-probability log p(c | x).
An empty continuation has no tokens to judge and scores -inf.

Batching: sequences (context + continuation tokens) are sorted by length and
padded per batch, on the left (default) or on the right, with an attention
mask and position ids counted from the first real token, so a padded batch
gives the same numbers as one sequence at a time. Sequences longer than the
LM's context keep the continuation (its first max_positions - 1 tokens) and
drop the beginning of the prefix.

Loading (`load_causal_lm`, shared with sampling in generation.py and
generative_negatives.py): a local HF folder, the tokenizer padding and
truncating on the left.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rankgen_jax.checkpoints.hf.common import safetensors_files
from rankgen_jax.errors import RankgenError
from rankgen_jax.pretrained import GEMMA, resolve_model

LM_METHODS = ("lm_loglik", "pmi", "avg_ull")
REDUCTIONS = ("mean", "sum")


@dataclass
class CausalLM:
    """A loaded HF causal LM and its tokenizer, with the few calls scoring and sampling need."""

    model: Any
    tokenizer: Any
    device: str
    max_positions: int | None
    source: str = ""

    def __post_init__(self):
        params = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed past_key_values to cache; accept either.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        # logits_to_keep avoids materialising [rows, length, vocab] logits when only a few positions are needed.
        self._keeps_logits = "logits_to_keep" in params

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    @property
    def start_id(self) -> int:
        """The token unconditional text follows: BOS, else EOS (GPT-2 separates documents with it)."""
        for token_id in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id):
            if token_id is not None:
                return token_id
        raise RankgenError(f"causal LM {self.source}: the tokenizer has neither a bos nor an eos token to start from")

    def prefix_ids(self, text: str) -> list[int]:
        """Token ids of a prefix, with the tokenizer's own special tokens (e.g. a BOS)."""
        ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        return list(ids) if ids else [self.start_id]

    def text_ids(self, text: str) -> list[int]:
        """Token ids of a continuation, without special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def forward(self, ids_RxT, mask_RxT, position_RxT, cache=None, keep: int = 0):
        """Logits [R, keep or T, V] (float32) and the updated KV cache of one forward pass."""
        import torch  # heavy and optional (the torch extra): only where an LM runs

        kwargs = {self._cache_arg: cache} if cache is not None else {}
        if keep and self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        with torch.no_grad():
            out = self.model(input_ids=ids_RxT, attention_mask=mask_RxT, position_ids=position_RxT,
                             use_cache=True, **kwargs)
        logits = out.logits if not keep or self._keeps_logits else out.logits[:, -keep:]
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return logits.float(), new_cache


def load_lm_and_tokenizer(lm_dir: str, device: str):
    """Load a causal LM and its tokenizer, or say clearly why it is not one.

    `lm_dir`: a HuggingFace causal LM folder (safetensors weights), a GGUF file of an architecture
    transformers reads (dequantised to float32), or a named pretrained LM (`pretrained.GEMMA`).
    """
    # Heavy and optional (the torch extra): imported when an LM is loaded.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    lm_dir = resolve_model(lm_dir)
    path = Path(lm_dir)
    if path.is_file() and path.suffix == ".gguf":
        where, options = str(path.parent), {"gguf_file": path.name}
    elif not path.is_dir():
        raise RankgenError(f"causal LM {lm_dir} is not a folder or a .gguf file (expected a HuggingFace causal LM folder, "
                           f"a GGUF file, or {GEMMA!r})")
    elif not (path / "config.json").is_file():
        raise RankgenError(f"causal LM {lm_dir} has no config.json: not a HuggingFace model folder")
    else:
        try:  # weights as safetensors only: unpickling a pytorch_model.bin can run code
            safetensors_files(lm_dir)
        except RankgenError as e:
            raise RankgenError(f"causal LM {e}") from None
        where, options = lm_dir, {"use_safetensors": True}
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=True, **options)
        model = AutoModelForCausalLM.from_pretrained(where, local_files_only=True, **options)
    except (OSError, ValueError, KeyError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"causal LM {lm_dir} is not a causal LM transformers can load: {first}") from None
    options.pop("use_safetensors", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True, **options)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"causal LM {lm_dir} has no usable tokenizer: {first}") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise RankgenError(f"causal LM {lm_dir}: the tokenizer has neither a pad nor an eos token")
        # Batched sampling needs a pad id; padded positions are masked, so eos is a safe stand-in.
        tokenizer.pad_token = tokenizer.eos_token
    # Decoder-only models continue from the last position, so pad on the left;
    # truncate on the left too, since the end of the prefix is what the continuation follows.
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    try:
        model.to(torch.device(device))
    except (RuntimeError, AssertionError) as e:
        raise RankgenError(f"`device` {device}: {str(e).strip().splitlines()[0]}", names=("device",)) from None
    model.eval()
    return config, model, tokenizer


def lm_max_positions(config) -> int | None:
    """The longest input an HF causal LM config allows, under whichever name it uses; None if it says none."""
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_causal_lm(lm_dir: str, device: str = "cpu") -> CausalLM:
    """Load a local HF causal LM folder (model + tokenizer) for scoring or sampling."""
    config, model, tokenizer = load_lm_and_tokenizer(lm_dir, device)
    return CausalLM(model, tokenizer, device, lm_max_positions(config), source=lm_dir)


def pad_for_causal_lm(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left"):
    """(ids [R, T], mask [R, T], positions [R, T]) torch tensors, T the longest row, padded on `side`.

    Positions count from each row's first real token, so a left-padded row
    sees the positions it would alone. (data.text.pad_batch is the encoders'
    one: a fixed length, right padding, rows cut to fit, no mask.)
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    if side not in ("left", "right"):
        raise RankgenError(f"padding side must be 'left' or 'right', got {side!r}")
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for r, seq in enumerate(seqs):
        if not seq:
            continue
        span = slice(length - len(seq), length) if side == "left" else slice(0, len(seq))
        ids[r, span] = torch.tensor(list(seq), dtype=torch.long)
        mask[r, span] = 1
    # Padded positions get 0; they are masked, so their value only has to be a valid index.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def _fit(context: Sequence[int], target: Sequence[int], max_positions: int | None) -> tuple[list[int], list[int]]:
    """Cut (context, target) to the LM's context: the target keeps its start, the context its end."""
    context, target = list(context), list(target)
    if max_positions is None or len(context) + len(target) <= max_positions:
        return context, target
    target = target[: max_positions - 1]
    return context[len(context) - (max_positions - len(target)) :], target


def token_logprobs(
    lm: CausalLM, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], batch_size: int = 16,
    padding_side: str = "left",
) -> list[np.ndarray]:
    """log p(target_t | context, target_<t) for every target token: one float64 array per pair.

    Every context needs at least one token (the first target token is
    predicted from the last context position).
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    if len(contexts) != len(targets):
        raise RankgenError(f"token_logprobs: {len(contexts)} contexts but {len(targets)} targets")
    if batch_size < 1:
        raise RankgenError(f"batch_size must be >= 1, got {batch_size}")
    pairs = [_fit(c, t, lm.max_positions) for c, t in zip(contexts, targets)]
    if any(not c for c, _ in pairs):
        raise RankgenError("token_logprobs: every context needs at least one token")
    out: list[np.ndarray] = [np.zeros(len(t), np.float64) for _, t in pairs]
    # Longest first, so similar lengths share a batch (little padding) and a memory error shows up at once.
    order = sorted((i for i, (_, t) in enumerate(pairs) if t), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        seqs = [pairs[i][0] + pairs[i][1] for i in rows]
        ids, mask, positions = pad_for_causal_lm(seqs, lm.pad_id, padding_side)
        length = ids.shape[1]
        # First position whose logits are needed in any row: the last context token of the row that starts earliest.
        starts = [(length - len(s) if padding_side == "left" else 0) + len(pairs[i][0]) - 1 for i, s in zip(rows, seqs)]
        keep = length - min(starts)
        logits, _ = lm.forward(ids.to(lm.device), mask.to(lm.device), positions.to(lm.device), keep=keep)
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
        offset = length - keep
        for r, (i, first) in enumerate(zip(rows, starts)):
            target = pairs[i][1]
            where = torch.arange(first, first + len(target)) - offset
            picked = logprobs[r, where, torch.tensor(target, dtype=torch.long)]
            out[i] = picked.double().numpy()
    return out


def _reduce(values: np.ndarray, reduce: str) -> float:
    if values.size == 0:
        return -math.inf
    return float(values.mean() if reduce == "mean" else values.sum())


def score_lists(
    lm: CausalLM, prefixes: Sequence[str], candidate_lists: Sequence[Sequence[str]], method: str = "lm_loglik",
    reduce: str = "mean", batch_size: int = 16,
) -> list[np.ndarray]:
    """For each prefix, the `method` scores [C_i] (float64) of its candidates; all pairs batched together."""
    if method not in LM_METHODS:
        raise RankgenError(f"unknown LM scoring method {method!r}: expected one of {LM_METHODS}")
    if reduce not in REDUCTIONS:
        raise RankgenError(f"unknown reduction {reduce!r}: expected one of {REDUCTIONS}")
    if len(prefixes) != len(candidate_lists):
        raise RankgenError(f"score_lists: {len(prefixes)} prefixes but {len(candidate_lists)} candidate lists")
    contexts, targets = [], []
    for prefix, candidates in zip(prefixes, candidate_lists):
        context = [lm.start_id] if method == "avg_ull" else lm.prefix_ids(prefix)
        for candidate in candidates:
            contexts.append(context)
            targets.append(_joined_ids(lm, prefix, candidate) if method == "avg_ull" else lm.text_ids(candidate))
    conditional = token_logprobs(lm, contexts, targets, batch_size)
    if method == "pmi":
        # Each distinct candidate's unconditional log-probability is computed once.
        unique = sorted({tuple(t) for t in targets})
        marginal = dict(zip(unique, token_logprobs(lm, [[lm.start_id]] * len(unique), unique, batch_size)))
    out, k = [], 0
    for candidates in candidate_lists:
        scores_C = np.empty(len(candidates), np.float64)
        for j in range(len(candidates)):
            values = conditional[k]
            if method == "pmi":
                # _fit may have shortened the target of either call; compare the tokens both saw.
                prior = marginal[tuple(targets[k])]
                n = min(len(values), len(prior))
                values = values[:n] - prior[:n]
            scores_C[j] = _reduce(values, reduce)
            k += 1
        out.append(scores_C)
    return out


def _joined_ids(lm: CausalLM, prefix: str, candidate: str) -> list[int]:
    """Token ids of prefix + " " + candidate (an empty candidate: none, so it scores -inf as in the other
    methods), cut from the left to fit the LM's context after the start token."""
    if not candidate.strip():
        return []
    ids = lm.text_ids(prefix.strip() + " " + candidate.strip())
    if lm.max_positions is not None and len(ids) >= lm.max_positions:
        ids = ids[len(ids) - (lm.max_positions - 1) :]
    return ids


def lm_loglik_scores(lm: CausalLM, prefix: str, candidates: Sequence[str], reduce: str = "mean",
                     batch_size: int = 16) -> np.ndarray:
    """Mean (or summed) log p(candidate | prefix) per candidate."""
    return score_lists(lm, [prefix], [candidates], "lm_loglik", reduce, batch_size)[0]


def pmi_scores(lm: CausalLM, prefix: str, candidates: Sequence[str], reduce: str = "mean",
               batch_size: int = 16) -> np.ndarray:
    """Mean per-token (or total) log p(candidate | prefix) - log p(candidate) per candidate."""
    return score_lists(lm, [prefix], [candidates], "pmi", reduce, batch_size)[0]

