"""The training loop: data -> sharded train_step -> metrics, eval, checkpoints; resumable and preemption-safe.

Read top to bottom: configs, state set-up (resume / init checkpoint / random),
the loop. Everything model- or loss-specific lives in train_step and losses.

The workdir may be local or a bucket URL (gs://bucket/run), which every host of
a multi-host slice passes alike: paths go through etils.epath (native.as_path),
host 0 alone writes the config files and metrics, and Orbax coordinates the
checkpoint writes. The hosts also agree on when to stop (see _StopVote).

Faults: a run killed at any point (SIGKILL included, during an async checkpoint
write too) resumes from the newest checkpoint that restores intact. Orbax never
lists an unfinished save; a finished step that no longer restores (a file
truncated or removed, an array that no longer matches the digest saved with it)
is named, renamed `<step>.damaged` and the previous step is used (_resume).
Steps with NaN/Inf gradients are skipped and counted (metric
`train/nonfinite_skipped`); too many in a row stop the run with a checkpoint
of the parameters from before them (_stop_if_diverged).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from rankgen_jax.losses import registry as losses
from rankgen_jax.runtime import partitioning
from rankgen_jax.checkpoints import native
from rankgen_jax.models.configs import BertConfig, ModelConfig, T5Config
from rankgen_jax.data.sources import DataConfig, make_sources
from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.train.metric_writers import MetricWriter
from rankgen_jax.models.factory import abstract_variables, build_model, check_params_match, init_variables, to_model_layout
from rankgen_jax.models.factory import init_params as random_params
from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer, nonfinite_counts
from rankgen_jax.runtime.process import initialize_distributed
from rankgen_jax.train.state import TrainState, create_state, state_shardings
from rankgen_jax.train.step import StepOptions, eval_step, train_step


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Loop, mesh and gradient-mode settings.

    num_chunks > 1: GradCache over that many chunks; accum_steps > 1: gradient
    accumulation (losses without cross-example terms only).
    init_checkpoint: a rankgen_jax checkpoint (from `import`) to start from,
      local or on a bucket (gs://...);
      its encoder config is used as saved (dropout included) except for the
      fields in encoder_overrides (e.g. {'dropout_rate': 0.0, 'remat': True,
      'dtype': 'bfloat16'}); the gin ModelConfig supplies the head and towers
      when the checkpoint is a bare encoder, is of another kind than gin's
      (e.g. a ranker started from a retriever), or init_encoder_only is set.
    """

    num_steps: int = 100
    log_every: int = 10
    eval_every: int = 0
    eval_batches: int = 2
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    async_checkpoints: bool = True
    seed: int = 0
    init_checkpoint: str = ""
    init_encoder_only: bool = False
    encoder_overrides: dict = dataclasses.field(default_factory=dict)
    mesh_data: int = -1
    mesh_model: int = 1
    mesh_replica: int = 1
    axis_rules: str = "standard"
    num_chunks: int = 1
    accum_steps: int = 1
    profile_start_step: int = -1
    profile_num_steps: int = 3
    # Wall-clock budget: stop (and save) after this many minutes; 0 = no limit.
    max_minutes: float = 0.0
    # Multi-host slices: "auto" joins jax.distributed when the environment is one host of many.
    distributed: str = "auto"

    def __post_init__(self):
        check_field_types(self)
        for name in ("num_steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_batches",
                     "num_chunks", "accum_steps", "profile_num_steps"):
            if getattr(self, name) < 1:
                raise RankgenError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "max_minutes"):
            if getattr(self, name) < 0:
                raise RankgenError(f"TrainerConfig.{name} must be >= 0, got {getattr(self, name)}")
        known = {f.name for config in (T5Config, BertConfig) for f in dataclasses.fields(config)}
        unknown = sorted(set(self.encoder_overrides) - known)
        if unknown:
            raise RankgenError(f"TrainerConfig.encoder_overrides: unknown encoder field(s) {unknown}")


