"""What every loss shares: its array and function types, and the one record of its facts (`LossSpec`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax

Array = jax.Array
# loss_fn(outputs, batch, loss_params, **options) -> (loss, metrics)
LossFn = Callable[..., tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """One loss's facts: its function, the batch form it reads (models.batch_layout), the model kinds it trains
    (with the reason each other kind is refused, where there is one worth saying), whether it has cross-example
    terms (then gradient accumulation would change it), and its formula in one line for the reference page."""

    fn: LossFn
    batch_form: str
    model_kinds: tuple[str, ...]
    needs_full_batch: bool
    formula: str
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
