"""The trainer's batch source over a seqio task or mixture (SeqioTriples) and the feature converter it pads with.

`SeqioTriples.batch(index)` is global batch `index` of the repeated stream, padded to fixed lengths; each
host reads its rows of every group (uncached) or its own files (cached), and a resume skips to the index.
How hosts share groups and files, and what resuming costs: docs/design/seqio.md, 'Reading for training:
SeqioTriples'.
"""

from __future__ import annotations

import atexit
import json
import weakref
from typing import Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from rankgen_jax.data.seqio.tasks import (
    ID_FEATURES,
    NEGATIVE,
    POSITIVE,
    QUERY,
    cache_stats_path,
    check_cached_vocabularies,
    is_rankgen_task,
    task_spec,
    task_vocab_path,
    trim_ids_keeping_last,
    vocabulary_fingerprints,
)
from rankgen_jax.errors import RankgenError


# ------------------------------------------------------------------------------------------
# Feature converter and the trainer's batch source
# ------------------------------------------------------------------------------------------


class RankGenFeatureConverter(seqio.FeatureConverter):
    """Task features -> the trainer's arrays: id features trimmed (keeping the last token) and padded; strings dropped.

    pad_id: the tokenizer's padding id (the vocabulary's `pad_id`: 0 for T5 and BERT, 1 for RoBERTa).
    with_negative: False drops `negative_ids` (training with in-batch negatives only).
    """

    TASK_FEATURES = {key: seqio.FeatureConverter.FeatureSpec(dtype=tf.int32) for key in ID_FEATURES}
    MODEL_FEATURES = dict(TASK_FEATURES)
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pad_id: int = 0, with_negative: bool = True, **kwargs):
        if kwargs.pop("pack", False):
            raise RankgenError("RankGenFeatureConverter does not pack: every row is one query or candidate")
        keys = ID_FEATURES if with_negative else ID_FEATURES[:2]
        # Instance attributes shadow the class ones: the feature set depends on with_negative.
        self.TASK_FEATURES = {key: seqio.FeatureConverter.FeatureSpec(dtype=tf.int32) for key in keys}
        self.MODEL_FEATURES = dict(self.TASK_FEATURES)
        self._pad_id = int(pad_id)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        pad_id = self._pad_id

        def convert(example):
            out = {}
            for key in self.MODEL_FEATURES:
                length = int(task_feature_lengths[key])
                ids = trim_ids_keeping_last(example[key], length)
                ids = tf.pad(ids, [[0, length - tf.shape(ids)[0]]], constant_values=pad_id)
                out[key] = tf.ensure_shape(ids, [length])
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
        return {key: task_feature_lengths[key] for key in self.MODEL_FEATURES}


# Sources whose tf.data pipeline may still be running. Its prefetch threads call back into
# Python (the examples come from a generator; HF tokenizers run in tf.py_function); left
# alive into interpreter shutdown, they abort ("terminate called without an active
# exception", exit 134) or hang the process after a clean run.
_OPEN_SOURCES: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_sources() -> None:
    for source in list(_OPEN_SOURCES):
        source.close()


