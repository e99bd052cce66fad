"""Parameters sharded over a fake 8-device mesh by logical axis rules give the single-device outputs."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rankgen_jax.runtime import partitioning
from rankgen_jax.models.configs import HeadConfig, ModelConfig, t5_config
from rankgen_jax.models.factory import abstract_variables, build_model, init_params


@pytest.fixture(scope="module")
def setup():
    # Sizes divisible by the model axis so every rule can actually shard.
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=96), head=HeadConfig("mean", -1, True))
    params = init_params(config, seed=2)
    ids = np.random.RandomState(0).randint(3, 96, (8, 12)).astype(np.int32)
    ids[3, 7:] = 0
    expected = np.asarray(build_model(config).apply({"params": params}, ids))
    return config, params, ids, expected


def test_eight_devices_available():
    assert jax.device_count() == 8


@pytest.mark.parametrize("data,model,rules", [(8, 1, "standard"), (4, 2, "standard"), (2, 4, "fsdp")])
def test_sharded_forward_equals_single_device(setup, data, model, rules):
    config, params, ids, expected = setup
    mesh = partitioning.make_mesh(data, model)
    rule_list = partitioning.rules_by_name(rules)
    shardings = partitioning.logical_shardings(abstract_variables(config), mesh, rule_list)["params"]
    sharded_params = partitioning.device_put_tree(params, shardings)
    # Something really is split: the MLP kernel over `model`, or `embed` over `data` with FSDP.
    wi = sharded_params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert len(wi.sharding.device_set) == data * model
    if model > 1:
        assert wi.addressable_shards[0].data.shape[1] == wi.shape[1] // model
    if rules == "fsdp":
        assert wi.addressable_shards[0].data.shape[0] == wi.shape[0] // data
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    apply = jax.jit(
        lambda p, x: build_model(config).apply({"params": p}, x),
        in_shardings=(shardings, batch_sharding),
        out_shardings=batch_sharding,
    )
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rule_list)):
        got = apply(sharded_params, jax.device_put(ids, batch_sharding))
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=1e-5)


def test_mesh_mismatch_is_a_clear_error():
    from rankgen_jax.errors import RankgenError

    with pytest.raises(RankgenError, match="does not match the 8 available devices"):
        partitioning.make_mesh(3, 2)
