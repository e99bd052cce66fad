"""Optimizers and learning-rate schedules for training, built from one gin-configurable config.

The optimizer acts on the trainable tree `{"model": <model params>, "loss":
<learnable loss params, maybe {}>}` (see train/state.py). Layers, outermost
first:

1. non-finite guard (`optax.apply_if_finite`): a step whose gradients hold a
   NaN or Inf is skipped -- zero updates, optimizer state untouched -- and
   counted; `nonfinite_counts` reads the counts (the trainer stops once
   `max_consecutive_nonfinite` steps in a row were skipped);
2. optional global-norm gradient clipping (over model and loss gradients);
3. Adafactor (the RankGen / T5X recipe) or AdamW, with the LR schedule; when
   `loss_params_learning_rate > 0` the `loss` subtree gets its own optimizer of
   the same kind at that constant LR (docs/design/rankgen.md, 'MiniLM demo': a learned logit scale
   barely moves at the model's LR).
"""

from __future__ import annotations

import dataclasses
import math

import gin
import jax
import jax.numpy as jnp
import optax

from rankgen_jax.errors import RankgenError, check_field_types

OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("constant", "linear", "cosine")
DECAYING_SCHEDULES = ("linear", "cosine")

# optax.apply_if_finite gives up and applies a non-finite update after
# `max_consecutive_errors` skipped steps. We want every such step skipped and
# the trainer to stop with a clear message instead, so the limit handed to
# optax is one its saturating int32 counter can never exceed.
_NEVER_GIVE_UP = 2**31 - 1


