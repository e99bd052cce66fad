"""The step functions of a mesh: train_step / eval_step jitted once with explicit shardings, and the batches they take.

`train`, `rankgen-jax compile` (tpu/aot.py), the benchmarks and the step tests
all build their steps here, so each runs exactly the program training runs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
from jax.sharding import NamedSharding

from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.models.factory import abstract_variables, build_model, init_variables
from rankgen_jax.runtime import partitioning
from rankgen_jax.train.optimizers import nonfinite_counts
from rankgen_jax.train.state import TrainState, create_state, state_shardings
from rankgen_jax.train.step import StepOptions, eval_step, train_step


@dataclasses.dataclass(frozen=True)
class StepFunctions:
    """What the loop needs: a sharded init, the jitted steps, and the shardings they use."""

    init: Callable[[], TrainState]
    train_step: Callable
    eval_step: Callable
    abstract_state: TrainState
    shardings: TrainState
    batch_sharding: NamedSharding


def build_step_functions(
    model_config: ModelConfig, options: StepOptions, tx, schedule, loss_params: dict, mesh, rules, seed: int
) -> StepFunctions:
    """Jit train_step / eval_step once for this mesh, with explicit shardings and a donated state.

    Call the returned functions under `jax.set_mesh(mesh)` and the logical axis rules.
    """
    model = build_model(model_config)
    param_specs = nn.get_partition_spec(abstract_variables(model_config))["params"]

    def random_state():
        params = nn.unbox(init_variables(model_config, jax.random.PRNGKey(seed)))["params"]
        return create_state(params, loss_params, tx, seed)

    abstract_state, shardings = state_shardings(random_state, param_specs, mesh, rules)
    batch_sharding = partitioning.batch_sharding(mesh)
    step = jax.jit(
        functools.partial(_counted_train_step, model=model, options=options, tx=tx, schedule=schedule,
                          use_dropout=model_config.encoder.dropout_rate > 0),
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, partitioning.replicated(mesh)),
        donate_argnums=(0,),
    )
    evaluate = jax.jit(
        functools.partial(eval_step, model=model, options=options),
        in_shardings=(shardings, batch_sharding),
        out_shardings=partitioning.replicated(mesh),
    )
    return StepFunctions(jax.jit(random_state, out_shardings=shardings), step, evaluate, abstract_state, shardings,
                         batch_sharding)


def _counted_train_step(state: TrainState, batch: dict, **static) -> tuple[TrainState, dict]:
    """train_step, its metrics joined by `nonfinite_skipped`: steps skipped so far for NaN/Inf gradients."""
    state, metrics = train_step(state, batch, **static)
    _, total = nonfinite_counts(state.opt_state)
    return state, {**metrics, "nonfinite_skipped": total}


def put_batch(local: dict, sharding: NamedSharding, batch_size: int) -> dict:
    """Global arrays from this host's rows (one host: the whole batch)."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (batch_size,) + v.shape[1:]) for k, v in local.items()
    }
