"""The project's own checkpoint folder: model config, vocabulary, Orbax-saved state.

Its layout, and every path in it, is `run_folder.RunFolder`'s.

Each step the trainer saves also holds, in its `data` item, a digest of every
array it saved (see `tree_digest`): Orbax stores arrays without checksums, so a
damaged file would otherwise restore silently as wrong numbers. Restoring
checks the digest when there is one (import-made checkpoints have none).

CKPT_DIR may be a local folder or a bucket URL (gs://bucket/run): paths go
through etils.epath, as Orbax's do, and pathlib would turn "gs://b" into the
local folder "gs:/b". For gs:// epath reaches the bucket through tf.io.gfile
(importing TensorFlow on first use) or gcsfs; local paths stay plain files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rankgen_jax.checkpoints.run_folder import (  # noqa: F401 - as_path, is_remote, resolve: used through this module
    MODEL_CONFIG_FILE,
    SPIECE_FILE,
    STEPS_DIR,
    VOCAB_DIR,
    RunFolder,
    as_path,
    is_remote,
    resolve,
)
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.errors import RankgenError

# Files that make up a tokenizer; copied together so the folder is self-contained.
TOKENIZER_FILES = (SPIECE_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt")


def ensure_writable_dir(path: str | os.PathLike, overwrite: bool) -> epath.Path:
    """Create an output folder; refuse a non-empty one unless overwrite (then empty it)."""
    out = as_path(path)
    if out.exists() and not out.is_dir():
        raise RankgenError(f"{out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise RankgenError(f"{out}: folder is not empty (pass `overwrite` to replace its contents)",
                               names=("overwrite",))
        out.rmtree()
    out.mkdir(parents=True, exist_ok=True)
    return out


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    return RunFolder.at(path).model_config.is_file()


def _require_checkpoint_dir(path: str | os.PathLike) -> epath.Path:
    ckpt = as_path(path)
    if not ckpt.exists():
        raise RankgenError(f"{ckpt}: no such checkpoint folder")
    if not is_checkpoint_dir(ckpt):
        raise RankgenError(
            f"{ckpt}: not a rankgen_jax checkpoint (no {MODEL_CONFIG_FILE}; "
            "create one with `rankgen-jax import` or `rankgen-jax train`)"
        )
    return ckpt


def step_manager(path: str | os.PathLike, max_to_keep: int | None = None, async_save: bool = False,
                 writer: bool = False) -> ocp.CheckpointManager:
    """Orbax manager over CKPT_DIR/checkpoints.

    writer=True (the one process family that saves steps here, i.e. the
    trainer): delete the temporary folders (`<step>.orbax-checkpoint-tmp`) of
    saves a killed run left unfinished. Readers must not: they would delete
    a running trainer's save in progress. Either way Orbax never lists an
    unfinished save as a step.
    """
    _check_bucket_support(path)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                           cleanup_tmp_directories=writer)
    return ocp.CheckpointManager(RunFolder.resolved(path).steps, options=options)


def _check_bucket_support(path: str | os.PathLike) -> None:
    """Orbax lists gs:// steps with google-cloud-storage (to detect hierarchical-namespace buckets): say so up front."""
    if not os.fspath(path).startswith("gs://"):
        return
    try:
        found = "google.cloud.storage" in sys.modules or importlib.util.find_spec("google.cloud.storage") is not None
    except ModuleNotFoundError:  # no google.cloud package at all
        found = False
    if not found:
        raise RankgenError(f"{path}: checkpoints on gs:// need the google-cloud-storage package, which Orbax uses "
                           "to list them (pip install google-cloud-storage)")


def tokenizer_files(vocab: str | os.PathLike | Sequence[str] | None) -> list[str]:
    """The tokenizer files a vocabulary spec stands for.

    A spiece.model is alone; a tokenizer.json brings the tokenizer files beside
    it; a folder gives every tokenizer file in it; a list is taken as is.
    """
    if vocab is None:
        return []
    if not isinstance(vocab, (str, os.PathLike)):
        return [str(v) for v in vocab]
    p = as_path(vocab)
    if p.is_dir():
        return [str(p / name) for name in TOKENIZER_FILES if (p / name).is_file()]
    if p.name == "tokenizer.json":
        return [str(p.parent / name) for name in TOKENIZER_FILES if name != SPIECE_FILE and (p.parent / name).is_file()]
    return [str(p)]


