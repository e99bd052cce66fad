"""Checkpoint policy of a training run: where its model comes from, and saving, restoring and resuming its steps.

The folder format (model_config.json, vocab/, Orbax steps, array digests) is
rankgen_jax.checkpoints.native's; this module decides what a run does with it:

- the model a run trains: a workdir's own config on resume, else an init
  checkpoint's (its encoder, or all of it; see `model_config_from_checkpoint`),
  else gin's;
- a step saves the params (the item `export-hf` reads), the rest of the state
  and the data position, with a digest of every array;
- resuming uses the newest step that restores intact: Orbax never lists an
  unfinished save, and a finished step that no longer restores (a file
  truncated or removed, an array that no longer matches its digest) is named,
  renamed `<step>.damaged` and the previous step is used (`resume`).
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import ModelConfig, T5Config
from rankgen_jax.models.factory import check_params_match, to_model_layout
from rankgen_jax.models.factory import init_params as random_params
from rankgen_jax.train.config import TrainerConfig
from rankgen_jax.train.state import TrainState

# --- the model a run trains -----------------------------------------------------------------

# Top-level parameter groups that belong to a head, not to the encoder.
HEAD_PARAMS = ("projection_layer", "perspective_projections", "score_head")


def _encoder_only(saved: ModelConfig, trainer: TrainerConfig, gin_model: ModelConfig) -> bool:
    """Whether only a checkpoint's encoder carries over (the head, kind and towers then come from gin)."""
    return saved.kind == "encoder" or trainer.init_encoder_only or gin_model.kind != saved.kind


# Encoder fields that change how an encoder runs, not what it computes: a gin binding of one applies to a
# checkpoint's encoder too.
RUNTIME_ENCODER_FIELDS = ("dropout_rate", "dtype", "remat", "scan_layers")


def model_config_from_checkpoint(saved: ModelConfig, trainer: TrainerConfig, gin_model: ModelConfig,
                                 gin_encoder_bindings: Sequence[str] = ()) -> ModelConfig:
    """The model config a run from a checkpoint trains, given the checkpoint's saved config (no weights read).

    The encoder is the checkpoint's, whatever its type: gin's encoder config
    counts only where gin_encoder_bindings (the gin config's bindings of the
    encoder, gin_parsing.encoder_bindings) name it. Bound runtime fields
    (RUNTIME_ENCODER_FIELDS) apply, then trainer.encoder_overrides; any other
    bound field must agree with the checkpoint (an include of the matching
    models/*.gin file does), else a RankgenError names the difference. The rest
    is the checkpoint's, or gin's when only the encoder carries over.
    """
    bound = {b.split(".", 1)[1] for b in gin_encoder_bindings if not b.startswith("ModelConfig.")}
    runtime = {f: getattr(gin_model.encoder, f) for f in RUNTIME_ENCODER_FIELDS if f in bound}
    if bound - set(RUNTIME_ENCODER_FIELDS) or "ModelConfig.encoder" in gin_encoder_bindings:
        _check_gin_encoder_agrees(saved.encoder, gin_model.encoder, trainer.init_checkpoint, gin_encoder_bindings,
                                  sizes=bool(bound - set(RUNTIME_ENCODER_FIELDS)))
    try:
        encoder = dataclasses.replace(saved.encoder, **runtime, **dict(trainer.encoder_overrides))
    except TypeError as e:
        raise RankgenError(f"TrainerConfig.encoder_overrides: {e}") from None
    if _encoder_only(saved, trainer, gin_model):
        return dataclasses.replace(gin_model, encoder=encoder)
    return dataclasses.replace(saved, encoder=encoder)


def _check_gin_encoder_agrees(saved, gin_encoder, checkpoint: str, bindings: Sequence[str], sizes: bool) -> None:
    """The gin config's encoder, which it binds, is of the checkpoint's type and, where it binds more than the
    type (`sizes`), describes the checkpoint's encoder (runtime fields aside)."""
    where = (f"TrainerConfig.init_checkpoint={checkpoint!r} holds a {_encoder_name(saved)}; the gin config binds "
             f"{', '.join(bindings)}")
    if type(saved) is not type(gin_encoder):
        raise RankgenError(f"{where}, which build a {_encoder_name(gin_encoder)}: remove those bindings (the "
                           "checkpoint's encoder is what trains)")
    differ = [f"{f.name}={getattr(gin_encoder, f.name)!r} where the checkpoint has {getattr(saved, f.name)!r}"
              for f in dataclasses.fields(saved) if sizes and f.name not in RUNTIME_ENCODER_FIELDS
              and getattr(saved, f.name) != getattr(gin_encoder, f.name)]
    if differ:
        raise RankgenError(f"{where}, which differ from it ({'; '.join(differ)}): remove those bindings or "
                           f"bind the checkpoint's values (the runtime fields {', '.join(RUNTIME_ENCODER_FIELDS)} "
                           "may differ; TrainerConfig.encoder_overrides changes a checkpoint's encoder)")


def _encoder_name(encoder) -> str:
    if isinstance(encoder, T5Config):
        return f"T5 encoder ({encoder.num_layers} layers, d_model {encoder.d_model})"
    return f"{encoder.variant} encoder ({encoder.num_layers} layers, d_model {encoder.d_model})"


