"""Reading T5X checkpoints: the real fixture, self-written v2/v3 and Orbax checkpoints, scanned layers, errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from flax import serialization

from rankgen_jax.checkpoints import native, t5x
from rankgen_jax.checkpoints.t5x import infer_t5_config, load_t5x_checkpoint, read_t5x_target
from rankgen_jax.models.configs import RANKGEN_HEAD, ST5_HEAD, T5Config
from rankgen_jax.cli.main import main
from rankgen_jax.errors import RankgenError

from conftest import T5X_FIXTURE

FIXTURE = T5X_FIXTURE
BF16 = np.dtype(ts.bfloat16.numpy_dtype)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def flatten(tree: dict) -> dict:
    """{'a/b': leaf} of a nested dict."""
    return flatten_dict(tree, sep="/")


def unflatten(flat: dict) -> dict:
    return unflatten_dict(flat, sep="/")


def fixture_msgpack() -> dict:
    return serialization.msgpack_restore((FIXTURE / "checkpoint").read_bytes())


def read_zarr(folder: Path) -> np.ndarray:
    return ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder)}}).result().read().result()


def writable_copy(tmp_path: Path) -> Path:
    """Copy of the read-only fixture that the test may damage."""
    dest = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, dest)
    # The fixture is read-only and copytree keeps modes: make the copy writable.
    for root, dirs, files in os.walk(dest):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return dest


def write_t5x(folder: Path, target: dict, version: int = 3, spelling: str = "v3-file",
              inline: tuple[str, ...] = (), extra: dict | None = None) -> None:
    """Write `target` ({'a/b': array}) in the T5X on-disk layout.

    spelling: 'v2-gfile' (kvstore.path, gfile driver, bfloat16 as uint16 bits,
    like the real fixture), 'v3-file' (top-level dtype, native bfloat16,
    kvstore path with a trailing '/'), 'v3-gcs-legacy' (written on GCS by an old
    TensorStore: dummy bucket, path beside the kvstore).
    """
    folder.mkdir(parents=True, exist_ok=True)
    tree = {}
    for name, array in target.items():
        if name in inline:
            tree[name] = array
            continue
        rel = "target." + name.replace("/", ".")
        stored = array.view(np.uint16) if (spelling == "v2-gfile" and array.dtype == BF16) else array
        zarr_dtype = "bfloat16" if stored.dtype == BF16 else stored.dtype.str
        metadata = {"chunks": list(stored.shape), "compressor": {"id": "gzip", "level": 1},
                    "dtype": zarr_dtype, "shape": list(stored.shape)}
        store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder / rel)},
                         "metadata": metadata}, create=True).result()
        store.write(stored).result()
        if spelling == "v2-gfile":
            spec = {"driver": "zarr", "kvstore": {"driver": "gfile", "path": rel}, "metadata": metadata}
        elif spelling == "v3-file":
            spec = {"driver": "zarr", "dtype": "bfloat16" if array.dtype == BF16 else array.dtype.name,
                    "kvstore": {"driver": "file", "path": rel + "/"}, "metadata": metadata}
        elif spelling == "v3-gcs-legacy":
            spec = {"driver": "zarr", "dtype": "bfloat16" if array.dtype == BF16 else array.dtype.name,
                    "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"}, "path": rel,
                    "metadata": metadata}
        else:
            raise AssertionError(spelling)
        tree[name] = spec
    contents = {"version": version,
                "optimizer": {"target": unflatten(tree), "state": {"step": np.asarray(1000, np.int32)}}}
    contents.update(extra or {})
    (folder / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))


def t5_1_1_encoder_decoder(rng: np.random.Generator, d=6, heads=3, dkv=2, ff=10, vocab=40,
                           buckets=8, layers=2) -> dict:
    """A tiny T5 1.1 encoder-decoder target ({'a/b': array}) with RankGen's projection name."""
    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    target = {"token_embedder/embedding": w(vocab, d).astype(BF16),  # bfloat16 on disk
              "encoder/relpos_bias/rel_embedding": w(heads, buckets),
              "encoder/encoder_norm/scale": w(d),
              "encoder/encoder_projection_layer/kernel": w(d, d),
              "decoder/relpos_bias/rel_embedding": w(heads, buckets),
              "decoder/decoder_norm/scale": w(d),
              "decoder/logits_dense/kernel": w(d, vocab)}
    for i in range(layers):
        p = f"encoder/layers_{i}"
        target.update({f"{p}/pre_attention_layer_norm/scale": w(d),
                       f"{p}/attention/query/kernel": w(d, heads * dkv),
                       f"{p}/attention/key/kernel": w(d, heads * dkv),
                       f"{p}/attention/value/kernel": w(d, heads * dkv),
                       f"{p}/attention/out/kernel": w(heads * dkv, d),
                       f"{p}/pre_mlp_layer_norm/scale": w(d),
                       f"{p}/mlp/wi_0/kernel": w(d, ff),
                       f"{p}/mlp/wi_1/kernel": w(d, ff).astype(BF16),
                       f"{p}/mlp/wo/kernel": w(ff, d)})
        target[f"decoder/layers_{i}/self_attention/query/kernel"] = w(d, heads * dkv)
        target[f"decoder/layers_{i}/mlp/wi_0/kernel"] = w(d, ff)
    return target


