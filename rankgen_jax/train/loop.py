"""The training loop: data -> sharded train_step -> metrics, eval, checkpoints; resumable and preemption-safe.

Read top to bottom: `train` sets up (mesh, model, data, state: resumed,
from an init checkpoint or random) and runs `_loop`. Everything model- or
loss-specific lives in train_step and losses; what is saved and resumed in
checkpointing; when every host stops in stopping.

The workdir may be local or a bucket URL (gs://bucket/run), which every host of
a multi-host slice passes alike: its paths are etils.epath's (checkpoints.run_folder.RunFolder),
host 0 alone writes the config files and metrics, and Orbax coordinates the
checkpoint writes. The hosts also agree on when to stop (stopping.StopVote).

Faults: a run killed at any point (SIGKILL included, during an async checkpoint
write too) resumes from the newest checkpoint that restores intact
(checkpointing.resume). Steps with NaN/Inf gradients are skipped and counted
(metric `train/nonfinite_skipped`); too many in a row stop the run with a
checkpoint of the parameters from before them (_stop_if_diverged).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import sys
import threading
import time
from typing import Callable, Iterator

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RETRIEVAL_METRIC_PREFIX, RunFolder
from rankgen_jax.data.source_configs import TEXT_SOURCES, DataConfig
from rankgen_jax.data.sources import BatchSource, make_sources, missing_eval_data, training_conventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import registry as losses
from rankgen_jax.models.batch_layout import BatchLayout
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.runtime import partitioning
from rankgen_jax.runtime.process import initialize_distributed
from rankgen_jax.train import checkpointing, gin_parsing, run_record, stopping
from rankgen_jax.train.compiled import build_step_functions, put_batch
from rankgen_jax.train.config import LossConfig, TrainerConfig, check_divisible, matryoshka_for
from rankgen_jax.train.metric_writers import MetricWriter
from rankgen_jax.train.optimizers import (DECAYING_SCHEDULES, OptimizerConfig, make_optimizer,
                                         nonfinite_counts, schedule_for_run)
from rankgen_jax.train.retrieval_eval import RetrievalEvalConfig, RetrievalEvaluator
from rankgen_jax.train.state import TrainState
from rankgen_jax.train.step import StepOptions


def train(
    workdir: str | os.PathLike | RunFolder,
    trainer: TrainerConfig | None = None,
    model_config: ModelConfig | None = None,
    data: DataConfig | None = None,
    loss: LossConfig | None = None,
    optimizer: OptimizerConfig | None = None,
    retrieval: RetrievalEvalConfig | None = None,
) -> dict:
    """Train (or resume) in workdir; returns the last logged train metrics, with "preempted" set when SIGTERM
    stopped training before its end (the state is saved: rerunning resumes). Configs default to gin's.

    workdir: the run's folder (a RunFolder, or its path); every file of the run is one of its paths.
    retrieval: the retrieval sets measured every eval_every steps (train/retrieval_eval.py).
    """
    # Gin's encoder bindings count against an init checkpoint's encoder only when the model config is gin's.
    encoder_bindings = gin_parsing.encoder_bindings() if model_config is None else ()
    trainer, model_config = trainer or TrainerConfig(), model_config or ModelConfig()
    data, loss, optimizer = data or DataConfig(), loss or LossConfig(), optimizer or OptimizerConfig()
    retrieval = retrieval or RetrievalEvalConfig()
    if retrieval.sets and not trainer.eval_every:
        raise RankgenError("RetrievalEvalConfig.sets are measured every TrainerConfig.eval_every steps: set it")
    # One spelling of the workdir for every file of the run: the OS's (a symlink then `..` resolves as opening a
    # file would), and "gs://b/run" stays a URL (pathlib would make it "gs:/b/run").
    folder = RunFolder.resolved(workdir)
    checkpointing.check_workdir(folder)

    # --- mesh and static step settings -------------------------------------------------
    initialize_distributed(trainer.distributed)
    mesh = partitioning.make_mesh(trainer.mesh_data, trainer.mesh_model, replica=trainer.mesh_replica)
    rules = partitioning.rules_by_name(trainer.axis_rules)
    check_divisible(data.batch_size, partitioning.data_parallel_size(mesh), trainer)
    resuming = checkpointing.holds_run(folder)
    intended_model = model_config
    model_config, init_params, vocab = checkpointing.resolve_model_config(folder, trainer, model_config,
                                                                          encoder_bindings)
    record = run_record.run_config(trainer=trainer, data=data, loss=loss, optimizer=optimizer)
    if resuming:  # before anything compiles: a resume trains the recorded run, or stops here
        recorded_run = run_record.load_run_config(folder)
        # A resume may leave out the init checkpoint: the model it intends is still the one started from it.
        init = trainer.init_checkpoint or run_record.recorded_init_checkpoint(recorded_run)
        intended = checkpointing.intended_model_config(dataclasses.replace(trainer, init_checkpoint=init),
                                                       intended_model, encoder_bindings)
        run_record.check_resume(folder, model_config, intended, recorded_run, record)
    vocab = checkpointing.local_vocab(vocab)
    if model_config.kind == "encoder":
        raise RankgenError("ModelConfig.kind='encoder' has no head to train: use dual_encoder or cross_encoder")
    losses.check_model_kind(loss.name, model_config.kind)
    if model_config.kind == "cross_encoder" and data.source.kind not in ("lists", "pairs", "retrieval"):
        raise RankgenError(f"a cross encoder trains on candidate lists or pairs (DataConfig.source @ListsData(), "
                           f"@PairsData() or @RetrievalData()), not {type(data.source).__name__}")
    # The model kind and the batch form its loss reads fix what a batch holds (models.batch_layout).
    layout = BatchLayout(model_config.kind, losses.batch_form(loss.name))
    options = StepOptions(loss.name, tuple(sorted(loss.options().items())), trainer.num_chunks, trainer.accum_steps,
                          towers=layout.towers, matryoshka=matryoshka_for(loss, model_config))
    optimizer = schedule_for_run(optimizer, trainer.num_steps)
    tx, schedule = make_optimizer(optimizer)
    loss_params = losses.init_loss_params(loss.name, **loss.options())
    if vocab and data.source.kind in TEXT_SOURCES and not data.source.vocab:
        # None chosen: tokenise with the checkpoint's own tokenizer.
        data = data.with_source(vocab=vocab)
    missing = missing_eval_data(data)
    if missing and trainer.eval_every and not retrieval.sets:
        raise RankgenError(f"TrainerConfig.eval_every={trainer.eval_every} evaluates on held-out data, which this data "
                           f"config does not name: give {missing}, or set TrainerConfig.eval_every=0")
    train_source, eval_source = make_sources(data, layout)
    _check_vocab_fits(data, train_source, model_config)
    data_vocab = data.source.tokenizer_path() if data.source.kind in TEXT_SOURCES else (
        vocab or getattr(train_source, "vocab_path", None))
    evaluator = None
    if retrieval.sets:
        # Before anything compiles: the sets read, the nano ones built.
        evaluator = RetrievalEvaluator(retrieval, folder, model_config, data_vocab,
                                       training_conventions(data, layout), mesh)
        print(f"retrieval evaluation every {trainer.eval_every} steps: {evaluator.describe()}", file=sys.stderr)

    gin_parsing.check_bindings_used()  # every configurable of the run has been called by now

    # --- state, created sharded; step functions jitted once -----------------------------
    setup = build_step_functions(model_config, options, tx, schedule, loss_params, mesh, rules, trainer.seed)
    manager = native.step_manager(folder, max_to_keep=trainer.keep_checkpoints, async_save=trainer.async_checkpoints,
                                  writer=True)
    start = manager.latest_step()
    if jax.process_count() > 1:
        # Every host has now decided fresh start or resume; only then may host 0 create
        # model_config.json, which a slower host would otherwise take for a run to resume.
        multihost_utils.sync_global_devices("rankgen_jax: resume decided")
    if init_params is not None and start is None:
        init_params = checkpointing.complete_params(init_params, model_config, trainer.init_checkpoint, trainer.seed)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        if start is not None:
            start, state, data_start = checkpointing.resume(manager, folder, setup.abstract_state, setup.shardings)
            print(f"resuming from {folder.step(start)}", file=sys.stderr)
        else:
            start = data_start = 0
            state = setup.init()
            if init_params is not None:
                # Optimizer moments start at zero whatever the params, so the fresh opt_state stays valid.
                state = state.replace(params=partitioning.device_put_tree(init_params, setup.shardings.params))
            if jax.process_index() == 0:  # one writer on shared storage
                # A seqio task's tokenizer when the run starts from scratch: the model then reads text as it learned.
                native.save_model_config(folder, model_config, data_vocab)
                provenance = training_provenance(trainer)
                if provenance:
                    native.save_provenance(folder, provenance)
        if jax.process_index() == 0:
            # Every start records what it runs, so the records match the steps it trains.
            run_record.save_run_config(folder, record)
            folder.gin_config.write_text(gin.config_str())
            run_record.save_operative_config(folder, start, gin.operative_config_str())
        if jax.process_index() == 0 and native.load_input_conventions(folder) is None:
            # How the data read text is how the model reads it; a run from before this record gets it on resume.
            native.save_input_conventions(folder, training_conventions(data, layout))
        put = functools.partial(put_batch, sharding=setup.batch_sharding, batch_size=data.batch_size)
        feed = _BatchFeed(train_source, eval_source, put, data_start)
        return _loop(trainer, optimizer, folder, manager, setup, state, start, feed, stopping.StopVote(mesh),
                     evaluator)


def training_provenance(trainer: TrainerConfig) -> dict:
    """What a run started from, for model cards: the init checkpoint, and its license and model id when known."""
    if not trainer.init_checkpoint:
        return {}
    source = native.load_provenance(trainer.init_checkpoint)
    provenance = {"trained_from": str(trainer.init_checkpoint)}
    # The starting model is the trained one's base (when its hub id is known; for a fine-tuned start, the hub model
    # that one came from); its license carries over.
    base = source.get("model_id") or (source.get("base_model") if source.get("trained_from") else None)
    if base:
        provenance["base_model"] = base
    if source.get("license"):
        provenance["license"] = source["license"]
    return provenance


def _check_vocab_fits(data: DataConfig, source, model_config: ModelConfig) -> None:
    """Token ids the data can produce must exist in the model's embedding table."""
    if data.source.kind == "random":
        size = data.source.vocab_size
    else:  # text sources know their tokenizer; seqio sources their vocabulary
        size = getattr(getattr(source, "text", None), "size", None) or getattr(source, "vocab_size", None)
    if size is not None and size > model_config.encoder.vocab_size:
        raise RankgenError(
            f"the data's vocabulary has {size} ids but the model's embedding has {model_config.encoder.vocab_size} rows "
            f"({type(data.source).__name__}.vocab={data.source.tokenizer_path()!r}); use the model's own tokenizer"
        )


