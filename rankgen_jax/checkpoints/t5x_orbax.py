"""The Orbax format of T5X checkpoints: find the PyTree folder, list its `target` arrays, restore some as numpy.

T5X's Orbax checkpoint manager (t5x/checkpoints.py, `OrbaxCheckpointManagerInterface`)
is an `orbax.checkpoint.CheckpointManager` with `step_prefix='checkpoint'` and one
PyTree item named `state` (plus `dataset` when the input pipeline is saved), so a
step is laid out as

    <model_dir>/checkpoint_<step>/_CHECKPOINT_METADATA
    <model_dir>/checkpoint_<step>/state/_METADATA          the tree and each leaf's type
    <model_dir>/checkpoint_<step>/state/manifest.ocdbt, ocdbt.process_*/, d/   (OCDBT)
    <model_dir>/checkpoint_<step>/state/target.encoder.layers_0.mlp.wo.kernel/ (without OCDBT: one zarr per array)

and the tree is the train state's `state_dict()`: `{'target': params, 'state':
{'step', 'param_states'}}` (and `flax_mutables` when the model has any). Earlier
T5X releases wrote the same tree straight into `checkpoint_<step>/`, with
`_METADATA` (and a msgpack `checkpoint` file of aggregated values) beside it;
t5x's `checkpoint_utils.detect_checkpoint_type` tells the formats apart by that
`_METADATA` file, and so does `find_pytree_folder` here.

Only `target` is restored, and only the arrays asked for, as numpy arrays
(orbax's `RestoreArgs(restore_type=np.ndarray)`): nothing is put on a device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rankgen_jax.errors import RankgenError

METADATA_FILE = "_METADATA"  # orbax's PyTreeCheckpointHandler tree metadata
STATE_ITEM = "state"  # the item name t5x's checkpoint manager saves the train state under
TARGET = "target"  # the parameters inside the train state's state_dict()


def find_pytree_folder(has_file) -> str | None:
    """'' or 'state' (the PyTree folder relative to the checkpoint folder), or None if it is not Orbax.

    has_file(relative_path) says whether a file exists in the checkpoint folder.
    """
    for folder in ("", STATE_ITEM):
        if has_file(f"{folder}/{METADATA_FILE}" if folder else METADATA_FILE):
            return folder
    return None


class OrbaxTarget:
    """The `target` arrays of one Orbax PyTree folder: shapes from its metadata, values on request."""

    def __init__(self, folder: str, where: str):
        self.where = where
        self._folder = epath.Path(folder)
        self._handler = ocp.PyTreeCheckpointHandler()
        try:
            tree = self._handler.metadata(self._folder).tree
        except Exception as e:  # orbax raises ValueError, FileNotFoundError, json errors...
            raise RankgenError(f"{where}: cannot read the Orbax checkpoint metadata "
                               f"({type(e).__name__}: {_one_line(e)})") from None
        target = tree.get(TARGET) if isinstance(tree, dict) else None
        if not isinstance(target, dict) or not target:
            keys = ", ".join(map(str, tree)) if isinstance(tree, dict) else type(tree).__name__
            raise RankgenError(f"{where}: the Orbax checkpoint has no '{TARGET}' parameters "
                               f"(its tree holds: {keys}); T5X saves {{'{TARGET}': params, 'state': ...}}")
        self._metadata = _flatten_metadata(target, where)
        self.shapes = {name: tuple(meta.shape) for name, meta in self._metadata.items()}

    def read(self, names) -> dict[str, np.ndarray]:
        """{name: numpy array as stored} for `names` (slash-joined paths inside `target`)."""
        names = sorted(set(names))
        if not names:
            return {}
        item: dict = {}
        for name in names:
            node = item
            *parents, leaf = name.split("/")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = self._metadata[name]
        restore_args = _map_leaves(item, lambda _: ocp.RestoreArgs(restore_type=np.ndarray))
        try:
            restored = self._handler.restore(self._folder, args=ocp.args.PyTreeRestore(
                item={TARGET: item}, restore_args={TARGET: restore_args}, partial_restore=True))
        except Exception as e:  # tensorstore and orbax errors of many types
            raise RankgenError(f"{self.where}: cannot restore the Orbax checkpoint's parameters "
                               f"({type(e).__name__}: {_one_line(e)})") from None
        flat = _flatten_plain(restored[TARGET])
        missing = [name for name in names if name not in flat]
        if missing:
            raise RankgenError(f"{self.where}: the Orbax checkpoint did not restore {', '.join(missing)}")
        return {name: np.asarray(flat[name]) for name in names}


def _flatten_metadata(tree: dict, where: str, prefix: str = "") -> dict[str, Any]:
    """{'a/b/c': array metadata}; empty subtrees and None (e.g. unused optimizer slots) vanish."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten_metadata(value, where, name + "/"))
        elif value is None:
            continue
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            flat[name] = value
        else:
            raise RankgenError(f"{where}: {TARGET}/{name}: unexpected {type(value).__name__} "
                               f"in the checkpoint parameters (expected arrays)")
    return flat


def _flatten_plain(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten_plain(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _map_leaves(tree: dict, fn) -> dict:
    return {key: _map_leaves(value, fn) if isinstance(value, dict) else fn(value) for key, value in tree.items()}


def _one_line(error: Exception) -> str:
    """An orbax / tensorstore error on one line, cut short (they can echo whole specs)."""
    text = " ".join(str(error).split()) or "no message"
    return text if len(text) <= 300 else text[:300] + "..."

