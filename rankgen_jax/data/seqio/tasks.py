"""RankGen training data as seqio tasks (the trainer reads them through `data/seqio/source.py`).

`register_rankgen_task` registers a `seqio.Task` of tokenised RankGen triples (`query_ids`, `positive_ids`,
`negative_ids`, `doc_id`) with InBook, generative or both kinds of negatives, emitted as whole
same-document groups so that a Beam cache (`rankgen-jax cache-tasks`) keeps InBook batches. What a task
emits, how examples are ordered and split, what bad input does and how the cache is sharded:
docs/design/seqio.md.
"""


from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from rankgen_jax.data import jsonl
from rankgen_jax.data.documents import (
    MALFORMED_JSON,
    TOO_SHORT,
    UNREADABLE_FILE,
    Document,
    ReadStats,
    read_documents,
)
from rankgen_jax.data.examples import (INCOMPLETE_GENERATIVE, Example, ExampleConfig, dropped_examples,
                                       generative_example, make_examples, pooled_examples, same_document_batches)
from rankgen_jax.data.sentences import word_count
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.seqio.vocab import DeferredVocabulary, make_vocabulary
from rankgen_jax.data.text import load_text_encoder

log = logging.getLogger(__name__)

QUERY, POSITIVE, NEGATIVE, DOC_ID = "query_ids", "positive_ids", "negative_ids", "doc_id"
ID_FEATURES = (QUERY, POSITIVE, NEGATIVE)
TRAIN, VALIDATION = "train", "validation"
SPLITS = (TRAIN, VALIDATION)
# What each kind reads and how its batches are grouped (docs/design/seqio.md, 'What a task emits'):
# inbook: document examples in same-document groups; generative: (p, c, g) records in groups mixed across
# documents (no InBook negative anywhere); both: (p, c, g) records in same-document groups, the paper's
# triples with InBook negatives from the batch; both_alternating: the inbook and generative streams
# interleaved a document at a time, in same-document groups (a named option, not the paper's data).
NEGATIVE_CHOICES = ("inbook", "generative", "both", "both_alternating")
# Skip reasons added to documents.py's (nouns whose plural is a plain "s").
SHORT_DOCUMENT = "short document"  # passes the word minimum, but no example fits
INCOMPLETE_RECORD = INCOMPLETE_GENERATIVE  # no prefix/continuation/generative_negative/doc_id



# ------------------------------------------------------------------------------------------
# Task specs
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankGenTaskSpec:
    """Everything a registered RankGen task reads, with deferred arguments resolved and checked."""

    name: str
    negatives: str
    documents: tuple[str, ...] | None
    vocab_path: str
    example_config: ExampleConfig
    generative_negatives_jsonl: str | None
    holdout_documents: int
    markers: tuple[str, str]
    group_size: int
    mix_documents: bool
    validation_documents: tuple[str, ...] | None
    validation_generative_negatives_jsonl: str | None
    shuffle_block_documents: int

    pool_leftovers: bool = True

    @property
    def reads_documents(self) -> bool:
        return reads_documents(self.negatives)

    @property
    def reads_generative(self) -> bool:
        return reads_generative(self.negatives)

    @property
    def mixes_documents(self) -> bool:
        """Groups cut regardless of document: asked for, or "generative" (whose batches hold no InBook negative)."""
        return self.mix_documents or self.negatives == "generative"

    @property
    def min_document_words(self) -> int:
        """A lower bound on the words one example needs; shorter documents are skipped without splitting them."""
        config = self.example_config
        return config.min_prefix_words + config.min_continuation_words + config.negatives_per_example


_TASK_ARGS: dict[str, dict[str, Any]] = {}


@dataclasses.dataclass(frozen=True)
class TaskGrouping:
    """How a task's examples become groups: `group_size` consecutive examples from one document (make the
    trainer's batch a multiple of it), or from any (`mix_documents`); documents shuffled in blocks of
    `shuffle_block_documents`; with `pool_leftovers`, a document's examples beyond its last whole group join the
    task's other leftovers in mixed groups (so documents shorter than a group still train) instead of being
    dropped. Any field may be a zero-argument callable, resolved whenever the task is read."""

    group_size: int | Callable = 32
    mix_documents: bool | Callable = False
    shuffle_block_documents: int | Callable = 256
    pool_leftovers: bool | Callable = True


