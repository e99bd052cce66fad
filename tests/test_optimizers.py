"""Optimizers: schedules, Adafactor state layout, AdamW maths, clipping, the non-finite guard, loss-param LR."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer, nonfinite_counts, schedule_for_run


def _jitted_update(tx):
    """One jitted optimizer step, as the trainer runs it: (grads, state, params) -> (params, state)."""

    @jax.jit
    def step(grads, opt_state, params):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def _find(tree, cls):
    """All nodes of type `cls` in an optimizer state."""
    is_cls = lambda x: isinstance(x, cls)  # noqa: E731
    return [n for n in jax.tree_util.tree_leaves(tree, is_leaf=is_cls) if is_cls(n)]


def _adam_state(opt_state) -> optax.ScaleByAdamState:
    (state,) = _find(opt_state, optax.ScaleByAdamState)
    return state


# --- schedules -------------------------------------------------------------------------------


def test_constant_schedule_with_warmup():
    _, sched = make_optimizer(OptimizerConfig(learning_rate=2e-3, warmup_steps=10))
    np.testing.assert_allclose([float(sched(s)) for s in (0, 5, 10, 1000, 100_000)], [0.0, 1e-3, 2e-3, 2e-3, 2e-3],
                               rtol=1e-6)
    # The RankGen default: constant 2e-3 from step 0.
    _, default = make_optimizer(OptimizerConfig())
    assert float(default(0)) == pytest.approx(2e-3) and float(default(99_999)) == pytest.approx(2e-3)


def test_linear_schedule():
    cfg = OptimizerConfig(name="adamw", learning_rate=1.0, schedule="linear", warmup_steps=10, total_steps=110,
                          end_lr_fraction=0.1)
    _, sched = make_optimizer(cfg)
    # Warmup to 1.0 at step 10, then linear to 0.1 at step 110, flat afterwards.
    got = [float(sched(s)) for s in (0, 5, 10, 60, 110, 500)]
    np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], rtol=1e-6, atol=1e-7)


def test_cosine_schedule():
    cfg = OptimizerConfig(name="adamw", learning_rate=1.0, schedule="cosine", warmup_steps=10, total_steps=110,
                          end_lr_fraction=0.1)
    _, sched = make_optimizer(cfg)
    cosine = lambda frac: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))  # noqa: E731
    got = [float(sched(s)) for s in (5, 10, 35, 60, 110, 500)]
    want = [0.5, 1.0, cosine(0.25), cosine(0.5), 0.1, 0.1]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_decay_without_warmup_starts_at_peak():
    _, sched = make_optimizer(OptimizerConfig(learning_rate=0.5, schedule="linear", total_steps=100))
    np.testing.assert_allclose([float(sched(s)) for s in (0, 50, 100)], [0.5, 0.25, 0.0], atol=1e-7)


# --- Adafactor --------------------------------------------------------------------------------


def test_adafactor_factors_matrices_and_keeps_vectors_full():
    tx, _ = make_optimizer(OptimizerConfig())
    params = {"model": {"kernel": jnp.ones((256, 512)), "scale": jnp.ones((512,))}, "loss": {}}
    (state,) = _find(tx.init(params), optax.FactoredState)
    kernel = {k: getattr(state, k)["model"]["kernel"].shape for k in ("v_row", "v_col", "v")}
    scale = {k: getattr(state, k)["model"]["scale"].shape for k in ("v_row", "v_col", "v")}
    # Row and column statistics, no full [256, 512] second moment ((1,) is optax's placeholder).
    assert kernel == {"v_row": (256,), "v_col": (512,), "v": (1,)}
    assert scale == {"v_row": (1,), "v_col": (1,), "v": (512,)}
    # No momentum: nothing in the state has the kernel's full shape.
    assert all(leaf.shape != (256, 512) for leaf in jax.tree_util.tree_leaves(tx.init(params)))


def test_adafactor_first_step_scales_by_param_rms_with_floor():
    # Step 1: beta2 = 1 - 1^-0.8 = 0, so the update is g / sqrt(g^2 + 1e-30) = sign(g), whose RMS is 1
    # (no clipping), times LR, times max(RMS(param), 1e-3).
    lr = 0.01
    tx, _ = make_optimizer(OptimizerConfig(learning_rate=lr))
    params = {"model": {"big": jnp.full((4,), 2.0), "zero": jnp.zeros((4,))}, "loss": {}}
    grads = {"model": {"big": jnp.array([1.0, -2.0, 3.0, -4.0]), "zero": jnp.array([0.5, 0.5, -0.5, -0.5])},
             "loss": {}}
    new, _ = _jitted_update(tx)(grads, tx.init(params), params)
    np.testing.assert_allclose(new["model"]["big"] - 2.0, -lr * 2.0 * np.sign(grads["model"]["big"]), rtol=1e-5)
    np.testing.assert_allclose(new["model"]["zero"], -lr * 1e-3 * np.sign(grads["model"]["zero"]), rtol=1e-5)


# --- AdamW -----------------------------------------------------------------------------------


def _numpy_adamw(params, grads_fn, steps, lr, b1, b2, eps, wd):
    """Reference AdamW: bias-corrected moments, weight decay decoupled from them, scaled by the LR."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    params = {k: p.copy() for k, p in params.items()}
    for t in range(1, steps + 1):
        grads = grads_fn(params)
        for k, p in params.items():
            g = grads[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1**t)
            v_hat = v[k] / (1 - b2**t)
            decay = wd * p if p.ndim >= 2 else 0.0  # kernels only
            params[k] = p - lr * (m_hat / (np.sqrt(v_hat) + eps) + decay)
    return params