# Sources that tokenise text with DataConfig.vocab (the checkpoint's own tokenizer by default).
TEXT_SOURCES = ("books", "examples", "lists", "pairs")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Which loss, with its options (see rankgen_jax.losses.registry)."""

    name: str = "in_batch_softmax"
    logit_scale: float = 1.0
    learn_logit_scale: bool = False
    margin: float = 0.0
    mask_duplicates: bool = True
    # List and distillation losses (rankgen_jax.losses.listwise).
    temperature: float = 1.0
    t_squared: bool = False
    position_weighting: bool = False
    tau: float = 0.5

    def __post_init__(self):
        check_field_types(self)

    def options(self) -> dict:
        every = {k: v for k, v in dataclasses.asdict(self).items() if k != "name"}
        accepted = losses.loss_option_names(self.name)
        return {k: v for k, v in every.items() if k in accepted}


def check_divisible(batch_size: int, data_axis: int, trainer: TrainerConfig) -> None:
    """The global batch must split evenly over data-parallel devices (and GradCache chunks / microbatches)."""
    parts = data_axis * max(trainer.num_chunks, trainer.accum_steps)
    if batch_size % parts:
        what = f"data axis ({data_axis})"
        if parts != data_axis:
            what += f" x {'num_chunks' if trainer.num_chunks > 1 else 'accum_steps'} ({parts // data_axis})"
        raise RankgenError(f"batch size {batch_size} is not divisible by the {what}")


def _check_vocab_fits(data: DataConfig, source, model_config: ModelConfig) -> None:
    """Token ids the data can produce must exist in the model's embedding table."""
    if data.source == "random":
        size = data.vocab_size
    else:  # text sources know their tokenizer; seqio sources their vocabulary
        size = getattr(getattr(source, "text", None), "size", None) or getattr(source, "vocab_size", None)
    if size is not None and size > model_config.encoder.vocab_size:
        raise RankgenError(
            f"the data's vocabulary has {size} ids but the model's embedding has {model_config.encoder.vocab_size} rows "
            f"(DataConfig.vocab={data.vocab!r}); use the model's own tokenizer"
        )


def resolve_model_config(
    workdir: epath.Path, trainer: TrainerConfig, gin_model: ModelConfig
) -> tuple[ModelConfig, dict | None, str | None]:
    """(model config, initial params or None, vocab path or None): resume > init checkpoint > gin."""
    if native.is_checkpoint_dir(workdir):
        return native.load_model_config(workdir), None, native.vocab_path(workdir)
    if not trainer.init_checkpoint:
        return gin_model, None, None
    source_config, params = native.restore_params(trainer.init_checkpoint)
    try:
        encoder = dataclasses.replace(source_config.encoder, **dict(trainer.encoder_overrides))
    except TypeError as e:
        raise RankgenError(f"TrainerConfig.encoder_overrides: {e}") from None
    if source_config.kind == "encoder" or trainer.init_encoder_only or gin_model.kind != source_config.kind:
        # The head, kind and towers come from gin; only the encoder weights carry over.
        config = dataclasses.replace(gin_model, encoder=encoder)
        params = _encoder_params(params, source_config)
    else:
        config = dataclasses.replace(source_config, encoder=encoder)
    return config, params, native.vocab_path(trainer.init_checkpoint)


def _local_vocab(vocab: str | None) -> str | None:
    """A checkpoint's tokenizer folder, copied to a local temporary folder when it is on a bucket.

    The tokenizer libraries open local files only. Tokenizers may load lazily at any point of
    the run, so the copy is removed when the process exits, not before.
    """
    if vocab is None or not native.is_remote(vocab):
        return vocab
    local = Path(tempfile.mkdtemp(prefix="rankgen_vocab_"))
    atexit.register(shutil.rmtree, local, ignore_errors=True)
    for file in native.tokenizer_files(vocab):
        source = native.as_path(file)
        (local / source.name).write_bytes(source.read_bytes())
    return str(local)