@dataclasses.dataclass(frozen=True)
class TaskValidation:
    """Where a task's validation split comes from: `documents` (and, for generative negatives, the
    `generative_negatives_jsonl` records) when given, else the last `holdout_documents` of the training documents.
    Any field may be a zero-argument callable."""

    holdout_documents: int | Callable = 1
    documents: str | Sequence[str] | Callable | None = None
    generative_negatives_jsonl: str | Callable | None = None


def reads_documents(negatives: str) -> bool:
    """Whether a task with these negatives cuts examples from documents."""
    return negatives in ("inbook", "both_alternating")


def reads_generative(negatives: str) -> bool:
    """Whether a task with these negatives reads `generate-negatives` records."""
    return negatives in ("generative", "both", "both_alternating")


def _resolve(value):
    """A deferred argument's value (call it), or the value itself."""
    return value() if callable(value) and not isinstance(value, type) else value


def _paths(value) -> tuple[str, ...] | None:
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, (str, Path)):
        return (str(value),)
    return tuple(str(v) for v in value)


def is_rankgen_task(name: str) -> bool:
    """Whether `name` was registered by `register_rankgen_task`."""
    return name in _TASK_ARGS


def task_markers(name: str) -> tuple[str, str]:
    """A registered task's (prefix, continuation) markers, without resolving its data paths (a cached read has none)."""
    if name not in _TASK_ARGS:
        raise RankgenError(f"{name!r} is not a registered RankGen task")
    return tuple(_TASK_ARGS[name]["markers"])


def task_vocab_path(name: str) -> str | None:
    """A registered task's vocabulary path, without resolving its data paths (a cached read has none)."""
    if name not in _TASK_ARGS:
        raise RankgenError(f"{name!r} is not a registered RankGen task")
    path = _resolve(_TASK_ARGS[name]["vocab_path"])
    return str(path) if path else None


def task_spec(name: str) -> RankGenTaskSpec:
    """The resolved spec of a task registered by `register_rankgen_task`; RankgenError for unset or bad values."""
    if name not in _TASK_ARGS:
        raise RankgenError(f"{name!r} is not a registered RankGen task")
    args = {key: _resolve(value) for key, value in _TASK_ARGS[name].items()}

    def optional_path(key):
        return str(args[key]) if args[key] else None

    spec = RankGenTaskSpec(
        name=name,
        negatives=args["negatives"],
        documents=_paths(args["documents"]),
        vocab_path=str(args["vocab_path"]) if args["vocab_path"] else "",
        example_config=args["example_config"],
        generative_negatives_jsonl=optional_path("generative_negatives_jsonl"),
        holdout_documents=int(args["holdout_documents"]),
        markers=tuple(args["markers"]),
        group_size=int(args["group_size"]),
        mix_documents=bool(args["mix_documents"]),
        validation_documents=_paths(args["validation_documents"]),
        validation_generative_negatives_jsonl=optional_path("validation_generative_negatives_jsonl"),
        shuffle_block_documents=int(args["shuffle_block_documents"]),
        pool_leftovers=bool(args["pool_leftovers"]),
    )
    problems = []
    if not spec.vocab_path:
        problems.append("no vocabulary path is set")
    if spec.reads_documents and spec.documents is None:
        problems.append(f"negatives={spec.negatives!r} reads documents, but none are set")
    if spec.reads_generative and spec.generative_negatives_jsonl is None:
        problems.append(f"negatives={spec.negatives!r} reads a generative-negatives JSONL, but none is set")
    if not isinstance(spec.example_config, ExampleConfig):
        problems.append(f"example_config must be an ExampleConfig, got {type(spec.example_config).__name__}")
    elif spec.reads_documents and spec.example_config.negatives_per_example < 1:
        problems.append("InBook negatives need example_config.negatives_per_example >= 1")
    if spec.group_size < 1:
        problems.append(f"group_size must be >= 1, got {spec.group_size}")
    if spec.holdout_documents < 0:
        problems.append(f"holdout_documents must be >= 0, got {spec.holdout_documents}")
    if spec.shuffle_block_documents < 1:
        problems.append(f"shuffle_block_documents must be >= 1, got {spec.shuffle_block_documents}")
    if len(spec.markers) != 2 or not all(isinstance(m, str) for m in spec.markers):
        problems.append(f"markers must be two strings (prefix, continuation), got {spec.markers!r}")
    if problems:
        raise RankgenError(f"task {name!r}: " + "; ".join(problems))
    return spec