INLINE = ("encoder/encoder_norm/scale", "encoder/layers_0/pre_attention_layer_norm/scale",
          "encoder/relpos_bias/rel_embedding")


# ---------------------------------------------------------------------------
# The real T5X fixture
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_import():
    assert FIXTURE.is_dir(), f"missing fixture {FIXTURE} (tests/fixtures/README.md)"
    return load_t5x_checkpoint(str(FIXTURE))


def test_fixture_config_and_head(fixture_import):
    config, _ = fixture_import
    enc = config.encoder
    assert (enc.vocab_size, enc.d_model, enc.d_ff, enc.num_layers, enc.num_heads, enc.d_kv) == (32128, 4, 8, 2, 2, 2)
    assert enc.mlp_activation == "relu"
    assert enc.relpos_buckets == 4 and enc.relpos_max_distance == 128
    assert config.head.projection_dim == 768
    assert config.head.pooling == RANKGEN_HEAD.pooling


def test_fixture_canonical_keys_and_shapes(fixture_import):
    _, params = fixture_import
    expected = {"token_embedder/embedding": (32128, 4), "encoder/relpos_bias/rel_embedding": (2, 4),
                "encoder/encoder_norm/scale": (4,), "projection_layer/kernel": (4, 768)}
    for i in range(2):
        p = f"encoder/layers_{i}"
        expected.update({f"{p}/pre_attention_layer_norm/scale": (4,), f"{p}/pre_mlp_layer_norm/scale": (4,),
                         f"{p}/attention/query/kernel": (4, 4), f"{p}/attention/key/kernel": (4, 4),
                         f"{p}/attention/value/kernel": (4, 4), f"{p}/attention/out/kernel": (4, 4),
                         f"{p}/mlp/wi/kernel": (4, 8), f"{p}/mlp/wo/kernel": (8, 4)})
    flat = flatten(params)
    assert {k: v.shape for k, v in flat.items()} == expected
    assert all(type(v) is np.ndarray and v.dtype == np.float32 for v in flat.values())


def test_fixture_values_match_tensorstore_and_msgpack(fixture_import):
    _, params = fixture_import
    for name in ("token_embedder/embedding", "encoder/layers_1/mlp/wo/kernel", "encoder/layers_0/attention/key/kernel"):
        direct = read_zarr(FIXTURE / ("target." + name.replace("/", ".")))
        np.testing.assert_array_equal(flatten(params)[name], direct)
    target = flatten(fixture_msgpack()["optimizer"]["target"])
    for name in ("encoder/encoder_norm/scale", "encoder/layers_1/pre_mlp_layer_norm/scale",
                 "encoder/relpos_bias/rel_embedding", "projection_layer/kernel"):
        assert isinstance(target[name], np.ndarray)  # inline in the msgpack file
        np.testing.assert_array_equal(flatten(params)[name], target[name])
    assert np.abs(params["token_embedder"]["embedding"]).sum() > 0