def test_adamw_matches_numpy_reference():
    cfg = OptimizerConfig(name="adamw", learning_rate=0.05, weight_decay=0.1, b1=0.9, b2=0.99, eps=1e-8)
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(2, 3)).astype(np.float32), "b": rng.normal(size=(3,)).astype(np.float32)}
    target = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in init.items()}
    grads_fn = lambda p: {k: p[k] - target[k] for k in p}  # noqa: E731  # d/dp of 0.5 * |p - target|^2

    tx, _ = make_optimizer(cfg)
    step = _jitted_update(tx)
    params = {"model": {k: jnp.asarray(v) for k, v in init.items()}, "loss": {}}
    opt_state = tx.init(params)
    for _ in range(3):  # several steps, so the bias correction's step dependence is exercised
        grads = {"model": grads_fn(params["model"]), "loss": {}}
        params, opt_state = step(grads, opt_state, params)

    want = _numpy_adamw(init, grads_fn, 3, cfg.learning_rate, cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay)
    for k in init:
        np.testing.assert_allclose(np.asarray(params["model"][k]), want[k], atol=1e-6, rtol=0)
    # The vector really was left undecayed and the matrix decayed (the reference would differ otherwise).
    no_decay = _numpy_adamw(init, grads_fn, 3, cfg.learning_rate, cfg.b1, cfg.b2, cfg.eps, 0.0)
    assert not np.allclose(no_decay["w"], want["w"], atol=1e-4)


def test_clipping_caps_global_norm():
    # AdamW's first moment after one step is (1 - b1) * the (clipped) gradient.
    params = {"model": {"w": jnp.zeros((3, 4)), "b": jnp.zeros((4,))}, "loss": {"scale": jnp.zeros(())}}
    big = jax.tree_util.tree_map(lambda p: jnp.full(p.shape, 3.0), params)  # global norm 3 * sqrt(17)
    small = jax.tree_util.tree_map(lambda p: jnp.full(p.shape, 0.01), params)

    def first_moment_norm(cfg, grads):
        tx, _ = make_optimizer(cfg)
        _, state = _jitted_update(tx)(grads, tx.init(params), params)
        return float(optax.tree.norm(_adam_state(state).mu)) / (1 - cfg.b1)

    clipped = OptimizerConfig(name="adamw", learning_rate=1e-3, clip_grad_norm=1.0)
    assert first_moment_norm(clipped, big) == pytest.approx(1.0, rel=1e-5)
    assert first_moment_norm(clipped, small) == pytest.approx(0.01 * math.sqrt(17), rel=1e-5)
    unclipped = OptimizerConfig(name="adamw", learning_rate=1e-3)
    assert first_moment_norm(unclipped, big) == pytest.approx(3.0 * math.sqrt(17), rel=1e-5)


