"""RankGen seqio tasks precomputed into seqio's cache with Apache Beam (`rankgen-jax cache-tasks`).

The pipeline is seqio's own (`seqio.scripts.cache_tasks_main.run_pipeline`),
built from the same transforms: `PreprocessTask` reads the task's source
shards, `beam.Reshuffle` spreads its records, `WriteExampleTfRecord` writes
TFRecord files, `GetInfo` / `GetStats` write `info.{split}.json` and
`stats.{split}.json`, and a `COMPLETED` file marks the task cached. Two
things differ, and are why seqio's `run_pipeline` is not called as it is: the
workers must read the tasks as the driver does (the tasks' gin bindings and the
source sharding below travel to them in PreprocessTask's `setup_fn`; seqio's
script ships neither), and what the reading skipped is kept beside the cache.

What a cached RankGen task holds
--------------------------------
One record per same-document group (`tasks._group_records`): the global
reshuffle moves whole groups, and `tasks.ungroup_examples`, after the cache
point, splits them into rows again. seqio's `stats.{split}.json` therefore
counts groups under "examples" (its token totals are over all rows).

The source is read in `source_shards` shards (`tasks.SourceSharding`): shard i
cuts and tokenises the blocks b (of `shuffle_block_documents` documents) with
b mod source_shards == i, each block's groups seeded by `seed` and the block
index, so the cache holds exactly the groups of the uncached stream at `seed`,
however many shards or workers read it. Every shard still reads (but does not
split into sentences or tokenise) all documents to find its blocks; for
PG19-sized corpora, reading is a small part of the work.

`rankgen_stats.{split}.json` beside seqio's files holds the group size, the
seed, the groups and examples written, the ReadStats of the read (files,
documents, skipped input by reason with the first location), merged from the
shards' files under `read_stats/`, and a fingerprint of each feature's
vocabulary, which training checks against the task's vocabulary now.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
from typing import Sequence

import apache_beam as beam
import gin
import seqio
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions
from seqio import beam_utils

from rankgen_jax.data.seqio.tasks import (
    SPLITS,
    SourceSharding,
    cache_stats_path,
    check_split_readable,
    is_rankgen_task,
    read_stats_path,
    set_source_sharding,
    task_spec,
    vocabulary_fingerprints,
)
from rankgen_jax.errors import RankgenError


def _is_not_an_example_dump(record: logging.LogRecord) -> bool:
    # PreprocessTask logs its 1st, 2nd, 4th, 8th... record whole; one record here is a group of tokenised
    # rows, thousands of numbers a line. Its other lines (shards, stats) stay.
    return not (isinstance(record.msg, str) and record.msg.startswith("Example ["))


def _quiet_example_dumps() -> None:
    absl_logger = logging.getLogger("absl")
    if _is_not_an_example_dump not in absl_logger.filters:
        absl_logger.addFilter(_is_not_an_example_dump)


def _setup_worker(modules: Sequence[str], gin_text: str, sharding: SourceSharding) -> None:
    """Run by PreprocessTask in every worker before it reads: the driver's tasks, bindings and sharding."""
    _quiet_example_dumps()
    for module in modules:
        importlib.import_module(module)
    if gin_text:
        gin.parse_config(gin_text, skip_unknown=True)
    set_source_sharding(sharding)


@dataclasses.dataclass(frozen=True)
class CachePlan:
    """What `cache_tasks` writes: each task into output_cache_dir/<task dir> (seqio's layout)."""

    tasks: tuple[str, ...]
    output_cache_dir: str
    source_shards: int = 16
    output_shards: int = 64
    seed: int = 0
    overwrite: bool = False

    def task_dir(self, name: str) -> str:
        return os.path.join(self.output_cache_dir, seqio.get_task_dir_from_name(name))


def _check_plan(plan: CachePlan) -> None:
    if not plan.tasks:
        raise RankgenError("cache-tasks: no task named (`tasks`)", names=("tasks",))
    unknown = [name for name in plan.tasks if not is_rankgen_task(name)]
    if unknown:
        known = sorted(name for name in seqio.TaskRegistry.names() if is_rankgen_task(name))
        raise RankgenError(f"cache-tasks: {', '.join(map(repr, unknown))} not a registered RankGen task "
                           f"(registered: {', '.join(known) or 'none'})")
    if plan.source_shards < 1 or plan.output_shards < 1:
        raise RankgenError(f"cache-tasks: source_shards ({plan.source_shards}) and output_shards "
                           f"({plan.output_shards}) must be >= 1")
    for name in plan.tasks:
        for split in SPLITS:
            check_split_readable(name, split)  # a clear error now, not inside a Beam worker