def test_fixture_head_variants():
    config, params = load_t5x_checkpoint(str(FIXTURE), head=ST5_HEAD)
    assert config.head.pooling == "mean" and config.head.l2_normalize and config.head.projection_dim == 768
    config, params = load_t5x_checkpoint(str(FIXTURE / "checkpoint"), head=None)
    assert config.head is None and "projection_layer" not in params
    assert params["encoder"]["layers_1"]["mlp"]["wi"]["kernel"].shape == (4, 8)


def test_read_t5x_target_fixture_and_infer(fixture_import):
    target = read_t5x_target(str(FIXTURE))
    flat = flatten(target)
    assert len(flat) == 20 and all(v.dtype == np.float32 for v in flat.values())
    np.testing.assert_array_equal(flat["encoder/layers_0/mlp/wi/kernel"],
                                  read_zarr(FIXTURE / "target.encoder.layers_0.mlp.wi.kernel"))
    assert infer_t5_config(target, relpos_max_distance=64) == T5Config(
        vocab_size=32128, d_model=4, d_ff=8, num_layers=2, num_heads=2, d_kv=2,
        mlp_activation="relu", relpos_buckets=4, relpos_max_distance=64)
    config, _ = fixture_import
    assert infer_t5_config(fixture_import[1]) == config.encoder


# ---------------------------------------------------------------------------
# Checkpoints written here in the T5X layout
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("version,spelling", [(2, "v2-gfile"), (3, "v3-file"), (3, "v3-gcs-legacy")])
def test_round_trip_t5_1_1_encoder_decoder(tmp_path, version, spelling):
    target = t5_1_1_encoder_decoder(np.random.default_rng(version))
    write_t5x(tmp_path / "ckpt", target, version=version, spelling=spelling, inline=INLINE)
    if spelling == "v2-gfile":  # bfloat16 really is stored as uint16 bits
        assert '"<u2"' in (tmp_path / "ckpt" / "target.token_embedder.embedding" / ".zarray").read_text()
    config, params = load_t5x_checkpoint(str(tmp_path / "ckpt"))

    enc = config.encoder
    assert (enc.vocab_size, enc.d_model, enc.d_ff, enc.num_layers, enc.num_heads, enc.d_kv,
            enc.relpos_buckets, enc.mlp_activation) == (40, 6, 10, 2, 3, 2, 8, "gated-gelu")
    assert config.head.projection_dim == -1  # square RankGen projection
    expected = {k: v.astype(np.float32) for k, v in target.items() if k.startswith("encoder/")}
    expected["projection_layer/kernel"] = expected.pop("encoder/encoder_projection_layer/kernel")
    expected["token_embedder/embedding"] = target["token_embedder/embedding"].astype(np.float32)
    flat = flatten(params)
    assert set(flat) == set(expected)  # decoder dropped, projection moved
    for name, value in expected.items():
        assert flat[name].dtype == np.float32
        np.testing.assert_array_equal(flat[name], value, err_msg=name)

    # The raw target keeps everything, decoder included, under the original names.
    raw = flatten(read_t5x_target(str(tmp_path / "ckpt")))
    assert set(raw) == set(target)
    np.testing.assert_array_equal(raw["decoder/logits_dense/kernel"], target["decoder/logits_dense/kernel"])
    np.testing.assert_array_equal(raw["encoder/encoder_projection_layer/kernel"],
                                  target["encoder/encoder_projection_layer/kernel"])


def test_inline_bfloat16_and_no_projection(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(7))
    del target["encoder/encoder_projection_layer/kernel"]
    target["encoder/encoder_norm/scale"] = target["encoder/encoder_norm/scale"].astype(BF16)
    write_t5x(tmp_path / "ckpt", target, inline=INLINE)
    config, params = load_t5x_checkpoint(str(tmp_path / "ckpt"))
    assert config.head.projection_dim == 0 and "projection_layer" not in params
    np.testing.assert_array_equal(params["encoder"]["encoder_norm"]["scale"],
                                  target["encoder/encoder_norm/scale"].astype(np.float32))
    config, _ = load_t5x_checkpoint(str(tmp_path / "ckpt"), head=None)
    assert config.head is None