# --- non-finite guard ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_nonfinite_step_is_skipped_and_counted(name):
    cfg = OptimizerConfig(name=name, learning_rate=0.1, max_consecutive_nonfinite=2)
    tx, _ = make_optimizer(cfg)
    step = _jitted_update(tx)
    params = {"model": {"w": jnp.ones((2, 3))}, "loss": {"scale": jnp.array(1.0)}}
    good = {"model": {"w": jnp.full((2, 3), 0.5)}, "loss": {"scale": jnp.array(0.5)}}
    bad = {"model": {"w": jnp.full((2, 3), 0.5).at[0, 1].set(jnp.nan)}, "loss": {"scale": jnp.array(jnp.inf)}}

    params, state = step(good, tx.init(params), params)
    before_params, before_state = params, state

    params, state = step(bad, state, params)
    # Params, moments and the inner step count are exactly as before the bad step.
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, before_params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, state.inner_state, before_state.inner_state)
    assert [int(x) for x in nonfinite_counts(state)] == [1, 1]

    params, state = step(bad, state, params)
    assert [int(x) for x in nonfinite_counts(state)] == [2, 2]
    # The trainer's stop at max_consecutive_nonfinite: tests/test_fault_injection.py.

    params, state = step(good, state, params)
    assert [int(x) for x in nonfinite_counts(state)] == [0, 2]  # consecutive resets, total stays
    assert not np.array_equal(params["model"]["w"], before_params["model"]["w"])
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(params))


def test_guard_never_gives_up():
    # optax.apply_if_finite applies the update after max_consecutive_errors skips; ours never does.
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.1, max_consecutive_nonfinite=1))
    step = _jitted_update(tx)
    params = {"model": {"w": jnp.ones((3,))}, "loss": {}}
    bad = {"model": {"w": jnp.full((3,), jnp.nan)}, "loss": {}}
    state = tx.init(params)
    for _ in range(5):
        params, state = step(bad, state, params)
    np.testing.assert_array_equal(params["model"]["w"], np.ones(3))
    assert [int(x) for x in nonfinite_counts(state)] == [5, 5]


# --- loss params ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_loss_params_get_their_own_learning_rate(name):
    # Model LR is 0 at step 0 (warmup); the loss params move by their own constant LR regardless.
    cfg = OptimizerConfig(name=name, learning_rate=1e-3, warmup_steps=100, loss_params_learning_rate=0.1,
                          weight_decay=0.5)
    tx, _ = make_optimizer(cfg)
    params = {"model": {"w": jnp.ones((2, 2))}, "loss": {"logit_scale": jnp.array(3.0)}}
    grads = {"model": {"w": jnp.ones((2, 2))}, "loss": {"logit_scale": jnp.array(-2.0)}}
    new, _ = _jitted_update(tx)(grads, tx.init(params), params)
    np.testing.assert_array_equal(new["model"]["w"], np.ones((2, 2)))
    # First step of either optimizer moves by LR * sign(-grad): absolute step, no param scaling or decay.
    assert float(new["loss"]["logit_scale"]) == pytest.approx(3.1, abs=1e-5)


def test_shared_learning_rate_when_loss_lr_is_zero():
    tx, sched = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.01))
    params = {"model": {"w": jnp.ones((2,))}, "loss": {"logit_scale": jnp.array(3.0)}}
    grads = {"model": {"w": jnp.ones((2,))}, "loss": {"logit_scale": jnp.array(-2.0)}}
    new, _ = _jitted_update(tx)(grads, tx.init(params), params)
    np.testing.assert_allclose(new["model"]["w"], 1.0 - 0.01, rtol=1e-6)
    assert float(new["loss"]["logit_scale"]) == pytest.approx(3.01, abs=1e-6)