# ------------------------------------------------------------------------------------------
# The example stream (plain Python: no TF below this line until the dataset function)
# ------------------------------------------------------------------------------------------


def _usable_documents(sources: Sequence[str], spec: RankGenTaskSpec, stats: ReadStats) -> Iterator[Document]:
    """Readable documents with at least the words one example needs; the rest are counted."""
    for doc in read_documents(list(sources), stats):
        if word_count(doc.text) < spec.min_document_words:
            stats.skip(TOO_SHORT, doc.id)
            continue
        yield doc


def _split(items: Iterable, split: str, holdout: int) -> Iterator:
    """train: all items but the last `holdout`; validation: the last `holdout` (a look-behind buffer, one pass)."""
    buffer: collections.deque = collections.deque()
    for item in items:
        buffer.append(item)
        if len(buffer) > holdout:
            first = buffer.popleft()
            if split == TRAIN:
                yield first
    if split == VALIDATION:
        yield from buffer


def _inbook_units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[Document]:
    """Each usable document of one split (its examples are cut later, only for the blocks that are read)."""
    if spec.validation_documents is not None:
        yield from _usable_documents(spec.documents if split == TRAIN else spec.validation_documents, spec, stats)
    else:
        # Only documents that leave the look-behind buffer reach the caller, so reading the validation
        # split costs one pass over the files but no example building for train documents.
        yield from _split(_usable_documents(spec.documents, spec, stats), split, spec.holdout_documents)


def _unit_examples(spec: RankGenTaskSpec, unit: Document | list[Example], stats: ReadStats) -> list[Example]:
    """A stream unit's examples: a document's are cut here (none fit: counted), generative ones are ready."""
    if not isinstance(unit, Document):
        return unit
    examples = make_examples(unit, spec.example_config)
    if not examples:
        stats.skip(SHORT_DOCUMENT, unit.id)
    return examples


def document_examples(name: str, split: str = TRAIN,
                      stats: ReadStats | None = None) -> Iterator[tuple[Document, list[Example]]]:
    """The documents of task `name`'s InBook stream for one split, in reading order, each with its examples
    exactly as the task cuts them; documents no example fits are skipped and counted in `stats`."""
    spec = task_spec(name)
    if not spec.reads_documents:
        raise RankgenError(f"task {name!r} reads no documents (negatives={spec.negatives!r})")
    _check_split_readable(dataclasses.replace(spec, negatives="inbook"), split)  # the documents only
    stats = stats if stats is not None else ReadStats()
    for doc in _inbook_units(spec, split, stats):
        examples = _unit_examples(spec, doc, stats)
        if examples:
            yield doc, examples


def _generative_records(path: str, stats: ReadStats) -> Iterator[Example]:
    """Complete records of a generate-negatives JSONL as Examples whose one negative is the generative one."""
    p = Path(path)
    if not p.is_file():
        raise RankgenError(f"{path}: no such generative-negatives file")
    stats.files += 1

    def skip(reason: str, number: int) -> None:
        stats.skip(INCOMPLETE_RECORD if reason == jsonl.NOT_AN_OBJECT else MALFORMED_JSON, f"{p}:{number}")

    try:
        for number, record in jsonl.iter_jsonl(p, on_skip=skip):
            example = generative_example(record)
            if example is None:
                stats.skip(INCOMPLETE_RECORD, f"{p}:{number}")
            else:
                yield example
    except RankgenError:  # the file exists, so a truncated or corrupt .gz: keep what was read
        stats.skip(UNREADABLE_FILE, str(p))


def _generative_units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[list[Example]]:
    """Runs of consecutive records with the same doc_id (one document each), for one split."""

    def runs(path):
        for _, group in itertools.groupby(_generative_records(path, stats), key=lambda e: e.doc_id):
            stats.documents += 1
            yield list(group)

    if spec.validation_generative_negatives_jsonl is not None:
        path = spec.generative_negatives_jsonl if split == TRAIN else spec.validation_generative_negatives_jsonl
        yield from runs(path)
    else:
        yield from _split(runs(spec.generative_negatives_jsonl), split, spec.holdout_documents)