@gin.configurable
@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer, LR schedule, clipping and non-finite guard settings.

    Defaults are the RankGen recipe (docs/design/rankgen.md, 'RankGen training'): Adafactor, constant LR 2e-3.

    schedule: "constant", "linear" or "cosine"; all start with `warmup_steps` of
      linear warmup from 0. "linear"/"cosine" then decay from `learning_rate`
      to `end_lr_fraction * learning_rate` at the schedule's last step.
    total_steps: that last step. 0 (the default): the run's length,
      TrainerConfig.num_steps (`schedule_for_run`); set it only on purpose, to
      a value the run does not pass (a longer schedule that a run stops
      partway through is allowed, a shorter one is an error).
    weight_decay: AdamW decoupled weight decay, multiplied by the LR (the optax
      and PyTorch convention); applied only to parameters with >= 2 dimensions
      (kernels and embeddings, not layer-norm scales or scalars), and not to
      a BERT pooler (unused by most heads).
    clip_grad_norm: clip gradients to this global norm before the optimizer; 0 = off.
    loss_params_learning_rate: constant LR for the `loss` subtree (e.g. a logit
      scale); 0 = the loss params share the model's optimizer and schedule.
    max_consecutive_nonfinite: the trainer saves and stops after this many
      consecutive skipped (non-finite) steps.
    """

    name: str = "adafactor"
    learning_rate: float = 2e-3
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    end_lr_fraction: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_grad_norm: float = 0.0
    loss_params_learning_rate: float = 0.0
    max_consecutive_nonfinite: int = 10

    def __post_init__(self):
        check_field_types(self)
        if self.name not in OPTIMIZERS:
            raise RankgenError(f"OptimizerConfig.name={self.name!r}: expected one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise RankgenError(f"OptimizerConfig.schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise RankgenError(f"OptimizerConfig.learning_rate must be positive, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise RankgenError(f"OptimizerConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps < 0:
            raise RankgenError(f"OptimizerConfig.total_steps must be >= 0 (0: TrainerConfig.num_steps), "
                               f"got {self.total_steps}")
        if self.total_steps and self.schedule not in DECAYING_SCHEDULES:
            raise RankgenError(f"OptimizerConfig.total_steps={self.total_steps} has no effect with "
                               f"schedule={self.schedule!r}: it is the length of a decaying schedule "
                               f"{DECAYING_SCHEDULES}")
        if self.total_steps and self.total_steps <= self.warmup_steps:
            raise RankgenError(
                f"OptimizerConfig.schedule={self.schedule!r} decays until total_steps, so total_steps must be "
                f"greater than warmup_steps={self.warmup_steps}; got total_steps={self.total_steps}")
        if not 0.0 <= self.end_lr_fraction <= 1.0:
            raise RankgenError(f"OptimizerConfig.end_lr_fraction must be in [0, 1], got {self.end_lr_fraction}")
        for field in ("weight_decay", "clip_grad_norm", "loss_params_learning_rate", "eps"):
            if getattr(self, field) < 0:
                raise RankgenError(f"OptimizerConfig.{field} must be >= 0, got {getattr(self, field)}")
        for field in ("b1", "b2"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise RankgenError(f"OptimizerConfig.{field} must be in [0, 1), got {getattr(self, field)}")
        if self.max_consecutive_nonfinite < 1:
            raise RankgenError(
                f"OptimizerConfig.max_consecutive_nonfinite must be >= 1, got {self.max_consecutive_nonfinite}")


def schedule_for_run(cfg: OptimizerConfig, num_steps: int) -> OptimizerConfig:
    """The config with its schedule's length settled for a run of `num_steps` steps (TrainerConfig.num_steps).

    One number sets a run's length: a decaying schedule ends at num_steps
    unless total_steps was set on purpose, and a total_steps that would leave
    steps after the end of the decay is refused before anything compiles. A
    time budget (TrainerConfig.max_minutes) stops a run early but never
    changes its schedule: the schedule counts steps, so that a resumed run
    follows the same one.
    """
    if cfg.schedule not in DECAYING_SCHEDULES:
        return cfg
    if not cfg.total_steps:
        if num_steps <= cfg.warmup_steps:
            raise RankgenError(
                f"OptimizerConfig.schedule={cfg.schedule!r} decays over TrainerConfig.num_steps={num_steps}, "
                f"which must be greater than OptimizerConfig.warmup_steps={cfg.warmup_steps}")
        return dataclasses.replace(cfg, total_steps=num_steps)
    if cfg.total_steps < num_steps:
        end = cfg.learning_rate * cfg.end_lr_fraction
        raise RankgenError(
            f"OptimizerConfig.total_steps={cfg.total_steps} ends the {cfg.schedule} decay before "
            f"TrainerConfig.num_steps={num_steps}: steps {cfg.total_steps}-{num_steps} would train at the end "
            f"learning rate {end:g}; leave OptimizerConfig.total_steps unset (the schedule then ends at "
            "TrainerConfig.num_steps) or make it at least TrainerConfig.num_steps")
    return cfg


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The model's LR as a function of the optimizer step (linear warmup, then constant/linear/cosine).

    A decaying schedule needs its length: pass the config through schedule_for_run first.
    """
    if cfg.schedule in DECAYING_SCHEDULES and not cfg.total_steps:
        raise RankgenError(f"OptimizerConfig.schedule={cfg.schedule!r} has no length yet: settle it with "
                           "schedule_for_run(config, TrainerConfig.num_steps)")
    lr = cfg.learning_rate
    decay_steps = cfg.total_steps - cfg.warmup_steps
    if cfg.schedule == "constant":
        after = optax.constant_schedule(lr)
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(lr, lr * cfg.end_lr_fraction, decay_steps)
    else:
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=cfg.end_lr_fraction)
    if cfg.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, lr, cfg.warmup_steps)
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def _matrices_only(params):
    """Weight-decay mask: True for kernels/embeddings, False for vectors and scalars.

    A BERT pooler is kept for round trips and most heads leave it unused: its
    gradient is zero, and decay alone would shrink the weights that get
    exported. The cross encoder's `pooler` head trains it, undecayed like a bias.
    """
    def decays(path, p):
        unused = any(isinstance(k, jax.tree_util.DictKey) and k.key == "pooler" for k in path)
        return jnp.ndim(p) >= 2 and not unused

    return jax.tree_util.tree_map_with_path(decays, params)


