"""Input-pipeline benchmark (`python -m benchmarks.data_pipeline`): is the data side ever the bottleneck?

Measures, in one process:

1. The sources alone, each built by `data.sources.make_sources` exactly as the
   trainer builds it, at the train step's batch shapes:
   - seqio (`DataConfig.source=@SeqioData()`, task `rankgen_demo`: the bundled books,
     InBook negatives, tokenised and padded by `SeqioTriples`): the first batch
     (pipeline start, reading and splitting the books) apart, then
     `source_batches` sequential batches, which by default cross the end of the
     stream's first epoch (2,880 examples at the default task options), where
     seqio re-reads the books; the slowest batch is reported;
   - the in-memory demo source (`ExamplesData`, what `make demo` trains
     on): build time (reading, example cutting and tokenising everything up
     front), then batch() throughput;
   - the random source (`RandomData`).
2. The train step: the T5 1.1 `size` RankGen dual encoder (default tiny) at
   batch 32, prefix 256, continuation 128 and a negative, built with
   `train.compiled.build_step_functions` and an Adafactor optimizer as bench.py does,
   in three interleaved conditions of `steps` steps per round (after
   `warmup_steps` warm-up steps each; the round order alternates):
   - synthetic: random-source batches already on the device (bench.py's way:
     no host work at all per step);
   - real: seqio batches through `train.loop.prefetch_batches` (the background thread)
     and `train.compiled.put_batch`, exactly as the train loop gets them;
   - prefetch_random: random-source batches through the same thread (splits
     the cost of the thread machinery from the cost of seqio).
   Like the train loop, steps are dispatched without waiting for each other;
   a round ends when its last step's metrics are ready. The background threads
   keep their queues full between rounds, so a round's data work equals its
   consumption give or take a few batches at its edges.

The flat dict `run()` returns (also written as JSON by `main`):

  size, batch_size, prefix_length, continuation_length, with_negative, task,
  steps, rounds, warmup_steps, source_batches, jax_devices       the settings
  seqio_first_batch_seconds     pipeline start to the first batch (incl. reading and splitting the books)
  seqio_examples_per_second     steady rate after the first batch (epoch restarts included)
  seqio_max_batch_seconds       slowest batch after the first (an epoch restart when the read crosses one)
  examples_build_seconds        make_sources for ExamplesData (everything tokenised up front)
  examples_examples_per_second  its batch() rate
  random_examples_per_second    RandomTriples.batch rate
  step_compile_seconds          the first train step (compilation included)
  synthetic_step_seconds, real_step_seconds, prefetch_random_step_seconds   mean over all timed rounds
  synthetic_step_seconds_best, real_step_seconds_best, prefetch_random_step_seconds_best   fastest round
  synthetic_examples_per_second the train step's consumption (batch_size / synthetic_step_seconds)
  real_examples_per_second      batch_size / real_step_seconds
  real_vs_synthetic             real_step_seconds / synthetic_step_seconds - 1 (target: within +-0.05)
  real_vs_synthetic_best        the same on the fastest rounds
  prefetch_random_vs_synthetic  prefetch_random_step_seconds / synthetic_step_seconds - 1
  real_vs_synthetic_paired, prefetch_random_vs_synthetic_paired   median over rounds of the round's
                                ratio to its synthetic round, - 1 (robust to load drifting between rounds)
  step_seconds_spread           largest (slowest - fastest) / fastest round of any condition: the noise level
  seqio_headroom                seqio_examples_per_second / synthetic_examples_per_second (> 1: never the bottleneck)
  examples_headroom             examples_examples_per_second / synthetic_examples_per_second
  loss                          last real-data step's loss (finite: the batches are sane)
  peak_rss_mib                  peak resident memory of the process
  malloc_tunables               GLIBC_TUNABLES of the run (`make bench` starts it with the CPU plug-in's)

With `--cache` (needs the beam extra) the benchmark runs on `rankgen_folder_inbook`
over the bundled books copied `--cache_copies` times (so that the Beam runs have
work to split), and adds:

3. The Beam cache pipeline (`rankgen-jax cache-tasks`, data/seqio/beam_cache.py)
   over that task, both splits, with the DirectRunner in one process and with 2
   worker processes (multi_processing): wall seconds from pipeline start to the
   merged stats, and examples written per second (worker start-up included).
4. Reading the cache (`SeqioData.seqio_cache_dir`) as the trainer does, next to
   building the same task uncached (section 1's seqio rate), and a fourth train
   step condition, "cached": cached batches through `prefetch_batches`.

  beam_1_worker_seconds, beam_2_workers_seconds            the pipeline's wall time
  beam_1_worker_examples_per_second, beam_2_workers_...    examples cached / wall time
  beam_examples, beam_groups                                what one run cached (train + validation)
  beam_2_vs_1_workers                                       beam_1 seconds / beam_2 seconds (speed-up)
  cached_first_batch_seconds, cached_examples_per_second   the cached source alone, as seqio_* above
  cached_vs_uncached_read                                   cached_examples_per_second / seqio_examples_per_second
  cached_step_seconds(_best), cached_vs_synthetic(_best, _paired)   as for "real"

Numbers, not pass/fail; on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_json


SOURCES = ("synthetic", "real", "prefetch_random")


def _bind_task_options(options: dict) -> None:
    """Bind `rankgen_task_options.<key>` in gin (how the seqio tasks read their settings)."""
    import gin

    import tasks  # noqa: F401 - registers rankgen_demo and the rankgen_task_options configurable

    with gin.unlock_config():
        for key, value in options.items():
            gin.bind_parameter(f"rankgen_task_options.{key}", value)


CACHE_TASK = "rankgen_folder_inbook"


def _copied_corpus(folder: Path, copies: int) -> Path:
    """The bundled books `copies` times over, each copy its own documents (file names differ)."""
    from rankgen_jax.resources import BUNDLED_CORPUS

    books = sorted(Path(BUNDLED_CORPUS).rglob("*.txt"))
    folder.mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        for book in books:
            shutil.copyfile(book, folder / f"{copy:02d}_{book.parent.name}_{book.name}")
    return folder


def time_cache_pipeline(out: Path, workers: int, source_shards: int) -> tuple[float, int, int]:
    """(wall seconds, examples, groups) of one cache-tasks run of CACHE_TASK with the DirectRunner."""
    import gin

    from rankgen_jax.data.seqio.beam_cache import CachePlan, cache_tasks

    options = ["--runner=DirectRunner"]
    if workers > 1:
        options += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    plan = CachePlan((CACHE_TASK,), str(out), source_shards=source_shards, output_shards=source_shards,
                     overwrite=True)
    began = time.perf_counter()
    stats = cache_tasks(plan, options, modules=("tasks.rankgen_tasks",), gin_text=gin.config_str())[CACHE_TASK]
    seconds = time.perf_counter() - began
    return seconds, sum(s["examples"] for s in stats.values()), sum(s["groups"] for s in stats.values())


def run_cache_pipelines(work: Path, copies: int, source_shards: int, shuffle_block_documents: int) -> tuple[dict, Path]:
    """Section 3: bind CACHE_TASK to the copied books and time the pipeline with 1 and 2 workers."""
    _bind_task_options({"shuffle_block_documents": shuffle_block_documents})
    import gin

    corpus = _copied_corpus(work / "books", copies)
    with gin.unlock_config():
        gin.bind_parameter("rankgen_data_paths.folder", str(corpus))
    row = {"cache_copies": copies, "cache_documents": len(list(corpus.iterdir())), "source_shards": source_shards,
           "shuffle_block_documents": shuffle_block_documents}
    for workers, name in ((1, "beam_1_worker"), (2, "beam_2_workers")):
        seconds, examples, groups = time_cache_pipeline(work / f"cache_{workers}", workers, source_shards)
        row.update({f"{name}_seconds": seconds, f"{name}_examples_per_second": examples / seconds,
                    "beam_examples": examples, "beam_groups": groups})
    row["beam_2_vs_1_workers"] = row["beam_1_worker_seconds"] / row["beam_2_workers_seconds"]
    return row, work / "cache_2"


def time_source(source, num_batches: int, start: int = 0) -> tuple[float, float, float]:
    """(first batch seconds, examples/s over the next num_batches - 1 batches, slowest of those batches)."""
    began = time.perf_counter()
    source.batch(start)
    first = time.perf_counter() - began
    times = []
    for index in range(start + 1, start + num_batches):
        began = time.perf_counter()
        source.batch(index)
        times.append(time.perf_counter() - began)
    rate = source.batch_size * len(times) / sum(times) if times else float("nan")
    return first, rate, max(times, default=float("nan"))


def _release(source) -> None:
    """Drop a seqio source's tf.data iterator now: one still alive at interpreter exit aborts the process."""
    if hasattr(source, "_iterator"):
        source._iterator = None


