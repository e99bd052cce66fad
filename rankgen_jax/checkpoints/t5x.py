"""Read T5X checkpoints, in either of T5X's formats and layer layouts, into our canonical encoder tree.

Formats, told apart by what the folder holds (as t5x's own
`checkpoint_utils.detect_checkpoint_type` does: a `_METADATA` file means Orbax):

- Orbax, what T5X writes with `use_orbax=True` (`t5x_orbax.py` has the
  layout): a PyTree written by orbax's `PyTreeCheckpointHandler`, in
  `checkpoint_<step>/state/` or, from earlier T5X releases, in
  `checkpoint_<step>/` itself. Read with orbax.
- msgpack + zarr, checkpoint format versions 2 and 3, T5X's original one: a
  folder (`.../checkpoint_<step>/`) holding
  - `checkpoint`: a msgpack file (flax.serialization encoding) with
    `{'version': 2|3, 'optimizer': {'target': params, 'state': ...}}`.
    Small arrays of `target` are stored inline as numpy arrays; large ones are
    replaced by a TensorStore spec dict.
  - one zarr (v2) folder per large array, named by the dotted parameter path,
    e.g. `target.encoder.layers_0.attention.key.kernel/`.

Spec spellings seen in the wild (all handled here):

- version 2 (e.g. the t5x_retrieval test checkpoint):
  `{'driver': 'zarr', 'kvstore': {'driver': 'gfile', 'path': 'target.x.y'},
    'metadata': {'chunks', 'compressor', 'dtype': '<f4', 'shape'}}`.
  bfloat16 parameters were written as their raw bits with dtype `uint16`
  (`'<u2'`), because TensorStore had no bfloat16 then.
- version 3 (T5X since 2021-06): the same, plus a top-level `'dtype'`, a
  kvstore driver `file` (local) or `gcs` (with the placeholder bucket
  `t5x-dummy-bucket`), and bfloat16 stored natively (zarr dtype `bfloat16`).
- older TensorStore spellings put the relative path at the top level
  (`'path': 'target.x.y'`, kvstore without a path); newer ones may end the
  kvstore path with `/`.

The relative path is always resolved against the folder the checkpoint is
read from, and the kvstore driver is chosen by that folder (local -> `file`,
`gs://bucket/prefix` -> `gcs` with that bucket), whatever the spec says: T5X
does the same, which is what makes its checkpoints movable between disks and
buckets. The `checkpoint` file itself is read through a TensorStore kvstore
too, so local folders and `gs://` share one code path. Reading `gs://` needs
network access and credentials that TensorStore's gcs driver can find (e.g.
Application Default Credentials); only local folders are covered by tests.

Layer layouts, in either format:

- unscanned: `encoder/layers_{i}/...`, the canonical layout.
- scanned (`scan_layers=True`): each layer parameter once, stacked along a
  layer axis, under `encoder/layers/...` (t5x's scalable_t5 model, axis
  `param_scan_axis`, default 1; rankgen_jax's own scan layout, axis 0) or
  `encoder/encoder/...` (flaxformer's scanned `Encoder`, axis `scan_axis`,
  default 1). The checkpoint does not record the axis: it is the one along
  which every unstacked shape fits one T5 encoder; when several axes fit
  (only possible if d_model, d_ff, heads * d_kv and the layer count coincide)
  the caller must name it (`scan_axis`). Layers are unstacked into
  `encoder/layers_{i}`.

t5x's scalable_t5 keeps attention kernels 3-D, `[embed, heads, kv]` and
`[heads, kv, embed]`; they are read as `[embed, heads * kv]` and
`[heads * kv, embed]` (the same row-major order as the 2-D kernels of t5x's
other models and flaxformer). Scanned models, and scalable_t5 always, have a
relative position bias per layer (`relative_posemb` in scalable_t5,
`relpos_bias` in flaxformer); the encoder here has one bias shared by every
layer, as T5 and T5 1.1 do, so such a checkpoint is read only when all the
layers' biases are equal, and refused (naming the layers) otherwise. Any
other encoder parameter the canonical tree has no place for is refused too,
rather than dropped.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from typing import Any, Callable

import numpy as np
from flax import serialization
from flax.traverse_util import unflatten_dict
import tensorstore as ts

from rankgen_jax.checkpoints import t5x_orbax
from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config
from rankgen_jax.errors import RankgenError

SUPPORTED_VERSIONS = (2, 3)
CHECKPOINT_FILE = "checkpoint"
FORMATS = ("Orbax (a `_METADATA` file in the folder or in its `state/` subfolder) or msgpack + zarr "
           "(a `checkpoint` file, format versions 2 and 3)")
PROJECTION = "projection_layer/kernel"
# RankGen's own T5X runs put the projection inside the encoder module.
RANKGEN_PROJECTION = "encoder/encoder_projection_layer/kernel"
SHARED_RELPOS = "encoder/relpos_bias/rel_embedding"
_BFLOAT16 = np.dtype(ts.bfloat16.numpy_dtype)

# Every parameter of the canonical tree.
_CANONICAL = re.compile(
    r"token_embedder/embedding"
    r"|encoder/relpos_bias/rel_embedding"
    r"|encoder/encoder_norm/scale"
    r"|encoder/layers_\d+/(pre_attention_layer_norm|pre_mlp_layer_norm)/scale"
    r"|encoder/layers_\d+/attention/(query|key|value|out)/kernel"
    r"|encoder/layers_\d+/mlp/(wi|wi_0|wi_1|wo)/kernel"
    r"|projection_layer/kernel")
_LAYER = re.compile(r"encoder/layers_(\d+)/")
# The arrays an encoder import looks at; the rest of a target (decoder, logits_dense) is not read.
_ENCODER_SIDE = ("encoder/", "token_embedder/", "projection_layer/")
# Where scanned encoders keep their stacked layers: t5x's scalable_t5 (and rankgen_jax), flaxformer.
_SCANNED_ROOTS = ("encoder/layers/", "encoder/encoder/")
# A relative position bias inside each layer: scalable_t5's name, flaxformer's.
_PER_LAYER_RELPOS = re.compile(r"encoder/layers_(\d+)/(relative_posemb|relpos_bias)/rel_embedding")
_ATTENTION_IN = tuple(f"/attention/{name}/kernel" for name in ("query", "key", "value"))
_ATTENTION_OUT = "/attention/out/kernel"


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def read_t5x_target(path: str) -> dict:
    """Nested dict of float32 numpy arrays: the parameter (`target`) tree of a T5X checkpoint, either format.

    `path` is a checkpoint folder (or its `checkpoint` file), local or
    `gs://bucket/path`. Every array of the target is read under its stored name,
    decoder included and scanned layers still stacked; use `load_t5x_checkpoint`
    to read only the encoder.
    """
    store = _open_store(path, keep=None)
    raw = store.read(store.shapes)
    return unflatten_dict({name: _to_float32(array, name, store.where) for name, array in raw.items()},
                          sep="/")


def infer_t5_config(params: dict, relpos_max_distance: int = 128, where: str = "",
                    scan_axis: int | None = None) -> T5Config:
    """T5Config from the array shapes of a T5X-named parameter tree (unscanned or scanned).

    vocab and d_model from token_embedder/embedding, num_layers from the count
    of encoder/layers_{i}, num_heads and buckets from
    encoder/relpos_bias/rel_embedding [heads, buckets], d_kv = query kernel
    columns / heads, d_ff and mlp_activation ('gated-gelu' if mlp/wi_0 exists,
    'relu' if mlp/wi) from the MLP kernels of layer 0. `where` prefixes error
    messages (e.g. the checkpoint path).
    """
    shapes = {name: tuple(np.shape(leaf)) for name, leaf in _flatten(params).items()}
    return _infer_config(_shapes_of(_layout(shapes, where, scan_axis)), relpos_max_distance, where)


def load_t5x_checkpoint(path: str, head: HeadConfig | None = RANKGEN_HEAD,
                        relpos_max_distance: int = 128,
                        scan_axis: int | None = None) -> tuple[ModelConfig, dict]:
    """Read a T5X checkpoint (Orbax or msgpack + zarr) as (ModelConfig, canonical float32 parameter tree).

    Only encoder parameters (and the dual-encoder projection) are read: the
    decoder of an encoder-decoder checkpoint, `logits_dense` and optimizer
    state are dropped. RankGen's `encoder/encoder_projection_layer/kernel` is
    moved to `projection_layer/kernel`. Scanned layers are unstacked into
    `encoder/layers_{i}`; `scan_axis` names their layer axis where the shapes
    cannot tell it.

    Head: if the checkpoint has a projection [d_model, P], `head.projection_dim`
    becomes -1 when P == d_model and P otherwise; without a projection it
    becomes 0. With `head=None` the model is a bare encoder: the config has no
    head and a projection in the checkpoint is not returned.
    The T5 config is inferred from array shapes (`infer_t5_config`);
    `relpos_max_distance` cannot be inferred and is taken as given.
    """
    store = _open_store(path, keep=lambda name: name.startswith(_ENCODER_SIDE))
    where = store.where
    plan = _layout(store.shapes, where, scan_axis)
    shapes = _shapes_of(plan)
    encoder = _infer_config(shapes, relpos_max_distance, where)
    projection_out = _projection_width(shapes, encoder, where)
    head = _fit_head(head, encoder, projection_out)
    expected = _expected_shapes(encoder, projection_out if head is not None else None)
    _check_shapes(shapes, expected, where)
    arrays = _assemble(store, {name: plan[name] for name in expected})
    return ModelConfig(encoder=encoder, head=head), unflatten_dict(arrays, sep="/")


# ---------------------------------------------------------------------------
# Where the checkpoint lives, and in which format
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Location:
    """A checkpoint folder: local (`bucket` None) or a prefix in a GCS bucket."""

    display: str        # the path as the user gave it, for messages
    root: str           # absolute local folder, or object prefix inside the bucket
    bucket: str | None = None
    file_name: str = CHECKPOINT_FILE

    def kvstore(self, relative: str = "") -> dict:
        """TensorStore kvstore spec for `relative` (a path inside the folder)."""
        # posixpath.join keeps an absolute `relative` as is, like T5X's os.path.join.
        path = posixpath.join(self.root, relative) if relative else self.root
        if self.bucket is None:
            return {"driver": "file", "path": path}
        return {"driver": "gcs", "bucket": self.bucket, "path": path}

    def url(self, relative: str = "") -> str:
        """`relative` inside the folder as a path or gs:// URL (what orbax opens)."""
        path = posixpath.join(self.root, relative) if relative else self.root
        return path if self.bucket is None else f"gs://{self.bucket}/{path}"