def save_model_config(path: str | os.PathLike, model_config: ModelConfig, vocab=None) -> None:
    """Write model_config.json and copy the tokenizer (see tokenizer_files) into vocab/."""
    folder = RunFolder.at(path)
    folder.root.mkdir(parents=True, exist_ok=True)
    folder.model_config.write_text(model_config.to_json() + "\n", encoding="utf-8")
    files = tokenizer_files(vocab)
    if files:
        folder.vocab.mkdir(exist_ok=True)
    for file in files:
        # A spiece model keeps T5's conventional name whatever it was called.
        source = as_path(file)
        name = source.name if source.name in TOKENIZER_FILES else SPIECE_FILE
        # Bytes rather than shutil.copyfile: source and folder may be on different filesystems (local -> gs://).
        (folder.vocab / name).write_bytes(source.read_bytes())


def save_input_conventions(path: str | os.PathLike, conventions: InputConventions) -> None:
    """Write input_conventions.json: how the model in this folder reads text."""
    RunFolder.at(path).input_conventions.write_text(conventions.to_json(), encoding="utf-8")


def load_input_conventions(path: str | os.PathLike) -> InputConventions | None:
    """The recorded input conventions of a checkpoint folder, or None when it has no record."""
    file = RunFolder.at(path).input_conventions
    if not file.is_file():
        return None
    return InputConventions.from_json(file.read_text(encoding="utf-8"), where=str(file))


def save_provenance(path: str | os.PathLike, provenance: dict) -> None:
    """Write provenance.json (license, base model, source folders; model cards read it)."""
    RunFolder.at(path).provenance.write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n",
                                             encoding="utf-8")


def load_provenance(path: str | os.PathLike) -> dict:
    """A checkpoint folder's provenance.json ({} when it has none)."""
    file = RunFolder.at(path).provenance
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RankgenError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RankgenError(f"{file}: expected a JSON object")
    return data


def save_params(
    path: str | os.PathLike,
    model_config: ModelConfig,
    params: dict,
    step: int = 0,
    vocab=None,
    overwrite: bool = False,
    conventions: InputConventions | None = None,
    provenance: dict | None = None,
) -> None:
    """Write a new checkpoint folder holding only parameters (what `import` produces).

    conventions / provenance, when given, are recorded beside the model.
    """
    ckpt = ensure_writable_dir(path, overwrite)
    save_model_config(ckpt, model_config, vocab)
    if conventions is not None:
        save_input_conventions(ckpt, conventions)
    if provenance:
        save_provenance(ckpt, provenance)
    manager = step_manager(ckpt)
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
    manager.wait_until_finished()
    manager.close()


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    config_file = RunFolder.at(_require_checkpoint_dir(path)).model_config
    return ModelConfig.from_json(config_file.read_text(encoding="utf-8"), where=str(config_file))


def vocab_path(path: str | os.PathLike) -> str | None:
    """The checkpoint's tokenizer folder (for load_text_encoder), or None when it has none."""
    folder = RunFolder.at(path).vocab
    return str(folder) if folder.is_dir() and any(folder.iterdir()) else None


def require_vocab_path(path: str | os.PathLike) -> str:
    """The checkpoint's tokenizer folder; a RankgenError when it has none."""
    vocab = vocab_path(path)
    if vocab is None:
        raise RankgenError(f"{path}: checkpoint has no tokenizer")
    return vocab


def spiece_path(path: str | os.PathLike) -> str | None:
    """The checkpoint's SentencePiece model, or None."""
    candidate = RunFolder.at(path).spiece_model
    return str(candidate) if candidate.is_file() else None


def latest_step(path: str | os.PathLike) -> int | None:
    """The newest saved step of a checkpoint folder (None when it has none)."""
    manager = step_manager(_require_checkpoint_dir(path))
    try:
        return manager.latest_step()
    finally:
        manager.close()


def operative_config_for_step(workdir: str | os.PathLike, step: int | None) -> epath.Path | None:
    """The operative config that trained `step`: the start with the greatest step below it (step 0: the first).

    Falls back to the single operative_config.gin of workdirs from before the per-start records; None
    when there is neither.
    """
    folder = RunFolder.at(workdir)
    starts = folder.operative_config_starts()
    if starts and step is not None:
        earlier = [s for s in starts if s < step] or [min(starts)]
        return starts[max(earlier)]
    latest = folder.operative_config
    return latest if latest.is_file() else None


