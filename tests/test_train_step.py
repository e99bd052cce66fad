"""The shared train step: sharded == single device, GradCache == plain backprop, accumulation == full batch."""

import jax
import flax.linen as nn
import numpy as np
import pytest

from rankgen_jax.runtime import partitioning
from rankgen_jax.models.configs import HeadConfig, ModelConfig, t5_config
from rankgen_jax.data.source_configs import DataConfig, RandomData
from rankgen_jax.data.sources import RandomTriples
from rankgen_jax.errors import RankgenError
from rankgen_jax.losses.registry import init_loss_params
from rankgen_jax.ops import dispatch
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.train.step import StepOptions, _embed, _embed_group, _group_inputs, _inputs, _tower_groups, compute_grads
from step_harness import TOL, assert_trees_close, run_steps

CONFIG = ModelConfig(encoder=t5_config("tiny", vocab_size=128), head=HeadConfig("first", -1, False))
DATA = DataConfig(RandomData(continuation_length=8, vocab_size=128), batch_size=16, prefix_length=12, seed=3)
LOSS_OPTIONS = (("learn_logit_scale", True), ("logit_scale", 2.0), ("margin", 0.1))


def _batch(index=0, data=DATA):
    return RandomTriples(data).batch(index)


def _run_steps(mesh, rules_name, num_steps=3):
    return run_steps(CONFIG, StepOptions("in_batch_softmax", LOSS_OPTIONS), _batch, mesh, rules_name, num_steps)


@pytest.fixture(scope="module")
def single_device_run():
    return _run_steps(partitioning.make_mesh(1, 1, devices=jax.devices()[:1]), "standard")


@pytest.mark.parametrize(
    "replica,data,model,rules",
    [(1, 8, 1, "standard"), (1, 4, 2, "standard"), (1, 4, 2, "fsdp"), (2, 2, 2, "standard")],
)
def test_sharded_steps_equal_single_device(single_device_run, replica, data, model, rules):
    losses, grads, params, loss_params, state = _run_steps(partitioning.make_mesh(data, model, replica=replica), rules)
    ref_losses, ref_grads, ref_params, ref_loss_params, _ = single_device_run
    np.testing.assert_allclose(losses, ref_losses, atol=TOL, rtol=TOL)
    assert losses[0] != losses[-1]  # the params really changed
    assert_trees_close(grads, ref_grads)
    assert_trees_close(params, ref_params)
    assert_trees_close(loss_params, ref_loss_params)
    # The state really is sharded as the rules say.
    wi = state.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert len(wi.sharding.device_set) == 8
    if rules == "fsdp":
        assert wi.addressable_shards[0].data.shape[0] == wi.shape[0] // data


@pytest.fixture(scope="module")
def plain_reference():
    params = init_params(CONFIG, seed=1)
    loss_params = init_loss_params("in_batch_softmax", **dict(LOSS_OPTIONS))
    return params, loss_params


def _grads(options, params, loss_params, batch):
    fn = jax.jit(lambda p, lp, b: compute_grads(build_model(CONFIG), options, p, lp, b, None))
    loss, metrics, grads = fn(params, loss_params, batch)
    return float(loss), jax.device_get(metrics), jax.device_get(grads)


@pytest.mark.parametrize("num_chunks", [2, 4, 8])
def test_grad_cache_equals_plain_backprop(plain_reference, num_chunks):
    params, loss_params = plain_reference
    batch = _batch(1)
    ref_loss, ref_metrics, ref_grads = _grads(StepOptions("in_batch_softmax", LOSS_OPTIONS), params, loss_params, batch)
    loss, metrics, grads = _grads(StepOptions("in_batch_softmax", LOSS_OPTIONS, num_chunks=num_chunks), params, loss_params, batch)
    assert abs(loss - ref_loss) <= TOL * max(1.0, abs(ref_loss))
    assert abs(metrics["accuracy"] - ref_metrics["accuracy"]) < TOL
    assert_trees_close(grads, ref_grads)
    assert np.abs(np.asarray(ref_grads[1]["log_logit_scale"])) > 0  # the learned scale gets a gradient