def resolve_model_config(
    workdir: RunFolder, trainer: TrainerConfig, gin_model: ModelConfig, gin_encoder_bindings: Sequence[str] = ()
) -> tuple[ModelConfig, dict | None, str | None]:
    """(model config, initial params or None, vocab path or None): resume > init checkpoint > gin.

    gin_encoder_bindings: as model_config_from_checkpoint takes them.
    """
    if holds_run(workdir):
        return native.load_model_config(workdir), None, native.vocab_path(workdir)
    if not trainer.init_checkpoint:
        return gin_model, None, None
    saved, params = native.restore_params(trainer.init_checkpoint)
    config = model_config_from_checkpoint(saved, trainer, gin_model, gin_encoder_bindings)
    if _encoder_only(saved, trainer, gin_model):
        params = encoder_params(params, saved)
    return config, params, native.vocab_path(trainer.init_checkpoint)


def holds_run(workdir: RunFolder) -> bool:
    """Whether the workdir holds a run to resume: its model config and at least one saved step.

    A workdir whose run was killed before its first checkpoint trained nothing that could continue:
    it starts afresh with this start's settings.
    """
    return native.is_checkpoint_dir(workdir) and native.latest_step(workdir) is not None


def intended_model_config(trainer: TrainerConfig, gin_model: ModelConfig,
                          gin_encoder_bindings: Sequence[str] = ()) -> ModelConfig | None:
    """The model a fresh start with these settings would train (no weights read): init checkpoint > gin.

    None when the init checkpoint is no longer there (a resumed run does not need it).
    """
    if not trainer.init_checkpoint:
        return gin_model
    if not native.is_checkpoint_dir(trainer.init_checkpoint):
        return None
    return model_config_from_checkpoint(native.load_model_config(trainer.init_checkpoint), trainer, gin_model,
                                        gin_encoder_bindings)


def check_workdir(workdir: RunFolder) -> None:
    """A workdir is a folder (made if missing) that is empty or holds a training run, not another checkpoint."""
    if workdir.root.exists() and not workdir.root.is_dir():
        raise RankgenError(f"`workdir` {workdir}: is a file; a workdir is a folder (created when missing)",
                           names=("workdir",))
    trained_here = workdir.run_config.exists() or workdir.gin_config.exists()
    if native.is_checkpoint_dir(workdir) and native.latest_step(workdir) is not None and not trained_here:
        made_by = native.load_provenance(workdir).get("imported_from")
        what = f"a checkpoint imported from {made_by}" if made_by else "a checkpoint not written by `rankgen-jax train`"
        raise RankgenError(f"`workdir` {workdir}: is {what}, not a training run to resume; to train from it, pass "
                           f"`TrainerConfig.init_checkpoint`={workdir} and a new `workdir`",
                           names=("workdir", "TrainerConfig.init_checkpoint"))


def encoder_params(params: dict, saved: ModelConfig) -> dict:
    """A checkpoint's encoder weights without its head (the query tower's, for a two-tower checkpoint)."""
    if saved.kind == "dual_encoder" and not saved.shared_towers:
        params = params["query_tower"]
    return {k: v for k, v in params.items() if k not in HEAD_PARAMS}


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


def local_vocab(vocab: str | None) -> str | None:
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


# --- saving and resuming steps ----------------------------------------------------------------


def save(manager, state: TrainState, next_batch_index: int) -> None:
    """Params (the item `export-hf` reads), the rest of the state, and the data position with a digest of both."""
    rest = {"step": state.step, "loss_params": state.loss_params, "opt_state": state.opt_state, "rng": state.rng}
    digest = {"params": native.tree_digest(state.params), "train_state": native.tree_digest(rest)}
    manager.save(int(state.step), args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        train_state=ocp.args.StandardSave(rest),
        data=ocp.args.JsonSave({"next_batch_index": next_batch_index, "digest": digest}),
    ))


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


def resume(manager, workdir: RunFolder, abstract_state: TrainState, shardings: TrainState) -> tuple[int, TrainState, int]:
    """(step, state, index of the next batch) of the newest saved step that restores intact.

    A step that fails while an older one restores is damaged (both were saved
    by this run's config): its folder is renamed `<step>.damaged` (RunFolder.damaged_step), which Orbax
    does not list, so it is kept for inspection, never retried and never
    deleted. When no step restores, the config (another optimizer, a learned
    loss parameter) is a likelier cause than the files: nothing is renamed
    and the error says what each step's failure was.
    """
    failed: list[tuple[int, str]] = []
    for step in sorted(manager.all_steps(), reverse=True):
        where = workdir.step(step)
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
    raise RankgenError(f"no checkpoint in {workdir.steps} restores ({tried}); if the files are intact, the "
                       f"config may differ from the one that saved them (compare the gin config with "
                       f"{workdir.gin_config}, and {workdir.model_config} with the saved arrays)")


def _any_process(flag: bool) -> bool:
    """True when the flag is set on any host (all hosts must take the same branch around collectives)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.max(multihost_utils.process_allgather(np.array(flag, np.int32))))


def _set_aside(manager, workdir: RunFolder, steps: list[int], resumed: int) -> None:
    """Rename damaged step folders to `<step>.damaged` (host 0; every host then re-lists the steps)."""
    if not steps:
        return
    if jax.process_index() == 0:
        for step in steps:
            folder = workdir.step(step)
            target = workdir.damaged_step(step)
            n = 1
            while target.exists():  # an earlier run set aside the same step number
                target, n = workdir.damaged_step(step, n), n + 1
            try:
                folder.rename(target)
                moved = f"moved it to {target.name} (kept, not deleted)"
            except Exception as e:  # noqa: BLE001 - e.g. a bucket that cannot rename folders: warn and go on
                moved = f"could not move it aside ({native.describe_error(e)})"
            print(f"warning: {workdir.step(step)} is damaged; {moved}; resumed from step {resumed}",
                  file=sys.stderr)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("rankgen_jax: damaged steps set aside")
    manager.reload()