def test_non_square_projection_sets_width(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(3))
    target["projection_layer/kernel"] = np.ones((6, 5), np.float32)
    del target["encoder/encoder_projection_layer/kernel"]
    write_t5x(tmp_path / "ckpt", target)
    config, params = load_t5x_checkpoint(str(tmp_path / "ckpt"))
    assert config.head.projection_dim == 5
    np.testing.assert_array_equal(params["projection_layer"]["kernel"], np.ones((6, 5), np.float32))


def test_gcs_paths_map_to_gcs_kvstore():
    # No network here: check the specs that would be opened, and that tensorstore accepts them.
    location = t5x._locate("gs://t5-data/pretrained_models/t5x/t5_1_1_xl/checkpoint_1000000/checkpoint")
    assert location.kvstore() == {"driver": "gcs", "bucket": "t5-data",
                                  "path": "pretrained_models/t5x/t5_1_1_xl/checkpoint_1000000/"}
    spec = {"driver": "zarr", "kvstore": {"driver": "gfile", "path": "target.encoder.layers_0.mlp.wo.kernel"}}
    rel = t5x._relative_path(spec, "encoder/layers_0/mlp/wo/kernel", "x")
    kv = location.kvstore(rel)
    assert kv["path"] == "pretrained_models/t5x/t5_1_1_xl/checkpoint_1000000/target.encoder.layers_0.mlp.wo.kernel"
    assert ts.Spec({"driver": "zarr", "kvstore": kv}).to_json()["kvstore"]["bucket"] == "t5-data"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("reader", [load_t5x_checkpoint, read_t5x_target])
def test_missing_array_folder_names_parameter(tmp_path, reader):
    ckpt = writable_copy(tmp_path)
    shutil.rmtree(ckpt / "target.encoder.layers_0.attention.key.kernel")
    with pytest.raises(RankgenError, match="encoder/layers_0/attention/key/kernel") as info:
        reader(str(ckpt))
    assert str(ckpt) in str(info.value) and "missing" in str(info.value) and "\n" not in str(info.value)


def test_corrupt_array_names_parameter(tmp_path):
    ckpt = writable_copy(tmp_path)
    (ckpt / "target.encoder.layers_1.mlp.wo.kernel" / ".zarray").write_text("{not json")
    with pytest.raises(RankgenError, match="encoder/layers_1/mlp/wo/kernel"):
        load_t5x_checkpoint(str(ckpt))


def test_missing_chunk_names_parameter(tmp_path):
    ckpt = writable_copy(tmp_path)
    (ckpt / "target.encoder.layers_1.mlp.wi.kernel" / "0.0").write_bytes(b"not gzip")
    with pytest.raises(RankgenError, match="encoder/layers_1/mlp/wi/kernel"):
        load_t5x_checkpoint(str(ckpt))


def test_missing_path(tmp_path):
    with pytest.raises(RankgenError, match="does not exist"):
        load_t5x_checkpoint(str(tmp_path / "nope"))


def test_folder_without_checkpoint_file(tmp_path):
    (tmp_path / "checkpoint_1000").mkdir()
    with pytest.raises(RankgenError, match="not a T5X checkpoint") as info:
        load_t5x_checkpoint(str(tmp_path))
    assert "checkpoint_1000" in str(info.value)  # hints at the step folder


@pytest.mark.parametrize("raw", [b"garbage bytes", b"\xc1", b"", serialization.msgpack_serialize([1, 2]),
                                 serialization.msgpack_serialize({"version": 3, "optimizer": {"state": {}}})])
def test_garbage_checkpoint_file(tmp_path, raw):
    ckpt = writable_copy(tmp_path)
    (ckpt / "checkpoint").write_bytes(raw)
    with pytest.raises(RankgenError, match="checkpoint") as info:
        load_t5x_checkpoint(str(ckpt))
    assert str(ckpt) in str(info.value)


@pytest.mark.parametrize("version", [1, 4, None])
def test_unsupported_version(tmp_path, version):
    write_t5x(tmp_path / "ckpt", t5_1_1_encoder_decoder(np.random.default_rng(0)), version=version)
    with pytest.raises(RankgenError, match=f"unsupported T5X checkpoint version {version}"):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))


def test_tensorflow_checkpoint_is_named(tmp_path):
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1000"\n')
    with pytest.raises(RankgenError, match="TensorFlow checkpoint"):
        load_t5x_checkpoint(str(tmp_path))