# Top-level parameter groups that belong to a head, not to the encoder.
HEAD_PARAMS = ("projection_layer", "perspective_projections", "score_head")


def _encoder_params(params: dict, source_config: ModelConfig) -> dict:
    """A checkpoint's encoder weights without its head (the query tower's, for a two-tower checkpoint)."""
    if source_config.kind == "dual_encoder" and not source_config.shared_towers:
        params = params["query_tower"]
    return {k: v for k, v in params.items() if k not in HEAD_PARAMS}


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


def train(
    workdir: str,
    trainer: TrainerConfig | None = None,
    model_config: ModelConfig | None = None,
    data: DataConfig | None = None,
    loss: LossConfig | None = None,
    optimizer: OptimizerConfig | None = None,
) -> dict:
    """Train (or resume) in workdir; returns the last logged train metrics. Configs default to gin's."""
    trainer, model_config = trainer or TrainerConfig(), model_config or ModelConfig()
    data, loss, optimizer = data or DataConfig(), loss or LossConfig(), optimizer or OptimizerConfig()
    workdir_path = native.as_path(workdir)  # "gs://b/run" stays a URL (pathlib would make it "gs:/b/run")

    # --- mesh and static step settings -------------------------------------------------
    initialize_distributed(trainer.distributed)
    mesh = partitioning.make_mesh(trainer.mesh_data, trainer.mesh_model, replica=trainer.mesh_replica)
    rules = partitioning.rules_by_name(trainer.axis_rules)
    check_divisible(data.batch_size, partitioning.data_parallel_size(mesh), trainer)
    model_config, init_params, vocab = resolve_model_config(workdir_path, trainer, model_config)
    vocab = _local_vocab(vocab)
    if model_config.kind == "encoder":
        raise RankgenError("ModelConfig.kind='encoder' has no head to train: use dual_encoder or cross_encoder")
    if model_config.kind == "cross_encoder" and data.source not in ("lists", "pairs"):
        raise RankgenError(f"a cross encoder trains on candidate lists or pairs (DataConfig.source 'lists' or "
                           f"'pairs'), not {data.source!r}")
    options = StepOptions(loss.name, tuple(sorted(loss.options().items())), trainer.num_chunks, trainer.accum_steps,
                          model_kind=model_config.kind)
    tx, schedule = make_optimizer(optimizer)
    loss_params = losses.init_loss_params(loss.name, **loss.options())
    if vocab and data.source in TEXT_SOURCES and data.vocab == DataConfig().vocab:
        data = dataclasses.replace(data, vocab=vocab)  # tokenise with the checkpoint's own tokenizer
    train_source, eval_source = make_sources(data, model_config.kind, loss.name)
    _check_vocab_fits(data, train_source, model_config)

    # --- state, created sharded; step functions jitted once -----------------------------
    setup = build_step_functions(model_config, options, tx, schedule, loss_params, mesh, rules, trainer.seed)
    manager = native.step_manager(workdir_path, max_to_keep=trainer.keep_checkpoints, async_save=trainer.async_checkpoints,
                                  writer=True)
    start = manager.latest_step()
    if jax.process_count() > 1:
        # Every host has now decided fresh start or resume; only then may host 0 create
        # model_config.json, which a slower host would otherwise take for a run to resume.
        multihost_utils.sync_global_devices("rankgen_jax: resume decided")
    if init_params is not None and start is None:
        init_params = complete_params(init_params, model_config, trainer.init_checkpoint, trainer.seed)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        if start is not None:
            start, state, data_start = _resume(manager, workdir, setup.abstract_state, setup.shardings)
            print(f"resuming from {workdir}/checkpoints/{start}", file=sys.stderr)
        else:
            start = data_start = 0
            state = setup.init()
            if init_params is not None:
                # Optimizer moments start at zero whatever the params, so the fresh opt_state stays valid.
                state = state.replace(params=partitioning.device_put_tree(init_params, setup.shardings.params))
            if jax.process_index() == 0:  # one writer on shared storage
                native.save_model_config(workdir_path, model_config,
                                         data.vocab if data.source in TEXT_SOURCES else vocab)
                (workdir_path / "config.gin").write_text(gin.config_str())
        put = functools.partial(put_batch, sharding=setup.batch_sharding, batch_size=data.batch_size)
        return _loop(trainer, workdir_path, state, start, data_start, train_source, eval_source, put,
                     setup.train_step, setup.eval_step, manager, optimizer, _StopVote(mesh))


