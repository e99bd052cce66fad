"""RankGen training examples from a document: prefix, gold continuation and InBook negatives.

Every piece is a run of whole sentences (see `sentences.split_sentences`), so
its text is exactly its sentences joined by spaces, and spans are recorded as
sentence index ranges [start, end) for checking that.

- Prefix: starting at sentence s, the longest run of whole sentences with at
  most `prefix_words` words; used only if it has at least
  `min_prefix_fraction * prefix_words` words (else that start is skipped, e.g.
  when a single sentence is longer than the budget).
- Continuation: the sentences right after the prefix. A target length T is
  drawn uniformly from [min_continuation_words, max_continuation_words]; the
  continuation is the longest run with at most T words, extended to the
  shortest run with at least `min_continuation_words` words when that is
  shorter. If that still breaks `max_continuation_words` (a single sentence
  longer than the maximum), the example is skipped rather than cut mid
  sentence, so every piece stays sentence-bounded.
- InBook negatives: other runs of whole sentences from the same document,
  disjoint from the prefix, the gold continuation and each other, with a word
  count as close as possible to the gold continuation's; a candidate within
  +-`length_tolerance` of it is taken at once, otherwise the closest of a few
  random tries. Negatives never exceed `max_continuation_words` words. If a
  document has no room for all negatives, the example is skipped.
- Prefix starts: with `prefix_stride_sentences` = 0 the next prefix starts
  where the previous one ended (non-overlapping prefixes); with k > 0 a prefix
  starts every k sentences. With `draw_prefix_words` each prefix's word
  budget is drawn uniformly from [min_prefix_words, prefix_words] instead, so
  that each seed ends prefixes, and starts continuations, at other sentences:
  fresh pairs from the same text. (Moving only the first prefix's start would
  not do: greedy runs of whole sentences fall back onto the same boundaries
  within a few prefixes.)

`make_examples` is deterministic given (config.seed, doc.id); a document too
short for one example gives [] (the caller counts those).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from rankgen_jax.data.documents import Document, document_genre
from rankgen_jax.data.sentences import split_sentences, word_count
from rankgen_jax.errors import RankgenError

Span = tuple[int, int]
# Random starting points tried per negative before settling for the closest length.
_NEGATIVE_TRIES = 24


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
    """How examples are cut from a document; every length is in whitespace-separated words."""

    prefix_words: int = 256
    min_continuation_words: int = 10
    max_continuation_words: int = 128
    negatives_per_example: int = 1
    prefix_stride_sentences: int = 0
    length_tolerance: float = 0.5
    seed: int = 0
    min_prefix_fraction: float = 0.5
    draw_prefix_words: bool = False

    def __post_init__(self):
        problems = []
        if self.prefix_words < 1:
            problems.append(f"prefix_words must be >= 1, got {self.prefix_words}")
        if not 1 <= self.min_continuation_words <= self.max_continuation_words:
            problems.append(
                "need 1 <= min_continuation_words <= max_continuation_words, got "
                f"{self.min_continuation_words} and {self.max_continuation_words}"
            )
        if self.negatives_per_example < 0:
            problems.append(f"negatives_per_example must be >= 0, got {self.negatives_per_example}")
        if self.prefix_stride_sentences < 0:
            problems.append(f"prefix_stride_sentences must be >= 0, got {self.prefix_stride_sentences}")
        if self.length_tolerance < 0:
            problems.append(f"length_tolerance must be >= 0, got {self.length_tolerance}")
        if not 0 < self.min_prefix_fraction <= 1:
            problems.append(f"min_prefix_fraction must be in (0, 1], got {self.min_prefix_fraction}")
        if problems:
            raise RankgenError("bad ExampleConfig: " + "; ".join(problems))

    @property
    def min_prefix_words(self) -> int:
        return math.ceil(self.min_prefix_fraction * self.prefix_words)


@dataclasses.dataclass(frozen=True)
class Example:
    """One training example: a prefix, its gold continuation and InBook negatives, with their sentence spans."""

    doc_id: str
    prefix: str
    continuation: str
    negatives: tuple[str, ...]
    prefix_span: Span
    continuation_span: Span
    negative_spans: tuple[Span, ...]

    def to_json(self, with_spans: bool = False) -> dict:
        """{"doc_id", "prefix", "continuation", "negatives"}, plus the three span fields if asked."""
        out = {
            "doc_id": self.doc_id,
            "prefix": self.prefix,
            "continuation": self.continuation,
            "negatives": list(self.negatives),
        }
        if with_spans:
            out["prefix_span"] = list(self.prefix_span)
            out["continuation_span"] = list(self.continuation_span)
            out["negative_spans"] = [list(s) for s in self.negative_spans]
        return out

    @classmethod
    def from_json(cls, record: dict) -> "Example":
        """Inverse of `to_json`; spans default to (0, 0) when the record has none."""
        negatives = tuple(record.get("negatives", ()))
        return cls(
            doc_id=record["doc_id"],
            prefix=record["prefix"],
            continuation=record["continuation"],
            negatives=negatives,
            prefix_span=tuple(record.get("prefix_span", (0, 0))),
            continuation_span=tuple(record.get("continuation_span", (0, 0))),
            negative_spans=tuple(tuple(s) for s in record.get("negative_spans", [(0, 0)] * len(negatives))),
        )


# The fields of a `generate-negatives` record that make it a (prefix, gold, generated) example.
GENERATIVE_FIELDS = ("prefix", "continuation", "generative_negative")
INCOMPLETE_GENERATIVE = "incomplete generative record"  # a skip reason: a field missing, or no doc_id


def generative_example(record: object) -> Example | None:
    """A `generate-negatives` record as an Example whose one negative is the sampled continuation; None when
    it lacks a non-empty prefix, continuation or generative_negative, or a doc_id (its same-document group)."""
    if not isinstance(record, dict):
        return None
    texts = [record.get(key) for key in GENERATIVE_FIELDS]
    if not all(isinstance(t, str) and t.strip() for t in texts):
        return None
    doc_id = record.get("doc_id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        return None
    prefix, continuation, negative = texts
    return Example(str(doc_id), prefix, continuation, (negative,), (0, 0), (0, 0), ((0, 0),))


def make_examples(doc: Document, config: ExampleConfig) -> list[Example]:
    """All examples of one document (see the module docstring); [] when it is too short for one."""
    sentences = split_sentences(doc.text)
    cum = cumulative_words(sentences)
    rng = np.random.default_rng([config.seed, _stable_hash(doc.id)])
    examples = []
    start = 0
    while start < len(sentences):
        budget = config.prefix_words
        if config.draw_prefix_words:
            budget = int(rng.integers(config.min_prefix_words, config.prefix_words + 1))
        prefix_end = longest_run(cum, start, budget)
        example = None
        if cum[prefix_end] - cum[start] >= config.min_prefix_words:
            example = _example_at(doc.id, sentences, cum, (start, prefix_end), config, rng)
        if example is not None:
            examples.append(example)
        if config.prefix_stride_sentences:
            start += config.prefix_stride_sentences
        else:
            start = max(prefix_end, start + 1)
    return examples


def _stable_hash(text: str) -> int:
    """A 63-bit hash of a document id that is the same in every process (unlike hash())."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little") >> 1


