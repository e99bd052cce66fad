"""Decode from a HuggingFace causal LM (PyTorch) with RankGen beam search, re-ranking, or plain sampling.

Strategies (`generate --strategy`):

- `nucleus`, `greedy`, `ancestral`, `top_k`, `typical`: one continuation per
  prefix, token by token, nothing re-ranked (the paper's baselines).
- `rerank`: over-generate `num_samples` continuations of `max_new_tokens`
  and keep the best by the re-ranker (beam search with B=1, L=max).
- `beam`: RankGen beam search (docs/design/rankgen.md, 'RankGen beam search'). For every unfinished
  beam sample N continuations of L more tokens from the LM given prefix +
  beam; score every candidate's whole generated text (not only its last L
  tokens) against the prefix; keep the top B of these candidates and of the
  beams already finished; stop when every kept beam has hit EOS or the
  budget. The first round starts from B empty beams, so every round samples
  up to B x N continuations per prefix: the paper's "number of samples"
  (App. A.3) and its released code's start.

The paper's protocol is the default (RankGen §2.3, §3.2, App. A.3): 128-token
generations; `rerank` over-generates 20 samples, `beam` keeps B = 2 beams of
N = 10 samples each, re-ranked every L = 20 tokens; nucleus sampling with
p = 0.9. A finished text (EOS or budget) is cut as the paper cuts generations
(`cut="sentence"`: whitespace collapsed, then cut after its last . ? ! or ;,
`data.sentences.cut_at_last_sentence_end`, the released code's `truncate`),
and a finished candidate is scored as cut, so what is ranked is what is
output (the released re-ranking scores cut samples; its beam search cuts
after the last ranking). `cut="none"` keeps the decoded text whole.

The token budget (`max_new_tokens`) belongs to each prefix: a beam counts its
own new tokens, so prefixes decoded together never share or reset a budget.
Work is batched across prefixes and beams; `max_batch_rows` caps how many
sequences the LM samples at once (the memory knob for small GPUs) and does
not change the result. Rows that share a context (a beam's N samples, the 20
of over-generation) share its first forward pass, whose cost grows with the
prefix's length and is most of the sampling time for short continuations.

Seeding: every sampled row (one continuation of one beam in one round) gets
its own `torch.Generator`, seeded from a hash of (seed, prefix index, round,
beam rank, sample index), and draws all its uniforms up front, one per token,
on the CPU. Tokens are picked by inverse-CDF sampling from those uniforms, so
a row's text depends only on its own key and context, never on which rows
share its batch: results are identical whatever `max_batch_rows` or the
number of prefixes per call (up to float noise of differently padded
batches, which would have to land exactly on a CDF boundary to matter).
Plain sampling is the row (seed, i, 0, 0, 0), so `beam` with N=1, B=1,
L=max equals `nucleus` under the same seed. The prefix index is the record's
position among the good input lines (or `prefix_indices` in the API).

Re-rankers are callables `(prefix_text, candidate_texts) -> scores`; an
optional `score_many(prefixes, candidate_lists)` method batches across
prefixes. Provided: RankGen (dual encoder, JAX: "pre " / "suffi " markers,
dot product), LM perplexity (mean token log-probability of the candidate
given the prefix) and unigram overlap (F1 of word sets with the prefix).

Timing: batched work is split among the prefixes in it in proportion to
their rows (sampling) or candidates (re-ranking); `seconds_generate` and
`seconds_rerank` of an output are its share. The first calls of a RankGen
re-ranker include JAX compilation.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.jsonl import collect_jsonl
from rankgen_jax.data.sentences import cut_at_last_sentence_end
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.sparse import unigram_overlap_scores
from rankgen_jax.lm.scoring import CausalLM, load_causal_lm, pad_for_causal_lm, score_lists

if TYPE_CHECKING:
    # For annotations only: inference.encoder imports jax, and the CLI imports this module before it
    # sets XLA's flags.
    from rankgen_jax.inference.encoder import LoadedModel

SAMPLERS = ("nucleus", "greedy", "ancestral", "top_k", "typical")
STRATEGIES = SAMPLERS + ("rerank", "beam")
RERANKERS = ("rankgen", "perplexity", "unigram")
CUTS = ("sentence", "none")
# The paper's protocol (RankGen §2.3, §3.2, App. A.3): 128-token generations; over-generate-and-rerank with 20
# samples; beam search with B = 2 beams of N = 10 samples, re-ranked every L = 20 tokens.
MAX_NEW_TOKENS = 128
RERANK_SAMPLES = 20
BEAM_SIZE, BEAM_SAMPLES, RERANK_LENGTH = 2, 10, 20
Reranker = Callable[[str, Sequence[str]], np.ndarray]


# ---------------------------------------------------------------------------
# Token sampling


@dataclass(frozen=True)
class Decoding:
    """How a token is picked from the next-token distribution."""

    sampler: str = "nucleus"
    top_p: float = 0.9
    top_k: int = 40
    typical_p: float = 0.95

    def check(self) -> None:
        """Raise RankgenError naming the first bad setting."""
        if self.sampler not in SAMPLERS:
            raise RankgenError(f"unknown sampling {self.sampler!r}: expected one of {SAMPLERS}")
        if not 0.0 < self.top_p <= 1.0:
            raise RankgenError(f"`top_p` must be in (0, 1], got {self.top_p}", names=("top_p",))
        if self.top_k < 1:
            raise RankgenError(f"`top_k` must be at least 1, got {self.top_k}", names=("top_k",))
        if not 0.0 < self.typical_p <= 1.0:
            raise RankgenError(f"`typical_p` must be in (0, 1], got {self.typical_p}", names=("typical_p",))


@dataclass(frozen=True)
class SearchSettings:
    """How generate() and search() decode; the defaults are the paper's protocol.

    num_samples None: the paper's number for the strategy (20 for rerank, 10 per beam); rerank_length None:
    candidates are ranked only once finished. max_batch_rows caps the sequences the LM samples at once (the memory
    knob) and never changes the result; `seed` keys every sampled row (see the module docstring).
    """

    beam_size: int = BEAM_SIZE
    num_samples: int | None = None
    rerank_length: int | None = RERANK_LENGTH
    max_new_tokens: int = MAX_NEW_TOKENS
    decoding: Decoding = Decoding()
    max_prompt_tokens: int | None = None
    cut: str = "sentence"
    seed: int = 0
    max_batch_rows: int = 64

    def check(self) -> None:
        """Raise RankgenError naming the first bad setting."""
        for name in ("beam_size", "num_samples", "rerank_length", "max_new_tokens", "max_batch_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RankgenError(f"`{name}` must be at least 1, got {value}", names=(name,))
        if self.cut not in CUTS:
            raise RankgenError(f"unknown `cut` {self.cut!r}: expected one of {CUTS}", names=("cut",))
        self.decoding.check()


# Candidates the nucleus is first looked for among: a trained LM's p = 0.9 head is a few dozen tokens, while
# sorting a 262k-token vocabulary (Gemma 3) for every row and step cost more than the LM's own forward pass.
NUCLEUS_CANDIDATES = 1024


def pick_tokens(logits_RxV, uniform_R, decoding: Decoding):
    """One token per row: inverse-CDF sampling of the truncated distribution with the given uniforms.

    Each row is computed on its own (no reduction across rows), so a row's
    token does not depend on the other rows of the batch. Tokens are ordered
    by probability, ties in vocabulary order (a stable sort).
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    if decoding.sampler == "greedy":
        return logits_RxV.argmax(dim=-1)
    logp_RxV = torch.log_softmax(logits_RxV.float(), dim=-1)
    p_RxV = logp_RxV.exp()
    if decoding.sampler == "typical":
        # Meister et al. 2022: rank tokens by how close their surprisal is to the entropy.
        entropy_Rx1 = -(p_RxV * logp_RxV).nan_to_num(0.0).sum(-1, keepdim=True)
        key_RxV = -(-logp_RxV - entropy_Rx1).abs()
    else:
        key_RxV = logp_RxV
    order_RxK = None
    if decoding.sampler in ("nucleus", "top_k"):
        order_RxK = _head_order(key_RxV, p_RxV, decoding)
    if order_RxK is None:
        # Stable sort: equal keys keep vocabulary order, so ties never depend on the batch.
        _, order_RxK = torch.sort(key_RxV, dim=-1, descending=True, stable=True)
    sorted_RxK = p_RxV.gather(-1, order_RxK)
    head = sorted_RxK.shape[-1]
    if decoding.sampler == "top_k":
        keep_RxK = (torch.arange(head, device=sorted_RxK.device) < decoding.top_k).expand_as(sorted_RxK)
    elif decoding.sampler in ("nucleus", "typical"):
        mass = decoding.top_p if decoding.sampler == "nucleus" else decoding.typical_p
        # Keep the smallest head whose mass reaches p: a token stays while the mass before it is below p.
        before_RxK = sorted_RxK.cumsum(-1) - sorted_RxK
        keep_RxK = before_RxK < mass
        keep_RxK[:, 0] = True
    else:  # ancestral
        keep_RxK = torch.ones_like(sorted_RxK, dtype=torch.bool)
    cdf_RxK = (sorted_RxK * keep_RxK).cumsum(-1)
    target_Rx1 = uniform_R.to(cdf_RxK.device, cdf_RxK.dtype)[:, None] * cdf_RxK[:, -1:]
    index_R = torch.searchsorted(cdf_RxK, target_Rx1, right=True).squeeze(-1)
    # Rounding can put the target on the total mass: fall back to the last kept token.
    index_R = torch.minimum(index_R, keep_RxK.sum(-1) - 1)
    return order_RxK.gather(-1, index_R[:, None]).squeeze(-1)