@dataclasses.dataclass(frozen=True)
class StepFunctions:
    """What the loop needs: a sharded init, the jitted steps, and the shardings they use."""

    init: Callable[[], TrainState]
    train_step: Callable
    eval_step: Callable
    abstract_state: TrainState
    shardings: TrainState
    batch_sharding: NamedSharding


def build_step_functions(
    model_config: ModelConfig, options: StepOptions, tx, schedule, loss_params: dict, mesh, rules, seed: int
) -> StepFunctions:
    """Jit train_step / eval_step once for this mesh, with explicit shardings and a donated state.

    Call the returned functions under `jax.set_mesh(mesh)` and the logical axis rules.
    """
    model = build_model(model_config)
    param_specs = nn.get_partition_spec(abstract_variables(model_config))["params"]

    def random_state():
        params = nn.unbox(init_variables(model_config, jax.random.PRNGKey(seed)))["params"]
        return create_state(params, loss_params, tx, seed)

    abstract_state, shardings = state_shardings(random_state, param_specs, mesh, rules)
    batch_sharding = partitioning.batch_sharding(mesh)
    step = jax.jit(
        functools.partial(_counted_train_step, model=model, options=options, tx=tx, schedule=schedule,
                          use_dropout=model_config.encoder.dropout_rate > 0),
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, partitioning.replicated(mesh)),
        donate_argnums=(0,),
    )
    evaluate = jax.jit(
        functools.partial(eval_step, model=model, options=options),
        in_shardings=(shardings, batch_sharding),
        out_shardings=partitioning.replicated(mesh),
    )
    return StepFunctions(jax.jit(random_state, out_shardings=shardings), step, evaluate, abstract_state, shardings,
                         batch_sharding)


def _counted_train_step(state: TrainState, batch: dict, **static) -> tuple[TrainState, dict]:
    """train_step, its metrics joined by `nonfinite_skipped`: steps skipped so far for NaN/Inf gradients."""
    state, metrics = train_step(state, batch, **static)
    _, total = nonfinite_counts(state.opt_state)
    return state, {**metrics, "nonfinite_skipped": total}