def _locate(path: str) -> _Location:
    """Checkpoint folder named by `path` (a folder or its `checkpoint` file)."""
    path = os.fspath(path)
    match = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
    if match:
        bucket, prefix = match.group(1), match.group(2).rstrip("/")
        # T5X folders are `checkpoint_<step>`; a last component `checkpoint` is the file.
        if prefix == CHECKPOINT_FILE or prefix.endswith("/" + CHECKPOINT_FILE):
            prefix = prefix[:-len(CHECKPOINT_FILE)].rstrip("/")
        return _Location(display=path, root=prefix + "/" if prefix else "", bucket=bucket)
    local = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(local):
        raise RankgenError(f"{path}: T5X checkpoint path does not exist")
    if os.path.isfile(local):
        return _Location(display=path, root=os.path.dirname(local) + "/",
                         file_name=os.path.basename(local))
    return _Location(display=path, root=local.rstrip("/") + "/")


def _open_store(path: str, keep: Callable[[str], bool] | None):
    """The checkpoint's target arrays, in whichever format the folder holds.

    A store has `where` (for messages), `shapes` ({slash-joined name: shape},
    the arrays `keep` accepts, all if None) and `read(names)` -> {name: array as
    stored}. Orbax wins when its `_METADATA` is there, as in t5x: an Orbax
    PyTree folder of older orbax releases also holds a msgpack `checkpoint`
    file (of aggregated values), which is not a T5X msgpack checkpoint.
    """
    location = _locate(path)
    folder = t5x_orbax.find_pytree_folder(lambda relative: _has_file(location, relative))
    if folder is not None:
        return t5x_orbax.OrbaxTarget(location.url(folder), location.display)
    if not _has_file(location, location.file_name):
        raise RankgenError(_neither_format(location))
    return _MsgpackTarget(location, keep)


