"""The one training step for every model and loss, and its eval twin.

`train_step(state, batch, ...)` is a pure module-level function; the trainer
binds the static parts (model, loss, optimizer, gradient mode) with
functools.partial and jits it once with explicit shardings and a donated state.

Gradient modes:
- plain: one forward/backward over the whole global batch;
- GradCache (num_chunks > 1): embed every chunk without keeping activations,
  take d loss / d embeddings on the full global batch (so every example still
  sees every in-batch negative), then back-propagate chunk by chunk in a
  lax.scan; activation memory scales with the chunk, not the batch;
- accumulation (accum_steps > 1): average gradients of microbatches; exact only
  for losses without cross-example terms, which is checked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import registry as losses
from rankgen_jax.losses.matryoshka import Matryoshka, matryoshka_loss
from rankgen_jax.models import batch_layout
from rankgen_jax.models.batch_layout import Tower
from rankgen_jax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """Static settings of a step (hashable, bound before jit).

    towers: the model calls the model kind makes (models.batch_layout.towers); a
      step runs those whose ids are in its batch.
    """

    loss_name: str = "in_batch_softmax"
    loss_options: tuple[tuple[str, Any], ...] = ()
    num_chunks: int = 1
    accum_steps: int = 1
    towers: tuple[Tower, ...] = batch_layout.DEFAULT_TOWERS
    matryoshka: Matryoshka | None = None

    def __post_init__(self):
        if not self.towers:
            raise RankgenError("StepOptions.towers is empty: pass the model kind's (models.batch_layout.towers)")
        if self.num_chunks < 1 or self.accum_steps < 1:
            raise RankgenError("num_chunks and accum_steps must be >= 1")
        if self.num_chunks > 1 and self.accum_steps > 1:
            raise RankgenError("choose GradCache (num_chunks) or gradient accumulation (accum_steps), not both")
        if self.accum_steps > 1 and losses.needs_full_batch(self.loss_name):
            raise RankgenError(
                f"loss {self.loss_name!r} compares examples across the batch: gradient accumulation would drop "
                "in-batch negatives; use GradCache (num_chunks) instead"
            )


def _towers(options: StepOptions, batch: dict) -> list[Tower]:
    return [t for t in options.towers if t.ids_key in batch]


def _inputs(tower: Tower, batch: dict) -> dict:
    """The model's keyword inputs for one tower: ids, and token types when the batch has them."""
    inputs = {"input_ids": batch[tower.ids_key]}
    if tower.type_ids_key in batch:
        inputs["token_type_ids"] = batch[tower.type_ids_key]
    return inputs


def _embed(model: nn.Module, params, tower: Tower, inputs: dict, rng) -> jax.Array:
    rngs = {"dropout": rng} if rng is not None else {}
    kwargs = {"tower": tower.tower} if tower.tower is not None else {}
    return model.apply({"params": params}, **inputs, **kwargs, rngs=rngs)


@dataclasses.dataclass(frozen=True)
class TowerGroup:
    """Towers that run as one model call: same tower, batch size, sequence length and inputs.

    A RankGen step's positives and negatives (both [B, L] continuations) make one
    call of 2B sequences: fewer, larger matmuls, which CPUs and TPUs both prefer.
    index: the first member's place in the batch layout, which seeds its dropout.
    """

    towers: tuple[Tower, ...]
    index: int


def _tower_groups(options: StepOptions, batch: dict) -> list[TowerGroup]:
    groups: dict[tuple, list[tuple[int, Tower]]] = {}
    for i, t in enumerate(_towers(options, batch)):
        ids = batch[t.ids_key]
        key = (t.tower, ids.shape[0], ids.shape[-1], t.type_ids_key in batch)
        groups.setdefault(key, []).append((i, t))
    return [TowerGroup(tuple(t for _, t in members), members[0][0]) for members in groups.values()]


def _group_inputs(group: TowerGroup, batch: dict) -> dict:
    """The model inputs of each tower of a group, keyed by output name."""
    return {t.output: _inputs(t, batch) for t in group.towers}