def run(size: str = "tiny", batch_size: int = 32, prefix_length: int = 256, continuation_length: int = 128,
        with_negative: bool = True, task: str = "rankgen_demo", steps: int = 20, rounds: int = 3,
        warmup_steps: int = 3, source_batches: int = 100, task_options: dict | None = None,
        measure_examples: bool = True, cache_dir: str = "") -> dict:
    """Run the benchmark in this process; see the module docstring.

    cache_dir: a cache of `task` (cache-tasks): also time reading it and the train step fed from it.
    task_options: extra `rankgen_task_options` gin bindings (e.g. prefix_words for short test
    settings); group_size is always bound to batch_size (one same-document group per batch, as
    RankGen trains). The example source gets the same prefix / continuation word settings.
    """
    import flax.linen as nn
    import jax
    import numpy as np

    from rankgen_jax.runtime import partitioning
    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.data.source_configs import SOURCE_CONFIGS, DataConfig, source_fields
    from rankgen_jax.data.sources import make_sources
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train.step import StepOptions
    from rankgen_jax.train.compiled import build_step_functions, put_batch
    from rankgen_jax.train.loop import prefetch_batches

    options = {**(task_options or {}), "group_size": batch_size}
    _bind_task_options(options)
    words = {k: options[k] for k in ("prefix_words", "min_continuation_words", "max_continuation_words")
             if k in options}
    # The demo vocabulary has 8000 pieces; 8064 rounds that up to a multiple of 128.
    config = ModelConfig(encoder=t5_config(size, vocab_size=8064), head=RANKGEN_HEAD)
    settings = dict(continuation_length=continuation_length, with_negative=with_negative,
                    vocab_size=config.encoder.vocab_size, task=task, **words)

    def data_config(source: str, **extra) -> DataConfig:
        """The settings each source reads (its config class holds only those)."""
        fields = source_fields(SOURCE_CONFIGS[source])
        chosen = {k: v for k, v in {**settings, **extra}.items() if k in fields}
        return DataConfig(SOURCE_CONFIGS[source](**chosen), batch_size=batch_size, prefix_length=prefix_length)

    row: dict = {"size": size, "batch_size": batch_size, "prefix_length": prefix_length,
                 "continuation_length": continuation_length, "with_negative": with_negative, "task": task,
                 "steps": steps, "rounds": rounds, "warmup_steps": warmup_steps, "source_batches": source_batches,
                 "jax_devices": jax.device_count()}

    # --- 1. the sources alone ---------------------------------------------------------
    seqio_source, seqio_eval = make_sources(data_config("seqio"))
    first, rate, slowest = time_source(seqio_source, source_batches)
    row.update(seqio_first_batch_seconds=first, seqio_examples_per_second=rate, seqio_max_batch_seconds=slowest)
    conditions = SOURCES + (("cached",) if cache_dir else ())
    if cache_dir:
        cached_source, cached_eval = make_sources(data_config("seqio", seqio_cache_dir=cache_dir))
        first, rate, _ = time_source(cached_source, source_batches)
        row.update(cached_first_batch_seconds=first, cached_examples_per_second=rate,
                   cached_vs_uncached_read=rate / row["seqio_examples_per_second"])
    if measure_examples:
        began = time.perf_counter()
        examples_source, _ = make_sources(data_config("examples"))
        row["examples_build_seconds"] = time.perf_counter() - began
        row["examples_examples_per_second"] = time_source(examples_source, source_batches)[1]
        del examples_source
    random_source, _ = make_sources(data_config("random"))
    row["random_examples_per_second"] = time_source(random_source, source_batches)[1]

    # --- 2. the train step: synthetic vs real data ---------------------------------------
    mesh = partitioning.make_mesh(-1, 1)
    rules = partitioning.STANDARD_RULES
    tx, schedule = make_optimizer(OptimizerConfig(name="adafactor", learning_rate=2e-3))
    step_options = StepOptions("in_batch_softmax", (), num_chunks=1)
    fns = build_step_functions(config, step_options, tx, schedule, {}, mesh, rules, seed=0)
    put = lambda local: put_batch(local, sharding=fns.batch_sharding, batch_size=batch_size)  # noqa: E731
    timed = {name: [] for name in conditions}  # per round: seconds per step
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = fns.init()
        synthetic = [jax.device_put(random_source.batch(i), fns.batch_sharding) for i in range(2)]
        began = time.perf_counter()
        state, metrics = fns.train_step(state, synthetic[0])
        jax.block_until_ready(metrics)
        row["step_compile_seconds"] = time.perf_counter() - began

        batches_needed = warmup_steps + rounds * steps
        # The seqio stream goes on from where the standalone read stopped (no pipeline rebuild).
        streams = {
            "synthetic": (synthetic[i % 2] for i in range(batches_needed)),
            "real": prefetch_batches(seqio_source, source_batches, source_batches + batches_needed, put),
            "prefetch_random": prefetch_batches(random_source, 0, batches_needed, put),
        }
        if cache_dir:
            streams["cached"] = prefetch_batches(cached_source, source_batches, source_batches + batches_needed, put)

        def steps_of(name: str, count: int):
            nonlocal state, metrics
            began = time.perf_counter()
            for _ in range(count):
                state, metrics = fns.train_step(state, next(streams[name]))
            jax.block_until_ready(metrics)
            return (time.perf_counter() - began) / count

        for name in conditions:
            steps_of(name, warmup_steps)
        for r in range(rounds):
            for name in (conditions if r % 2 == 0 else conditions[::-1]):
                timed[name].append(steps_of(name, steps))
                if name == "real":
                    row["loss"] = float(metrics["loss"])
    for name in conditions:
        row[f"{name}_step_seconds"] = float(np.mean(timed[name]))
        row[f"{name}_step_seconds_best"] = float(np.min(timed[name]))
    row["synthetic_examples_per_second"] = batch_size / row["synthetic_step_seconds"]
    row["real_examples_per_second"] = batch_size / row["real_step_seconds"]
    row["real_vs_synthetic"] = row["real_step_seconds"] / row["synthetic_step_seconds"] - 1
    row["real_vs_synthetic_best"] = row["real_step_seconds_best"] / row["synthetic_step_seconds_best"] - 1
    row["prefetch_random_vs_synthetic"] = row["prefetch_random_step_seconds"] / row["synthetic_step_seconds"] - 1
    # Paired: each round's conditions ran back to back, under about the same background load.
    if cache_dir:
        row["cached_vs_synthetic"] = row["cached_step_seconds"] / row["synthetic_step_seconds"] - 1
        row["cached_vs_synthetic_best"] = row["cached_step_seconds_best"] / row["synthetic_step_seconds_best"] - 1
    for name in conditions[1:]:
        ratios = np.asarray(timed[name]) / np.asarray(timed["synthetic"])
        row[f"{name}_vs_synthetic_paired"] = float(np.median(ratios) - 1)
    row["step_seconds_spread"] = float(max((max(v) - min(v)) / min(v) for v in timed.values()))
    row["seqio_headroom"] = row["seqio_examples_per_second"] / row["synthetic_examples_per_second"]
    if measure_examples:
        row["examples_headroom"] = row["examples_examples_per_second"] / row["synthetic_examples_per_second"]
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row["malloc_tunables"] = os.environ.get("GLIBC_TUNABLES", "")
    for stream in streams.values():
        stream.close()
    for source in (seqio_source, seqio_eval) + ((cached_source, cached_eval) if cache_dir else ()):
        _release(source)
    gc.collect()
    return row