@pytest.mark.parametrize("name", ["encoder/layers_1/mlp/wo/kernel", "encoder/encoder_norm/scale",
                                  "encoder/layers_0/attention/query/kernel", "token_embedder/embedding"])
def test_missing_encoder_parameter(tmp_path, name):
    target = t5_1_1_encoder_decoder(np.random.default_rng(0))
    del target[name]
    write_t5x(tmp_path / "ckpt", target)
    with pytest.raises(RankgenError, match=f"missing encoder parameter {name}"):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))


def test_inconsistent_shape_is_named(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(0))
    target["encoder/layers_1/attention/key/kernel"] = np.zeros((6, 4), np.float32)
    write_t5x(tmp_path / "ckpt", target)
    with pytest.raises(RankgenError, match=r"encoder/layers_1/attention/key/kernel has shape \(6, 4\), expected \(6, 6\)"):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))


def test_infer_t5_config_missing_parameter():
    with pytest.raises(RankgenError, match="here: missing encoder parameter encoder/relpos_bias/rel_embedding"):
        infer_t5_config({"token_embedder": {"embedding": np.zeros((8, 4))},
                         "encoder": {"layers_0": {"attention": {"query": {"kernel": np.zeros((4, 4))}}}}},
                        where="here")


# ---------------------------------------------------------------------------
# Orbax checkpoints, written the way t5x writes them
# ---------------------------------------------------------------------------


def tree_map(fn, tree: dict) -> dict:
    return {k: tree_map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def write_t5x_orbax(model_dir: Path, target: dict, step: int = 1000, use_ocdbt: bool = True,
                    state_item: bool = True, save_dtype=None) -> Path:
    """Save a T5X train state with orbax the way t5x/checkpoints.py's OrbaxCheckpointManagerInterface does.

    The tree is the train state's state_dict(): {'target': params, 'state': {'step', 'param_states'}}
    (factored Adafactor slots). state_item=True: a CheckpointManager with step_prefix 'checkpoint'
    and the one item 'state' (model_dir/checkpoint_<step>/state/); False: the tree straight in
    checkpoint_<step>/, as earlier T5X releases wrote it. Returns the checkpoint_<step> folder.
    """
    params = unflatten(target)
    slots = {}
    for name, array in target.items():
        if array.ndim >= 2:
            slots[f"{name}/v_row"] = np.zeros(array.shape[:-1], np.float32)
            slots[f"{name}/v_col"] = np.zeros(array.shape[-1:], np.float32)
        else:
            slots[f"{name}/v"] = np.zeros(array.shape, np.float32)
    state_dict = {"target": params, "state": {"step": np.asarray(step, np.int32), "param_states": unflatten(slots)}}
    # t5x also sets aggregate=True for unpartitioned values, an option orbax 0.12.8 ignores.
    save_args = {"target": tree_map(lambda _: ocp.SaveArgs(dtype=save_dtype), params),
                 "state": tree_map(lambda _: ocp.SaveArgs(), state_dict["state"])}
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt)
    if state_item:
        manager = ocp.CheckpointManager(
            str(model_dir), checkpointers={"state": ocp.Checkpointer(handler)},
            options=ocp.CheckpointManagerOptions(step_prefix="checkpoint", cleanup_tmp_directories=True))
        manager.save(step, {"state": state_dict}, save_kwargs={"state": {"save_args": save_args}})
        manager.wait_until_finished()
        manager.close()
    else:
        model_dir.mkdir(parents=True, exist_ok=True)
        ocp.Checkpointer(handler).save(model_dir / f"checkpoint_{step}",
                                       args=ocp.args.PyTreeSave(state_dict, save_args=save_args))
    return model_dir / f"checkpoint_{step}"


def canonical_encoder(target: dict) -> dict:
    """What the import must return for an (unscanned) target: its encoder side in float32."""
    expected = {k: v.astype(np.float32) for k, v in target.items()
                if k.startswith(("encoder/", "token_embedder/", "projection_layer/"))}
    if t5x.RANKGEN_PROJECTION in expected:
        expected[t5x.PROJECTION] = expected.pop(t5x.RANKGEN_PROJECTION)
    return expected