def _embed_group(model: nn.Module, params, group: TowerGroup, inputs: dict, rng) -> dict:
    """{output: vectors} of a group's towers from one model call.

    inputs: {output: model inputs} as `_group_inputs` gives (or chunks of them).
    Members are joined on axis 1 ([B, n, L] each), so the batch axis and its
    sharding stay first and no example moves between devices.
    """
    if len(group.towers) == 1:
        (tower,) = group.towers
        return {tower.output: _embed(model, params, tower, inputs[tower.output], rng)}
    members = [inputs[t.output] for t in group.towers]
    batch, length = members[0]["input_ids"].shape[0], members[0]["input_ids"].shape[-1]
    joined = {k: jnp.concatenate([m[k].reshape(batch, -1, length) for m in members], axis=1) for k in members[0]}
    vectors = _embed(model, params, group.towers[0], joined, rng)
    outputs, start = {}, 0
    for tower, member in zip(group.towers, members):
        lead = member["input_ids"].shape[:-1]
        count = math.prod(lead[1:])
        outputs[tower.output] = vectors[:, start:start + count].reshape(*lead, *vectors.shape[2:])
        start += count
    return outputs


# The fold-in key of the microbatches' streams: tower groups fold in their own small indices, so a key no group
# index reaches keeps a microbatch's stream apart from every tower's.
MICROBATCH_STREAM = 99


def _tower_rng(rng, tower_index: int, chunk_index=0):
    return None if rng is None else jax.random.fold_in(jax.random.fold_in(rng, tower_index), chunk_index)


def _embed_batch(model: nn.Module, params, options: StepOptions, batch: dict, rng) -> dict:
    """{output: vectors} of every tower in the batch, one model call per group."""
    outputs = {}
    for group in _tower_groups(options, batch):
        outputs.update(_embed_group(model, params, group, _group_inputs(group, batch), _tower_rng(rng, group.index)))
    return outputs


def _loss(options: StepOptions, outputs, batch, loss_params):
    loss_fn = losses.get_loss(options.loss_name)
    if options.matryoshka is not None:
        loss_fn = matryoshka_loss(loss_fn, options.matryoshka)
    return loss_fn(outputs, batch, loss_params, **dict(options.loss_options))


def _split(x: jax.Array, n: int) -> jax.Array:
    """[B, ...] -> [n, B/n, ...] taking every n-th row, so each chunk spans all data shards."""
    chunked = x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
    return nn.with_logical_constraint(chunked, (None, "batch") + (None,) * (x.ndim - 1))