def _add_task(pipeline: beam.Pipeline, plan: CachePlan, name: str, setup) -> None:
    """seqio's run_pipeline steps for one task, every split, then its COMPLETED file."""
    task = seqio.TaskRegistry.get(name)
    output_dir = plan.task_dir(name)
    completion = []
    for split in SPLITS:
        label = f"{name}_{split}"
        records = (
            pipeline
            | f"{label}_pat" >> beam_utils.PreprocessTask(task, split, setup_fn=setup)
            # Records are whole groups: this shuffles groups, never the rows within one.
            | f"{label}_global_group_shuffle" >> beam.Reshuffle()
        )
        completion.append(records | f"{label}_write_tfrecord" >> beam_utils.WriteExampleTfRecord(
            seqio.get_cached_tfrecord_prefix(output_dir, split), num_shards=plan.output_shards))
        completion.append(records | f"{label}_info" >> beam_utils.GetInfo(plan.output_shards)
                          | f"{label}_write_info" >> beam_utils.WriteJson(seqio.get_cached_info_path(output_dir, split)))
        completion.append(records | f"{label}_stats" >> beam_utils.GetStats(task.output_features)
                          | f"{label}_write_stats" >> beam_utils.WriteJson(seqio.get_cached_stats_path(output_dir, split)))
    _ = (
        completion
        | f"{name}_flatten_completion_values" >> beam.Flatten()
        | f"{name}_discard_completion_values" >> beam.Filter(lambda _: False)
        | f"{name}_write_completed_file" >> beam.io.textio.WriteToText(
            os.path.join(output_dir, "COMPLETED"), append_trailing_newlines=False, num_shards=1,
            shard_name_template="")
    )


def _merge_shard_stats(plan: CachePlan, name: str, split: str) -> dict:
    """The shards' read_stats files summed into the split's rankgen_stats file; RankgenError if one is missing."""
    totals = {"groups": 0, "examples": 0, "files": 0, "documents": 0, "skipped": {}, "first_skipped": {}}
    missing = []
    for shard in range(plan.source_shards):
        path = read_stats_path(plan.output_cache_dir, name, split, shard, plan.source_shards)
        if not tf.io.gfile.exists(path):
            missing.append(path)
            continue
        with tf.io.gfile.GFile(path) as f:
            record = json.load(f)
        for key in ("groups", "examples", "files", "documents"):
            totals[key] += record[key]
        for reason, count in record["skipped"].items():
            totals["skipped"][reason] = totals["skipped"].get(reason, 0) + count
            totals["first_skipped"].setdefault(reason, record["first_skipped"][reason])
    if missing:
        raise RankgenError(f"task {name!r} ({split}): {len(missing)} of {plan.source_shards} source shards wrote no "
                           f"read stats (first: {missing[0]}); the pipeline did not finish them")
    spec = task_spec(name)
    merged = {"group_size": spec.group_size, "mix_documents": spec.mixes_documents, "seed": plan.seed,
              "source_shards": plan.source_shards, "output_shards": plan.output_shards,
              "vocabularies": vocabulary_fingerprints(seqio.get_mixture_or_task(name)), **totals}
    with tf.io.gfile.GFile(cache_stats_path(plan.task_dir(name), split), "w") as f:
        f.write(json.dumps(merged, indent=2, sort_keys=True))
    return merged


def cache_tasks(plan: CachePlan, pipeline_options: Sequence[str] = ("--runner=DirectRunner",),
                modules: Sequence[str] = (), gin_text: str = "") -> dict[str, dict]:
    """Run the Beam pipeline for the plan's RankGen tasks; returns {task: {split: its rankgen_stats}}.

    pipeline_options: Beam's command-line options (runner, workers, Dataflow project...).
    modules: imported in every worker first (the ones that register the tasks, e.g. "tasks.rankgen_tasks").
    gin_text: bindings parsed in every worker (the tasks' data paths and options), e.g. gin.config_str().
    A task already cached in its folder is left as it is unless plan.overwrite.
    """
    _check_plan(plan)
    todo = []
    for name in plan.tasks:
        task_dir = plan.task_dir(name)
        if tf.io.gfile.exists(os.path.join(task_dir, "COMPLETED")) and not plan.overwrite:
            print(f"{name}: already cached in {task_dir} (--overwrite rebuilds it)", flush=True)
            continue
        if tf.io.gfile.exists(task_dir):
            tf.io.gfile.rmtree(task_dir)  # a partial or overwritten cache: no stale shard files
        todo.append(name)
    sharding = SourceSharding(plan.source_shards, plan.seed, plan.output_cache_dir)
    setup = functools.partial(_setup_worker, tuple(modules), gin_text, sharding)
    tf.io.gfile.makedirs(plan.output_cache_dir)
    if todo:
        set_source_sharding(sharding)  # list_shards, called while the pipeline is built, names the source shards
        try:
            with beam.Pipeline(options=PipelineOptions(list(pipeline_options))) as pipeline:
                for name in todo:
                    _add_task(pipeline, plan, name, setup)
        finally:
            set_source_sharding(None)
    results = {}
    for name in todo:
        results[name] = {split: _merge_shard_stats(plan, name, split) for split in SPLITS}
        for split, stats in results[name].items():
            skipped = ", ".join(f"{n} {reason}" for reason, n in stats["skipped"].items()) or "nothing"
            print(f"{name} ({split}): {stats['groups']} groups of {stats['group_size']} "
                  f"({stats['examples']} examples) from {stats['documents']} documents; skipped {skipped}",
                  flush=True)
    return results