def test_separate_loss_lr_works_with_empty_loss_tree():
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.01, loss_params_learning_rate=0.1))
    params = {"model": {"w": jnp.ones((2,))}, "loss": {}}
    new, state = _jitted_update(tx)({"model": {"w": jnp.ones((2,))}, "loss": {}}, tx.init(params), params)
    np.testing.assert_allclose(new["model"]["w"], 0.99, rtol=1e-6)
    assert new["loss"] == {}
    assert [int(x) for x in nonfinite_counts(state)] == [0, 0]


def test_separate_loss_lr_needs_model_and_loss_keys():
    tx, _ = make_optimizer(OptimizerConfig(loss_params_learning_rate=0.1))
    with pytest.raises(RankgenError, match="'model'"):
        tx.init({"w": jnp.ones((2,))})


# --- config validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="sgd"), "name='sgd'"),
        (dict(schedule="step"), "schedule='step'"),
        (dict(schedule="linear", warmup_steps=100, total_steps=100), "total_steps"),
        (dict(schedule="constant", total_steps=100), "no effect with schedule='constant'"),
        (dict(schedule="cosine", total_steps=-1), "total_steps must be >= 0"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(end_lr_fraction=1.5), "end_lr_fraction"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(clip_grad_norm=-1.0), "clip_grad_norm"),
        (dict(max_consecutive_nonfinite=0), "max_consecutive_nonfinite"),
    ],
)
def test_invalid_configs_raise(kwargs, match):
    with pytest.raises(RankgenError, match=match):
        OptimizerConfig(**kwargs)


def test_nonfinite_counts_needs_guarded_state():
    with pytest.raises(RankgenError, match="non-finite guard"):
        nonfinite_counts(optax.sgd(0.1).init({"w": jnp.ones(2)}))


def test_adamw_does_not_decay_an_unused_pooler():
    cfg = OptimizerConfig(name="adamw", learning_rate=0.1, weight_decay=0.5)
    tx, _ = make_optimizer(cfg)
    params = {"model": {"pooler": {"dense": {"kernel": jnp.ones((4, 4))}}, "w": {"kernel": jnp.ones((4, 4))}}, "loss": {}}
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(np.asarray(new["model"]["pooler"]["dense"]["kernel"]), 1.0)
    np.testing.assert_allclose(np.asarray(new["model"]["w"]["kernel"]), 1.0 - 0.1 * 0.5, rtol=1e-6)


# --- the schedule's length: one number for a run ------------------------------------------------


def test_decaying_schedule_ends_at_the_runs_last_step():
    run = schedule_for_run(OptimizerConfig(schedule="linear", learning_rate=1.0, warmup_steps=10), num_steps=110)
    assert run.total_steps == 110
    _, sched = make_optimizer(run)
    np.testing.assert_allclose([float(sched(s)) for s in (10, 60, 109, 110)], [1.0, 0.5, 0.01, 0.0], atol=1e-6)
    # A constant schedule has no length; a longer schedule set on purpose is kept (the run stops partway).
    assert schedule_for_run(OptimizerConfig(), 500) == OptimizerConfig()
    longer = OptimizerConfig(schedule="cosine", total_steps=1000)
    assert schedule_for_run(longer, 500) == longer


def test_a_schedule_that_ends_before_the_run_is_refused():
    with pytest.raises(RankgenError) as e:
        schedule_for_run(OptimizerConfig(schedule="linear", learning_rate=1e-3, total_steps=200), num_steps=500)
    assert "OptimizerConfig.total_steps=200" in str(e.value) and "TrainerConfig.num_steps=500" in str(e.value)
    with pytest.raises(RankgenError, match="TrainerConfig.num_steps=10, which must be greater than "
                                           "OptimizerConfig.warmup_steps=10"):
        schedule_for_run(OptimizerConfig(schedule="cosine", warmup_steps=10), num_steps=10)
    with pytest.raises(RankgenError, match="schedule_for_run"):
        make_optimizer(OptimizerConfig(schedule="linear"))