def _head_order(key_RxV, p_RxV, decoding: Decoding):
    """The first tokens of the stable descending order, when they hold every kept token; else None.

    The top NUCLEUS_CANDIDATES keys are put in the full sort's order (by key, ties by vocabulary
    index). They are that order's head when the next key is strictly smaller, and they hold every
    kept token when the nucleus (or top k) ends before the last of them; otherwise the caller sorts
    the whole vocabulary.
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    vocab = key_RxV.shape[-1]
    head = NUCLEUS_CANDIDATES
    if vocab <= head + 1 or (decoding.sampler == "top_k" and decoding.top_k >= head):
        return None
    top_RxH, index_RxH = torch.topk(key_RxV, head + 1, dim=-1, sorted=True)
    if bool((top_RxH[:, head - 1] <= top_RxH[:, head]).any()):
        return None  # a tie across the cut: which tokens are in the head depends on the tie order
    by_index_RxH = index_RxH[:, :head].sort(dim=-1).values
    _, order_RxH = torch.sort(key_RxV.gather(-1, by_index_RxH), dim=-1, descending=True, stable=True)
    order_RxH = by_index_RxH.gather(-1, order_RxH)
    if decoding.sampler == "nucleus":
        sorted_RxH = p_RxV.gather(-1, order_RxH)
        before_last_R = sorted_RxH[:, :-1].sum(-1)
        if bool((before_last_R < decoding.top_p).any()):
            return None  # the nucleus may reach past the head
    return order_RxH


def row_seed(seed: int, prefix_index: int, round_index: int, beam_index: int, sample_index: int) -> int:
    """The generator seed of one sampled row: a hash, so nearby keys give unrelated streams."""
    key = f"{seed}:{prefix_index}:{round_index}:{beam_index}:{sample_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)


@dataclass
class SampleRow:
    """One continuation to sample: its context ids, how many tokens at most, and its seed."""

    context: list[int]
    steps: int
    seed: int
    owner: int = 0  # the prefix it belongs to (for timing shares)


def sample_rows(lm: CausalLM, rows: Sequence[SampleRow], decoding: Decoding, max_batch_rows: int = 64,
                ) -> tuple[list[list[int]], list[float]]:
    """New token ids of every row (up to and including EOS) and each row's share of the seconds spent.

    Rows are sorted by context length (little padding) and sampled at most
    `max_batch_rows` at a time; neither choice changes a row's tokens.
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    if max_batch_rows < 1:
        raise RankgenError(f"`max_batch_rows` must be at least 1, got {max_batch_rows}", names=("max_batch_rows",))
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r].context))
    tokens: list[list[int]] = [[] for _ in rows]
    seconds = [0.0] * len(rows)
    for start in range(0, len(order), max_batch_rows):
        chunk = order[start : start + max_batch_rows]
        began = time.perf_counter()
        for r, new in zip(chunk, _decode_chunk(lm, [rows[r] for r in chunk], decoding)):
            tokens[r] = new
        if lm.device.startswith("cuda"):
            torch.cuda.synchronize()
        spent = (time.perf_counter() - began) / len(chunk)
        for r in chunk:
            seconds[r] = spent
    return tokens, seconds