def _alternate(streams: Sequence[Iterator]) -> Iterator:
    """One item from each stream in turn until all are exhausted."""
    live = list(streams)
    while live:
        for stream in list(live):
            try:
                yield next(stream)
            except StopIteration:
                live.remove(stream)


def _units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[Document | list[Example]]:
    """The split's documents in reading order: Documents (InBook) and runs of generative Examples."""
    streams = []
    if spec.reads_documents:
        streams.append(_inbook_units(spec, split, stats))
    if spec.reads_generative:
        streams.append(_generative_units(spec, split, stats))
    return _alternate(streams)


def _block_seed(seed: int, block: int) -> int:
    return int(np.random.SeedSequence([seed % (1 << 64), block]).generate_state(1, np.uint64)[0] >> 1)


def _blocks(spec: RankGenTaskSpec, units: Iterator, stats: ReadStats,
            owns_block: Callable[[int], bool] = lambda block: True) -> Iterator[tuple[int, list[list[Example]]]]:
    """(block index, its documents' examples) for every block of `shuffle_block_documents` units it owns.

    Block membership is decided before any example is cut, so a reader that owns only some blocks
    (a Beam shard) cuts and tokenises only those, and every reader agrees on what each block holds.
    """
    for block_index in itertools.count():
        block = list(itertools.islice(units, spec.shuffle_block_documents))
        if not block:
            return
        if owns_block(block_index):
            examples = [_unit_examples(spec, unit, stats) for unit in block]
            yield block_index, [unit for unit in examples if unit]


@dataclasses.dataclass
class GroupTally:
    """Examples a pass put in pooled (mixed-document) groups and left out of every group."""

    pooled: int = 0
    dropped: int = 0

    def summary(self) -> str:
        return (f"{self.pooled} examples of documents shorter than a group pooled into mixed groups of their "
                f"domain, {self.dropped} left in no group")


def _block_groups(spec: RankGenTaskSpec, block_index: int, block: list[list[Example]], seed: int,
                  tally: GroupTally | None = None) -> Iterator[list[Example]]:
    examples = [example for unit in block for example in unit]
    # A task is one domain: its documents' leftovers pool together, whatever their ids.
    grouping = dict(mix_documents=spec.mixes_documents, pool_leftovers=spec.pool_leftovers,
                    pool_key=lambda doc_id: spec.name)
    if tally is not None:
        tally.pooled += pooled_examples(examples, spec.group_size, **grouping)
        tally.dropped += dropped_examples(examples, spec.group_size, **grouping)
    return same_document_batches(examples, spec.group_size, _block_seed(seed, block_index), **grouping)


def _groups(spec: RankGenTaskSpec, units: Iterator, seed: int, stats: ReadStats,
            owns_block: Callable[[int], bool] = lambda block: True,
            tally: GroupTally | None = None) -> Iterator[list[Example]]:
    """Whole groups of `group_size` examples, shuffled block by block (see the module docstring)."""
    for block_index, block in _blocks(spec, units, stats, owns_block):
        yield from _block_groups(spec, block_index, block, seed, tally)


def _check_split_readable(spec: RankGenTaskSpec, split: str) -> None:
    """RankgenError now (not deep inside tf.data) when a split cannot give one example.

    Reads only as far as needed: holdout+1 usable documents per stream (so
    both splits get one), or one from a split's own validation files.
    """
    if split not in SPLITS:
        raise RankgenError(f"task {spec.name!r} has splits {SPLITS}, not {split!r}")
    checks = []
    if spec.reads_documents:
        own = spec.validation_documents is not None
        sources = spec.documents if (split == TRAIN or not own) else spec.validation_documents

        def documents(sources=sources):
            stats = ReadStats()
            usable = (d for d in _usable_documents(sources, spec, stats) if make_examples(d, spec.example_config))
            return usable, stats

        checks.append((", ".join(sources), own, documents))
    if spec.reads_generative:
        own = spec.validation_generative_negatives_jsonl is not None
        path = spec.generative_negatives_jsonl
        if split == VALIDATION and own:
            path = spec.validation_generative_negatives_jsonl

        def records(path=path):
            stats = ReadStats()
            return (g for _, g in itertools.groupby(_generative_records(path, stats), key=lambda e: e.doc_id)), stats

        checks.append((path, own, records))
    for where, own, open_stream in checks:
        if not own and spec.holdout_documents == 0 and split == VALIDATION:
            raise RankgenError(
                f"task {spec.name!r} has no validation data in {where}: "
                "holdout_documents=0 and no separate validation files"
            )
        needed = 1 if own else spec.holdout_documents + 1
        stream, stats = open_stream()
        found = sum(1 for _ in itertools.islice(stream, needed))
        if found == 0:
            raise RankgenError(f"task {spec.name!r} ({split}): no usable document in {where} ({stats.summary()})")
        if found < needed:
            raise RankgenError(
                f"task {spec.name!r}: {where} has {found} usable document{'s' if found > 1 else ''}; "
                f"holdout_documents={spec.holdout_documents} needs at least {needed} (one left for training)"
            )