def summary(row: dict) -> str:
    """A few readable lines of a run() result."""
    lines = [
        f"batch {row['batch_size']}, prefix {row['prefix_length']}, continuation {row['continuation_length']}"
        f"{' + negative' if row['with_negative'] else ''}; T5 1.1 {row['size']} step; {row['rounds']} rounds of "
        f"{row['steps']} steps per condition",
        f"  seqio {row['task']:<14} {row['seqio_examples_per_second']:9.0f} examples/s  (first batch "
        f"{row['seqio_first_batch_seconds']:.2f} s, slowest later batch {row['seqio_max_batch_seconds']:.2f} s)",
    ]
    if "examples_examples_per_second" in row:
        lines.append(f"  in-memory examples   {row['examples_examples_per_second']:9.0f} examples/s  (built in "
                     f"{row['examples_build_seconds']:.1f} s)")
    lines += [
        f"  random               {row['random_examples_per_second']:9.0f} examples/s",
        f"  train step consumes  {row['synthetic_examples_per_second']:9.1f} examples/s  (step "
        f"{row['synthetic_step_seconds']:.3f} s; first step {row['step_compile_seconds']:.1f} s)  -> seqio headroom "
        f"{row['seqio_headroom']:.0f}x",
        f"  step time: synthetic {row['synthetic_step_seconds']:.3f} s, real (seqio via prefetch_batches) "
        f"{row['real_step_seconds']:.3f} s ({row['real_vs_synthetic']:+.1%}; paired {row['real_vs_synthetic_paired']:+.1%}, "
        f"best rounds {row['real_vs_synthetic_best']:+.1%}), random via prefetch_batches "
        f"{row['prefetch_random_step_seconds']:.3f} s ({row['prefetch_random_vs_synthetic']:+.1%}; paired "
        f"{row['prefetch_random_vs_synthetic_paired']:+.1%}); rounds differ by up to {row['step_seconds_spread']:.0%}",
    ]
    if "cached_step_seconds" in row:
        lines += [
            f"  Beam cache of {row['beam_examples']} examples ({row['beam_groups']} groups, {row['cache_documents']} "
            f"documents, {row['source_shards']} source shards): 1 worker {row['beam_1_worker_seconds']:.1f} s "
            f"({row['beam_1_worker_examples_per_second']:.0f} examples/s), 2 workers {row['beam_2_workers_seconds']:.1f} s "
            f"({row['beam_2_workers_examples_per_second']:.0f} examples/s): {row['beam_2_vs_1_workers']:.2f}x",
            f"  cached read          {row['cached_examples_per_second']:9.0f} examples/s  "
            f"({row['cached_vs_uncached_read']:.1f}x building uncached; first batch {row['cached_first_batch_seconds']:.2f} s)",
            f"  step time: cached (via prefetch_batches) {row['cached_step_seconds']:.3f} s "
            f"({row['cached_vs_synthetic']:+.1%} vs synthetic; paired {row['cached_vs_synthetic_paired']:+.1%}, "
            f"best rounds {row['cached_vs_synthetic_best']:+.1%})",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", help="T5 1.1 size of the train step (default tiny)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--prefix_length", type=int, default=256)
    parser.add_argument("--continuation_length", type=int, default=128)
    parser.add_argument("--no_negative", action="store_true", help="train without the InBook negative")
    parser.add_argument("--task", default="rankgen_demo", help="seqio task or mixture (default rankgen_demo)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round and condition (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--source_batches", type=int, default=100, help="batches read per source alone (default 100)")
    parser.add_argument("--cache", action="store_true",
                        help=f"also time the Beam cache pipeline (1 and 2 workers) and training from the cache, on "
                        f"{CACHE_TASK} over copies of the bundled books (replaces --task)")
    parser.add_argument("--cache_copies", type=int, default=1,
                        help="copies of the bundled corpus for --cache (default 1: its 168 documents, 2.6M words)")
    parser.add_argument("--source_shards", type=int, default=8, help="Beam source shards for --cache (default 8)")
    parser.add_argument("--out", default="runs/bench/data.json")
    args = parser.parse_args(argv)
    cache_row, cache_dir, task = {}, "", args.task
    with tempfile.TemporaryDirectory(prefix="bench_cache_") as work:
        if args.cache:
            _bind_task_options({"group_size": args.batch_size})
            # Blocks of 2 documents: enough blocks for every source shard to have work.
            cache_row, cache_path = run_cache_pipelines(Path(work), args.cache_copies, args.source_shards, 2)
            cache_dir, task = str(cache_path), CACHE_TASK
        row = run(args.size, args.batch_size, args.prefix_length, args.continuation_length, not args.no_negative,
                  task, args.steps, args.rounds, args.warmup_steps, args.source_batches, cache_dir=cache_dir)
    row.update(cache_row)
    print(summary(row))
    write_json(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