def _decode_chunk(lm: CausalLM, rows: Sequence[SampleRow], decoding: Decoding) -> list[list[int]]:
    """Sample the rows together with a KV cache; each row stops at EOS or after its own step count."""
    import torch  # heavy and optional (the torch extra): only where an LM runs

    steps = max(row.steps for row in rows)
    uniform_RxS = torch.zeros((len(rows), steps), dtype=torch.float64)
    for r, row in enumerate(rows):
        generator = torch.Generator().manual_seed(row.seed)
        uniform_RxS[r, : row.steps] = torch.rand(row.steps, generator=generator, dtype=torch.float64)
    logits_RxV, cache, mask, positions = _prefill(lm, [row.context for row in rows])
    eos = lm.eos_id
    out: list[list[int]] = [[] for _ in rows]
    active = [row.steps > 0 for row in rows]
    position_Rx1 = positions[:, -1:]
    for t in range(steps):
        picked = pick_tokens(logits_RxV[:, -1], uniform_RxS[:, t], decoding).tolist()
        for r, token in enumerate(picked):
            if active[r]:
                out[r].append(token)
                if token == eos or len(out[r]) >= rows[r].steps:
                    active[r] = False
        if not any(active):
            break
        # Finished rows keep running (their tokens are ignored) so the batch keeps one shape.
        feed_Rx1 = torch.tensor([[token] for token in picked], dtype=torch.long, device=lm.device)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position_Rx1 = position_Rx1 + 1
        logits_RxV, cache = lm.forward(feed_Rx1, mask, position_Rx1, cache=cache, keep=1)
    return out