def cumulative_words(sentences: Sequence[str]) -> list[int]:
    """cum[i] = words in sentences[:i]; strictly increasing (no sentence is empty)."""
    cum = [0]
    for sentence in sentences:
        cum.append(cum[-1] + word_count(sentence))
    return cum


def _words(cum: list[int], span: Span) -> int:
    return cum[span[1]] - cum[span[0]]


def longest_run(cum: list[int], start: int, max_words: int, limit: int | None = None) -> int:
    """End of the longest run of sentences from `start` (not past `limit`) with at most `max_words` words."""
    limit = len(cum) - 1 if limit is None else limit
    end = bisect.bisect_right(cum, cum[start] + max_words, lo=start, hi=limit + 1) - 1
    return max(end, start)


def _example_at(
    doc_id: str, sentences: list[str], cum: list[int], prefix: Span, config: ExampleConfig, rng: np.random.Generator
) -> Example | None:
    """The example whose prefix is `prefix`, or None when no valid continuation or negatives fit."""
    continuation = _continuation(cum, prefix[1], config, rng)
    if continuation is None:
        return None
    negatives = []
    taken = [prefix, continuation]
    for _ in range(config.negatives_per_example):
        negative = _negative(cum, taken, _words(cum, continuation), config, rng)
        if negative is None:
            return None
        negatives.append(negative)
        taken.append(negative)

    def text(span: Span) -> str:
        return " ".join(sentences[span[0] : span[1]])

    return Example(
        doc_id=doc_id,
        prefix=text(prefix),
        continuation=text(continuation),
        negatives=tuple(text(s) for s in negatives),
        prefix_span=prefix,
        continuation_span=continuation,
        negative_spans=tuple(negatives),
    )


