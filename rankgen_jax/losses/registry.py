"""Every loss by name (one `LossSpec` each): the function, the batch form it reads, the model kinds it trains,
whether it compares examples across the batch, its formula, options and parameters.

All losses share one signature, `loss_fn(outputs, batch, loss_params, **options)
-> (loss, metrics)`, so the train step picks one by name and never knows which.
"""

from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import listwise
from rankgen_jax.losses.contrastive import in_batch_softmax_loss, per_example_softmax_loss
from rankgen_jax.losses.spec import Array, LossFn, LossSpec
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES

_BOTH = ("dual_encoder", "cross_encoder")
_TRIPLES_ONLY = ("it compares separate query and candidate vectors of triples, and a cross encoder reads each "
                 "pair together: train it with a list loss (listwise_softmax, listmle, ...)")

# Every loss, registered here only. Formulas: s scores, T temperature, y labels, t teacher scores
# (docs/design/losses.md has the details and pitfalls; docs/reference/losses.md is generated from this table).
# needs_full_batch: a micro-batch would see fewer negatives, so the step refuses gradient accumulation (GradCache
# is exact); every list loss is a sum of per-query terms.
LOSS_SPECS: dict[str, LossSpec] = {
    "in_batch_softmax": LossSpec(
        in_batch_softmax_loss, TRIPLES, ("dual_encoder",), needs_full_batch=True,
        formula="-mean_i log softmax_j(c (s_ij - m [j = i]))_i, s_ij = q_i . d_j over the global batch's "
                "B positives and B*K negatives; columns with the row's gold text masked",
        refused={"cross_encoder": _TRIPLES_ONLY}),
    "per_example_softmax": LossSpec(
        per_example_softmax_loss, TRIPLES, ("dual_encoder",), needs_full_batch=False,
        formula="-mean_i log softmax_j(c (s_ij - m [j = 0]))_0 over example i's own positive (j = 0) and its K "
                "negatives",
        refused={"cross_encoder": _TRIPLES_ONLY}),
    "listwise_softmax": LossSpec(
        listwise.listwise_softmax_loss, CANDIDATE_LISTS, _BOTH, needs_full_batch=False,
        formula="-mean_b sum_c (y_bc / sum_c' y_bc') log softmax_c(s_bc / T), rows with a positive label"),
    "listmle": LossSpec(
        listwise.listmle_loss, CANDIDATE_LISTS, _BOTH, needs_full_batch=False,
        formula="-mean_b sum_i w_i [s_(i) / T - logsumexp_{j >= i} s_(j) / T], candidates sorted by label "
                "(w = 1, or PListMLE's (2^(n-i+1) - 1) / (2^n - 1))"),
    "kl_distillation": LossSpec(
        listwise.kl_distillation_loss, CANDIDATE_LISTS, _BOTH, needs_full_batch=False,
        formula="mean_b KL(softmax(t_b / T) || softmax(scale s_b / T)) (times T^2 with t_squared)"),
    "lambdarank_mrr": LossSpec(
        listwise.lambdarank_mrr_loss, CANDIDATE_LISTS, _BOTH, needs_full_batch=False,
        formula="sum over pairs y_i > y_j of |1/pi_i - 1/pi_j| softplus(s_j - s_i) / #pairs, pi the student's "
                "own ranks"),
    "sigmoid_bce": LossSpec(
        listwise.sigmoid_bce_loss, CANDIDATE_LISTS, ("cross_encoder",), needs_full_batch=False,
        formula="mean over valid entries of BCE(sigmoid(s / T), y)",
        refused={"dual_encoder": "it reads a cross encoder's per-pair logits; a dual encoder trains with "
                                 "in_batch_softmax or a list loss (listwise_softmax, ...)"}),
    "margin_mse": LossSpec(
        listwise.margin_mse_loss, CANDIDATE_LISTS, _BOTH, needs_full_batch=False,
        formula="mean_{b, j >= 1} ((s_b0 - s_bj) - (t_b0 - t_bj))^2, candidate 0 the positive"),
    "multi_perspective_bce": LossSpec(
        listwise.multi_perspective_bce_loss, CANDIDATE_LISTS, ("dual_encoder",), needs_full_batch=False,
        formula="mean_{b, n} BCE(sigmoid(2 cos(a_bn, b_bn) / tau), y_bn), one projection per perspective n",
        refused={"cross_encoder": "it compares a bi-encoder's per-perspective vectors; a cross encoder's "
                                  "per-perspective logits train with sigmoid_bce"}),
}


def loss_spec(name: str) -> LossSpec:
    """The spec registered under `name`."""
    if name not in LOSS_SPECS:
        raise RankgenError(f"unknown loss {name!r}: expected one of {sorted(LOSS_SPECS)}")
    return LOSS_SPECS[name]


def get_loss(name: str) -> LossFn:
    """The loss function registered under `name`."""
    return loss_spec(name).fn


def batch_form(name: str) -> str:
    """The batch form the named loss reads: TRIPLES or CANDIDATE_LISTS."""
    return loss_spec(name).batch_form


def model_kinds(name: str) -> tuple[str, ...]:
    """The model kinds the named loss trains."""
    return loss_spec(name).model_kinds


def check_model_kind(name: str, model_kind: str) -> None:
    """Raise a RankgenError, with the reason, when the named loss does not train a model of this kind."""
    if model_kind not in model_kinds(name):
        reason = loss_spec(name).refused.get(model_kind, f"it trains {' and '.join(model_kinds(name))} models")
        raise RankgenError(f"loss {name!r} does not train a {model_kind}: {reason} (LossConfig.name)")


def needs_full_batch(name: str) -> bool:
    """Whether the loss compares examples across the batch (unknown names count as yes)."""
    return LOSS_SPECS[name].needs_full_batch if name in LOSS_SPECS else True


def loss_option_names(name: str) -> list[str]:
    """The keyword options the named loss accepts."""
    signature = inspect.signature(get_loss(name))
    return [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def check_loss_options(name: str, options: dict) -> None:
    """Raise a RankgenError naming any option the loss does not accept (catches config typos)."""
    unknown = sorted(set(options) - set(loss_option_names(name)))
    if unknown:
        raise RankgenError(f"loss {name!r} got unknown options {unknown}: expected some of {loss_option_names(name)}")


def init_loss_params(name: str, **options) -> dict[str, Array]:
    """Initial learnable parameters of a loss: `log_logit_scale` when learning the scale, else empty."""
    check_loss_options(name, options)
    if not options.get("learn_logit_scale", False):
        return {}
    scale = float(options.get("logit_scale", 1.0))
    if not scale > 0 or not math.isfinite(scale):
        raise RankgenError(f"logit_scale must be a positive finite number to learn its log, got {scale}")
    return {"log_logit_scale": jnp.asarray(np.log(scale), jnp.float32)}