@dataclasses.dataclass(frozen=True)
class _BatchFeed:
    """The run's batches: its sources, how a batch goes onto the mesh (`put`), and the train source's index at the
    first step this process trains."""

    train_source: BatchSource
    eval_source: BatchSource | None
    put: Callable
    data_start: int


def _loop(trainer, optimizer: OptimizerConfig, workdir, manager, setup, state, start, feed: _BatchFeed,
          vote: stopping.StopVote, evaluator: RetrievalEvaluator | None = None):
    """Steps start..num_steps: log, evaluate and save on their schedules; stop early on SIGTERM or the time budget."""
    train_source, eval_source, put, data_start = feed.train_source, feed.eval_source, feed.put, feed.data_start
    step_fn, eval_fn = setup.train_step, setup.eval_step
    # Rows of steps after `start` that an earlier process wrote are of steps this one trains again: set aside.
    writer = MetricWriter(workdir.root, enabled=jax.process_index() == 0, restart_step=start + 1 if start else 0)
    writer.write_text(start, "gin_config", gin.config_str())
    preemption = stopping.Preemption()
    pending: list[tuple[int, dict]] = []
    last: dict = {}
    # With a time budget the bar counts steps with no total; its description gives steps per minute and the
    # budget's time left (_budget_description).
    by_time = trainer.max_minutes > 0
    bar = tqdm(total=None if by_time else trainer.num_steps, initial=start, unit="step", dynamic_ncols=True,
               desc=f"train (budget {trainer.max_minutes:g} min)" if by_time else "train",
               bar_format="{desc}{n_fmt} steps [{elapsed}{postfix}]" if by_time else None,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, disable=jax.process_index() != 0)
    if by_time and optimizer.schedule in DECAYING_SCHEDULES:
        print(f"note: the {optimizer.schedule} learning-rate schedule ends at step {optimizer.total_steps}; the time "
              "budget may stop the run before that, and does not shorten the schedule", file=sys.stderr)
    started = time.time()

    def evaluate(step: int) -> None:
        if eval_source is not None:
            writer.write_scalars(step, _evaluate(eval_fn, state, eval_source, put, trainer.eval_batches), prefix="eval/")
        if evaluator is not None:
            measured = evaluator.measure(state.params)
            writer.write_scalars(step, measured, prefix=RETRIEVAL_METRIC_PREFIX)
            evaluator.keep_if_best(step, measured, state.params)

    if trainer.eval_every and start == 0:
        # The starting point (e.g. a pretrained encoder zero-shot) is the first point of the eval curve.
        evaluate(0)
    try:
        batches = prefetch_batches(train_source, data_start, data_start + trainer.num_steps - start, put)
        for step, batch in zip(range(start, trainer.num_steps), batches):
            if step == trainer.profile_start_step:
                jax.profiler.start_trace(str(workdir.profile))
            state, metrics = step_fn(state, batch)
            if trainer.profile_start_step >= 0 and step == trainer.profile_start_step + trainer.profile_num_steps - 1:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
            pending.append((step + 1, metrics))
            done = step + 1
            local_out_of_time = trainer.max_minutes > 0 and time.time() - started > 60 * trainer.max_minutes
            # From here on only the agreed flags decide anything (see stopping.StopVote).
            flags = vote(np.array([preemption.requested, local_out_of_time], np.int32))
            sigterm, out_of_time = (bool(f) for f in flags)
            is_last = done == trainer.num_steps or out_of_time
            if done % trainer.log_every == 0 or is_last or sigterm:
                last = _flush_metrics(writer, pending, bar, time.time() - started)
                pending = []
                _stop_if_diverged(state, optimizer, manager, workdir, next_batch_index=data_start + done - start)
            if trainer.eval_every and (done % trainer.eval_every == 0 or is_last):
                evaluate(done)
            if done % trainer.checkpoint_every == 0 or is_last or sigterm:
                checkpointing.save(manager, state, next_batch_index=data_start + done - start)
            if by_time:
                bar.set_description(_budget_description(done - start, time.time() - started, trainer.max_minutes),
                                    refresh=False)
            bar.update(1)
            if sigterm:
                where = "" if preemption.requested else " on another host"
                print(f"SIGTERM{where}: saved step {done}; exiting", file=sys.stderr)
                # Callers that go on after training (the main job, a sweep) must know it did not finish.
                last["preempted"] = 1.0
                break
            if out_of_time:
                where = "" if local_out_of_time else " (by another host's clock)"
                unfinished = ""
                if optimizer.schedule in DECAYING_SCHEDULES and done < optimizer.total_steps and "learning_rate" in last:
                    unfinished = (f" (learning rate {last['learning_rate']:.3g}: the {optimizer.schedule} schedule "
                                  f"ends at step {optimizer.total_steps})")
                print(f"time budget of {trainer.max_minutes} minutes used{where}: saved step {done}{unfinished}",
                      file=sys.stderr)
                break
        if pending:
            last = _flush_metrics(writer, pending, bar, time.time() - started)
    finally:
        manager.wait_until_finished()
        manager.close()
        writer.close()
        bar.close()
        preemption.restore()
    last["seconds"] = time.time() - started
    last["steps"] = float(int(state.step))
    if evaluator is not None:
        last["retrieval_eval_seconds"] = evaluator.seconds
        share = evaluator.seconds / last["seconds"] if last["seconds"] > 0 else 0.0
        print(f"retrieval evaluation: {evaluator.evaluations} runs, {evaluator.seconds:.1f} s, {share:.1%} of the "
              "run's time", file=sys.stderr)
    return last