def _prefill(lm: CausalLM, contexts: Sequence[Sequence[int]]):
    """The first forward pass of every row: (last logits [R, 1, V], KV cache, mask [R, T], positions [R, T]).

    Rows that share a context (the N samples of one beam, the 20 of over-generation) share its
    forward pass: each distinct context runs once and the cache is expanded to the rows, which is
    what prefilling every row would give (the padding is the same: the longest context sets it). An
    LM whose cache cannot be reordered prefills every row.
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    keys = [tuple(context) for context in contexts]
    slot = {key: k for k, key in enumerate(dict.fromkeys(keys))}
    distinct = [list(key) for key in slot]
    ids, mask, positions = pad_for_causal_lm(distinct, lm.pad_id, "left")
    ids, mask, positions = ids.to(lm.device), mask.to(lm.device), positions.to(lm.device)
    logits, cache = lm.forward(ids, mask, positions, keep=1)
    if len(distinct) == len(keys):
        return logits, cache, mask, positions
    if not hasattr(cache, "reorder_cache"):
        ids, mask, positions = pad_for_causal_lm(contexts, lm.pad_id, "left")
        ids, mask, positions = ids.to(lm.device), mask.to(lm.device), positions.to(lm.device)
        logits, cache = lm.forward(ids, mask, positions, keep=1)
        return logits, cache, mask, positions
    index_R = torch.tensor([slot[key] for key in keys], dtype=torch.long, device=logits.device)
    cache.reorder_cache(index_R)
    return logits[index_R], cache, mask[index_R], positions[index_R]


# ---------------------------------------------------------------------------
# Re-rankers


def _score_many(reranker, prefixes: Sequence[str], candidate_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Scores of every candidate list, batched across prefixes when the re-ranker can."""
    many = getattr(reranker, "score_many", None)
    if many is not None:
        return [np.asarray(s, np.float64) for s in many(prefixes, candidate_lists)]
    return [np.asarray(reranker(p, c), np.float64) for p, c in zip(prefixes, candidate_lists)]


