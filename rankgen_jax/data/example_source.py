"""RankGen examples (sentence-bounded prefixes, continuations, InBook negatives) as a trainer batch source.

Examples are built once in memory from whole documents and tokenised with the
model's own tokenizer; batch `index` is the index-th batch of an endless
sequence of epochs, each a fresh seeded order of same-document batches
(RankGen's InBook setting), so resuming needs only the index.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rankgen_jax.data.documents import Document
from rankgen_jax.data.examples import Example, ExampleConfig, dropped_examples, make_examples, same_document_batches
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.text import TextEncoder, encode_truncated, pad_batch

PREFIX_MARKER, SUFFIX_MARKER = "pre ", "suffi "


def build_examples(documents: Sequence[Document], config: ExampleConfig) -> tuple[list[Example], int]:
    """All examples of the documents, and how many documents were too short for one."""
    examples, too_short = [], 0
    for doc in documents:
        found = make_examples(doc, config)
        too_short += not found
        examples.extend(found)
    return examples, too_short


class ExampleTriples:
    """Same-document batches of (prefix, gold continuation, first InBook negative) token ids."""

    def __init__(self, examples: Sequence[Example], text: TextEncoder, batch_size: int, prefix_length: int,
                 continuation_length: int, seed: int, mix_documents: bool = False, with_negative: bool = True,
                 prefix_keep: str = "end"):
        if not examples:
            raise RankgenError("no examples to train on (documents too short for the configured prefix length?)")
        self.batch_size = batch_size
        self.seed, self.mix_documents, self.with_negative = seed, mix_documents, with_negative
        self.lengths = {"query_ids": prefix_length, "positive_ids": continuation_length, "negative_ids": continuation_length}
        self.ids = {
            "query_ids": [encode_truncated(text, PREFIX_MARKER, e.prefix, prefix_length, prefix_keep) for e in examples],
            "positive_ids": [encode_truncated(text, SUFFIX_MARKER, e.continuation, continuation_length) for e in examples],
            "negative_ids": [encode_truncated(text, SUFFIX_MARKER, e.negatives[0], continuation_length) for e in examples],
        }
        self.pad_id = text.pad_id
        self.examples = list(examples)
        self._index_of = {id(e): i for i, e in enumerate(self.examples)}
        self.batches_per_epoch = len(self._epoch(0))
        if self.batches_per_epoch == 0:
            raise RankgenError(
                f"no document has {batch_size} examples for a same-document batch "
                f"({dropped_examples(self.examples, batch_size, mix_documents)} examples dropped); "
                "lower the batch size or set mix_documents"
            )
        self._cached_epoch = (0, self._epoch(0))

    def _epoch(self, epoch: int) -> list[list[int]]:
        return [[self._index_of[id(e)] for e in b]
                for b in same_document_batches(self.examples, self.batch_size, self.seed + epoch, self.mix_documents)]

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        epoch, position = divmod(index, self.batches_per_epoch)
        if self._cached_epoch[0] != epoch:
            self._cached_epoch = (epoch, self._epoch(epoch))
        members = self._cached_epoch[1][position][rows or slice(None)]
        keys = ["query_ids", "positive_ids"] + (["negative_ids"] if self.with_negative else [])
        return {k: pad_batch([self.ids[k][i] for i in members], self.lengths[k], self.pad_id) for k in keys}
