"""RankGen examples (sentence-bounded prefixes, continuations, InBook negatives) as a trainer batch source.

Examples are built in memory from whole documents and tokenised with the
model's own tokenizer; batch `index` is the index-th batch of an endless
sequence of epochs, each a fresh seeded order of same-document batches
(RankGen's InBook setting), so resuming needs only the index.

A small corpus is seen many times over, and a model that meets the same
prefix / continuation pairs each epoch learns those pairs rather than the
task. With `recut`, every epoch after the first cuts the documents afresh
(`recut(epoch)`: another seed, other prefix lengths), so each epoch pairs
the same text differently. Every epoch is as many batches as the first (a
recut epoch with more is cut short, one with fewer starts over), so that a
batch index still maps to one epoch without building the ones before it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rankgen_jax.data.documents import Document
from rankgen_jax.data.examples import Example, ExampleConfig, dropped_examples, make_examples, same_document_batches
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.text import TokenWindows, encode_truncated, pad_batch


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

    def __init__(self, examples: Sequence[Example], windows: TokenWindows, batch_size: int, seed: int,
                 mix_documents: bool = False, with_negative: bool = True,
                 recut: Callable[[int], Sequence[Example]] | None = None, pool_leftovers: bool = False):
        """windows: prefixes are its queries, continuations and negatives its candidates."""
        if not examples:
            raise RankgenError("no examples to train on (documents too short for the configured prefix length?)")
        self.batch_size = batch_size
        self.seed, self.mix_documents, self.with_negative = seed, mix_documents, with_negative
        self.pool_leftovers = pool_leftovers
        continuation_length = windows.candidate_length
        self.lengths = {"query_ids": windows.query_length, "positive_ids": continuation_length,
                        "negative_ids": continuation_length}
        self.text, self.prefix_keep, self.recut, self.markers = (windows.text, windows.query_keep, recut,
                                                                 windows.markers)
        self.pad_id = windows.text.pad_id
        self.examples = list(examples)
        self.ids = self._tokenised(self.examples)
        self.batches_per_epoch = len(self._batches(0, self.examples))
        if self.batches_per_epoch == 0:
            raise RankgenError(
                f"no document has {batch_size} examples for a same-document batch "
                f"({self.dropped_examples()} examples dropped); "
                "lower the batch size or set mix_documents"
            )
        self._cached_epoch = (0, self.ids, self._batches(0, self.examples))

    def _tokenised(self, examples: Sequence[Example]) -> dict[str, list[list[int]]]:
        text, prefix_length, continuation_length = self.text, self.lengths["query_ids"], self.lengths["positive_ids"]
        return {
            "query_ids": [encode_truncated(text, self.markers[0], e.prefix, prefix_length, self.prefix_keep)
                          for e in examples],
            "positive_ids": [encode_truncated(text, self.markers[1], e.continuation, continuation_length)
                             for e in examples],
            "negative_ids": [encode_truncated(text, self.markers[1], e.negatives[0], continuation_length)
                             for e in examples],
        }

    def _batches(self, epoch: int, examples: Sequence[Example]) -> list[list[int]]:
        """The epoch's batches, as indices into `examples`."""
        index_of = {id(e): i for i, e in enumerate(examples)}
        return [[index_of[id(e)] for e in b]
                for b in same_document_batches(examples, self.batch_size, self.seed + epoch, self.mix_documents,
                                               pool_leftovers=self.pool_leftovers)]

    def dropped_examples(self) -> int:
        """Examples of the first epoch's cut that are in no batch (see examples.same_document_batches)."""
        return dropped_examples(self.examples, self.batch_size, self.mix_documents, self.pool_leftovers)

    def _load_epoch(self, epoch: int) -> tuple[int, dict[str, list[list[int]]], list[list[int]]]:
        if self.recut is None or epoch == 0:
            return epoch, self.ids, self._batches(epoch, self.examples)
        examples = list(self.recut(epoch))
        batches = self._batches(epoch, examples)
        if not batches:
            raise RankgenError(f"epoch {epoch}: cutting the documents afresh gave no batch of {self.batch_size} "
                               f"({len(examples)} examples)")
        # As many batches as the first epoch, so that batch indices map to epochs by division.
        repeats = -(-self.batches_per_epoch // len(batches))
        return epoch, self._tokenised(examples), (batches * repeats)[: self.batches_per_epoch]

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        epoch, position = divmod(index, self.batches_per_epoch)
        if self._cached_epoch[0] != epoch:
            self._cached_epoch = self._load_epoch(epoch)
        _, ids, batches = self._cached_epoch
        members = batches[position][rows or slice(None)]
        keys = ["query_ids", "positive_ids"] + (["negative_ids"] if self.with_negative else [])
        return {k: pad_batch([ids[k][i] for i in members], self.lengths[k], self.pad_id) for k in keys}