def restore_params(path: str | os.PathLike, step: int | None = None) -> tuple[ModelConfig, dict]:
    """(model config, parameters as numpy arrays) of a step (default: the latest)."""
    ckpt = _require_checkpoint_dir(path)
    model_config = load_model_config(ckpt)
    manager = step_manager(ckpt)
    steps = manager.all_steps()
    if not steps:
        raise RankgenError(f"{ckpt}: checkpoint folder has no saved steps under {STEPS_DIR}/")
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise RankgenError(f"{ckpt}: no step {step} (saved steps: {sorted(steps)})")
    items = {"params": ocp.args.StandardRestore()}
    if RunFolder.at(ckpt).step_item(step, "data").is_dir():  # a trainer's step: the digest lives there
        items["data"] = ocp.args.JsonRestore()
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**items))
        params = _to_numpy(restored.params)
        digest = (restored.data or {}).get("digest", {}).get("params") if "data" in items else None
        if digest is not None:
            check_digest(params, digest)
    except Exception as e:  # Orbax raises many types for damaged folders
        raise RankgenError(f"{ckpt}: cannot read step {step} ({describe_error(e)})") from None
    finally:
        manager.close()
    return model_config, params


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)


def describe_error(e: BaseException) -> str:
    """`Type: first line` of an exception's root cause, for one-line messages.

    Orbax wraps tensorstore's errors (which name the array and file) in
    generic ones, and its messages run to pages.
    """
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "..."
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# --- array digests -------------------------------------------------------------------------
# One uint32 per array: sum over elements of mix(bits) * weight(flat index), mod 2^32.
# Integer sums wrap exactly whatever the order, so the digest of a sharded array does not
# depend on the sharding; the position weights make moved elements count, not just changed
# ones. The same code runs on numpy (host arrays) and jax.numpy (device arrays, jitted).

_DIGEST_SEEDS = (0x85EBCA6B, 0x27D4EB2F)


def _mix32(x, xp):
    """MurmurHash3's finaliser on uint32 values (wrapping arithmetic)."""
    x = x ^ (x >> xp.uint32(16))
    x = x * xp.uint32(0x85EBCA6B)
    x = x ^ (x >> xp.uint32(13))
    x = x * xp.uint32(0xC2B2AE35)
    return x ^ (x >> xp.uint32(16))


def _words(x, xp):
    """The array's bits as uint32 values, one per element (8-byte elements: two)."""
    size = x.dtype.itemsize
    if x.dtype == bool:
        return x.astype(xp.uint32)
    unsigned = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32}.get(size)
    if unsigned is None:
        if size != 8:
            raise RankgenError(f"cannot digest arrays of dtype {x.dtype}")
        unsigned = xp.uint32
    bits = x.view(unsigned) if xp is np else jax.lax.bitcast_convert_type(x, unsigned)
    return bits.astype(xp.uint32)


def _flat_index(shape, xp):
    """Row-major element index, as uint32, without reshaping (a reshape could regather a sharded array)."""
    index = xp.zeros(shape, xp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        iota = np.arange(shape[axis], dtype=np.uint32) if xp is np else jax.lax.iota(jnp.uint32, shape[axis])
        index = index + xp.uint32(stride % 2**32) * iota.reshape((-1,) + (1,) * (len(shape) - axis - 1))
        stride *= shape[axis]
    return index


def _leaf_digest(x, xp):
    words = _words(xp.asarray(x), xp)
    weights = _mix32(_flat_index(words.shape, xp) * xp.uint32(0x9E3779B9) + xp.uint32(_DIGEST_SEEDS[0]), xp)
    codes = _mix32(words ^ xp.uint32(_DIGEST_SEEDS[1]), xp)
    return xp.sum(codes * (weights | xp.uint32(1)), dtype=xp.uint32)


_device_digests = jax.jit(lambda tree: jax.tree_util.tree_map(lambda x: _leaf_digest(x, jnp), tree))


def tree_digest(tree) -> dict[str, int]:
    """{path: digest} of every array in a tree: jax arrays on their devices, numpy arrays on the host."""
    leaves = jax.tree_util.tree_leaves(tree)
    if leaves and all(isinstance(x, jax.Array) for x in leaves):
        values = jax.device_get(_device_digests(tree))
    else:
        with np.errstate(over="ignore"):
            values = jax.tree_util.tree_map(lambda x: _leaf_digest(np.asarray(x), np), tree)
    return {jax.tree_util.keystr(path): int(v) for path, v in jax.tree_util.tree_leaves_with_path(values)}


def check_digest(tree, expected: dict[str, int]) -> None:
    """Raise RankgenError when a tree's arrays are not the ones a digest was taken of."""
    got = tree_digest(tree)
    differ = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    if differ:
        raise RankgenError(f"{len(differ)} of {len(expected)} arrays differ from the digest saved with them "
                           f"(first: {differ[0]})")