def _continuation(cum: list[int], start: int, config: ExampleConfig, rng: np.random.Generator) -> Span | None:
    """Sentences from `start` with a length drawn in [min, max] words, sentence-bounded; None if none fits."""
    target = int(rng.integers(config.min_continuation_words, config.max_continuation_words + 1))
    n = len(cum) - 1
    if start >= n:
        return None
    end = longest_run(cum, start, target)
    if cum[end] - cum[start] < config.min_continuation_words:
        # Shortest run reaching the minimum (a long next sentence, or the target fell between sentences).
        end = bisect.bisect_left(cum, cum[start] + config.min_continuation_words, lo=start)
        if end > n or cum[end] - cum[start] > config.max_continuation_words:
            return None
    return (start, end)


def _negative(
    cum: list[int], taken: list[Span], gold_words: int, config: ExampleConfig, rng: np.random.Generator
) -> Span | None:
    """A run of sentences disjoint from `taken` with about `gold_words` words; None if the document has no room."""
    n = len(cum) - 1
    free = np.ones(n, bool)
    for a, b in taken:
        free[a:b] = False
    starts = np.flatnonzero(free)
    if starts.size == 0:
        return None
    low = max(1, math.ceil((1 - config.length_tolerance) * gold_words))
    high = min(math.floor((1 + config.length_tolerance) * gold_words), config.max_continuation_words)
    taken_starts = sorted(a for a, _ in taken)
    best, best_gap = None, None
    for start in rng.choice(starts, size=min(_NEGATIVE_TRIES, starts.size), replace=False):
        start = int(start)
        # The run may not reach into the next taken span.
        limit = next((a for a in taken_starts if a > start), n)
        span = _closest_run(cum, start, limit, gold_words)
        words = _words(cum, span)
        if words > config.max_continuation_words:
            continue
        if low <= words <= high:
            return span
        gap = abs(words - gold_words)
        if best_gap is None or gap < best_gap:
            best, best_gap = span, gap
    return best


def _closest_run(cum: list[int], start: int, limit: int, target: int) -> Span:
    """The run of at least one sentence from `start` (ending by `limit`) whose word count is closest to `target`."""
    shorter = longest_run(cum, start, target, limit)
    candidates = [end for end in (shorter, shorter + 1) if start < end <= limit]
    end = min(candidates, key=lambda e: abs(cum[e] - cum[start] - target))
    return (start, end)