def put_batch(local: dict, sharding: NamedSharding, batch_size: int) -> dict:
    """Global arrays from this host's rows (one host: the whole batch)."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (batch_size,) + v.shape[1:]) for k, v in local.items()
    }


def _restore(manager, step: int, abstract_state: TrainState, shardings: TrainState) -> tuple[TrainState, int]:
    """(state, index of the next batch) of a saved step, restored straight into its shardings.

    Raises when the step does not restore, or its arrays differ from the digest saved with them.
    """
    target = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
    )
    rest = {"step": target.step, "loss_params": target.loss_params, "opt_state": target.opt_state, "rng": target.rng}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target.params),
            train_state=ocp.args.StandardRestore(rest),
            data=ocp.args.JsonRestore(),
        ),
    )
    digest = restored.data.get("digest")
    if digest is not None:  # steps saved before digests existed have none
        native.check_digest(restored.params, digest["params"])
        native.check_digest(restored.train_state, digest["train_state"])
    return TrainState(params=restored.params, **restored.train_state), int(restored.data["next_batch_index"])


DAMAGED_SUFFIX = ".damaged"


def _resume(manager, workdir: str, abstract_state: TrainState, shardings: TrainState) -> tuple[int, TrainState, int]:
    """(step, state, index of the next batch) of the newest saved step that restores intact.

    A step that fails while an older one restores is damaged (both were saved
    by this run's config): its folder is renamed `<step>.damaged`, which Orbax
    does not list, so it is kept for inspection, never retried and never
    deleted. When no step restores, the config (another optimizer, a learned
    loss parameter) is a likelier cause than the files: nothing is renamed
    and the error says what each step's failure was.
    """
    failed: list[tuple[int, str]] = []
    for step in sorted(manager.all_steps(), reverse=True):
        where = f"{workdir}/checkpoints/{step}"
        try:
            error = None
            state, data_start = _restore(manager, step, abstract_state, shardings)
        except Exception as e:  # noqa: BLE001 - Orbax and tensorstore raise many types for damaged folders
            error = native.describe_error(e)
        if _any_process(error is not None):
            error = error or "failed on another host"
            failed.append((step, error))
            print(f"warning: cannot restore {where} ({error}); trying the previous checkpoint", file=sys.stderr)
            continue
        _set_aside(manager, workdir, [s for s, _ in failed], resumed=step)
        return step, state, data_start
    tried = "; ".join(f"step {s}: {e}" for s, e in failed)
    raise RankgenError(f"no checkpoint in {workdir}/checkpoints restores ({tried}); if the files are intact, the "
                       f"config may differ from the one that saved them (compare the gin config with {workdir}/config.gin, "
                       f"and {workdir}/{native.MODEL_CONFIG_FILE} with the saved arrays)")


def _any_process(flag: bool) -> bool:
    """True when the flag is set on any host (all hosts must take the same branch around collectives)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.max(multihost_utils.process_allgather(np.array(flag, np.int32))))


def _set_aside(manager, workdir: str, steps: list[int], resumed: int) -> None:
    """Rename damaged step folders to `<step>.damaged` (host 0; every host then re-lists the steps)."""
    if not steps:
        return
    if jax.process_index() == 0:
        for step in steps:
            folder = manager.directory / str(step)
            target = manager.directory / f"{step}{DAMAGED_SUFFIX}"
            n = 1
            while target.exists():  # an earlier run set aside the same step number
                target, n = manager.directory / f"{step}{DAMAGED_SUFFIX}.{n}", n + 1
            try:
                folder.rename(target)
                moved = f"moved it to {target.name} (kept, not deleted)"
            except Exception as e:  # noqa: BLE001 - e.g. a bucket that cannot rename folders: warn and go on
                moved = f"could not move it aside ({native.describe_error(e)})"
            print(f"warning: {workdir}/checkpoints/{step} is damaged; {moved}; resumed from step {resumed}",
                  file=sys.stderr)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("rankgen_jax: damaged steps set aside")
    manager.reload()


def complete_params(params: dict, model_config: ModelConfig, where: str, seed: int) -> dict:
    """A checkpoint's params in the model's layout.

    A missing head projection starts from random init; a single encoder
    starts both towers of a two-tower model.
    """
    params = to_model_layout(params, model_config)
    single = dataclasses.replace(model_config, shared_towers=True)
    if "query_tower" not in params:
        missing = [k for k in HEAD_PARAMS if k not in params]
        fresh = {k: v for k, v in random_params(single, seed).items() if k in missing}
        if fresh:
            print(f"note: {where} has no {', '.join(sorted(fresh))}; starting from random init", file=sys.stderr)
            params = {**params, **fresh}
    if not model_config.shared_towers and "query_tower" not in params:
        params = {"query_tower": params, "document_tower": params}
    check_params_match(params, model_config, where)
    return params