def _merge(x: jax.Array) -> jax.Array:
    """Inverse of _split: [n, B/n, ...] -> [B, ...] in the original row order."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def plain_grads(model, options: StepOptions, params, loss_params, batch, rng):
    """(loss, metrics, (model grads, loss-param grads)) from one pass over the batch."""

    def objective(params, loss_params):
        return _loss(options, _embed_batch(model, params, options, batch, rng), batch, loss_params)

    (loss, metrics), grads = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(params, loss_params)
    return loss, metrics, grads


def grad_cache_grads(model, options: StepOptions, params, loss_params, batch, rng):
    """GradCache: same loss and gradients as plain_grads, activation memory of one chunk.

    The backward scan re-runs each chunk's forward inside its own iteration
    (a vjp per chunk), so no activations outlive the chunk that made them: the
    same recomputation jax.checkpoint would do, without a differentiated scan.
    """
    n = options.num_chunks
    groups = _tower_groups(options, batch)
    chunk_rngs = jnp.arange(n)
    split_inputs = [jax.tree_util.tree_map(lambda x: _split(x, n), _group_inputs(g, batch)) for g in groups]

    def embed_chunks(group, inputs):
        return jax.lax.map(
            lambda xs: _embed_group(model, params, group, xs[0], _tower_rng(rng, group.index, xs[1])),
            (inputs, chunk_rngs),
        )

    outputs = {}
    for group, inputs in zip(groups, split_inputs):
        outputs.update(jax.tree_util.tree_map(_merge, jax.lax.stop_gradient(embed_chunks(group, inputs))))
    (loss, metrics), (d_outputs, loss_grads) = jax.value_and_grad(
        lambda outs, lp: _loss(options, outs, batch, lp), argnums=(0, 1), has_aux=True
    )(outputs, loss_params)

    def backprop_chunk(group):
        def body(grads_acc, xs):
            inputs, d_output, chunk = xs
            _, vjp = jax.vjp(lambda p: _embed_group(model, p, group, inputs, _tower_rng(rng, group.index, chunk)), params)
            return jax.tree_util.tree_map(jnp.add, grads_acc, vjp(d_output)[0]), None

        return body

    model_grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    for group, inputs in zip(groups, split_inputs):
        d_chunks = {t.output: _split(d_outputs[t.output], n) for t in group.towers}
        model_grads, _ = jax.lax.scan(backprop_chunk(group), model_grads, (inputs, d_chunks, chunk_rngs))
    return loss, metrics, (model_grads, loss_grads)


def accumulated_grads(model, options: StepOptions, params, loss_params, batch, rng):
    """Mean of microbatch gradients and metrics (for losses that are means over examples)."""
    n = options.accum_steps
    micro = jax.tree_util.tree_map(lambda x: _split(x, n), batch)

    def body(carry, xs):
        micro_batch, index = xs
        loss, metrics, grads = plain_grads(model, options, params, loss_params, micro_batch, _tower_rng(rng, MICROBATCH_STREAM, index))
        return jax.tree_util.tree_map(jnp.add, carry, (loss, metrics, grads)), None

    zeros = jax.tree_util.tree_map(
        jnp.zeros_like,
        jax.eval_shape(lambda: plain_grads(model, options, params, loss_params, jax.tree_util.tree_map(lambda x: x[0], micro), rng)),
    )
    total, _ = jax.lax.scan(body, zeros, (micro, jnp.arange(n)))
    return jax.tree_util.tree_map(lambda x: x / n, total)


def compute_grads(model, options: StepOptions, params, loss_params, batch, rng):
    """Dispatch on the gradient mode; all return (loss, metrics, (model grads, loss grads))."""
    if options.num_chunks > 1:
        return grad_cache_grads(model, options, params, loss_params, batch, rng)
    if options.accum_steps > 1:
        return accumulated_grads(model, options, params, loss_params, batch, rng)
    return plain_grads(model, options, params, loss_params, batch, rng)


def train_step(
    state: TrainState,
    batch: dict,
    *,
    model: nn.Module,
    options: StepOptions,
    tx: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    use_dropout: bool,
) -> tuple[TrainState, dict]:
    """One optimizer update on a global batch; returns the new state and scalar metrics."""
    base_rng = jax.random.wrap_key_data(state.rng)
    step_rng = jax.random.fold_in(base_rng, state.step) if use_dropout else None
    loss, metrics, (model_grads, loss_grads) = compute_grads(model, options, state.params, state.loss_params, batch, step_rng)
    grads = {"model": model_grads, "loss": loss_grads}
    updates, opt_state = tx.update(grads, state.opt_state, state.trainable())
    trainable = optax.apply_updates(state.trainable(), updates)
    new_state = state.replace(
        step=state.step + 1, params=trainable["model"], loss_params=trainable["loss"], opt_state=opt_state
    )
    metrics = {
        **metrics,
        "loss": loss,
        "grad_norm": optax.global_norm(grads),
        "learning_rate": schedule(state.step),
    }
    return new_state, metrics


def eval_step(state: TrainState, batch: dict, *, model: nn.Module, options: StepOptions) -> dict:
    """Loss and metrics on a batch without updating anything (no dropout)."""
    loss, metrics = _loss(options, _embed_batch(model, state.params, options, batch, None), batch, state.loss_params)
    return {**metrics, "loss": loss}