def _budget_description(steps: int, seconds: float, max_minutes: float) -> str:
    """A time-budgeted run's progress: steps per minute so far and the budget's time left."""
    left = max(0, int(60 * max_minutes - seconds))
    rate = 60 * steps / seconds if seconds > 0 else 0.0
    return f"train ({rate:.1f} steps/min, {left // 60}:{left % 60:02d} of {max_minutes:g} min left)"


def prefetch_batches(source, start: int, stop: int, put) -> Iterator:
    """Build and place batches on a background thread, two steps ahead of the device.

    An exception in the thread is re-raised here, so a data error stops the run
    with its message instead of leaving the loop waiting forever.
    """
    q: queue.Queue = queue.Queue(maxsize=2)
    rows = _local_rows(source.batch_size)
    done = object()

    def work():
        try:
            for index in range(start, stop):
                q.put(put(source.batch(index, rows)))
            q.put(done)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            q.put(e)

    threading.Thread(target=work, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


def _local_rows(batch_size: int) -> slice:
    """This host's rows of the global batch."""
    per_host = batch_size // jax.process_count()
    return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)


def _flush_metrics(writer: MetricWriter, pending: list, bar, elapsed_seconds: float) -> dict:
    """One host sync per log interval: fetch every pending step's metrics and write them. The interval's last
    step also gets `elapsed_seconds` since this process's loop began, counted as the time budget counts it, so that
    accuracy can be read against minutes of training."""
    fetched = jax.device_get([m for _, m in pending])
    scalars = {}
    for i, ((step, _), values) in enumerate(zip(pending, fetched)):
        scalars = {k: float(np.asarray(v)) for k, v in values.items()}
        if i == len(pending) - 1:
            scalars["elapsed_seconds"] = elapsed_seconds
        writer.write_scalars(step, scalars, prefix="train/")
    bar.set_postfix(step=pending[-1][0], loss=f"{scalars['loss']:.4f}", acc=f"{scalars.get('accuracy', float('nan')):.3f}")
    writer.flush()
    return scalars


