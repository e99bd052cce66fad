"""Matryoshka representation learning around any loss of a dual encoder's vectors.

Kusupati et al. (2022) train the first d dimensions of one vector to work on their own for each d of a nested
list: the loss is sum_d w_d L(z_{1:d}). sentence-transformers' MatryoshkaLoss does the same around a retrieval
loss: each dimension's loss is the wrapped loss on every vector cut to its first d components, weighted and
summed (weights 1 by default). Here the wrapped loss is any of the registry's dual-encoder losses (in-batch,
per-example, list and distillation losses alike): it sees the cut vectors and never knows. A model whose head
L2-normalises its vectors gets each cut vector normalised again, so that every dimension trains the cosine it
will be used with (the cosine sentence-transformers' losses compute); otherwise the cut is all there is, as a
dot-product model is then used.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses.spec import Array, LossFn


@dataclasses.dataclass(frozen=True)
class Matryoshka:
    """The dimensions trained (largest first), their weights, and whether each cut vector is normalised again."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]
    normalize: bool = False

    def __post_init__(self):
        if not self.dims or len(self.weights) != len(self.dims):
            raise RankgenError(f"Matryoshka needs dimensions and one weight each, got {self.dims} and {self.weights}")
        if any(d < 1 for d in self.dims) or list(self.dims) != sorted(set(self.dims), reverse=True):
            raise RankgenError(f"Matryoshka dimensions must be positive, distinct and largest first, got {self.dims}")
        if any(w < 0 for w in self.weights) or not any(w > 0 for w in self.weights):
            raise RankgenError(f"Matryoshka weights must be >= 0, one of them > 0, got {self.weights}")


def cut_vectors(vectors_xD: Array, dim: int, normalize: bool) -> Array:
    """The first `dim` components of each vector (the last axis), normalised again when `normalize`."""
    cut = vectors_xD[..., :dim]
    if not normalize:
        return cut
    norm = jnp.sqrt(jnp.sum(jnp.square(cut.astype(jnp.float32)), axis=-1, keepdims=True))
    return (cut / jnp.maximum(norm, 1e-12)).astype(cut.dtype)


def matryoshka_loss(loss_fn: LossFn, spec: Matryoshka) -> LossFn:
    """sum_d w_d loss_fn(outputs cut to d dimensions); metrics: the largest dimension's, and `loss_dim<d>` each."""

    def loss(outputs: dict[str, Array], batch: dict[str, Array], loss_params: dict[str, Array], **options):
        total, metrics = 0.0, {}
        for dim, weight in zip(spec.dims, spec.weights):
            value, dim_metrics = loss_fn({name: cut_vectors(v, dim, spec.normalize) for name, v in outputs.items()},
                                         batch, loss_params, **options)
            total = total + weight * value
            if not metrics:
                metrics = dict(dim_metrics)
            metrics[f"loss_dim{dim}"] = value
        metrics["loss"] = total
        return total, metrics

    return loss
