"""The project's own checkpoint folder: model config, vocabulary, Orbax-saved state.

Layout of CKPT_DIR (the same that `rankgen-jax train` writes into its workdir):

    model_config.json        ModelConfig (encoder + head)
    vocab/                   the tokenizer, when known: spiece.model (T5) or
                             tokenizer.json and its companions (BERT family)
    checkpoints/<step>/      Orbax CheckpointManager steps; item `params` holds
                             the canonical (unscanned, T5X-named) parameters

CKPT_DIR may be a local folder or a bucket URL (gs://bucket/run): paths go
through etils.epath, as Orbax's do, and pathlib would turn "gs://b" into the
local folder "gs:/b". For gs:// epath reaches the bucket through tf.io.gfile
(importing TensorFlow on first use) or gcsfs; local paths stay plain files.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Sequence

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rankgen_jax.configs import ModelConfig
from rankgen_jax.errors import RankgenError

MODEL_CONFIG_FILE = "model_config.json"
VOCAB_DIR = "vocab"
# Files that make up a tokenizer; copied together so the folder is self-contained.
TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt")
STEPS_DIR = "checkpoints"


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local or remote (gs://, s3://...) path as an epath.Path; never a local folder named "gs:"."""
    return epath.Path(path)


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL such as gs://bucket/run, False for a local path."""
    return "://" in os.fspath(path)


def absolute(path: str | os.PathLike) -> epath.Path:
    """The path made absolute when local; a URL is absolute already (and epath's absolute() would mangle it)."""
    return as_path(path) if is_remote(path) else as_path(path).absolute()


def ensure_writable_dir(path: str | os.PathLike, overwrite: bool) -> epath.Path:
    """Create an output folder; refuse a non-empty one unless overwrite (then empty it)."""
    out = as_path(path)
    if out.exists() and not out.is_dir():
        raise RankgenError(f"{out}: exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise RankgenError(f"{out}: folder is not empty (pass --overwrite to replace its contents)")
        out.rmtree()
    out.mkdir(parents=True, exist_ok=True)
    return out


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    return (as_path(path) / MODEL_CONFIG_FILE).is_file()


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


def step_manager(path: str | os.PathLike, max_to_keep: int | None = None, async_save: bool = False) -> ocp.CheckpointManager:
    """Orbax manager over CKPT_DIR/checkpoints."""
    _check_bucket_support(path)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save)
    return ocp.CheckpointManager(absolute(path) / STEPS_DIR, options=options)


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
        return [str(p.parent / name) for name in TOKENIZER_FILES if name != "spiece.model" and (p.parent / name).is_file()]
    return [str(p)]


def save_model_config(path: str | os.PathLike, model_config: ModelConfig, vocab=None) -> None:
    """Write model_config.json and copy the tokenizer (see tokenizer_files) into vocab/."""
    ckpt = as_path(path)
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / MODEL_CONFIG_FILE).write_text(model_config.to_json() + "\n", encoding="utf-8")
    files = tokenizer_files(vocab)
    if files:
        (ckpt / VOCAB_DIR).mkdir(exist_ok=True)
    for file in files:
        # A spiece model keeps T5's conventional name whatever it was called.
        source = as_path(file)
        name = source.name if source.name in TOKENIZER_FILES else "spiece.model"
        # Bytes rather than shutil.copyfile: source and folder may be on different filesystems (local -> gs://).
        (ckpt / VOCAB_DIR / name).write_bytes(source.read_bytes())


def save_params(
    path: str | os.PathLike,
    model_config: ModelConfig,
    params: dict,
    step: int = 0,
    vocab=None,
    overwrite: bool = False,
) -> None:
    """Write a new checkpoint folder holding only parameters (what `import` produces)."""
    ckpt = ensure_writable_dir(path, overwrite)
    save_model_config(ckpt, model_config, vocab)
    manager = step_manager(ckpt)
    manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)))
    manager.wait_until_finished()
    manager.close()


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    ckpt = _require_checkpoint_dir(path)
    config_file = ckpt / MODEL_CONFIG_FILE
    return ModelConfig.from_json(config_file.read_text(encoding="utf-8"), where=str(config_file))


def vocab_path(path: str | os.PathLike) -> str | None:
    """The checkpoint's tokenizer folder (for load_text_encoder), or None when it has none."""
    folder = as_path(path) / VOCAB_DIR
    return str(folder) if folder.is_dir() and any(folder.iterdir()) else None


def spiece_path(path: str | os.PathLike) -> str | None:
    """The checkpoint's SentencePiece model, or None."""
    candidate = as_path(path) / VOCAB_DIR / "spiece.model"
    return str(candidate) if candidate.is_file() else None


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
    try:
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    except Exception as e:  # Orbax raises many types for damaged folders
        raise RankgenError(f"{ckpt}: cannot read step {step} ({type(e).__name__}: {e})") from None
    finally:
        manager.close()
    params = _to_numpy(restored.params)
    return model_config, params


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree)