def check_split_readable(name: str, split: str) -> None:
    """RankgenError when task `name`'s split cannot give one example (bad paths, too few documents)."""
    _check_split_readable(task_spec(name), split)


@dataclasses.dataclass
class TaskScan:
    """What one pass over a split gives: whole-group examples, documents used, and skipped input."""

    examples: int
    documents: int
    dropped_examples: int
    stats: ReadStats
    pooled_examples: int = 0


def scan_task(name: str, split: str = TRAIN, seed: int = 0) -> TaskScan:
    """One pass over a RankGen task's split in plain Python (no tokenising): counts and ReadStats."""
    spec = task_spec(name)
    _check_split_readable(spec, split)
    stats = ReadStats()
    documents = total = emitted = 0
    tally = GroupTally()
    for block_index, block in _blocks(spec, _units(spec, split, stats), stats):
        documents += len(block)
        total += sum(len(unit) for unit in block)
        emitted += sum(len(group) for group in _block_groups(spec, block_index, block, seed, tally))
    return TaskScan(examples=emitted, documents=documents, dropped_examples=total - emitted, stats=stats,
                    pooled_examples=tally.pooled)


# ------------------------------------------------------------------------------------------
# Reading by source shard (the Beam cache, data/seqio/beam_cache.py)
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SourceSharding:
    """How a cache pipeline reads the tasks: shard i of `num_shards` holds the blocks b with b % num_shards == i.

    seed: orders every block's groups; the cache then holds the groups of the uncached stream at this
      seed, whatever the number of shards or workers.
    stats_dir: the cache folder; each shard writes what it skipped to `read_stats_path` there.
    """

    num_shards: int
    seed: int = 0
    stats_dir: str = ""


# seqio's Beam transform (PreprocessTask) calls the source's get_dataset with a ShardInfo that indexes
# `list_shards`, while training passes one that names a host. The two are told apart by this setting,
# which the cache pipeline makes in its driver and in every worker before reading; None: training.
_SOURCE_SHARDING: SourceSharding | None = None


def set_source_sharding(sharding: SourceSharding | None) -> None:
    """Read RankGen sources by source shard (`sharding`) from now on in this process, or by host (None)."""
    global _SOURCE_SHARDING
    _SOURCE_SHARDING = sharding


def read_stats_path(stats_dir: str, task: str, split: str, shard: int | None = None, num_shards: int = 0) -> str:
    """Where a cached task keeps what its read skipped: one file per split (merged), or one per source shard."""
    task_dir = f"{stats_dir.rstrip('/')}/{seqio.get_task_dir_from_name(task)}"
    if shard is None:
        return f"{task_dir}/read_stats.{split}.json"
    return f"{task_dir}/read_stats/{split}-{shard:05d}-of-{num_shards:05d}.json"


def cache_stats_path(task_cache_dir: str, split: str) -> str:
    """The cache's own record of a split (group size, seed, groups, examples, skipped input), beside seqio's files."""
    return f"{task_cache_dir.rstrip('/')}/rankgen_stats.{split}.json"


def vocabulary_fingerprints(task: seqio.Task) -> dict[str, str]:
    """Output feature -> sha256 of its vocabulary (a SentencePiece model's bytes; another vocabulary by its type
    and size). A cache holds token ids, which mean what they meant only under the vocabulary that made them."""
    fingerprints = {}
    for name, feature in sorted(task.output_features.items()):
        vocab = feature.vocabulary
        model = getattr(vocab, "sp_model", None)
        data = model if isinstance(model, bytes) else f"{type(vocab).__name__}:{vocab.vocab_size}".encode()
        fingerprints[name] = hashlib.sha256(data).hexdigest()
    return fingerprints