def _save(manager, state: TrainState, next_batch_index: int) -> None:
    """Params (the item `export-hf` reads), the rest of the state, and the data position with a digest of both."""
    rest = {"step": state.step, "loss_params": state.loss_params, "opt_state": state.opt_state, "rng": state.rng}
    digest = {"params": native.tree_digest(state.params), "train_state": native.tree_digest(rest)}
    manager.save(int(state.step), args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        train_state=ocp.args.StandardSave(rest),
        data=ocp.args.JsonSave({"next_batch_index": next_batch_index, "digest": digest}),
    ))


_all_finite = jax.jit(lambda tree: jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)])))


def _stop_if_diverged(state: TrainState, optimizer: OptimizerConfig, manager, workdir, next_batch_index: int) -> None:
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
                           f"an earlier checkpoint in {workdir}/checkpoints (saved steps: {saved}) with a lower "
                           "learning rate")
    if step not in manager.all_steps():
        _save(manager, state, next_batch_index)
    manager.wait_until_finished()
    raise RankgenError(f"{what}; their updates were skipped, so {workdir}/checkpoints/{step} holds the parameters "
                       f"from before them (those of step {first - 1}): resume from it with a lower learning rate")


class _Preemption:
    """SIGTERM sets a flag; the loop saves and exits cleanly at the next step boundary."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


# Why the hosts vote: SIGTERM and the wall-clock budget are noticed by each host on its
# own, at different steps. A host that saved and left the loop after step N while the
# others ran step N+1 would leave every collective of step N+1 (and Orbax's save
# barriers) waiting forever. So every host acts on the same flags: the max over all
# processes of each host's (sigterm, out_of_time). jax's preemption sync point
# (multihost_utils.reached_preemption_sync_point) would cover SIGTERM alone, through
# its own signal handler; one vote covers both flags and our handler.


@functools.lru_cache(maxsize=None)
def _vote_functions(mesh) -> tuple[NamedSharding, Callable]:
    """The sharding of the vote (one row per device) and the jitted max over rows, replicated."""
    rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    return rows, jax.jit(functools.partial(jnp.max, axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))


def _max_over_processes(flags: np.ndarray, mesh) -> jax.Array:
    """Elementwise max of every process's flags, dispatched without waiting; read it with np.asarray."""
    rows, reduce_max = _vote_functions(mesh)
    # Each device holds one row, its own host's flags, so the max over rows spans all hosts.
    votes = jax.make_array_from_callback((mesh.size,) + flags.shape, rows, lambda index: flags[None])
    return reduce_max(votes)


class _StopVote:
    """The stop flags all hosts act on at a step boundary.

    One process: the local flags, at once and without any device sync (the
    single-host loop is as before). Several: each boundary dispatches a tiny
    max-reduction of this boundary's local flags over all devices and returns
    the previous boundary's result. Reading the previous vote waits only for
    the previous step, so dispatch stays a step ahead of the device; and as
    every host reads the same vote at the same boundary, all of them stop
    after the same step (one step after the first host raised a flag), save
    that same checkpoint, and leave the loop together.
    """

    def __init__(self, mesh, processes: int | None = None):
        self.voting = (jax.process_count() if processes is None else processes) > 1
        self._mesh = mesh
        self._pending: jax.Array | None = None

    def __call__(self, local: np.ndarray) -> np.ndarray:
        if not self.voting:
            return local
        previous, self._pending = self._pending, _max_over_processes(local, self._mesh)
        return np.zeros_like(local) if previous is None else np.asarray(previous)


