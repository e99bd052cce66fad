"""Read T5X checkpoints (format versions 2 and 3) into our canonical encoder tree.

A T5X checkpoint is a folder (`.../checkpoint_<step>/`) holding:

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

Scanned-layer checkpoints (`encoder/layers/...` stacked along an axis) are
not supported.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
from typing import Any

import numpy as np
from flax import serialization
from flax.traverse_util import unflatten_dict
import tensorstore as ts

from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config
from rankgen_jax.errors import RankgenError

SUPPORTED_VERSIONS = (2, 3)
CHECKPOINT_FILE = "checkpoint"
PROJECTION = "projection_layer/kernel"
# RankGen's own T5X runs put the projection inside the encoder module.
RANKGEN_PROJECTION = "encoder/encoder_projection_layer/kernel"
_BFLOAT16 = np.dtype(ts.bfloat16.numpy_dtype)

# Every parameter of the canonical tree; anything else in a target is dropped.
_CANONICAL = re.compile(
    r"token_embedder/embedding"
    r"|encoder/relpos_bias/rel_embedding"
    r"|encoder/encoder_norm/scale"
    r"|encoder/layers_\d+/(pre_attention_layer_norm|pre_mlp_layer_norm)/scale"
    r"|encoder/layers_\d+/attention/(query|key|value|out)/kernel"
    r"|encoder/layers_\d+/mlp/(wi|wi_0|wi_1|wo)/kernel"
    r"|projection_layer/kernel")
_LAYER = re.compile(r"encoder/layers_(\d+)/")


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def read_t5x_target(path: str) -> dict:
    """Nested dict of float32 numpy arrays: the `optimizer/target` tree of a T5X checkpoint (versions 2 and 3).

    `path` is a checkpoint folder (or its `checkpoint` file), local or
    `gs://bucket/path`. Every array of the target is read, decoder included;
    use `load_t5x_checkpoint` to read only the encoder.
    """
    location = _locate(path)
    _, target = _read_index(location)
    flat = _flatten(target)
    arrays = _read_arrays(location, _open_arrays(location, flat))
    return unflatten_dict(arrays, sep="/")


def infer_t5_config(params: dict, relpos_max_distance: int = 128, where: str = "") -> T5Config:
    """T5Config from the array shapes of a T5X-named parameter tree.

    vocab and d_model from token_embedder/embedding, num_layers from the count
    of encoder/layers_{i}, num_heads and buckets from
    encoder/relpos_bias/rel_embedding [heads, buckets], d_kv = query kernel
    columns / heads, d_ff and mlp_activation ('gated-gelu' if mlp/wi_0 exists,
    'relu' if mlp/wi) from the MLP kernels of layer 0. `where` prefixes error
    messages (e.g. the checkpoint path).
    """
    shapes = {name: tuple(np.shape(leaf)) for name, leaf in _flatten(params).items()}
    return _infer_config(shapes, relpos_max_distance, where)


def load_t5x_checkpoint(path: str, head: HeadConfig | None = RANKGEN_HEAD,
                        relpos_max_distance: int = 128) -> tuple[ModelConfig, dict]:
    """Read a T5X checkpoint as (ModelConfig, canonical float32 parameter tree).

    Only encoder parameters (and the dual-encoder projection) are read: the
    decoder of an encoder-decoder checkpoint, `logits_dense` and optimizer
    state are dropped. RankGen's `encoder/encoder_projection_layer/kernel` is
    moved to `projection_layer/kernel`.

    Head: if the checkpoint has a projection [d_model, P], `head.projection_dim`
    becomes -1 when P == d_model and P otherwise; without a projection it
    becomes 0. With `head=None` the model is a bare encoder: the config has no
    head and a projection in the checkpoint is not returned.
    The T5 config is inferred from array shapes (`infer_t5_config`);
    `relpos_max_distance` cannot be inferred and is taken as given.
    """
    location = _locate(path)
    where = location.display
    _, target = _read_index(location)
    flat = _canonical_names(_flatten(target), where)
    handles = _open_arrays(location, {k: v for k, v in flat.items() if _CANONICAL.fullmatch(k)})
    shapes = {name: tuple(handle.shape) for name, handle in handles.items()}
    encoder = _infer_config(shapes, relpos_max_distance, where)
    projection_out = _projection_width(shapes, encoder, where)
    head = _fit_head(head, encoder, projection_out)
    expected = _expected_shapes(encoder, projection_out if head is not None else None)
    _check_shapes(shapes, expected, where)
    arrays = _read_arrays(location, {name: handles[name] for name in expected})
    return ModelConfig(encoder=encoder, head=head), unflatten_dict(arrays, sep="/")


# ---------------------------------------------------------------------------
# Where the checkpoint lives
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


# ---------------------------------------------------------------------------
# The msgpack index
# ---------------------------------------------------------------------------


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


def _step_hint(location: _Location) -> str:
    """A hint naming checkpoint_<step> subfolders when the user gave the model dir."""
    if location.bucket is not None:
        return ""
    steps = sorted(name for name in os.listdir(location.root)
                   if re.fullmatch(r"checkpoint_\d+", name))
    return f"; it holds {', '.join(steps)}: pass one of those" if steps else ""


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


# ---------------------------------------------------------------------------
# Trees and names
# ---------------------------------------------------------------------------


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


def _canonical_names(flat: dict[str, Any], where: str) -> dict[str, Any]:
    """Rename RankGen's projection and reject layouts we cannot represent."""
    flat = dict(flat)
    if any(name.startswith("encoder/layers/") for name in flat):
        raise RankgenError(f"{where}: scanned-layers T5X checkpoint (stacked encoder/layers/...) "
                           f"is not supported; export it with unscanned layers_{{i}}")
    if RANKGEN_PROJECTION in flat:
        if PROJECTION in flat:
            raise RankgenError(f"{where}: both {PROJECTION} and {RANKGEN_PROJECTION} exist; "
                               f"cannot tell which projection the model uses")
        flat[PROJECTION] = flat.pop(RANKGEN_PROJECTION)
    for bias in ("projection_layer/bias", "encoder/encoder_projection_layer/bias"):
        if bias in flat:
            # Dropping it would silently change every embedding.
            raise RankgenError(f"{where}: {bias}: projections with a bias are not supported")
    return flat


# ---------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------


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
    """Read every handle (all reads in flight at once) and convert to float32."""
    futures = {name: h.read() for name, h in handles.items() if not isinstance(h, np.ndarray)}
    arrays = {}
    for name, handle in handles.items():
        if name in futures:
            try:
                handle = futures[name].result()
            except Exception as e:
                raise RankgenError(f"{location.display}: array {name} is unreadable "
                                   f"({_short(e)})") from None
        arrays[name] = _to_float32(handle, name, location.display)
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
# Config from shapes
# ---------------------------------------------------------------------------


def _infer_config(shapes: dict[str, tuple], relpos_max_distance: int, where: str) -> T5Config:
    """T5Config from {name: shape} of T5X-named parameters."""
    prefix = f"{where}: " if where else ""

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
            raise RankgenError(f"{where}: missing encoder parameter {name}")
        if tuple(shapes[name]) != shape:
            raise RankgenError(f"{where}: {name} has shape {tuple(shapes[name])}, expected {shape} "
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