def assert_params_equal(params: dict, expected: dict) -> None:
    flat = flatten(params)
    assert set(flat) == set(expected)
    for name, value in expected.items():
        assert type(flat[name]) is np.ndarray and flat[name].dtype == np.float32, name
        np.testing.assert_array_equal(flat[name], value, err_msg=name)


@pytest.mark.parametrize("use_ocdbt,state_item,save_dtype", [
    (True, True, None),          # t5x's manager with OCDBT
    (False, True, np.float32),   # t5x's manager without OCDBT (one zarr per array), saved as float32
    (True, False, None),         # earlier T5X: the PyTree straight in checkpoint_<step>/
])
def test_orbax_round_trip(tmp_path, use_ocdbt, state_item, save_dtype):
    target = t5_1_1_encoder_decoder(np.random.default_rng(11))
    ckpt = write_t5x_orbax(tmp_path / "model", target, use_ocdbt=use_ocdbt, state_item=state_item,
                           save_dtype=save_dtype)
    pytree = ckpt / "state" if state_item else ckpt
    assert (pytree / "_METADATA").is_file() and (pytree / "manifest.ocdbt").is_file() == use_ocdbt
    assert (pytree / "target.encoder.layers_0.mlp.wo.kernel").is_dir() == (not use_ocdbt)
    if state_item:
        assert (ckpt / "_CHECKPOINT_METADATA").is_file() and not (ckpt / "_METADATA").exists()
    for path in {ckpt, pytree}:
        config, params = load_t5x_checkpoint(str(path))
        enc = config.encoder
        assert (enc.vocab_size, enc.d_model, enc.d_ff, enc.num_layers, enc.num_heads, enc.d_kv,
                enc.relpos_buckets, enc.mlp_activation) == (40, 6, 10, 2, 3, 2, 8, "gated-gelu")
        assert config.head.projection_dim == -1
        assert_params_equal(params, canonical_encoder(target))

    # The raw target: every array (decoder included) under its stored name; no optimizer state.
    raw = flatten(read_t5x_target(str(ckpt)))
    assert set(raw) == set(target)
    for name, value in target.items():
        np.testing.assert_array_equal(raw[name], value.astype(np.float32), err_msg=name)


def test_orbax_import_through_the_cli(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(12))
    ckpt = write_t5x_orbax(tmp_path / "model", target)
    out = tmp_path / "ckpt"
    assert main(["import", "--from", "t5x", "--path", str(ckpt), "--out", str(out)]) == 0
    config, params = native.restore_params(out)
    assert config.encoder.num_layers == 2 and config.head.projection_dim == -1
    assert_params_equal(params, canonical_encoder(target))


def test_orbax_model_dir_names_the_steps(tmp_path):
    write_t5x_orbax(tmp_path / "model", t5_1_1_encoder_decoder(np.random.default_rng(0)), step=300)
    with pytest.raises(RankgenError, match="not a T5X checkpoint") as info:
        load_t5x_checkpoint(str(tmp_path / "model"))
    assert "pass one of its step folders (checkpoint_300)" in str(info.value)


def test_orbax_tree_without_target(tmp_path):
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).save(
        tmp_path / "flax_ckpt", args=ocp.args.PyTreeSave({"params": {"dense": {"kernel": np.ones((2, 2))}}}))
    with pytest.raises(RankgenError, match=r"no 'target' parameters \(its tree holds: params\)"):
        load_t5x_checkpoint(str(tmp_path / "flax_ckpt"))