_all_finite = jax.jit(lambda tree: jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)])))


def _stop_if_diverged(state: TrainState, optimizer: OptimizerConfig, manager, workdir: RunFolder,
                      next_batch_index: int) -> None:
    """After max_consecutive_nonfinite skipped steps in a row: save, then stop with a RankgenError.

    The guard skipped the streak's updates, so the parameters are those from
    before it, and the checkpoint saved now holds them: the message names it.
    If the parameters themselves are not finite (a finite but overflowing
    update before the streak) nothing is saved and the message says so.
    """
    consecutive, total = (int(x) for x in nonfinite_counts(state.opt_state))
    if consecutive < optimizer.max_consecutive_nonfinite:
        return
    step = int(state.step)
    first = step - consecutive + 1
    what = (f"training diverged: the last {consecutive} steps had NaN/Inf gradients (steps {first}-{step}; "
            f"{total} skipped in all)")
    if not bool(_all_finite(state.params)):
        saved = sorted(manager.all_steps())
        raise RankgenError(f"{what} and the parameters themselves are not finite, so nothing was saved; resume from "
                           f"an earlier checkpoint in {workdir.steps} (saved steps: {saved}) with a lower "
                           "learning rate")
    if step not in manager.all_steps():
        checkpointing.save(manager, state, next_batch_index)
    manager.wait_until_finished()
    raise RankgenError(f"{what}; their updates were skipped, so {workdir.step(step)} holds the parameters "
                       f"from before them (those of step {first - 1}): resume from it with a lower learning rate")


def _evaluate(eval_fn, state, source, put, num_batches: int) -> dict:
    results = [eval_fn(state, put(source.batch(i, _local_rows(source.batch_size)))) for i in range(num_batches)]
    fetched = jax.device_get(results)
    return {k: float(np.mean([r[k] for r in fetched])) for k in fetched[0]}