class SeqioTriples:
    """The trainer's BatchSource over a seqio task or mixture: `batch(index)` is global batch `index`.

    lengths: {"query_ids": Lq, "positive_ids": Lc, "negative_ids": Lc} (negative defaults to positive).
    seed: orders the stream (passed to the task's source; seqio shuffles nothing).
    shard_info: this host's share (multi-host); `batch` then returns the local batch, see the module docstring.
    use_cached: read the task(s) from seqio's cache as `rankgen-jax cache-tasks` wrote it (whole
      groups; see the module docstring), found in `seqio.add_global_cache_dirs` folders.
    threads: tf.data threads of the pipeline. One suits a host whose cores all run the
      train step (see `_dataset`); a TPU VM, whose cores are free, can give it more.
    """

    def __init__(
        self,
        task_or_mixture_name: str,
        split: str,
        batch_size: int,
        lengths: Mapping[str, int],
        seed: int = 0,
        shard_info: seqio.ShardInfo | None = None,
        *,
        with_negative: bool = True,
        use_cached: bool = False,
        threads: int = 1,
    ):
        try:
            provider = seqio.get_mixture_or_task(task_or_mixture_name)
        except ValueError:
            known = sorted(n for n in list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names()))
            raise RankgenError(
                f"no seqio task or mixture named {task_or_mixture_name!r} is registered; the project's tasks are "
                f"registered by `import tasks` (tasks/rankgen_tasks.py), which `rankgen-jax` does when the gin config "
                f"mentions seqio; registered: {', '.join(known) or 'none'}"
            ) from None
        self.name, self.split, self.seed = task_or_mixture_name, split, int(seed)
        self.shard_info, self.use_cached, self.with_negative = shard_info, use_cached, with_negative
        hosts = shard_info.num_shards if shard_info else 1
        if batch_size < 1 or batch_size % hosts:
            raise RankgenError(f"batch_size={batch_size} must be positive and divisible by the {hosts} hosts")
        self.batch_size = int(batch_size)
        self.local_batch_size = self.batch_size // hosts
        if threads < 1:
            raise RankgenError(f"tf.data threads must be >= 1, got {threads} (SeqioData.tfdata_threads)")
        self.threads = int(threads)
        self._tasks, self._weights = self._tasks_and_weights(provider)
        for task in self._tasks:
            if use_cached:
                self._check_cached_grouping(task, hosts)
            else:
                self._check_grouping(task.name, hosts)
        keys = ID_FEATURES if with_negative else ID_FEATURES[:2]
        lengths = dict(lengths)
        lengths.setdefault(NEGATIVE, lengths.get(POSITIVE))
        missing = [k for k in ID_FEATURES if not lengths.get(k)]
        if missing:
            raise RankgenError(f"SeqioTriples lengths need {', '.join(missing)}; got {dict(lengths)}")
        self._task_lengths = {k: int(lengths[k]) for k in ID_FEATURES}
        self.lengths = {k: self._task_lengths[k] for k in keys}
        self.vocabulary = provider.output_features[QUERY].vocabulary
        # The tokenizer file a model trained on this data reads text with (saved with a model trained from scratch).
        self.vocab_path = next((task_vocab_path(t.name) for t in self._tasks if is_rankgen_task(t.name)), None)
        self.pad_id = int(self.vocabulary.pad_id)
        self.vocab_size = int(self.vocabulary.vocab_size)
        self.converter = RankGenFeatureConverter(pad_id=self.pad_id, with_negative=with_negative)
        self._iterator: Iterator | None = None
        self._next_index: int | None = None

    def _tasks_and_weights(self, provider) -> tuple[list[seqio.Task], list[float]]:
        """The tasks to read with their normalised rates; zero-rate tasks are never opened."""
        if isinstance(provider, seqio.Task):
            pairs = [(provider, 1.0)]
        else:
            pairs = [(task, float(provider.get_rate(task))) for task in provider.tasks]
        pairs = [(task, rate) for task, rate in pairs if rate > 0 and self.split in task.splits]
        if not pairs:
            raise RankgenError(f"{self.name!r} has no task with a positive rate and a {self.split!r} split")
        total = sum(rate for _, rate in pairs)
        return [task for task, _ in pairs], [rate / total for _, rate in pairs]

    def _check_grouping(self, task_name: str, hosts: int) -> None:
        """Batches must be whole same-document groups, and every host must own whole rows of each group."""
        if not is_rankgen_task(task_name):
            return
        spec = task_spec(task_name)
        if spec.group_size % hosts:
            raise RankgenError(
                f"task {task_name!r}: group_size={spec.group_size} is not divisible by the {hosts} hosts"
            )
        if not spec.mixes_documents and self.batch_size % spec.group_size:
            raise RankgenError(
                f"task {task_name!r}: batch_size={self.batch_size} is not a multiple of its "
                f"group_size={spec.group_size}, so batches would split same-document groups"
            )

    def _check_cached_grouping(self, task: seqio.Task, hosts: int) -> None:
        """The task is cached by cache-tasks, and every host's local batch is whole cached groups."""
        if task.cache_dir is None:
            searched = ", ".join(seqio.utils.get_global_cache_dirs()) or "none set"
            raise RankgenError(
                f"task {task.name!r} is not cached in any seqio cache folder ({searched}): build it with "
                f"`rankgen-jax cache-tasks --tasks {task.name} --output_cache_dir DIR` and set "
                "SeqioData.seqio_cache_dir = DIR"
            )
        path = cache_stats_path(task.cache_dir, self.split)
        if not tf.io.gfile.exists(path):
            raise RankgenError(
                f"task {task.name!r} cached in {task.cache_dir} has no {path.rsplit('/', 1)[-1]}: it was not "
                "written by `rankgen-jax cache-tasks` (or not for this split), so its records are not whole groups"
            )
        with tf.io.gfile.GFile(path) as f:
            cached = json.load(f)
        if "vocabularies" in cached:  # a cache of an earlier version did not record them
            check_cached_vocabularies(task.name, cached["vocabularies"], vocabulary_fingerprints(task))
        group_size = int(cached["group_size"])
        if not cached["mix_documents"] and self.local_batch_size % group_size:
            raise RankgenError(
                f"task {task.name!r} is cached in groups of {group_size}: each of the {hosts} hosts' "
                f"{self.local_batch_size} rows (batch_size={self.batch_size}) must be a multiple of it, so that "
                "every local batch is whole same-document groups"
            )

    def _dataset(self, start: int):
        """Numpy iterator over local batches from global batch `start` on (rebuilt from the stream's beginning)."""
        batched = []
        for task in self._tasks:
            ds = task.get_dataset(
                sequence_length=self._task_lengths, split=self.split, use_cached=self.use_cached, shuffle=False,
                seed=self.seed, shard_info=self.shard_info, num_epochs=None,
            )
            ds = self.converter(ds, self.lengths)
            batched.append(ds.batch(self.local_batch_size, drop_remainder=True))
        if len(batched) == 1:
            ds = batched[0]
        else:
            # Whole batches are drawn from one task at a time, with the same seed on every host.
            ds = tf.data.Dataset.sample_from_datasets(batched, weights=self._weights, seed=self.seed,
                                                      stop_on_empty_dataset=True)
        # A jump re-reads the stream from its start: `start` batches (start * batch_size examples) are skipped.
        # One tf.data thread by default: it reads ~2,200 examples/s, 25x what a 2-core step
        # consumes, and tf.data's default pool (a thread per core) preempts XLA's threads mid-op:
        # the real-data step was 4-10% slower than on synthetic batches with it, ~3.5% with one
        # (docs/benchmarks.md).
        options = tf.data.Options()
        options.threading.private_threadpool_size = self.threads
        options.threading.max_intra_op_parallelism = 1
        return ds.skip(start).prefetch(2).with_options(options).as_numpy_iterator()

    def close(self) -> None:
        """Stop the tf.data pipeline now (done at exit for every open source); `batch` reopens it."""
        self._iterator = None
        self._next_index = None
        _OPEN_SOURCES.discard(self)

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        """Global batch `index` (its `rows`); with shard_info, this host's local batch (`rows` must match its size)."""
        if index < 0:
            raise RankgenError(f"batch index must be >= 0, got {index}")
        if self._iterator is None or index != self._next_index:
            self._iterator = self._dataset(index)
            _OPEN_SOURCES.add(self)
        try:
            out = next(self._iterator)
        except StopIteration:
            self._iterator = None
            raise RankgenError(
                f"{self.name!r} ({self.split}) gives no complete batch of {self.local_batch_size} rows: "
                "too few examples for one group (see scan_task)"
            ) from None
        self._next_index = index + 1
        if self.shard_info is not None:
            if rows is not None and len(range(self.batch_size)[rows]) != self.local_batch_size:
                raise RankgenError(
                    f"rows {rows} do not match this host's {self.local_batch_size} rows "
                    f"of the {self.batch_size}-row batch"
                )
            return out
        return {k: v[rows] for k, v in out.items()} if rows is not None else out