def test_folder_of_neither_format(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(RankgenError) as info:
        load_t5x_checkpoint(str(tmp_path))
    message = str(info.value)
    assert "not a T5X checkpoint (it holds config.json, model.safetensors, tokenizer/)" in message
    assert "Orbax (a `_METADATA` file" in message and "format versions 2 and 3" in message
    assert "\n" not in message


# ---------------------------------------------------------------------------
# Scanned layers
# ---------------------------------------------------------------------------


def t5x_layers(target: dict, layers: int, root: str | None = "encoder/layers/", axis: int = 1,
               attention_3d: bool = False, relpos: str = "shared") -> dict:
    """`target` (canonical T5X names) in another layer layout of T5X models.

    root: where a scanned model stacks its layers along `axis`: 'encoder/layers/' (t5x's
    scalable_t5, param_scan_axis=1; rankgen_jax's scan layout, axis 0) or 'encoder/encoder/'
    (flaxformer, scan_axis=1); None keeps layers_{i}. The decoder is stacked the same way.
    attention_3d: scalable_t5's [embed, heads, kv] / [heads, kv, embed] attention kernels.
    relpos: 'shared' (encoder/relpos_bias) or a per-layer bias name ('relative_posemb' in
    scalable_t5, 'relpos_bias' in flaxformer), each layer holding a copy of the shared one.
    """
    heads = target["encoder/relpos_bias/rel_embedding"].shape[0]

    def shaped(tail: str, array: np.ndarray) -> np.ndarray:
        if attention_3d and tail.endswith(("query/kernel", "key/kernel", "value/kernel")):
            return array.reshape(array.shape[0], heads, -1)
        if attention_3d and tail.endswith("out/kernel"):
            return array.reshape(heads, -1, array.shape[1])
        return array

    out = {}
    for name, array in target.items():
        parts = name.split("/", 2)
        is_layer = len(parts) == 3 and parts[1].startswith("layers_")
        out[name] = shaped(parts[2], array) if is_layer else array
    if relpos != "shared":
        rel = out.pop("encoder/relpos_bias/rel_embedding")
        for i in range(layers):
            out[f"encoder/layers_{i}/{relpos}/rel_embedding"] = rel
    if root is None:
        return out
    stacked = {}
    for side, stack in (("encoder", root), ("decoder", "decoder/layers/")):
        for tail in sorted({k.split("/", 2)[2] for k in out if k.startswith(f"{side}/layers_0/")}):
            per_layer = [out.pop(f"{side}/layers_{i}/{tail}") for i in range(layers)]
            stacked[stack + tail] = np.stack(per_layer, axis=axis)
    return {**out, **stacked}


SCANNED = [
    pytest.param("orbax", "encoder/layers/", 1, True, "relative_posemb", id="orbax-scalable_t5"),
    pytest.param("orbax", "encoder/encoder/", 1, False, "relpos_bias", id="orbax-flaxformer"),
    pytest.param("msgpack", "encoder/layers/", 1, True, "relative_posemb", id="msgpack-scalable_t5"),
    pytest.param("msgpack", "encoder/encoder/", 1, False, "relpos_bias", id="msgpack-flaxformer"),
    pytest.param("msgpack", "encoder/layers/", 0, False, "shared", id="msgpack-leading-axis"),
    pytest.param("orbax", None, None, True, "relative_posemb", id="orbax-scalable_t5-unscanned"),
]


def write_layout(folder: Path, fmt: str, stored: dict) -> Path:
    if fmt == "orbax":
        return write_t5x_orbax(folder, stored)
    write_t5x(folder, stored)
    return folder


@pytest.mark.parametrize("fmt,root,axis,attention_3d,relpos", SCANNED)
def test_layer_layouts_round_trip(tmp_path, fmt, root, axis, attention_3d, relpos):
    target = t5_1_1_encoder_decoder(np.random.default_rng(21), layers=3)
    stored = t5x_layers(target, 3, root, axis, attention_3d, relpos)
    if root is not None:
        assert not any("layers_" in name for name in stored)
        assert stored[root + "pre_mlp_layer_norm/scale"].shape == ((3, 6) if axis == 0 else (6, 3))
    path = write_layout(tmp_path / "ckpt", fmt, stored)
    config, params = load_t5x_checkpoint(str(path))
    enc = config.encoder
    assert (enc.num_layers, enc.num_heads, enc.d_kv, enc.d_model, enc.d_ff) == (3, 3, 2, 6, 10)
    assert_params_equal(params, canonical_encoder(target))
    assert infer_t5_config(unflatten(stored)) == enc
    if attention_3d:
        # scalable_t5 contracts the input with kernel axis 0 into [heads, kv] and [heads, kv] into
        # the output (its DenseGeneral); our model splits [heads * d_kv] heads-major (models/t5.py).
        def layer_1(tail):
            if root is None:
                return stored[f"encoder/layers_1/{tail}"]
            return np.take(stored[root + tail], 1, axis=axis)
        layer = params["encoder"]["layers_1"]["attention"]
        x_TxD = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
        np.testing.assert_allclose((x_TxD @ layer["query"]["kernel"]).reshape(5, 3, 2),
                                   np.einsum("td,dhk->thk", x_TxD, layer_1("attention/query/kernel")), rtol=1e-5)
        o_TxHxK = np.random.default_rng(1).standard_normal((5, 3, 2)).astype(np.float32)
        np.testing.assert_allclose(o_TxHxK.reshape(5, 6) @ layer["out"]["kernel"],
                                   np.einsum("thk,hkd->td", o_TxHxK, layer_1("attention/out/kernel")), rtol=1e-5)


def test_per_layer_relative_position_biases_must_agree(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(22), layers=3)
    stored = t5x_layers(target, 3, attention_3d=True, relpos="relative_posemb")
    stored["encoder/layers/relative_posemb/rel_embedding"][:, 2, 0] += 1  # layer 2's bias differs
    path = write_t5x_orbax(tmp_path / "model", stored)
    with pytest.raises(RankgenError, match="relative position biases differ between layers") as info:
        load_t5x_checkpoint(str(path))
    assert "(layer 2 along axis 1)" in str(info.value) and "\n" not in str(info.value)


def test_ambiguous_layer_axis_needs_scan_axis(tmp_path):
    # d_model == d_ff == heads * d_kv == layers: every array is 4 wide on each side.
    target = t5_1_1_encoder_decoder(np.random.default_rng(23), d=4, heads=2, dkv=2, ff=4, layers=4)
    write_t5x(tmp_path / "ckpt", t5x_layers(target, 4, axis=1))
    with pytest.raises(RankgenError, match="ambiguous: axes 0, 1 .* pass scan_axis"):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))
    _, params = load_t5x_checkpoint(str(tmp_path / "ckpt"), scan_axis=1)
    assert_params_equal(params, canonical_encoder(target))
    _, params = load_t5x_checkpoint(str(tmp_path / "ckpt"), scan_axis=0)  # fits, but is another model
    assert not np.array_equal(params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"],
                              target["encoder/layers_1/mlp/wo/kernel"])


