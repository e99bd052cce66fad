"""Candidate lists and labelled pairs from JSON lines, as trainer batch sources (rankers, distillation, MPTS).

List records (one per line): `{"query": str, "candidates": [str, ...],
"labels": [float, ...], "teacher_scores": [float, ...], "student_ranks": [float, ...]}`;
labels, teacher scores and student ranks (CL-DRD: each candidate's rank in the
student's retrieved list) are optional (a loss that needs one fails with a clear error), and
candidate 0 is the positive when the batch form is triples. Pair records:
`{"a": str, "b": str, "labels": [float] * N}` (one label per perspective).

The ids arrays follow the BatchLayout a source is given (see
rankgen_jax.models.batch_layout; `[B, C, L]` lists are never split along C):
- candidate lists, separate towers: `query_ids` [B, Lq] ("pre " marker) and
  `candidate_ids` [B, C, Lc] ("suffi " marker; ListsData.prefix_marker / suffix_marker set others);
- triples, separate towers: `query_ids`, `positive_ids` [B, Lc] (candidate 0)
  and `negative_ids` [B, C - 1, Lc] (the rest; hard negatives);
- joint pairs (cross encoders): `pair_ids` [B, C, Lq + Lc] (`query </s>
  candidate </s>` for T5, `[CLS] q [SEP] c [SEP]` with `pair_type_ids` for
  BERT); the query keeps its last tokens within Lq, the candidate its first
  within Lc;
- labelled pairs: `query_ids` / `positive_ids` [B, L] with separate towers,
  `pair_ids` [B, L] joint.
Every list batch has `candidate_mask` [B, C] (padded candidates are 0), the
float arrays that exist in every record (`labels`, `teacher_scores`, `student_ranks`), and
`tie_break` [B, C] uniform noise that ListMLE uses to break label ties at random.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rankgen_jax.data.text import TextEncoder, TokenWindows, encode_pair_truncated, encode_truncated, pad_batch
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import TRIPLES, BatchLayout

LIST_FLOAT_KEYS = ("labels", "teacher_scores", "student_ranks")


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _numbers(value, length: int) -> bool:
    return (isinstance(value, list) and len(value) == length
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value))


def check_list_record(record: dict) -> str | None:
    """None for a usable candidate-list record, else why not."""
    if not _is_text(record.get("query")):
        return "missing or empty query"
    candidates = record.get("candidates")
    if not isinstance(candidates, list) or not candidates or not all(_is_text(c) for c in candidates):
        return "missing, empty or non-text candidates"
    for key in LIST_FLOAT_KEYS:
        if key in record and not _numbers(record[key], len(candidates)):
            return f"{key} not one finite number per candidate"
    return None


def check_pair_record(record: dict) -> str | None:
    """None for a usable labelled pair, else why not."""
    if not (_is_text(record.get("a")) and _is_text(record.get("b"))):
        return "missing or empty text a/b"
    labels = record.get("labels")
    if not isinstance(labels, list) or not labels or not _numbers(labels, len(labels)):
        return "labels not a non-empty list of numbers"
    return None


def _epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(count)


class RecordBatches:
    """Batch `index` of an endless sequence of seeded epochs over the records (resume needs only the index)."""

    def __init__(self, records: list[dict], batch_size: int, seed: int, where: str):
        if len(records) < batch_size:
            raise RankgenError(f"{where}: {len(records)} records, fewer than one batch of {batch_size}")
        self.records, self.batch_size, self.seed = records, batch_size, seed
        self.batches_per_epoch = len(records) // batch_size

    def members(self, index: int, rows: slice | None) -> tuple[list[dict], list[int]]:
        epoch, position = divmod(index, self.batches_per_epoch)
        order = _epoch_order(len(self.records), self.seed, epoch)
        picked = order[position * self.batch_size : (position + 1) * self.batch_size]
        row_numbers = list(range(self.batch_size))[rows or slice(None)]
        return [self.records[i] for i in picked[rows or slice(None)]], row_numbers


class ListEncoder:
    """Candidate-list records to the arrays of a layout: query + candidates or triples (separate towers), or joint pairs.

    Lists are cut or padded to list_size candidates (padding masked); float_keys
    are the record fields copied as [B, C] float arrays; seed and the batch
    index and row numbers seed each row's tie-break noise. markers: the texts
    put before queries and candidates for separate towers (RankGen's by default).
    """

    def __init__(self, windows: TokenWindows, layout: BatchLayout, list_size: int, float_keys: Sequence[str] = (),
                 seed: int = 0):
        self.text, self.layout, self.list_size, self.float_keys, self.seed = (windows.text, layout, list_size,
                                                                              list(float_keys), seed)
        self.query_length, self.candidate_length = windows.query_length, windows.candidate_length
        self.query_keep, self.markers = windows.query_keep, windows.markers

    def _candidate_ids(self, candidates: Sequence[str]) -> np.ndarray:
        ids = [encode_truncated(self.text, self.markers[1], c, self.candidate_length) for c in candidates]
        return pad_batch(ids, self.candidate_length, self.text.pad_id)

    def encode(self, records: Sequence[dict], row_numbers: Sequence[int], index: int) -> dict[str, np.ndarray]:
        """The arrays of these records, rows `row_numbers` of batch `index`."""
        size, num = self.list_size, len(records)
        mask_BxC = np.zeros((num, size), np.int32)
        floats = {k: np.zeros((num, size), np.float32) for k in self.float_keys}
        for b, record in enumerate(records):
            count = min(len(record["candidates"]), size)
            mask_BxC[b, :count] = 1
            for k in self.float_keys:
                floats[k][b, :count] = record[k][:count]
        tie_BxC = np.stack([np.random.default_rng([self.seed, index, r, 7]).random(size) for r in row_numbers])
        out = {"candidate_mask": mask_BxC, "tie_break": tie_BxC.astype(np.float32), **floats}
        # Padding repeats the first candidate (real text, so no tower sees an empty input); the mask hides it.
        padded = [(r["candidates"][:size] + [r["candidates"][0]] * size)[:size] for r in records]
        if self.layout.joint:
            pairs = [encode_pair_truncated(self.text, r["query"], c, self.query_length, self.candidate_length,
                                           self.query_keep) for r, cands in zip(records, padded) for c in cands]
            length = self.query_length + self.candidate_length
            out["pair_ids"] = pad_batch([p[0] for p in pairs], length, self.text.pad_id).reshape(num, size, length)
            if any(any(p[1]) for p in pairs):
                out["pair_type_ids"] = pad_batch([p[1] for p in pairs], length, 0).reshape(num, size, length)
            return out
        out["query_ids"] = pad_batch(
            [encode_truncated(self.text, self.markers[0], r["query"], self.query_length, self.query_keep)
             for r in records],
            self.query_length, self.text.pad_id)
        cand_BxCxL = np.stack([self._candidate_ids(c) for c in padded])
        if self.layout.form == TRIPLES:
            out["positive_ids"] = cand_BxCxL[:, 0]
            if size > 1:
                out["negative_ids"] = cand_BxCxL[:, 1:]
        else:
            out["candidate_ids"] = cand_BxCxL
        return out


class ListBatches:
    """Candidate-list records as batches of the layout's arrays (ListEncoder), in seeded epochs."""

    def __init__(self, records: list[dict], windows: TokenWindows, batch_size: int, layout: BatchLayout,
                 list_size: int = 0, seed: int = 0, where: str = "lists"):
        self.text, self.layout = windows.text, layout
        self.list_size = list_size or max(len(r["candidates"]) for r in records)
        if layout.form == TRIPLES and self.list_size < 1:
            raise RankgenError(f"{where}: triples need at least the positive candidate")
        float_keys = [k for k in LIST_FLOAT_KEYS if all(k in r for r in records)]
        self.encoder = ListEncoder(windows, layout, self.list_size, float_keys, seed)
        self.batches = RecordBatches(records, batch_size, seed, where)
        self.batch_size, self.seed = batch_size, seed

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        records, row_numbers = self.batches.members(index, rows)
        return self.encoder.encode(records, row_numbers, index)


class PairBatches:
    """Labelled passage pairs for multi-perspective matching: [B, N] labels per batch."""

    def __init__(self, records: list[dict], text: TextEncoder, batch_size: int, layout: BatchLayout, length: int,
                 seed: int = 0, where: str = "pairs"):
        sizes = {len(r["labels"]) for r in records}
        if len(sizes) != 1:
            raise RankgenError(f"{where}: records have different numbers of perspective labels {sorted(sizes)}")
        self.text, self.layout, self.length = text, layout, length
        self.num_perspectives = sizes.pop()
        self.batches = RecordBatches(records, batch_size, seed, where)
        self.batch_size = batch_size

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        records, _ = self.batches.members(index, rows)
        out = {"labels": np.asarray([r["labels"] for r in records], np.float32)}
        if self.layout.joint:
            if self.num_perspectives == 1:  # a one-output cross encoder gives one score per pair: [B], not [B, 1]
                out["labels"] = out["labels"][:, 0]
            half = self.length // 2
            pairs = [encode_pair_truncated(self.text, r["a"], r["b"], half, self.length - half, "start")
                     for r in records]
            out["pair_ids"] = pad_batch([p[0] for p in pairs], self.length, self.text.pad_id)
            if any(any(p[1]) for p in pairs):
                out["pair_type_ids"] = pad_batch([p[1] for p in pairs], self.length, 0)
            return out
        for key, field in (("query_ids", "a"), ("positive_ids", "b")):
            out[key] = pad_batch([encode_truncated(self.text, "", r[field], self.length) for r in records],
                                 self.length, self.text.pad_id)
        return out
