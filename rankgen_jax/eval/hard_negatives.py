"""Suffix identification with hard negatives mined by a trained dual encoder (RankGen App. C.1).

The paper scores "every 128-word sequence in the document" against the
prefix with a trained RankGen model and keeps the 10 highest-scoring ones
that are not the gold continuation, every one starting and ending at a
sentence boundary. Here, for each document (sentences: data/sentences.py):

- Items: prefixes are the longest runs of whole sentences with at most
  `prefix_words` words (at least half of that, as examples.ExampleConfig's
  prefixes), the gold continuation the longest run after it with at most
  `continuation_words` words (at least `min_words`); the next item starts
  after that gold, so items do not overlap. `items_per_document` > 0 keeps
  that many, drawn with a seed of (seed, document id).
- Candidates: from every sentence, the longest run of whole sentences with
  at most `span_words` words, when it has at least `min_words` (a sentence
  longer than `span_words` starts none; runs near the end are shorter).
  A candidate that overlaps the item's prefix or gold is left out: it would
  hold the gold's own text (the paper names only the gold; overlapping
  spans are our reading of "not the gold continuation").
- Scores: the model's prefix vector . candidate vector (its "pre " / "suffi "
  conventions, as `rankgen-jax score`); every candidate of a document is
  encoded once. The `negatives` best, ties by position, are the item's
  negatives, hardest first; they may overlap one another, as the paper's
  top 10 of every span may.

Items are written as `rankgen-jax score` reads them: {"prefix", "candidates"
(gold first), "label": 0}, plus "doc_id", the sentence spans and the miner's
scores, so any scorer (the model, the LM baselines, the overlap baselines)
can be measured on them. A document with no item (too short) is counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.documents import Document, require_documents
from rankgen_jax.data.examples import Span, cumulative_words, longest_run
from rankgen_jax.data.sentences import split_sentences
from rankgen_jax.errors import RankgenError


class VectorEncoder(Protocol):
    """What the miner needs of a dual encoder (inference.encoder.LoadedModel has it)."""

    def encode(self, texts: Sequence[str], side: str | None = None, max_length: int | None = None,
               batch_size: int | None = 64) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class HardNegativeConfig:
    """How items are cut and negatives mined; every length in words (the paper: 256, 128, 128, 10)."""

    prefix_words: int = 256
    continuation_words: int = 128
    span_words: int = 128
    min_words: int = 10
    negatives: int = 10
    items_per_document: int = 0
    seed: int = 0

    def __post_init__(self):
        for name in ("prefix_words", "continuation_words", "span_words", "min_words", "negatives"):
            if getattr(self, name) < 1:
                raise RankgenError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.items_per_document < 0:
            raise RankgenError(f"items_per_document must be >= 0, got {self.items_per_document}")
        if self.min_words > min(self.continuation_words, self.span_words):
            raise RankgenError(f"min_words {self.min_words} exceeds continuation_words or span_words")


def _overlaps(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def document_items(cum: list[int], config: HardNegativeConfig, doc_id: str) -> list[tuple[Span, Span]]:
    """(prefix span, gold span) of every item of one document (see the module docstring)."""
    n = len(cum) - 1
    items, start = [], 0
    while start < n:
        prefix_end = longest_run(cum, start, config.prefix_words)
        gold_end = longest_run(cum, prefix_end, config.continuation_words) if prefix_end < n else prefix_end
        if (2 * (cum[prefix_end] - cum[start]) >= config.prefix_words
                and cum[gold_end] - cum[prefix_end] >= config.min_words):
            items.append(((start, prefix_end), (prefix_end, gold_end)))
            start = gold_end
        else:
            start += 1
    if config.items_per_document and len(items) > config.items_per_document:
        digest = hashlib.sha256(doc_id.encode("utf-8")).digest()[:8]
        rng = np.random.default_rng([config.seed, int.from_bytes(digest, "little")])
        keep = sorted(rng.choice(len(items), size=config.items_per_document, replace=False).tolist())
        items = [items[k] for k in keep]
    return items


def candidate_spans(cum: list[int], config: HardNegativeConfig) -> list[Span]:
    """From every sentence, the longest run with at most span_words words, when it has at least min_words."""
    spans = []
    for start in range(len(cum) - 1):
        end = longest_run(cum, start, config.span_words)
        if cum[end] - cum[start] >= config.min_words:
            spans.append((start, end))
    return spans


def mine_document(encoder: VectorEncoder, doc: Document, config: HardNegativeConfig,
                  batch_size: int = 64) -> list[dict]:
    """The items of one document with their mined negatives, as JSON-ready records."""
    sentences = split_sentences(doc.text)
    cum = cumulative_words(sentences)
    items = document_items(cum, config, doc.id)
    spans = candidate_spans(cum, config)
    if not items or not spans:
        return []

    def text(span: Span) -> str:
        return " ".join(sentences[span[0] : span[1]])

    cand_CxD = np.asarray(encoder.encode([text(s) for s in spans], "suffix", batch_size=batch_size))
    prefix_IxD = np.asarray(encoder.encode([text(p) for p, _ in items], "prefix", batch_size=batch_size))
    gold_IxD = np.asarray(encoder.encode([text(g) for _, g in items], "suffix", batch_size=batch_size))
    if cand_CxD.ndim != 2:
        raise RankgenError(f"hard negatives need one vector per text; the model gives shape {cand_CxD.shape[1:]}")
    scores_IxC = prefix_IxD @ cand_CxD.T
    records = []
    for i, (prefix, gold) in enumerate(items):
        allowed = np.array([not (_overlaps(s, prefix) or _overlaps(s, gold)) for s in spans])
        order = [c for c in np.argsort(-scores_IxC[i], kind="stable") if allowed[c]][: config.negatives]
        if not order:
            continue
        records.append({
            "doc_id": doc.id, "prefix": text(prefix), "candidates": [text(gold)] + [text(spans[c]) for c in order],
            "label": 0, "prefix_span": list(prefix), "continuation_span": list(gold),
            "negative_spans": [list(spans[c]) for c in order],
            "gold_score": float(prefix_IxD[i] @ gold_IxD[i]),
            "negative_scores": [float(scores_IxC[i, c]) for c in order],
        })
    return records


def mine_hard_negatives(model_path: str, documents: str | Sequence[str], output_path: str,
                        config: HardNegativeConfig = HardNegativeConfig(), batch_size: int = 64,
                        progress: bool = True) -> dict:
    """What `rankgen-jax suffix-negatives` does: items of every document with mined negatives, to JSON lines."""
    output = Path(output_path)
    if not output.parent.is_dir():
        raise RankgenError(f"output folder {output.parent} does not exist")
    docs, stats = require_documents(documents)
    from rankgen_jax.inference.encoder import load_model  # starts jax: after the CLI has set XLA's flags

    model = load_model(model_path)
    print(model.conventions_note(), file=sys.stderr)
    items = no_item = 0
    full = 0  # items with all `negatives` negatives
    with open(output, "w", encoding="utf-8") as out:
        for doc in tqdm(docs, desc="suffix-negatives", unit="document", disable=not progress, file=sys.stderr):
            records = mine_document(model, doc, config, batch_size)
            no_item += not records
            items += len(records)
            full += sum(len(r["candidates"]) == config.negatives + 1 for r in records)
            out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    result = {"documents": len(docs), "documents_without_item": no_item, "items": items,
              "items_with_all_negatives": full}
    print(f"suffix-negatives: {stats.summary()}; {items} items ({full} with {config.negatives} negatives) from "
          f"{len(docs) - no_item} documents, {no_item} without an item -> {output}")
    if not items:
        output.unlink(missing_ok=True)
        raise RankgenError(f"no document in {documents} is long enough for one item "
                           f"({config.prefix_words}-word prefix, {config.min_words}+ word continuation)")
    return result
