"""The shared train step: sharded == single device, GradCache == plain backprop, accumulation == full batch."""

import jax
import flax.linen as nn
import numpy as np
import pytest

from rankgen_jax import partitioning
from rankgen_jax.configs import HeadConfig, ModelConfig, t5_config
from rankgen_jax.data.triples import DataConfig, RandomTriples
from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import init_loss_params
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.optimizers import OptimizerConfig, make_optimizer
from rankgen_jax.train_step import StepOptions, compute_grads
from rankgen_jax.trainer import build_step_functions

TOL = 1e-5
CONFIG = ModelConfig(encoder=t5_config("tiny", vocab_size=128), head=HeadConfig("first", -1, False))
DATA = DataConfig(source="random", batch_size=16, prefix_length=12, continuation_length=8, vocab_size=128, seed=3)
LOSS_OPTIONS = (("learn_logit_scale", True), ("logit_scale", 2.0), ("margin", 0.1))


def _batch(index=0, data=DATA):
    return RandomTriples(data).batch(index)


def _assert_trees_close(a, b, tol=TOL):
    """Every tensor within tol of the reference, relative to the tensor's scale (fp32 sums in another order)."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(1.0, float(np.abs(y).max()))
        diff = float(np.abs(x - y).max())
        assert diff <= tol * scale, f"{jax.tree_util.keystr(path)}: max abs diff {diff:.3g} > {tol} x {scale:.3g}"


def _run_steps(mesh, rules_name, num_steps=3):
    rules = partitioning.rules_by_name(rules_name)
    options = StepOptions("in_batch_softmax", LOSS_OPTIONS)
    # Adam divides by sqrt(v) + eps: with the default eps 1e-8 a gradient entry that is ~0
    # turns fp32 summation-order noise (1e-7) into a full-size update. eps 1e-3 keeps the
    # comparison about the step, not about amplified rounding noise.
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3, eps=1e-3, clip_grad_norm=1.0))
    loss_params = init_loss_params("in_batch_softmax", **dict(LOSS_OPTIONS))
    fns = build_step_functions(CONFIG, options, tx, schedule, loss_params, mesh, rules, seed=0)
    losses = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = fns.init()
        grads = jax.jit(
            lambda s, b: compute_grads(build_model(CONFIG), options, s.params, s.loss_params, b, None)[2],
            in_shardings=(fns.shardings, fns.batch_sharding),
        )(state, jax.device_put(_batch(0), fns.batch_sharding))
        for i in range(num_steps):
            batch = jax.device_put(_batch(i), fns.batch_sharding)
            assert len(batch["query_ids"].sharding.device_set) == mesh.shape["replica"] * mesh.shape["data"] * mesh.shape["model"]
            state, metrics = fns.train_step(state, batch)
            losses.append(float(metrics["loss"]))
    return losses, jax.device_get(grads), jax.device_get(state.params), jax.device_get(state.loss_params), state


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
    _assert_trees_close(grads, ref_grads)
    _assert_trees_close(params, ref_params)
    _assert_trees_close(loss_params, ref_loss_params)
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
    _assert_trees_close(grads, ref_grads)
    assert np.abs(np.asarray(ref_grads[1]["log_logit_scale"])) > 0  # the learned scale gets a gradient


def test_grad_cache_sharded_equals_plain_single(plain_reference):
    params, loss_params = plain_reference
    batch = _batch(2)
    ref_loss, _, ref_grads = _grads(StepOptions("in_batch_softmax", LOSS_OPTIONS), params, loss_params, batch)
    mesh = partitioning.make_mesh(8, 1)
    options = StepOptions("in_batch_softmax", LOSS_OPTIONS, num_chunks=2)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(partitioning.STANDARD_RULES)):
        sharded = jax.device_put(batch, partitioning.NamedSharding(mesh, partitioning.PartitionSpec("data")))
        loss, _, grads = _grads(options, params, loss_params, sharded)
    assert abs(loss - ref_loss) <= TOL * max(1.0, abs(ref_loss))
    _assert_trees_close(grads, ref_grads)


@pytest.mark.parametrize("accum_steps", [2, 4])
def test_accumulation_equals_full_batch_for_per_example_loss(plain_reference, accum_steps):
    params, _ = plain_reference
    batch = _batch(3)
    ref = _grads(StepOptions("per_example_softmax", (("logit_scale", 3.0),)), params, {}, batch)
    got = _grads(StepOptions("per_example_softmax", (("logit_scale", 3.0),), accum_steps=accum_steps), params, {}, batch)
    assert abs(got[0] - ref[0]) <= TOL * max(1.0, abs(ref[0]))
    _assert_trees_close(got[2], ref[2])


def test_accumulation_refused_for_in_batch_loss():
    with pytest.raises(RankgenError, match="GradCache"):
        StepOptions("in_batch_softmax", accum_steps=2)
    with pytest.raises(RankgenError, match="not both"):
        StepOptions("per_example_softmax", num_chunks=2, accum_steps=2)