def _has_file(location: _Location, relative: str) -> bool:
    """Whether the folder holds the file `relative`, via a TensorStore kvstore (local or gs://)."""
    try:
        store = ts.KvStore.open(location.kvstore()).result()
        return store.read(relative).result().state == "value"
    except Exception as e:  # tensorstore reports I/O problems as ValueError and friends
        raise RankgenError(f"{location.display}: cannot read `{relative}` ({_short(e)})") from None


def _neither_format(location: _Location) -> str:
    """The message for a folder that holds no T5X checkpoint: what it holds and what would do."""
    if location.bucket is None:
        found = _listing(location.root)
    else:
        found = f"no `{location.file_name}` or `{t5x_orbax.METADATA_FILE}` file"
    return (f"{location.display}: not a T5X checkpoint (it holds {found}); a T5X checkpoint folder is "
            f"{FORMATS}{_step_hint(location)}")


def _listing(folder: str, limit: int = 8) -> str:
    """'a, b/, c' for what a local folder holds (at most `limit` names)."""
    names = sorted(os.listdir(folder))
    if not names:
        return "nothing"
    shown = [name + ("/" if os.path.isdir(os.path.join(folder, name)) else "") for name in names[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _step_hint(location: _Location) -> str:
    """A hint naming checkpoint_<step> subfolders when the user gave the model dir."""
    if location.bucket is not None:
        return ""
    steps = sorted(name for name in os.listdir(location.root)
                   if re.fullmatch(r"checkpoint_\d+", name))
    return f"; pass one of its step folders ({', '.join(steps)})" if steps else ""


# ---------------------------------------------------------------------------
# The msgpack + zarr format: the index file and the arrays it points to
# ---------------------------------------------------------------------------


class _MsgpackTarget:
    """The target arrays of a msgpack + zarr checkpoint: inline arrays and opened TensorStores."""

    def __init__(self, location: _Location, keep: Callable[[str], bool] | None):
        self.where = location.display
        self._location = location
        _, target = _read_index(location)
        flat = {name: leaf for name, leaf in _flatten(target).items() if keep is None or keep(name)}
        self._handles = _open_arrays(location, flat)
        self.shapes = {name: tuple(handle.shape) for name, handle in self._handles.items()}

    def read(self, names) -> dict[str, np.ndarray]:
        return _read_arrays(self._location, {name: self._handles[name] for name in names})


def _read_index(location: _Location) -> tuple[int, dict]:
    """(version, target tree with inline arrays and spec dicts) of a checkpoint."""
    raw = _read_checkpoint_file(location)
    return _parse_checkpoint(raw, location.display)


def _read_checkpoint_file(location: _Location) -> bytes:
    """Bytes of the msgpack `checkpoint` file, via a TensorStore kvstore."""
    try:
        store = ts.KvStore.open(location.kvstore()).result()
        result = store.read(location.file_name).result()
    except Exception as e:  # tensorstore reports I/O problems as ValueError and friends
        raise RankgenError(f"{location.display}: cannot read the T5X `{location.file_name}` file "
                           f"({_short(e)})") from None
    if result.state != "value":
        raise RankgenError(f"{location.display}: not a T5X checkpoint (no `{location.file_name}` "
                           f"file){_step_hint(location)}")
    return bytes(result.value)


def _parse_checkpoint(raw: bytes, where: str) -> tuple[int, dict]:
    """Decode the msgpack file and check it has the T5X shape."""
    if raw.startswith(b"model_checkpoint_path"):
        raise RankgenError(f"{where}: this is a TensorFlow checkpoint, not a T5X checkpoint")
    try:
        contents = serialization.msgpack_restore(raw)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise RankgenError(f"{where}: the `checkpoint` file is not valid msgpack "
                           f"({type(e).__name__}: {_short(e) or 'malformed data'})") from None
    if not isinstance(contents, dict) or "optimizer" not in contents:
        raise RankgenError(f"{where}: the `checkpoint` file is not a T5X checkpoint "
                           f"(expected a msgpack map with 'version' and 'optimizer')")
    version = contents.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise RankgenError(f"{where}: unsupported T5X checkpoint version {version!r} "
                           f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    optimizer = contents["optimizer"]
    target = optimizer.get("target") if isinstance(optimizer, dict) else None
    if not isinstance(target, dict) or not target:
        raise RankgenError(f"{where}: the T5X checkpoint has no 'optimizer/target' parameters")
    return version, target


def _is_spec(value: Any) -> bool:
    """Whether a msgpack value is a TensorStore spec standing in for an array."""
    return (isinstance(value, dict) and isinstance(value.get("driver"), str)
            and ("kvstore" in value or "path" in value))


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'a/b/c': leaf}; spec dicts are leaves, empty subtrees and None vanish."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not _is_spec(value):
            flat.update(_flatten(value, name + "/"))
        elif value is not None:
            flat[name] = value
    return flat


def _relative_path(spec: dict, name: str, where: str) -> str:
    """The spec's path relative to the checkpoint folder (both spellings)."""
    kvstore = spec.get("kvstore")
    if spec.get("driver") != "zarr":
        raise RankgenError(f"{where}: {name}: unsupported TensorStore driver {spec.get('driver')!r} "
                           f"(T5X writes zarr)")
    if kvstore is not None and not isinstance(kvstore, dict):
        raise RankgenError(f"{where}: {name}: unsupported TensorStore kvstore {kvstore!r}")
    kvstore = kvstore or {}
    if kvstore.get("driver", "file") not in ("file", "gfile", "gcs"):
        raise RankgenError(f"{where}: {name}: unsupported TensorStore kvstore driver "
                           f"{kvstore.get('driver')!r}")
    # tensorstore >= 0.1.14 keeps the path in the kvstore, older ones beside it.
    parts = [p.strip("/") for p in (kvstore.get("path"), spec.get("path")) if p]
    if not parts:
        raise RankgenError(f"{where}: {name}: TensorStore spec has no path")
    return posixpath.join(*parts)


def _open_arrays(location: _Location, flat: dict[str, Any]) -> dict[str, Any]:
    """{name: numpy array (inline) or opened TensorStore}; shapes come free, data is not read."""
    where = location.display
    pending = {}
    handles = {}
    for name, leaf in flat.items():
        if _is_spec(leaf):
            # Only driver + kvstore: the .zarray on disk is the truth for chunks,
            # compressor and dtype (version 2 wrote bfloat16 as uint16).
            spec = {"driver": "zarr",
                    "kvstore": location.kvstore(_relative_path(leaf, name, where))}
            pending[name] = (leaf, ts.open(spec, read=True, open=True))
        else:
            handles[name] = _inline_array(leaf, name, where)
    for name, (leaf, future) in pending.items():
        try:
            store = future.result()
        except Exception as e:
            raise RankgenError(f"{where}: array {name} is missing or unreadable "
                               f"({_relative_path(leaf, name, where)}: {_short(e)})") from None
        declared = (leaf.get("metadata") or {}).get("shape")
        if declared is not None and tuple(declared) != tuple(store.shape):
            raise RankgenError(f"{where}: array {name} has shape {tuple(store.shape)} on disk but "
                               f"{tuple(declared)} in the `checkpoint` file")
        handles[name] = store
    return handles


def _inline_array(leaf: Any, name: str, where: str) -> np.ndarray:
    """An array stored inside the msgpack file."""
    if isinstance(leaf, (np.ndarray, np.generic, int, float)) and not isinstance(leaf, bool):
        return np.asarray(leaf)
    raise RankgenError(f"{where}: {name}: unexpected value of type {type(leaf).__name__} "
                       f"in the checkpoint target")


def _read_arrays(location: _Location, handles: dict[str, Any]) -> dict[str, np.ndarray]:
    """Read every handle, all reads in flight at once; arrays as stored (see `_to_float32`)."""
    futures = {name: h.read() for name, h in handles.items() if not isinstance(h, np.ndarray)}
    arrays = {}
    for name, handle in handles.items():
        if name in futures:
            try:
                handle = futures[name].result()
            except Exception as e:
                raise RankgenError(f"{location.display}: array {name} is unreadable "
                                   f"({_short(e)})") from None
        arrays[name] = np.asarray(handle)
    return arrays


def _to_float32(array: np.ndarray, name: str, where: str) -> np.ndarray:
    """float32 copy of a parameter; uint16 is bfloat16 bits (version 2's encoding)."""
    if array.dtype == np.uint16:
        # No parameter is ever uint16: version 2 stored bfloat16 this way.
        array = array.view(_BFLOAT16)
    if array.dtype != _BFLOAT16 and array.dtype.kind not in "fiub":
        raise RankgenError(f"{where}: {name}: cannot convert dtype {array.dtype} to float32")
    return np.asarray(array, dtype=np.float32)


# ---------------------------------------------------------------------------
# Layout: stored arrays -> canonical parameters
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Piece:
    """Where one canonical parameter comes from: a stored array, or one layer of a stacked one."""

    source: str                 # the array's name in the checkpoint target
    shape: tuple[int, ...]      # the canonical shape
    layer: int | None = None    # index along `axis` of a stacked (scanned) array
    axis: int | None = None
    same_as: tuple["_Piece", ...] = ()  # per-layer copies that must equal this one

    def take(self, array: np.ndarray) -> np.ndarray:
        if self.layer is not None:
            array = np.take(array, self.layer, axis=self.axis)
        # Row-major, like T5X's own reshape of its 2-D attention kernels.
        return array.reshape(self.shape)

    def describe(self) -> str:
        return self.source if self.layer is None else f"{self.source} (layer {self.layer} along axis {self.axis})"


def _shapes_of(plan: dict[str, _Piece]) -> dict[str, tuple]:
    return {name: piece.shape for name, piece in plan.items()}


def _layout(shapes: dict[str, tuple], where: str, scan_axis: int | None = None) -> dict[str, _Piece]:
    """{canonical name: _Piece} for the encoder-side arrays of `shapes` ({stored name: shape}).

    Renames RankGen's projection, unstacks scanned layers, folds equal per-layer
    relative position biases into the shared one, and refuses encoder arrays the
    canonical tree has no place for (dropping them would change the model).
    """
    prefix = _prefix(where)
    names = sorted(name for name in shapes if name.startswith(_ENCODER_SIDE))
    if RANKGEN_PROJECTION in names and PROJECTION in names:
        raise RankgenError(f"{prefix}both {PROJECTION} and {RANKGEN_PROJECTION} exist; "
                           f"cannot tell which projection the model uses")
    for bias in ("projection_layer/bias", "encoder/encoder_projection_layer/bias"):
        if bias in names:
            # Dropping it would silently change every embedding.
            raise RankgenError(f"{prefix}{bias}: projections with a bias are not supported")
    roots = [root for root in _SCANNED_ROOTS if any(name.startswith(root) for name in names)]
    if len(roots) > 1:
        raise RankgenError(f"{prefix}scanned layers under both {' and '.join(roots)}; expected one stack")
    if roots and any(_LAYER.match(name) for name in names):
        raise RankgenError(f"{prefix}both scanned layers ({roots[0]}...) and unscanned ones "
                           f"(encoder/layers_{{i}}/...); expected one layout")
    plan = {}
    for name in names:
        if not (roots and name.startswith(roots[0])):
            canonical = PROJECTION if name == RANKGEN_PROJECTION else name
            plan[canonical] = _Piece(name, _canonical_shape(canonical, shapes[name]))
    if roots:
        stacked = {name[len(roots[0]):]: name for name in names if name.startswith(roots[0])}
        plan = _unstack(roots[0], stacked, shapes, plan, where, scan_axis)
    else:
        plan = _share_relpos(plan, where)
    unplaced = [plan[name].describe() for name in sorted(plan) if not _CANONICAL.fullmatch(name)]
    if unplaced:
        shown = ", ".join(unplaced[:4]) + (f" and {len(unplaced) - 4} more" if len(unplaced) > 4 else "")
        raise RankgenError(f"{prefix}encoder parameters the T5 encoder here has no place for: {shown}")
    return plan


def _canonical_shape(name: str, shape: tuple) -> tuple:
    """The 2-D shape of a 3-D attention kernel (scalable_t5's [embed, heads, kv] / [heads, kv, embed])."""
    shape = tuple(shape)
    if len(shape) == 3 and name.endswith(_ATTENTION_IN):
        return (shape[0], shape[1] * shape[2])
    if len(shape) == 3 and name.endswith(_ATTENTION_OUT):
        return (shape[0] * shape[1], shape[2])
    return shape


def _unstack(root: str, stacked: dict[str, str], shapes: dict[str, tuple], plan: dict[str, _Piece],
             where: str, scan_axis: int | None) -> dict[str, _Piece]:
    """`plan` plus encoder/layers_{i}/<tail> for every stacked array root<tail>, along the one fitting axis."""
    prefix = _prefix(where)
    ndim = min(len(shapes[name]) for name in stacked.values())
    fitting, misfits, problems = [], [], []
    for axis in (range(ndim) if scan_axis is None else (scan_axis,)):
        sizes = sorted({shapes[name][axis] for name in stacked.values()}) if 0 <= axis < ndim else []
        if len(sizes) != 1:
            misfits.append(f"axis {axis}: " + (f"the stacked arrays differ in size along it ({sizes})" if sizes
                                               else "not every stacked array has it"))
            continue
        candidate = dict(plan)
        for tail, name in stacked.items():
            layer_shape = shapes[name][:axis] + shapes[name][axis + 1:]
            for i in range(sizes[0]):
                canonical = f"encoder/layers_{i}/{tail}"
                candidate[canonical] = _Piece(name, _canonical_shape(canonical, layer_shape), layer=i, axis=axis)
        candidate = _share_relpos(candidate, where)
        problem = _misfit(candidate)
        if problem is None:
            fitting.append((axis, candidate))
        else:
            misfits.append(f"axis {axis}: {problem}")
            problems.append(problem)
    if len(fitting) == 1:
        return fitting[0][1]
    if not fitting and len(problems) == 1:
        # One axis stacks the layers consistently: what is wrong is the model, not the axis.
        raise RankgenError(f"{prefix}{problems[0]}")
    if not fitting:
        raise RankgenError(f"{prefix}cannot unstack the scanned layers under {root}: no layer axis gives "
                           f"the shapes of a T5 encoder ({'; '.join(misfits)})")
    raise RankgenError(f"{prefix}the layer axis of the scanned layers under {root} is ambiguous: axes "
                       f"{', '.join(str(axis) for axis, _ in fitting)} all give the shapes of a T5 encoder; "
                       f"pass scan_axis to load_t5x_checkpoint (t5x and flaxformer stack along 1 by default)")


def _misfit(plan: dict[str, _Piece]) -> str | None:
    """Why `plan`'s shapes are not one T5 encoder's, or None if they are."""
    shapes = _shapes_of(plan)
    try:
        _check_shapes(shapes, _expected_shapes(_infer_config(shapes, 128, ""), None), "")
    except RankgenError as e:
        return str(e)
    return None


def _share_relpos(plan: dict[str, _Piece], where: str) -> dict[str, _Piece]:
    """Fold per-layer relative position biases into the shared one, to be checked equal when read."""
    prefix = _prefix(where)
    per_layer = {int(m.group(1)): name for name in plan if (m := _PER_LAYER_RELPOS.fullmatch(name))}
    if not per_layer:
        return plan
    if SHARED_RELPOS in plan:
        raise RankgenError(f"{prefix}both a shared relative position bias ({SHARED_RELPOS}) and per-layer "
                           f"ones ({plan[per_layer[min(per_layer)]].describe()}); expected one or the other")
    layers = sorted({int(m.group(1)) for name in plan if (m := _LAYER.match(name))})
    if sorted(per_layer) != layers:
        raise RankgenError(f"{prefix}only layers {sorted(per_layer)} of {layers} have a relative position bias")
    plan = dict(plan)
    first, *others = (plan.pop(per_layer[i]) for i in layers)
    plan[SHARED_RELPOS] = dataclasses.replace(first, same_as=tuple(others))
    return plan


def _assemble(store, plan: dict[str, _Piece]) -> dict[str, np.ndarray]:
    """{canonical name: float32 array} for `plan`, each stored array read once."""
    raw = store.read({piece.source for top in plan.values() for piece in (top, *top.same_as)})
    floats: dict[str, np.ndarray] = {}

    def value(piece: _Piece) -> np.ndarray:
        if piece.source not in floats:
            floats[piece.source] = _to_float32(raw[piece.source], piece.source, store.where)
        return piece.take(floats[piece.source])

    arrays = {}
    for name, piece in plan.items():
        arrays[name] = value(piece)
        for other in piece.same_as:
            if not np.array_equal(value(other), arrays[name]):
                raise RankgenError(
                    f"{store.where}: the relative position biases differ between layers ({piece.describe()} "
                    f"and {other.describe()}); the T5 encoder here has one bias shared by all layers, "
                    f"as T5 and T5 1.1 do, so this model cannot be imported")
    return arrays


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


# ---------------------------------------------------------------------------
# Config from shapes
# ---------------------------------------------------------------------------


def _infer_config(shapes: dict[str, tuple], relpos_max_distance: int, where: str) -> T5Config:
    """T5Config from {name: shape} of T5X-named parameters."""
    prefix = _prefix(where)

    def matrix(name: str) -> tuple[int, int]:
        if name not in shapes:
            raise RankgenError(f"{prefix}missing encoder parameter {name}")
        if len(shapes[name]) != 2:
            raise RankgenError(f"{prefix}{name} has shape {shapes[name]}, expected a matrix")
        return shapes[name]

    vocab, d_model = matrix("token_embedder/embedding")
    layers = sorted({int(m.group(1)) for name in shapes if (m := _LAYER.match(name))})
    if not layers:
        raise RankgenError(f"{prefix}missing encoder parameters encoder/layers_0/...")
    if layers != list(range(len(layers))):
        raise RankgenError(f"{prefix}encoder layers are not numbered 0..{len(layers) - 1} "
                           f"(found layers_{', layers_'.join(map(str, layers))})")
    heads, buckets = matrix("encoder/relpos_bias/rel_embedding")
    inner = matrix("encoder/layers_0/attention/query/kernel")[1]
    if inner % heads:
        raise RankgenError(f"{prefix}query kernel width {inner} is not a multiple of "
                           f"{heads} heads (from encoder/relpos_bias/rel_embedding)")
    if "encoder/layers_0/mlp/wi_0/kernel" in shapes:
        activation, d_ff = "gated-gelu", matrix("encoder/layers_0/mlp/wi_0/kernel")[1]
    elif "encoder/layers_0/mlp/wi/kernel" in shapes:
        activation, d_ff = "relu", matrix("encoder/layers_0/mlp/wi/kernel")[1]
    else:
        raise RankgenError(f"{prefix}missing encoder parameter encoder/layers_0/mlp/wi_0/kernel "
                           f"(T5 1.1) or encoder/layers_0/mlp/wi/kernel (T5 1.0)")
    try:
        return T5Config(vocab_size=vocab, d_model=d_model, d_ff=d_ff, num_layers=len(layers),
                        num_heads=heads, d_kv=inner // heads, mlp_activation=activation,
                        relpos_buckets=buckets, relpos_max_distance=relpos_max_distance)
    except RankgenError as e:
        raise RankgenError(f"{prefix}{e}") from None


def _expected_shapes(cfg: T5Config, projection_out: int | None) -> dict[str, tuple]:
    """{name: shape} of every parameter in the canonical tree for `cfg`."""
    d, inner, ff = cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff
    shapes = {
        "token_embedder/embedding": (cfg.vocab_size, d),
        "encoder/relpos_bias/rel_embedding": (cfg.num_heads, cfg.relpos_buckets),
    }
    wi = ("wi_0", "wi_1") if cfg.mlp_activation == "gated-gelu" else ("wi",)
    for i in range(cfg.num_layers):
        layer = f"encoder/layers_{i}"
        shapes[f"{layer}/pre_attention_layer_norm/scale"] = (d,)
        for proj in ("query", "key", "value"):
            shapes[f"{layer}/attention/{proj}/kernel"] = (d, inner)
        shapes[f"{layer}/attention/out/kernel"] = (inner, d)
        shapes[f"{layer}/pre_mlp_layer_norm/scale"] = (d,)
        for w in wi:
            shapes[f"{layer}/mlp/{w}/kernel"] = (d, ff)
        shapes[f"{layer}/mlp/wo/kernel"] = (ff, d)
    shapes["encoder/encoder_norm/scale"] = (d,)
    if projection_out is not None:
        shapes[PROJECTION] = (d, projection_out)
    return shapes


def _check_shapes(shapes: dict[str, tuple], expected: dict[str, tuple], where: str) -> None:
    """Every expected parameter exists with its expected shape."""
    for name, shape in expected.items():
        if name not in shapes:
            raise RankgenError(f"{_prefix(where)}missing encoder parameter {name}")
        if tuple(shapes[name]) != shape:
            raise RankgenError(f"{_prefix(where)}{name} has shape {tuple(shapes[name])}, expected {shape} "
                               f"(from the shapes of the other encoder parameters)")


def _projection_width(shapes: dict[str, tuple], cfg: T5Config, where: str) -> int | None:
    """Output width P of the projection kernel [d_model, P], or None without one."""
    if PROJECTION not in shapes:
        return None
    shape = shapes[PROJECTION]
    if len(shape) != 2 or shape[0] != cfg.d_model:
        raise RankgenError(f"{where}: {PROJECTION} has shape {shape}, expected "
                           f"({cfg.d_model}, P) for d_model {cfg.d_model}")
    return shape[1]


def _fit_head(head: HeadConfig | None, cfg: T5Config, projection_out: int | None) -> HeadConfig | None:
    """The caller's head with projection_dim set from the checkpoint."""
    if head is None:
        return None
    if projection_out is None:
        return dataclasses.replace(head, projection_dim=0)
    return dataclasses.replace(head, projection_dim=-1 if projection_out == cfg.d_model else projection_out)


def _short(error: Exception) -> str:
    """One line of a (tensorstore) error, without the echoed JSON spec."""
    text = str(error).split(" [tensorstore_spec=")[0]
    return " ".join(text.split())