def _adafactor(
    learning_rate: optax.ScalarOrSchedule, multiply_by_parameter_scale: bool
) -> optax.GradientTransformation:
    """Adafactor configured as T5X's default (t5x/adafactor.py), mapped onto optax's arguments.

    T5X                               optax.adafactor
    factored=True                     factored=True: row/column second-moment
                                      vectors for a leaf whose two largest dims
                                      are >= min_dim_size_to_factor=128 (T5X's
                                      default too); full moments otherwise.
    decay_rate=0.8                    decay_rate=0.8: beta2_t = 1 - t^-0.8.
    step_offset=0                     decay_offset=0.
    clipping_threshold=1.0            clipping_threshold=1.0: update RMS capped
                                      at 1 per leaf, before the LR.
    multiply_by_parameter_scale=True  multiply_by_parameter_scale=True: the step
                                      is LR * max(RMS(param), epsilon2).
    beta1=None (no momentum)          momentum=None.
    epsilon1=1e-30                    eps=1e-30 (added to grad^2).
    epsilon2=1e-3                     not an adafactor argument: it is the
                                      default `min_scale=1e-3` of the
                                      optax.scale_by_param_block_rms it uses.
    weight_decay_rate=None            weight_decay_rate=None.

    One difference: T5X chooses the factored dims from logical axis rules,
    optax from the two largest dims. They agree for 2-D kernels; for a stacked
    (scanned) kernel optax factors its two largest dims, which are the
    per-layer dims unless there are more layers than d_model.
    """
    return optax.adafactor(
        learning_rate=learning_rate,
        min_dim_size_to_factor=128,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        clipping_threshold=1.0,
        momentum=None,
        weight_decay_rate=None,
        eps=1e-30,
        factored=True,
    )


def _base_optimizer(cfg: OptimizerConfig, learning_rate: optax.ScalarOrSchedule, *, for_loss_params: bool):
    """Adafactor or AdamW at `learning_rate`.

    For the separately-trained loss params the LR is meant as an absolute step
    size, so Adafactor does not scale it by the parameter's RMS, and AdamW does
    not decay them (decaying a logit scale towards 0 is never wanted).
    """
    if cfg.name == "adafactor":
        return _adafactor(learning_rate, multiply_by_parameter_scale=not for_loss_params)
    return optax.adamw(
        learning_rate=learning_rate,
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=0.0 if for_loss_params else cfg.weight_decay,
        mask=_matrices_only,
    )


def _top_level_labels(params):
    """Label every leaf with its top-level key ("model" or "loss")."""
    if not isinstance(params, dict) or set(params) != {"model", "loss"}:
        keys = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise RankgenError(
            "loss_params_learning_rate > 0 needs the optimizer to act on {'model': ..., 'loss': ...}; "
            f"got {keys}")
    return {key: jax.tree_util.tree_map(lambda _, k=key: k, sub) for key, sub in params.items()}


def make_optimizer(cfg: OptimizerConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer for `{"model": ..., "loss": ...}` and the model's LR schedule (for logging).

    Skipped (non-finite) steps do not advance the optimizer's own step count,
    so after k skips the schedule inside the optimizer lags the trainer's step
    by k; log `schedule(count)` with the count you trust.
    """
    schedule = make_schedule(cfg)
    model_tx = _base_optimizer(cfg, schedule, for_loss_params=False)
    if cfg.loss_params_learning_rate > 0:
        loss_tx = _base_optimizer(cfg, cfg.loss_params_learning_rate, for_loss_params=True)
        tx = optax.partition({"model": model_tx, "loss": loss_tx}, _top_level_labels)
    else:
        tx = model_tx
    if cfg.clip_grad_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_grad_norm), tx)
    # The guard is outermost so it sees the raw gradients and, on a bad step,
    # leaves every inner state (moments, counts, schedule step) unchanged.
    tx = optax.apply_if_finite(tx, max_consecutive_errors=_NEVER_GIVE_UP)
    return tx, schedule


def _guard_state(opt_state) -> optax.ApplyIfFiniteState:
    """The non-finite guard's state inside `opt_state` (outermost, or nested by a caller's wrapper)."""
    if isinstance(opt_state, optax.ApplyIfFiniteState):
        return opt_state
    is_guard = lambda x: isinstance(x, optax.ApplyIfFiniteState)  # noqa: E731
    for node in jax.tree_util.tree_leaves(opt_state, is_leaf=is_guard):
        if is_guard(node):
            return node
    raise RankgenError("optimizer state has no non-finite guard: build the optimizer with make_optimizer")


def nonfinite_counts(opt_state) -> tuple[jax.Array, jax.Array]:
    """(consecutive, total) steps skipped because their gradients were not finite."""
    guard = _guard_state(opt_state)
    return guard.notfinite_count, guard.total_notfinite
