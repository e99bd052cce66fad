"""Every loss by name: the function, the batch form it reads, whether it compares examples across the batch,
its options and parameters.

All losses share one signature, `loss_fn(outputs, batch, loss_params, **options)
-> (loss, metrics)`, so the train step picks one by name and never knows which.
"""

from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses.contrastive import Array, LossFn, in_batch_softmax_loss, per_example_softmax_loss
from rankgen_jax.losses.listwise import LIST_LOSSES
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES

LOSSES: dict[str, LossFn] = {
    "in_batch_softmax": in_batch_softmax_loss,
    "per_example_softmax": per_example_softmax_loss,
    **LIST_LOSSES,
}

# The batch form each loss reads (see rankgen_jax.models.batch_layout): a positive and
# negatives per query, or scored candidate lists.
LOSS_BATCH_FORMS: dict[str, str] = {
    "in_batch_softmax": TRIPLES,
    "per_example_softmax": TRIPLES,
    **{name: CANDIDATE_LISTS for name in LIST_LOSSES},
}

_BOTH = ("dual_encoder", "cross_encoder")
# The model kinds each loss trains (models.configs.MODEL_KINDS); a model of another kind is refused before anything
# compiles, with the reason below.
LOSS_MODEL_KINDS: dict[str, tuple[str, ...]] = {
    "in_batch_softmax": ("dual_encoder",),
    "per_example_softmax": ("dual_encoder",),
    "listwise_softmax": _BOTH,
    "listmle": _BOTH,
    "kl_distillation": _BOTH,
    "lambdarank_mrr": _BOTH,
    "margin_mse": _BOTH,
    "sigmoid_bce": ("cross_encoder",),
    "multi_perspective_bce": ("dual_encoder",),
}
_TRIPLES_ONLY = ("it compares separate query and candidate vectors of triples, and a cross encoder reads each "
                 "pair together: train it with a list loss (listwise_softmax, listmle, ...)")
REFUSED_MODEL_KINDS: dict[tuple[str, str], str] = {
    ("in_batch_softmax", "cross_encoder"): _TRIPLES_ONLY,
    ("per_example_softmax", "cross_encoder"): _TRIPLES_ONLY,
    ("sigmoid_bce", "dual_encoder"): "it reads a cross encoder's per-pair logits; a dual encoder trains with "
                                     "in_batch_softmax or a list loss (listwise_softmax, ...)",
    ("multi_perspective_bce", "cross_encoder"): "it compares a bi-encoder's per-perspective vectors; a cross "
                                                "encoder's per-perspective logits train with sigmoid_bce",
}

# Each loss in one line (s: scores, T: temperature, y: labels, t: teacher scores; docs/design/losses.md has the
# details and pitfalls). The reference page docs/reference/losses.md is generated from this table.
LOSS_FORMULAS: dict[str, str] = {
    "in_batch_softmax": "-mean_i log softmax_j(c (s_ij - m [j = i]))_i, s_ij = q_i . d_j over the global batch's "
                        "B positives and B*K negatives; columns with the row's gold text masked",
    "per_example_softmax": "-mean_i log softmax_j(c (s_ij - m [j = 0]))_0 over example i's own positive (j = 0) "
                           "and its K negatives",
    "listwise_softmax": "-mean_b sum_c (y_bc / sum_c' y_bc') log softmax_c(s_bc / T), rows with a positive label",
    "listmle": "-mean_b sum_i w_i [s_(i) / T - logsumexp_{j >= i} s_(j) / T], candidates sorted by label "
               "(w = 1, or PListMLE's (2^(n-i+1) - 1) / (2^n - 1))",
    "kl_distillation": "mean_b KL(softmax(t_b / T) || softmax(scale s_b / T)) (times T^2 with t_squared)",
    "lambdarank_mrr": "sum over pairs y_i > y_j of |1/pi_i - 1/pi_j| softplus(s_j - s_i) / #pairs, "
                      "pi the student's own ranks",
    "sigmoid_bce": "mean over valid entries of BCE(sigmoid(s / T), y)",
    "margin_mse": "mean_{b, j >= 1} ((s_b0 - s_bj) - (t_b0 - t_bj))^2, candidate 0 the positive",
    "multi_perspective_bce": "mean_{b, n} BCE(sigmoid(2 cos(a_bn, b_bn) / tau), y_bn), one projection per "
                             "perspective n",
}

# Losses with cross-example terms: a micro-batch sees fewer negatives, so the
# step refuses gradient accumulation for these (GradCache is exact). Every list
# loss is a sum of per-query terms.
LOSS_NEEDS_FULL_BATCH: dict[str, bool] = {name: name == "in_batch_softmax" for name in LOSSES}


def get_loss(name: str) -> LossFn:
    """The loss function registered under `name`."""
    if name not in LOSSES:
        raise RankgenError(f"unknown loss {name!r}: expected one of {sorted(LOSSES)}")
    return LOSSES[name]


def batch_form(name: str) -> str:
    """The batch form the named loss reads: TRIPLES or CANDIDATE_LISTS."""
    get_loss(name)
    if name not in LOSS_BATCH_FORMS:
        raise RankgenError(f"loss {name!r} declares no batch form: add it to LOSS_BATCH_FORMS")
    return LOSS_BATCH_FORMS[name]


def model_kinds(name: str) -> tuple[str, ...]:
    """The model kinds the named loss trains."""
    get_loss(name)
    if name not in LOSS_MODEL_KINDS:
        raise RankgenError(f"loss {name!r} declares no model kinds: add it to LOSS_MODEL_KINDS")
    return LOSS_MODEL_KINDS[name]


def check_model_kind(name: str, model_kind: str) -> None:
    """Raise a RankgenError, with the reason, when the named loss does not train a model of this kind."""
    if model_kind not in model_kinds(name):
        reason = REFUSED_MODEL_KINDS.get((name, model_kind), f"it trains {' and '.join(model_kinds(name))} models")
        raise RankgenError(f"loss {name!r} does not train a {model_kind}: {reason} (LossConfig.name)")


def needs_full_batch(name: str) -> bool:
    """Whether the loss compares examples across the batch (unknown names count as yes)."""
    return LOSS_NEEDS_FULL_BATCH.get(name, True)


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
