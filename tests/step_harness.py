"""Shared by the step tests: run a few sharded train steps and compare trees at fp32 tolerance."""

import flax.linen as nn
import jax
import numpy as np

from rankgen_jax.losses import registry as losses
from rankgen_jax.runtime import partitioning
from rankgen_jax.models.factory import build_model
from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
from rankgen_jax.train.step import StepOptions, compute_grads
from rankgen_jax.train.compiled import build_step_functions

TOL = 1e-5


def assert_trees_close(a, b, tol=TOL):
    """Every tensor within tol of the reference, relative to the tensor's scale (fp32 sums in another order)."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(1.0, float(np.abs(y).max()))
        diff = float(np.abs(x - y).max())
        assert diff <= tol * scale, f"{jax.tree_util.keystr(path)}: max abs diff {diff:.3g} > {tol} x {scale:.3g}"


def run_steps(config, options: StepOptions, batch_fn, mesh, rules_name: str, num_steps: int = 3):
    """(losses per step, grads of step 0, params after, loss params after, final state) on `mesh`."""
    rules = partitioning.rules_by_name(rules_name)
    # Adam divides by sqrt(v) + eps: with the default eps 1e-8 a gradient entry that is ~0
    # turns fp32 summation-order noise (1e-7) into a full-size update. eps 1e-3 keeps the
    # comparison about the step, not about amplified rounding noise.
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3, eps=1e-3, clip_grad_norm=1.0))
    loss_params = losses.init_loss_params(options.loss_name, **dict(options.loss_options))
    fns = build_step_functions(config, options, tx, schedule, loss_params, mesh, rules, seed=0)
    step_losses = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = fns.init()
        grads = jax.jit(
            lambda s, b: compute_grads(build_model(config), options, s.params, s.loss_params, b, None)[2],
            in_shardings=(fns.shardings, fns.batch_sharding),
        )(state, jax.device_put(batch_fn(0), fns.batch_sharding))
        for i in range(num_steps):
            batch = jax.device_put(batch_fn(i), fns.batch_sharding)
            state, metrics = fns.train_step(state, batch)
            step_losses.append(float(metrics["loss"]))
    return step_losses, jax.device_get(grads), jax.device_get(state.params), jax.device_get(state.loss_params), state
