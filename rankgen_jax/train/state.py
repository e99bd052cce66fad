"""The train state and its shardings: created already sharded, never first materialised on one device."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rankgen_jax.runtime.partitioning import LogicalRules


@flax.struct.dataclass
class TrainState:
    """Everything a training step reads and writes.

    The optimizer sees {"model": params, "loss": loss_params}: learnable loss
    parameters (a logit scale) train with the model but live outside it, so the
    model's parameter tree stays exactly T5X's.
    """

    step: jax.Array
    params: Any
    loss_params: Any
    opt_state: Any
    rng: jax.Array

    def trainable(self) -> dict:
        return {"model": self.params, "loss": self.loss_params}


def create_state(params, loss_params, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh state at step 0 around given parameters."""
    trainable = {"model": params, "loss": loss_params}
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        loss_params=loss_params,
        opt_state=tx.init(trainable),
        rng=jax.random.key_data(jax.random.PRNGKey(seed)),
    )


def _dict_path(path) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _spec_for_optimizer_leaf(leaf_shape, leaf_path, param_index) -> PartitionSpec:
    """Shard an optimizer-state leaf like the parameter it belongs to.

    Moments with the parameter's shape take its spec; factored moments
    (Adafactor's row/column statistics) take the spec without the reduced
    dimension; anything else (counters, scalars) is replicated.
    """
    keys = _dict_path(leaf_path)
    for n in range(len(keys), 0, -1):
        hit = param_index.get(keys[-n:])
        if hit is None:
            continue
        shape, spec = hit
        spec = tuple(spec) + (None,) * (len(shape) - len(spec))
        if tuple(leaf_shape) == tuple(shape):
            return PartitionSpec(*spec)
        if len(leaf_shape) == len(shape) - 1:
            for dropped in reversed(range(len(shape))):
                if tuple(shape[:dropped]) + tuple(shape[dropped + 1 :]) == tuple(leaf_shape):
                    return PartitionSpec(*(spec[:dropped] + spec[dropped + 1 :]))
        return PartitionSpec()
    return PartitionSpec()


def state_shardings(
    init_fn: Callable[[], TrainState], param_logical_specs, mesh: Mesh, rules: LogicalRules
) -> tuple[TrainState, TrainState]:
    """(abstract state, NamedShardings of the state) for a state built by init_fn.

    param_logical_specs: logical PartitionSpecs of the model params (from the
    model's boxed abstract variables); the optimizer state follows them.
    """
    abstract = jax.eval_shape(init_fn)
    param_mesh_specs = nn.logical_to_mesh(param_logical_specs, list(rules))
    trainable_specs = {"model": param_mesh_specs, "loss": jax.tree_util.tree_map(lambda _: PartitionSpec(), abstract.loss_params)}
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    param_index = {}
    shapes = {"model": abstract.params, "loss": abstract.loss_params}
    for (path, spec), leaf in zip(
        jax.tree_util.tree_leaves_with_path(trainable_specs, is_leaf=is_spec), jax.tree_util.tree_leaves(shapes)
    ):
        param_index[_dict_path(path)] = (leaf.shape, spec)
    opt_specs = jax.tree_util.tree_map_with_path(
        lambda path, leaf: _spec_for_optimizer_leaf(leaf.shape, path, param_index), abstract.opt_state
    )
    specs = TrainState(
        step=PartitionSpec(),
        params=param_mesh_specs,
        loss_params=trainable_specs["loss"],
        opt_state=opt_specs,
        rng=PartitionSpec(),
    )
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=is_spec)
    return abstract, shardings