def check_cached_vocabularies(task_name: str, cached: Mapping[str, str], current: Mapping[str, str]) -> None:
    """RankgenError naming the features whose vocabulary differs from the one the cache was tokenised with."""
    changed = sorted(name for name in set(cached) | set(current) if cached.get(name) != current.get(name))
    if changed:
        raise RankgenError(
            f"task {task_name!r}: the cache was tokenised with another vocabulary than the task has now "
            f"(features {changed}); rebuild it with `rankgen-jax cache-tasks --tasks {task_name}`"
        )


def stats_record(stats: ReadStats, groups: int, examples: int) -> dict:
    """ReadStats and the groups / examples read, as the JSON the cache keeps."""
    return {"groups": groups, "examples": examples, "files": stats.files, "documents": stats.documents,
            "skipped": dict(stats.skipped), "first_skipped": dict(stats.first_skipped)}


def _merged(first: ReadStats, second: ReadStats) -> ReadStats:
    out = ReadStats(first.files + second.files, first.documents + second.documents,
                    dict(first.skipped), dict(first.first_skipped))
    for reason, count in second.skipped.items():
        out.skipped[reason] = out.skipped.get(reason, 0) + count
        out.first_skipped.setdefault(reason, second.first_skipped[reason])
    return out


# ------------------------------------------------------------------------------------------
# seqio: source, preprocessors, registration
# ------------------------------------------------------------------------------------------

# The source emits one record per same-document group: each id feature's rows end to end with
# their lengths, and the rows' doc_ids. That record is what the Beam cache stores (so its global
# reshuffle moves whole groups); `ungroup_examples`, after the cache point, splits it into rows.
_LENGTHS = "_lengths"
# The generator hands groups to tf.data several at a time: each element crossing from Python costs
# a few hundred microseconds, as much as making and tokenising an example (docs/performance/cpu-step.md,
# 'seqio examples cross into tf.data 64 at a time').
_CHUNK_EXAMPLES = 64
_CHUNK_SIGNATURE = {
    **{key: tf.TensorSpec([None], tf.int32) for key in ID_FEATURES},
    **{key + _LENGTHS: tf.TensorSpec([None], tf.int32) for key in ID_FEATURES},
    DOC_ID: tf.TensorSpec([None], tf.string),
}


def _chunks(groups: Iterator[list[dict]], rows_per_group: int, size: int = _CHUNK_EXAMPLES) -> Iterator[dict]:
    """Groups of examples ({id feature: int32 ids, DOC_ID: str}), whole groups at a time, as flat chunks."""
    per_chunk = max(1, size // rows_per_group)
    while True:
        taken = [row for group in itertools.islice(groups, per_chunk) for row in group]
        if not taken:
            return
        chunk = {DOC_ID: np.array([e[DOC_ID] for e in taken], dtype=object)}
        for key in ID_FEATURES:
            chunk[key] = np.concatenate([e[key] for e in taken]).astype(np.int32, copy=False)
            chunk[key + _LENGTHS] = np.array([len(e[key]) for e in taken], np.int32)
        yield chunk


def _group_records(chunks: tf.data.Dataset, rows_per_group: int) -> tf.data.Dataset:
    """One record per group of `rows_per_group` rows from `_chunks`' chunks, in order."""

    def split_groups(chunk):
        out = {DOC_ID: tf.reshape(chunk[DOC_ID], [-1, rows_per_group])}
        for key in ID_FEATURES:
            rows = tf.RaggedTensor.from_row_lengths(chunk[key], chunk[key + _LENGTHS])
            out[key] = tf.RaggedTensor.from_uniform_row_length(rows, rows_per_group)
        return out

    def flatten(group):
        out = {DOC_ID: group[DOC_ID]}
        for key in ID_FEATURES:
            out[key], out[key + _LENGTHS] = group[key].flat_values, tf.cast(group[key].row_lengths(), tf.int32)
        return out

    return chunks.map(split_groups).unbatch().map(flatten)


def ungroup_examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """seqio post-cache preprocessor: the rows of each group record, one example each, in order."""

    def ragged(group):
        rows = {key: tf.RaggedTensor.from_row_lengths(group[key], group[key + _LENGTHS]) for key in ID_FEATURES}
        return {**rows, DOC_ID: group[DOC_ID]}

    # Unbatched, each row is a plain tensor typed as a ragged one of rank 0; seqio wants TensorSpecs.
    plain = lambda example: {key: tf.identity(value) for key, value in example.items()}  # noqa: E731
    return dataset.map(ragged).unbatch().map(plain)


class RankGenDataSource(seqio.FunctionDataSource):
    """A FunctionDataSource that takes ShardInfo itself: a host's rows of every group, or a Beam source shard."""

    def __init__(self, dataset_fn, splits: Iterable[str] = SPLITS):
        super().__init__(dataset_fn=dataset_fn, splits=splits, caching_permitted=True)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    @property
    def performs_internal_shuffling(self) -> bool:
        # The source orders whole same-document groups by seed; seqio must not shuffle examples.
        return True

    def list_shards(self, split: str) -> Sequence[str]:
        """One name per source shard while a cache pipeline reads (`set_source_sharding`), else the split."""
        sharding = _SOURCE_SHARDING
        if sharding is None:
            return [split]
        return [f"{split}-{k:05d}-of-{sharding.num_shards:05d}" for k in range(sharding.num_shards)]

    def get_dataset(self, split: str = TRAIN, shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False,
                    num_epochs=1) -> tf.data.Dataset:
        del sequence_length, use_cached, num_epochs  # seqio handles these around the source
        return self._dataset_fn(split=split, shuffle_files=shuffle, seed=seed, shard_info=shard_info)


def _write_json(path: str, record: dict) -> None:
    directory = path.rsplit("/", 1)[0]
    tf.io.gfile.makedirs(directory)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(record, indent=2, sort_keys=True))