class RankGenReranker:
    """RankGen scores: "pre " + prefix vector . "suffi " + candidate vector (JAX dual encoder).

    Long prefixes keep their end (the text the continuation follows). Prefix
    vectors are cached between calls for the prefixes of the latest call, so
    beam search encodes each prefix once.
    """

    def __init__(self, model: LoadedModel, batch_size: int = 64):
        self.model = model
        self.batch_size = batch_size
        self._prefix_vectors: dict[str, np.ndarray] = {}

    def __call__(self, prefix: str, candidates: Sequence[str]) -> np.ndarray:
        return self.score_many([prefix], [candidates])[0]

    def score_many(self, prefixes: Sequence[str], candidate_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
        missing = sorted({p for p in prefixes if p not in self._prefix_vectors})
        vectors = {p: self._prefix_vectors[p] for p in prefixes if p in self._prefix_vectors}
        if missing:
            # Long LM contexts keep their end, the text the candidates continue (whatever the model records).
            encoded_NxD = self.model.encode(missing, side="prefix", batch_size=self.batch_size, keep="end",
                                            truncation="clean")
            vectors.update(zip(missing, encoded_NxD))
        self._prefix_vectors = vectors
        flat = [c for cands in candidate_lists for c in cands]
        cand_MxD = (self.model.encode(flat, side="suffix", batch_size=self.batch_size, truncation="clean")
                    if flat else None)
        out, k = [], 0
        for prefix, cands in zip(prefixes, candidate_lists):
            out.append(cand_MxD[k : k + len(cands)] @ vectors[prefix] if cands else np.zeros(0, np.float32))
            k += len(cands)
        return out


class PerplexityReranker:
    """LM scores: mean log-probability of the candidate's tokens given the prefix (higher = lower perplexity)."""

    def __init__(self, lm: CausalLM, batch_size: int = 16):
        self.lm = lm
        self.batch_size = batch_size

    def __call__(self, prefix: str, candidates: Sequence[str]) -> np.ndarray:
        return self.score_many([prefix], [candidates])[0]

    def score_many(self, prefixes: Sequence[str], candidate_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
        return score_lists(self.lm, prefixes, candidate_lists, "lm_loglik", "mean", self.batch_size)


def unigram_reranker(prefix: str, candidates: Sequence[str]) -> np.ndarray:
    """Unigram-overlap F1 of each candidate's word set with the prefix's (retrieval.sparse.unigram_overlap_scores)."""
    return unigram_overlap_scores(prefix, candidates)


# ---------------------------------------------------------------------------
# Search


@dataclass
class _Beam:
    ids: list[int]
    finished: bool
    score: float | None = None
    text: str | None = None


@dataclass
class Generation:
    """The result for one prefix; `beams` are the final beams, best first ({"text", "score", "new_tokens", "eos"})."""

    prefix: str
    text: str
    new_tokens: int
    beams: list[dict] = field(default_factory=list)
    seconds_generate: float = 0.0
    seconds_rerank: float = 0.0


def prompt_ids(lm: CausalLM, prefix: str, max_new_tokens: int, max_prompt_tokens: int | None) -> list[int]:
    """The prefix's ids, cut from the left so that prompt + budget fits the LM's context."""
    ids = lm.prefix_ids(prefix)
    limit = max_prompt_tokens
    if limit is None and lm.max_positions is not None:
        limit = lm.max_positions - max_new_tokens
    if limit is not None:
        if limit < 1:
            raise RankgenError(f"no room for a prompt: `max_new_tokens` {max_new_tokens} fills the LM's "
                               f"{lm.max_positions}-token context; lower it or set `max_prompt_tokens`",
                               names=("max_new_tokens", "max_prompt_tokens"))
        ids = ids[-limit:]
    return ids


def _rank_key(beam: _Beam) -> float:
    """Sort key: NaN scores rank last."""
    return -math.inf if beam.score is None or math.isnan(beam.score) else beam.score


def search(
    lm: CausalLM,
    prefixes: Sequence[str],
    settings: SearchSettings = SearchSettings(),
    *,
    reranker: Reranker | None = None,
    prefix_indices: Sequence[int] | None = None,
) -> list[Generation]:
    """RankGen beam search over a group of prefixes (see the module docstring); num_samples None is the paper's 10.

    Without a re-ranker every candidate scores 0 and the first ones are kept
    (used by the plain sampling strategies, where B = N = 1).
    """
    settings.check()
    beam_size, max_new_tokens, rerank_length, cut = (settings.beam_size, settings.max_new_tokens,
                                                     settings.rerank_length, settings.cut)
    num_samples = BEAM_SAMPLES if settings.num_samples is None else settings.num_samples
    keys = list(range(len(prefixes))) if prefix_indices is None else list(prefix_indices)
    if len(keys) != len(prefixes):
        raise RankgenError(f"search: {len(prefixes)} prefixes but {len(keys)} `prefix_indices`",
                           names=("prefix_indices",))
    step = max_new_tokens if rerank_length is None else min(rerank_length, max_new_tokens)
    prompts = [prompt_ids(lm, p, max_new_tokens, settings.max_prompt_tokens) for p in prefixes]
    beams = [[_Beam([], False) for _ in range(beam_size)] for _ in prefixes]
    seconds_generate = [0.0] * len(prefixes)
    seconds_rerank = [0.0] * len(prefixes)
    round_index = 0
    while True:
        rows, parents = [], []
        for i, prefix_beams in enumerate(beams):
            for b, beam in enumerate(prefix_beams):
                if beam.finished:
                    continue
                steps = min(step, max_new_tokens - len(beam.ids))
                for j in range(num_samples):
                    rows.append(
                        SampleRow(prompts[i] + beam.ids, steps, row_seed(settings.seed, keys[i], round_index, b, j), i)
                    )
                    parents.append(beam)
        if not rows:
            break
        new_ids, row_seconds = sample_rows(lm, rows, settings.decoding, settings.max_batch_rows)
        # Finished beams compete again with the new candidates (their scores are kept).
        candidates = [[beam for beam in prefix_beams if beam.finished] for prefix_beams in beams]
        for row, parent, ids, spent in zip(rows, parents, new_ids, row_seconds):
            full = parent.ids + ids
            done = (lm.eos_id is not None and lm.eos_id in ids) or len(full) >= max_new_tokens
            candidates[row.owner].append(_Beam(full, done))
            seconds_generate[row.owner] += spent
        for prefix_candidates in candidates:
            for beam in prefix_candidates:
                if beam.text is None:
                    beam.text = lm.decode(beam.ids)
                    if beam.finished and cut == "sentence":
                        beam.text = cut_at_last_sentence_end(beam.text)
        _score_candidates(reranker, prefixes, candidates, seconds_rerank)
        for i, prefix_candidates in enumerate(candidates):
            # Stable sort: equal scores keep candidate order (finished beams first, then by beam and sample).
            beams[i] = sorted(prefix_candidates, key=_rank_key, reverse=True)[:beam_size]
        round_index += 1
    results = []
    for i, prefix in enumerate(prefixes):
        best = beams[i][0]
        results.append(Generation(
            prefix=prefix, text=best.text or "", new_tokens=len(best.ids),
            beams=[{"text": b.text, "score": _json_score(b.score), "new_tokens": len(b.ids),
                    "eos": bool(b.ids) and b.ids[-1] == lm.eos_id} for b in beams[i]],
            seconds_generate=seconds_generate[i], seconds_rerank=seconds_rerank[i],
        ))
    return results


def _json_score(score: float | None) -> float | None:
    """The score as written to JSON: None when missing or not finite (an empty text under the LM scores -inf)."""
    return float(score) if score is not None and math.isfinite(score) else None


def _score_candidates(reranker, prefixes, candidates, seconds_rerank) -> None:
    """Score the candidates that have no score yet, in one batched call; charge each prefix its share."""
    todo = [i for i, cands in enumerate(candidates) if any(c.score is None for c in cands)]
    if reranker is None:
        for i in todo:
            for c in candidates[i]:
                c.score = 0.0 if c.score is None else c.score
        return
    if not todo:
        return
    texts = [[c.text for c in candidates[i] if c.score is None] for i in todo]
    began = time.perf_counter()
    scores = _score_many(reranker, [prefixes[i] for i in todo], texts)
    spent = time.perf_counter() - began
    total = sum(len(t) for t in texts)
    for i, t, scores_C in zip(todo, texts, scores):
        if len(scores_C) != len(t):
            raise RankgenError(f"re-ranker returned {len(scores_C)} scores for {len(t)} candidates")
        unscored = (c for c in candidates[i] if c.score is None)
        for c, s in zip(unscored, scores_C.tolist()):
            c.score = s
        seconds_rerank[i] += spent * len(t) / total


def generate(
    lm: CausalLM,
    prefixes: Sequence[str],
    strategy: str = "beam",
    settings: SearchSettings = SearchSettings(),
    *,
    reranker: Reranker | None = None,
    prefix_indices: Sequence[int] | None = None,
) -> list[Generation]:
    """Continue every prefix with `strategy` (see STRATEGIES); `settings.decoding` is the token sampler of rerank / beam.

    num_samples None is the paper's: 20 for rerank, 10 per beam for beam.
    The plain strategies ignore beam_size, num_samples, rerank_length and
    reranker, and take their sampler from the strategy name (its
    top_p / top_k / typical_p from `settings.decoding`).
    """
    if strategy not in STRATEGIES:
        raise RankgenError(f"unknown `strategy` {strategy!r}: expected one of {STRATEGIES}", names=("strategy",))
    decoding = settings.decoding
    if strategy in SAMPLERS:
        plain = Decoding(strategy, decoding.top_p, decoding.top_k, decoding.typical_p)
        return search(lm, prefixes, replace(settings, beam_size=1, num_samples=1, rerank_length=None, decoding=plain),
                      prefix_indices=prefix_indices)
    if reranker is None:
        raise RankgenError(f"strategy {strategy!r} needs a `reranker`", names=("reranker",))
    if decoding.sampler == "greedy":
        raise RankgenError(f"strategy {strategy!r} needs a random sampler: greedy would give N identical samples")
    if strategy == "rerank":
        samples = RERANK_SAMPLES if settings.num_samples is None else settings.num_samples
        settings = replace(settings, beam_size=1, num_samples=samples, rerank_length=None)
    return search(lm, prefixes, settings, reranker=reranker, prefix_indices=prefix_indices)


# ---------------------------------------------------------------------------
# The released package's generator


class RankGenGenerator:
    """The released `rankgen` package's RankGenGenerator over `generate` (code written for it runs unchanged).

    rankgen_encoder: a rankgen_jax RankGenEncoder; language_model: a local HF
    causal LM folder (no model hub here). beam_search is the `beam` strategy,
    overgenerate_rerank `rerank` and generate_single `nucleus`, re-ranked by
    RankGenReranker; each returns (texts, scores) per context as the released
    class does: the final beams' texts, best first, and their scores (NumPy
    here, torch there). The sampler is this module's (seeded by `seed`, see
    the module docstring), so samples differ from the released code's.
    """

    def __init__(self, rankgen_encoder, language_model: str, cache_dir: str | None = None, device: str = "cpu",
                 seed: int = 0, batch_size: int = 64):
        if cache_dir is not None:
            raise RankgenError("RankGenGenerator: cache_dir is for model-hub downloads; pass a local causal LM folder "
                               "as language_model")
        self.rankgen_encoder = rankgen_encoder
        self.lm = load_causal_lm(str(language_model), device)
        # The released class's attribute names.
        self.language_model, self.tokenizer, self.device = self.lm.model, self.lm.tokenizer, device
        self.reranker = RankGenReranker(rankgen_encoder.model, batch_size=batch_size)
        self.seed = seed

    def _run(self, contexts: Sequence[str], strategy: str, temperature: float, top_p: float, max_length: int,
             **settings) -> tuple[list[list[str]], list[np.ndarray]]:
        if isinstance(contexts, str) or not all(isinstance(c, str) for c in contexts):
            raise RankgenError("RankGenGenerator takes a list of context strings, e.g. beam_search(['Once upon a "
                               "time'])")
        if temperature != 1.0:
            raise RankgenError(f"RankGenGenerator: temperature={temperature} is not supported (the sampler draws at "
                               "temperature 1.0, as the RankGen paper's runs do)")
        settings = SearchSettings(max_new_tokens=max_length, decoding=Decoding("nucleus", top_p), seed=self.seed,
                                  **settings)
        results = generate(self.lm, list(contexts), strategy, settings, reranker=self.reranker)
        return ([[b["text"] for b in r.beams] for r in results],
                [np.array([np.nan if b["score"] is None else b["score"] for b in r.beams]) for r in results])

    def beam_search(self, contexts: Sequence[str], beam_size: int = 2, temperature: float = 1.0, top_p: float = 0.9,
                    num_tokens: int = 20, num_samples: int = 10, max_length: int = 115):
        """RankGen beam search: num_samples continuations of num_tokens per beam, the best beam_size kept."""
        return self._run(contexts, "beam", temperature, top_p, max_length, beam_size=beam_size,
                         num_samples=num_samples, rerank_length=num_tokens)

    def overgenerate_rerank(self, contexts: Sequence[str], temperature: float = 1.0, top_p: float = 0.9,
                            num_samples: int = 10, max_length: int = 115):
        """num_samples whole continuations, the best one kept."""
        return self._run(contexts, "rerank", temperature, top_p, max_length, num_samples=num_samples)

    def generate_single(self, contexts: Sequence[str], temperature: float = 1.0, top_p: float = 0.9,
                        num_samples: int = 10, max_length: int = 115):
        """One nucleus sample per context (num_samples is unused, as in the released class)."""
        return self._run(contexts, "nucleus", temperature, top_p, max_length)


# ---------------------------------------------------------------------------
# JSONL in, JSONL out


def check_prefix_record(record: dict) -> str | None:
    """None for a record with a non-empty string "prefix" (a `data.jsonl` check), else why not."""
    prefix = record.get("prefix")
    return None if isinstance(prefix, str) and prefix.strip() else "no non-empty string prefix"


def read_prefix_records(path: str) -> tuple[list[dict], int]:
    """The objects of a JSONL file that have a non-empty string "prefix", and the number of other (bad) lines."""
    if not Path(path).is_file():
        raise RankgenError(f"input {path} does not exist or is not a file")
    records, skipped = collect_jsonl(path, check_prefix_record)
    return records, skipped.count


@dataclass(frozen=True)
class RerankerSpec:
    """Which re-ranker rerank / beam use (one of RERANKERS); "rankgen" loads the dual encoder at model_path and
    encodes batch_size texts per call."""

    name: str = "rankgen"
    model_path: str | None = None
    batch_size: int = 64

    def check(self) -> None:
        """Raise RankgenError before any model is loaded."""
        if self.name not in RERANKERS:
            raise RankgenError(f"unknown re-ranker {self.name!r}: expected one of {RERANKERS}", names=("reranker",))
        if self.name == "rankgen" and not self.model_path:
            raise RankgenError("the rankgen re-ranker needs `model_path` (a RankGen dual encoder)",
                               names=("model_path",))


def make_reranker(spec: RerankerSpec, lm: CausalLM):
    """The re-ranker `spec` names, its model loaded."""
    spec.check()
    if spec.name == "rankgen":
        from rankgen_jax.inference.encoder import load_model  # starts jax: after the CLI has set XLA's flags

        return RankGenReranker(load_model(spec.model_path), batch_size=spec.batch_size)
    if spec.name == "perplexity":
        return PerplexityReranker(lm)
    return unigram_reranker


def generate_file(
    lm_path: str,
    input_path: str,
    output_path: str,
    strategy: str = "beam",
    settings: SearchSettings = SearchSettings(),
    *,
    reranker: RerankerSpec = RerankerSpec(),
    prefix_batch: int = 8,
    device: str = "cpu",
    progress: bool = True,
) -> dict:
    """What `rankgen-jax generate` does: continue every prefix of a JSONL file into output_path; returns summary stats.

    `reranker` is the re-ranker of rerank / beam (unused by the plain strategies). The LM at lm_path runs on the
    torch device.
    """
    if prefix_batch < 1:
        raise RankgenError(f"`prefix_batch` must be at least 1, got {prefix_batch}", names=("prefix_batch",))
    output = Path(output_path)
    if not output.parent.is_dir():
        raise RankgenError(f"output folder {output.parent} does not exist")
    if output.exists() and output.resolve() == Path(input_path).resolve():
        raise RankgenError(f"output {output_path} is the input file; write the generations elsewhere")
    settings.check()
    reranks = strategy in ("rerank", "beam")
    # Check everything cheap before loading models, which can take minutes.
    if reranks:
        reranker.check()
    elif reranker.model_path:
        print(f"note: the RankGen model {reranker.model_path} is not used with strategy {strategy}", file=sys.stderr)
    records, bad = read_prefix_records(input_path)
    lm = load_causal_lm(lm_path, device)
    scorer = make_reranker(reranker, lm) if reranks else None
    stats = write_generations(lm, records, output, strategy, settings, reranker=scorer,
                              reranker_name=reranker.name if reranks else None, prefix_batch=prefix_batch,
                              progress=progress)
    stats["bad_lines"] = bad
    print(f"generate: {len(records)} prefixes with {strategy}, {bad} bad lines skipped; "
          f"{stats['seconds_generate']:.1f}s generating, {stats['seconds_rerank']:.1f}s re-ranking "
          f"({stats['rerank_share']:.1%}) -> {output_path}")
    return stats


def write_generations(lm: CausalLM, records: Sequence[dict], output: Path, strategy: str,
                      settings: SearchSettings, *, reranker: Reranker | None = None, reranker_name: str | None = None,
                      prefix_batch: int = 8, progress: bool = True) -> dict:
    """Continue every record's prefix with loaded models and write the records with their generations.

    Each record is written back with "generation", "strategy", the re-ranker's
    name (`reranker_name`) and the final "beams" (rerank / beam), the seconds and "new_tokens".
    Returns the totals.
    """
    totals = {"seconds_generate": 0.0, "seconds_rerank": 0.0, "new_tokens": 0}
    bar = tqdm(total=len(records), unit="prefix", desc=f"generate ({strategy})", dynamic_ncols=True,
               disable=not progress, file=sys.stderr)
    try:
        with open(output, "w", encoding="utf-8") as out:
            for start in range(0, len(records), prefix_batch):
                group = records[start : start + prefix_batch]
                results = generate(lm, [r["prefix"] for r in group], strategy, settings, reranker=reranker,
                                   prefix_indices=range(start, start + len(group)))
                lines = []
                for record, result in zip(group, results):
                    row = {**record, "generation": result.text, "strategy": strategy}
                    if reranker_name is not None:
                        row["reranker"] = reranker_name
                        row["beams"] = result.beams
                    row.update(seconds_generate=result.seconds_generate, seconds_rerank=result.seconds_rerank,
                               new_tokens=result.new_tokens)
                    lines.append(json.dumps(row, ensure_ascii=False) + "\n")
                    for key in totals:
                        totals[key] += getattr(result, key)
                out.write("".join(lines))
                out.flush()
                bar.update(len(group))
    finally:
        bar.close()
    spent = totals["seconds_generate"] + totals["seconds_rerank"]
    return {"generated": len(records), **totals, "rerank_share": totals["seconds_rerank"] / spent if spent > 0 else 0.0}