def _loop(trainer, workdir, state, start, data_start, train_source, eval_source, put, step_fn, eval_fn, manager,
          optimizer: OptimizerConfig, vote: _StopVote):
    writer = MetricWriter(str(workdir), enabled=jax.process_index() == 0)
    writer.write_text(start, "gin_config", gin.config_str())
    preemption = _Preemption()
    pending: list[tuple[int, dict]] = []
    last: dict = {}
    # With a time budget the bar counts seconds, so its ETA is the budget's end.
    by_time = trainer.max_minutes > 0
    bar = tqdm(total=int(60 * trainer.max_minutes) if by_time else trainer.num_steps, initial=0 if by_time else start,
               desc=f"train (budget {trainer.max_minutes:g} min)" if by_time else "train",
               unit="s" if by_time else "step", dynamic_ncols=True,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, disable=jax.process_index() != 0)
    started = time.time()
    if trainer.eval_every and start == 0:
        # The starting point (e.g. a pretrained encoder zero-shot) is the first point of the eval curve.
        writer.write_scalars(0, _evaluate(eval_fn, state, eval_source, put, trainer.eval_batches), prefix="eval/")
    try:
        batches = prefetch_batches(train_source, data_start, data_start + trainer.num_steps - start, put)
        for step, batch in zip(range(start, trainer.num_steps), batches):
            if step == trainer.profile_start_step:
                jax.profiler.start_trace(str(workdir / "profile"))
            state, metrics = step_fn(state, batch)
            if trainer.profile_start_step >= 0 and step == trainer.profile_start_step + trainer.profile_num_steps - 1:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
            pending.append((step + 1, metrics))
            done = step + 1
            local_out_of_time = trainer.max_minutes > 0 and time.time() - started > 60 * trainer.max_minutes
            # From here on only the agreed flags decide anything (see _StopVote).
            flags = vote(np.array([preemption.requested, local_out_of_time], np.int32))
            sigterm, out_of_time = (bool(f) for f in flags)
            is_last = done == trainer.num_steps or out_of_time
            if done % trainer.log_every == 0 or is_last or sigterm:
                last = _flush_metrics(writer, pending, bar)
                pending = []
                _stop_if_diverged(state, optimizer, manager, workdir, next_batch_index=data_start + done - start)
            if trainer.eval_every and (done % trainer.eval_every == 0 or is_last):
                writer.write_scalars(done, _evaluate(eval_fn, state, eval_source, put, trainer.eval_batches), prefix="eval/")
            if done % trainer.checkpoint_every == 0 or is_last or sigterm:
                _save(manager, state, next_batch_index=data_start + done - start)
            bar.update(min(int(time.time() - started), bar.total) - bar.n if by_time else 1)
            if sigterm:
                where = "" if preemption.requested else " on another host"
                print(f"SIGTERM{where}: saved step {done}; exiting", file=sys.stderr)
                break
            if out_of_time:
                where = "" if local_out_of_time else " (by another host's clock)"
                print(f"time budget of {trainer.max_minutes} minutes used{where}: saved step {done}", file=sys.stderr)
                break
        if pending:
            last = _flush_metrics(writer, pending, bar)
    finally:
        manager.wait_until_finished()
        manager.close()
        writer.close()
        bar.close()
        preemption.restore()
    if jax.process_index() == 0 and not (workdir / "operative_config.gin").exists():
        (workdir / "operative_config.gin").write_text(gin.operative_config_str())
    last["seconds"] = time.time() - started
    last["steps"] = float(int(state.step))
    return last


def _flush_metrics(writer: MetricWriter, pending: list, bar) -> dict:
    """One host sync per log interval: fetch every pending step's metrics and write them."""
    fetched = jax.device_get([m for _, m in pending])
    scalars = {}
    for (step, _), values in zip(pending, fetched):
        scalars = {k: float(np.asarray(v)) for k, v in values.items()}
        writer.write_scalars(step, scalars, prefix="train/")
    bar.set_postfix(step=pending[-1][0], loss=f"{scalars['loss']:.4f}", acc=f"{scalars.get('accuracy', float('nan')):.3f}")
    writer.flush()
    return scalars


def _evaluate(eval_fn, state, source, put, num_batches: int) -> dict:
    results = [eval_fn(state, put(source.batch(i, _local_rows(source.batch_size)))) for i in range(num_batches)]
    fetched = jax.device_get(results)
    return {k: float(np.mean([r[k] for r in fetched])) for k in fetched[0]}