def _make_dataset_fn(name: str) -> Callable[..., tf.data.Dataset]:
    def dataset_fn(split: str, shuffle_files: bool = False, seed: int | None = None,
                   shard_info: seqio.ShardInfo | None = None) -> tf.data.Dataset:
        """RankGen triples of task `name`, tokenised, one record per seeded same-document group."""
        del shuffle_files  # the order is set by `seed` alone (see the module docstring)
        spec = task_spec(name)
        sharding = _SOURCE_SHARDING
        if sharding is None or shard_info is None:
            # A cache pipeline checks every split once in its driver (beam_cache._check_plan), not per shard.
            _check_split_readable(spec, split)
        text = load_text_encoder(spec.vocab_path)
        stats_path = None
        if sharding is not None and shard_info is not None:
            # A cache pipeline's source shard: whole groups of the blocks it owns, at the pipeline's seed
            # (seqio's per-shard seed would give each shard other groups than the uncached stream has).
            shard, shards = shard_info.index, shard_info.num_shards
            rows = range(spec.group_size)
            seed = sharding.seed
            owns_block = lambda block: block % shards == shard  # noqa: E731
            if sharding.stats_dir:
                stats_path = read_stats_path(sharding.stats_dir, name, split, shard, shards)
        else:
            seed = 0 if seed is None else int(seed)
            shards = shard_info.num_shards if shard_info else 1
            shard = shard_info.index if shard_info else 0
            if spec.group_size % shards:
                raise RankgenError(
                    f"task {name!r}: group_size={spec.group_size} is not divisible by the {shards} data shards (hosts)"
                )
            # Host `shard` owns a contiguous block of rows in every group (decided before
            # tokenising, so the other hosts' rows cost no tokenizer time here).
            rows_per_host = spec.group_size // shards
            rows = range(shard * rows_per_host, (shard + 1) * rows_per_host)
            owns_block = lambda block: True  # noqa: E731
        pre, suffi = spec.markers

        def ids(s: str) -> np.ndarray:
            return np.asarray(text.add_special(text.tokenize(s)), np.int32)

        def groups():
            read_stats, block_stats, tally = ReadStats(), ReadStats(), GroupTally()
            count = 0
            for count, group in enumerate(_groups(spec, _units(spec, split, read_stats), seed, block_stats,
                                                  owns_block, tally), 1):
                yield [{QUERY: ids(pre + group[i].prefix), POSITIVE: ids(suffi + group[i].continuation),
                        NEGATIVE: ids(suffi + group[i].negatives[0]), DOC_ID: group[i].doc_id} for i in rows]
            if stats_path is not None:
                # Every shard reads all documents to find its blocks: shard 0 alone reports the reading's skips.
                stats = _merged(read_stats, block_stats) if shard == 0 else block_stats
                _write_json(stats_path, stats_record(stats, count, count * len(rows)))
            log.info("%s (%s): %s; %s", name, split, _merged(read_stats, block_stats).summary(), tally.summary())

        chunks = tf.data.Dataset.from_generator(lambda: _chunks(groups(), len(rows)), output_signature=_CHUNK_SIGNATURE)
        return _group_records(chunks, len(rows))

    return dataset_fn


