"""The Flax T5 encoder on its own: relative buckets, scan/remat equivalence, masking, axis names, dtypes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from rankgen_jax.models.configs import HeadConfig, ModelConfig, t5_config
from rankgen_jax.models.factory import abstract_variables, build_model, init_params, to_model_layout
from rankgen_jax.models.t5 import relative_position_buckets, to_scanned_layout, to_unscanned_layout

VOCAB = 97


def _ids(batch=3, length=11, seed=0, pad_from=None):
    ids = np.random.RandomState(seed).randint(3, VOCAB, (batch, length)).astype(np.int32)
    if pad_from is not None:
        for row, start in enumerate(pad_from):
            ids[row, start:] = 0
    return ids


@pytest.mark.parametrize("length,buckets,max_distance", [(7, 32, 128), (300, 32, 128), (50, 16, 20)])
def test_relative_buckets_match_hf(length, buckets, max_distance):
    relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    expected = T5Attention._relative_position_bucket(
        relative, bidirectional=True, num_buckets=buckets, max_distance=max_distance
    ).numpy()
    got = relative_position_buckets(length, length, buckets, max_distance)
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module")
def dual_config():
    return ModelConfig(encoder=t5_config("tiny", vocab_size=VOCAB), head=HeadConfig("last2_avg", 24, True))


@pytest.fixture(scope="module")
def dual_params(dual_config):
    return init_params(dual_config, seed=1)


def test_every_parameter_has_logical_axis_names(dual_config):
    variables = abstract_variables(dual_config)
    specs = nn.get_partition_spec(variables)["params"]
    shapes = nn.unbox(variables)["params"]
    flat_specs = jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    flat_shapes = jax.tree_util.tree_leaves(shapes)
    assert len(flat_specs) == len(flat_shapes) > 10
    for (path, spec), shape in zip(flat_specs, flat_shapes):
        assert isinstance(spec, jax.sharding.PartitionSpec), path
        assert len(spec) == len(shape.shape) and all(isinstance(a, str) for a in spec), (path, spec)


def test_scan_and_remat_equal_unrolled(dual_config, dual_params):
    ids = _ids(pad_from=[11, 6, 2])
    plain = build_model(dual_config).apply({"params": dual_params}, ids)
    for remat in (False, True):
        enc = dual_config.encoder.__class__(**{**dual_config.encoder.__dict__, "scan_layers": True, "remat": remat})
        scan_config = ModelConfig(encoder=enc, head=dual_config.head)
        scan_params = to_model_layout(dual_params, scan_config)
        assert "layers" in scan_params["encoder"] and "layers_0" not in scan_params["encoder"]
        scanned = build_model(scan_config).apply({"params": scan_params}, ids)
        np.testing.assert_allclose(np.asarray(scanned), np.asarray(plain), atol=1e-5, rtol=1e-5)
    # Layout conversions are exact inverses.
    back = to_unscanned_layout(to_scanned_layout(dual_params, dual_config.encoder.num_layers))
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(dual_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_padding_does_not_change_real_positions(dual_config, dual_params):
    from rankgen_jax.models.t5 import T5Encoder

    encoder = T5Encoder(dual_config.encoder)
    short = _ids(batch=2, length=9, seed=3)
    padded = np.concatenate([short, np.zeros((2, 5), np.int32)], axis=1)
    params = {k: v for k, v in dual_params.items() if k != "projection_layer"}
    out_short = encoder.apply({"params": params}, short).last_hidden_state
    out_padded = encoder.apply({"params": params}, padded).last_hidden_state
    np.testing.assert_allclose(np.asarray(out_padded[:, :9]), np.asarray(out_short), atol=1e-5, rtol=1e-5)


def test_dropout_only_with_rng():
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=VOCAB, dropout_rate=0.3), head=HeadConfig())
    params = init_params(config)
    model = build_model(config)
    ids = _ids()
    a = model.apply({"params": params}, ids)
    b = model.apply({"params": params}, ids)
    c = model.apply({"params": params}, ids, rngs={"dropout": jax.random.PRNGKey(1)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_bfloat16_activations_keep_float32_params(dual_config, dual_params):
    enc = dual_config.encoder.__class__(**{**dual_config.encoder.__dict__, "dtype": "bfloat16"})
    config = ModelConfig(encoder=enc, head=HeadConfig("first", -1, False))
    params = init_params(config)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
    from rankgen_jax.models.t5 import T5Encoder

    hidden = T5Encoder(enc).apply({"params": {k: v for k, v in params.items() if k != "projection_layer"}}, _ids())
    assert hidden.last_hidden_state.dtype == jnp.bfloat16
    f32 = T5Encoder(dual_config.encoder).apply(
        {"params": {k: v for k, v in params.items() if k != "projection_layer"}}, _ids()
    )
    # bf16 has ~3 significant digits; the RMS-normed outputs are O(1).
    np.testing.assert_allclose(
        np.asarray(hidden.last_hidden_state, np.float32), np.asarray(f32.last_hidden_state), atol=0.1, rtol=0.1
    )