def same_document_batches(
    examples: Sequence[Example],
    batch_size: int,
    seed: int,
    mix_documents: bool = False,
    drop_remainder: bool = True,
    pool_leftovers: bool = False,
    pool_key: Callable[[str], str] = document_genre,
) -> Iterator[list[Example]]:
    """Batches of examples, each from a single document (RankGen's in-book setting) unless `mix_documents`.

    Same-document mode: each document's examples are shuffled and cut into
    batches of `batch_size`; a document's leftover examples (all of them when
    it has fewer than `batch_size`) are dropped with `drop_remainder`, or
    yielded as one smaller batch without it. Batches are never topped up from
    other documents; `dropped_examples` counts what is dropped. The batches of
    all documents are then shuffled together, so training does not see one
    book after another.

    `pool_leftovers=True`: a document's leftover examples are not dropped but
    pooled with the other leftovers of its `pool_key` (by default its genre,
    `document_genre`: the first folder of its id; a domain's task pools by
    domain), shuffled and cut into batches of that key; only each key's last
    remainder is dropped. A corpus of short documents (addresses of 10 to 40
    examples against batches of 32, Wikipedia articles against 1536) otherwise
    loses most of its examples; their batches then draw negatives from
    documents of the same genre or domain, the nearest to InBook that such
    documents allow (`pooled_examples` counts them).

    `mix_documents=True`: all examples are shuffled together and cut into
    batches regardless of document (the remainder as above).

    The same (examples, batch_size, seed, flags) always give the same batches.
    """
    if batch_size < 1:
        raise RankgenError(f"batch_size must be >= 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    if mix_documents:
        groups = [list(examples)]
    else:
        groups = list(_by_document(examples).values())
    pooling = pool_leftovers and not mix_documents
    batches, leftovers = [], {}
    for group in groups:
        for batch in _shuffled_cuts(group, batch_size, rng):
            if len(batch) == batch_size or not (pooling or drop_remainder):
                batches.append(batch)
            elif pooling:
                leftovers.setdefault(pool_key(batch[0].doc_id), []).extend(batch)
    for pooled in leftovers.values():
        batches += [b for b in _shuffled_cuts(pooled, batch_size, rng) if len(b) == batch_size or not drop_remainder]
    for k in rng.permutation(len(batches)):
        yield batches[k]


def _shuffled_cuts(group: Sequence[Example], batch_size: int, rng: np.random.Generator) -> Iterator[list[Example]]:
    """The group shuffled and cut into runs of batch_size (the last one shorter)."""
    order = rng.permutation(len(group))
    for i in range(0, len(group), batch_size):
        yield [group[j] for j in order[i : i + batch_size]]


def dropped_examples(examples: Sequence[Example], batch_size: int, mix_documents: bool = False,
                     pool_leftovers: bool = False, pool_key: Callable[[str], str] = document_genre) -> int:
    """How many examples `same_document_batches(..., drop_remainder=True)` leaves out."""
    if mix_documents:
        return len(examples) % batch_size
    leftovers = {document: len(group) % batch_size for document, group in _by_document(examples).items()}
    if not pool_leftovers:
        return sum(leftovers.values())
    by_key: dict[str, int] = {}
    for document, count in leftovers.items():
        by_key[pool_key(document)] = by_key.get(pool_key(document), 0) + count
    return sum(count % batch_size for count in by_key.values())


def pooled_examples(examples: Sequence[Example], batch_size: int, mix_documents: bool = False,
                    pool_leftovers: bool = False, pool_key: Callable[[str], str] = document_genre) -> int:
    """How many examples `same_document_batches(..., drop_remainder=True)` puts in pooled (mixed-document) batches."""
    if mix_documents or not pool_leftovers:
        return 0
    leftovers = sum(len(group) % batch_size for group in _by_document(examples).values())
    return leftovers - dropped_examples(examples, batch_size, False, True, pool_key)


def _by_document(examples: Sequence[Example]) -> dict[str, list[Example]]:
    """Examples grouped by doc_id, documents in order of first appearance."""
    groups: dict[str, list[Example]] = {}
    for example in examples:
        groups.setdefault(example.doc_id, []).append(example)
    return groups