def trim_ids_keeping_last(ids: tf.Tensor, length: int) -> tf.Tensor:
    """The first length-1 ids and the last one (EOS / [SEP]) of a too-long 1-D tensor; shorter ones unchanged."""
    n = tf.shape(ids)[0]
    return tf.concat([ids[: tf.minimum(n, length) - 1], ids[-1:]], axis=0) if length > 0 else ids[:0]


def trim_keeping_last_token(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int] | None = None
) -> tf.data.Dataset:
    """seqio post-cache preprocessor: cut id features to `sequence_length` keeping their final special token."""
    if not sequence_length:
        return dataset
    lengths = {k: int(v) for k, v in sequence_length.items() if k in ID_FEATURES and v is not None}

    def trim(example):
        return {k: trim_ids_keeping_last(v, lengths[k]) if k in lengths else v for k, v in example.items()}

    return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


def register_rankgen_task(
    name: str,
    documents: str | Sequence[str] | Callable | None,
    vocab_path: str | Callable,
    *,
    negatives: str = "inbook",
    example_config: ExampleConfig | Callable = ExampleConfig(),
    generative_negatives_jsonl: str | Callable | None = None,
    markers: tuple[str, str] = ("pre ", "suffi "),
    grouping: TaskGrouping = TaskGrouping(),
    validation: TaskValidation = TaskValidation(),
) -> seqio.Task:
    """Register (or re-register, replacing) a RankGen triples task; see the module docstring.

    documents: folder(s)/file(s) for `documents.read_documents` (None for "generative").
    vocab_path: spiece.model, tokenizer.json, or a folder with one (the model's own tokenizer).
    Deferred arguments (zero-argument callables) are resolved whenever the task is read.
    """
    if negatives not in NEGATIVE_CHOICES:
        raise RankgenError(f"negatives must be one of {NEGATIVE_CHOICES}, got {negatives!r}")
    _TASK_ARGS[name] = dict(
        negatives=negatives, documents=documents, vocab_path=vocab_path, example_config=example_config,
        generative_negatives_jsonl=generative_negatives_jsonl, holdout_documents=validation.holdout_documents,
        markers=tuple(markers), group_size=grouping.group_size, mix_documents=grouping.mix_documents,
        validation_documents=validation.documents,
        validation_generative_negatives_jsonl=validation.generative_negatives_jsonl,
        shuffle_block_documents=grouping.shuffle_block_documents, pool_leftovers=grouping.pool_leftovers,
    )
    vocabulary = DeferredVocabulary(vocab_path) if callable(vocab_path) else make_vocabulary(vocab_path)
    output_features = {key: seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32) for key in ID_FEATURES}
    output_features[DOC_ID] = seqio.Feature(
        seqio.PassThroughVocabulary(size=0), add_eos=False, required=False, dtype=tf.string, rank=0
    )
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=RankGenDataSource(_make_dataset_fn(name)),
        output_features=output_features,
        # The cache holds whole groups (see `_group_records`); length trimming needs `sequence_length`.
        preprocessors=[seqio.CacheDatasetPlaceholder(), ungroup_examples, trim_keeping_last_token],
        shuffle_buffer_size=None,
    )


def register_mixture(name: str, tasks: Sequence[str], rates: Sequence[float | Callable] | None = None) -> seqio.Mixture:
    """Register (or replace) a mixture of tasks, e.g. the paper's "all" model over several domains.

    rates: relative rates, one per task (default equal); a callable takes the Task and returns its rate.
    """
    rates = list(rates) if rates is not None else [1.0] * len(tasks)
    if len(rates) != len(tasks):
        raise RankgenError(f"mixture {name!r}: {len(tasks)} tasks but {len(rates)} rates")
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, list(zip(tasks, rates)))