def test_unstackable_layers_are_named(tmp_path):
    target = t5_1_1_encoder_decoder(np.random.default_rng(24), layers=3)
    stored = t5x_layers(target, 3)
    stored["encoder/layers/mlp/wo/kernel"] = stored["encoder/layers/mlp/wo/kernel"][:, :2]
    write_t5x(tmp_path / "ckpt", stored)
    with pytest.raises(RankgenError, match=r"cannot unstack the scanned layers under encoder/layers/: .*"
                                           r"axis 1: the stacked arrays differ in size along it \(\[2, 3\]\)"):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))
    # Stacked consistently but a parameter missing: the message is about the parameter.
    stored = t5x_layers(target, 3)
    del stored["encoder/layers/mlp/wi_1/kernel"]
    write_t5x(tmp_path / "ckpt2", stored)
    with pytest.raises(RankgenError, match=r"ckpt2: missing encoder parameter encoder/layers_0/mlp/wi_1/kernel$"):
        load_t5x_checkpoint(str(tmp_path / "ckpt2"))


@pytest.mark.parametrize("extra,message", [
    ({"encoder/layers/mlp/wo/kernel": np.zeros((10, 2, 6), np.float32)}, "expected one layout"),
    ({"encoder/layers_1/attention/query/bias": np.zeros((6,), np.float32)},
     "no place for: encoder/layers_1/attention/query/bias"),
    ({"encoder/layers_0/relpos_bias/rel_embedding": np.zeros((3, 8), np.float32)},
     "both a shared relative position bias"),
    ({"encoder/position_embedder/embedding": np.zeros((16, 6), np.float32)},
     "no place for: encoder/position_embedder/embedding"),
])
def test_encoder_arrays_that_do_not_fit_are_refused(tmp_path, extra, message):
    target = {**t5_1_1_encoder_decoder(np.random.default_rng(25)), **extra}
    write_t5x(tmp_path / "ckpt", target)
    with pytest.raises(RankgenError, match=message):
        load_t5x_checkpoint(str(tmp_path / "ckpt"))