def test_grad_cache_sharded_equals_plain_single(plain_reference, monkeypatch):
    params, loss_params = plain_reference
    batch = _batch(2)
    # The sharded step runs XLA's implementations (the CPU plug-in's kernels have no sharding
    # rule), so the reference does too: this test is about sharding and GradCache. The
    # kernels against XLA are test_attention.py's and test_cpu_kernels.py's; float32
    # rounding of the two adds up to the tolerance here in the first layer's gradients.
    monkeypatch.setattr(dispatch, "active_kernels", lambda: None)
    ref_loss, _, ref_grads = _grads(StepOptions("in_batch_softmax", LOSS_OPTIONS), params, loss_params, batch)
    mesh = partitioning.make_mesh(8, 1)
    options = StepOptions("in_batch_softmax", LOSS_OPTIONS, num_chunks=2)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(partitioning.STANDARD_RULES)):
        sharded = jax.device_put(batch, partitioning.NamedSharding(mesh, partitioning.PartitionSpec("data")))
        loss, _, grads = _grads(options, params, loss_params, sharded)
    assert abs(loss - ref_loss) <= TOL * max(1.0, abs(ref_loss))
    assert_trees_close(grads, ref_grads)


@pytest.mark.parametrize("accum_steps", [2, 4])
def test_accumulation_equals_full_batch_for_per_example_loss(plain_reference, accum_steps):
    params, _ = plain_reference
    batch = _batch(3)
    ref = _grads(StepOptions("per_example_softmax", (("logit_scale", 3.0),)), params, {}, batch)
    got = _grads(StepOptions("per_example_softmax", (("logit_scale", 3.0),), accum_steps=accum_steps), params, {}, batch)
    assert abs(got[0] - ref[0]) <= TOL * max(1.0, abs(ref[0]))
    assert_trees_close(got[2], ref[2])


def test_accumulation_refused_for_in_batch_loss():
    with pytest.raises(RankgenError, match="GradCache"):
        StepOptions("in_batch_softmax", accum_steps=2)
    with pytest.raises(RankgenError, match="not both"):
        StepOptions("per_example_softmax", num_chunks=2, accum_steps=2)
    with pytest.raises(RankgenError, match="StepOptions.towers is empty"):
        StepOptions(towers=())


@pytest.mark.parametrize("negatives", [None, 3])
def test_towers_of_one_length_share_one_model_call_with_the_same_vectors(plain_reference, negatives):
    """Positives and negatives ([B, L] or [B, K, L]) run as one call; each tower's vectors are what its own call gives."""
    params, _ = plain_reference
    batch = dict(_batch(4))
    if negatives:
        batch["negative_ids"] = np.stack([RandomTriples(DATA).batch(5 + i)["negative_ids"] for i in range(negatives)], 1)
    groups = _tower_groups(StepOptions(), batch)
    assert [[t.output for t in g.towers] for g in groups] == [["query"], ["positive", "negative"]]
    model = build_model(CONFIG)
    merged = jax.jit(lambda p, b: _embed_group(model, p, groups[1], _group_inputs(groups[1], b), None))(params, batch)
    for tower in groups[1].towers:
        alone = jax.jit(lambda p, b, t=tower: _embed(model, p, t, _inputs(t, b), None))(params, batch)
        assert merged[tower.output].shape == batch[tower.ids_key].shape[:-1] + (CONFIG.encoder.d_model,)
        np.testing.assert_allclose(merged[tower.output], alone, atol=TOL, rtol=TOL)
    # A tower of another length is a group of its own.
    batch["negative_ids"] = np.asarray(batch["negative_ids"])[..., :-1]
    assert len(_tower_groups(StepOptions(), batch)) == 3
