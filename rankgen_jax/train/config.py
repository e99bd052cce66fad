"""The trainer's gin-configurable settings: the loop and mesh (TrainerConfig) and the loss (LossConfig)."""

from __future__ import annotations

import dataclasses

import gin

from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.losses import registry as losses
from rankgen_jax.losses.matryoshka import Matryoshka
from rankgen_jax.models.configs import BertConfig, ModelConfig, T5Config


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Loop, mesh and gradient-mode settings.

    num_chunks > 1: GradCache over that many chunks; accum_steps > 1: gradient
    accumulation (losses without cross-example terms only).
    init_checkpoint: a rankgen_jax checkpoint (from `import`) to start from,
      local or on a bucket (gs://...);
      its encoder (T5 or BERT family, whatever gin's ModelConfig.encoder is)
      is used as saved (dropout included) except for the runtime fields
      (dropout_rate, dtype, remat, scan_layers) the gin config binds and the
      fields in encoder_overrides (e.g. {'dropout_rate': 0.0, 'remat': True,
      'dtype': 'bfloat16'}); other encoder bindings must agree with it. The
      gin ModelConfig supplies the head and towers
      when the checkpoint is a bare encoder, is of another kind than gin's
      (e.g. a ranker started from a retriever), or init_encoder_only is set.
    num_steps: the run's length, and the length of a decaying learning-rate
      schedule (OptimizerConfig.total_steps left unset). max_minutes stops a
      run early but never changes its schedule.
    """

    num_steps: int = 100  # the run's length in optimizer steps
    log_every: int = 10  # train metrics to metrics.jsonl / TensorBoard every this many steps
    eval_every: int = 0  # held-out loss every this many steps (and at the start and end); 0 = never
    eval_batches: int = 2  # batches of the eval source per evaluation
    checkpoint_every: int = 100  # save every this many steps (and at the end, on SIGTERM or the time budget)
    keep_checkpoints: int = 3  # the newest this many saved steps are kept
    async_checkpoints: bool = True  # write checkpoints while training goes on
    seed: int = 0  # parameter init and dropout
    init_checkpoint: str = ""
    init_encoder_only: bool = False  # take only the encoder of init_checkpoint; the head comes from gin
    encoder_overrides: dict = dataclasses.field(default_factory=dict)
    mesh_data: int = -1  # devices on the `data` mesh axis (-1: the rest)
    mesh_model: int = 1  # devices on the `model` mesh axis
    mesh_replica: int = 1  # slices on the `replica` axis (data parallel over the data-centre network)
    axis_rules: str = "standard"  # "standard" (T5X) or "fsdp" (parameters and optimizer state also split over data)
    num_chunks: int = 1  # > 1: GradCache over that many chunks of the global batch
    accum_steps: int = 1  # > 1: gradient accumulation (losses without cross-example terms only)
    profile_start_step: int = -1  # >= 0: a jax.profiler trace from this step (WORKDIR/profile/)
    profile_num_steps: int = 3  # steps the trace covers
    # Wall-clock budget: stop (and save) after this many minutes; 0 = no limit.
    max_minutes: float = 0.0
    # Multi-host slices: "auto" joins jax.distributed when the environment is one host of many.
    distributed: str = "auto"

    def __post_init__(self):
        check_field_types(self)
        for name in ("num_steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_batches",
                     "num_chunks", "accum_steps", "profile_num_steps"):
            if getattr(self, name) < 1:
                raise RankgenError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "max_minutes"):
            if getattr(self, name) < 0:
                raise RankgenError(f"TrainerConfig.{name} must be >= 0, got {getattr(self, name)}")
        known = {f.name for config in (T5Config, BertConfig) for f in dataclasses.fields(config)}
        unknown = sorted(set(self.encoder_overrides) - known)
        if unknown:
            raise RankgenError(f"TrainerConfig.encoder_overrides: unknown encoder field(s) {unknown}")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Which loss, with its options (see rankgen_jax.losses.registry)."""

    name: str = "in_batch_softmax"
    logit_scale: float = 1.0
    learn_logit_scale: bool = False
    margin: float = 0.0
    mask_duplicates: bool = True
    # List and distillation losses (rankgen_jax.losses.listwise).
    temperature: float = 1.0
    t_squared: bool = False
    position_weighting: bool = False
    tau: float = 0.5
    # lambdarank_mrr's student ranks: "list" (its ranking of each list at the step) or "retrieval"
    # (batch["student_ranks"], from the list the student retrieved).
    rank_source: str = "list"
    # Matryoshka representation learning (losses/matryoshka.py): the loss also on each vector's first d
    # dimensions for each d here (largest first, the model's own dimension included if it is to be trained),
    # weighted by matryoshka_weights (() = 1 each). () trains the full vectors only.
    matryoshka_dims: tuple[int, ...] = ()
    matryoshka_weights: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "matryoshka_dims", tuple(self.matryoshka_dims))
        object.__setattr__(self, "matryoshka_weights", tuple(float(w) for w in self.matryoshka_weights))
        check_field_types(self)
        if self.matryoshka_weights and not self.matryoshka_dims:
            raise RankgenError("LossConfig.matryoshka_weights weigh matryoshka_dims, which are not given")
        if self.matryoshka_dims:
            self.matryoshka(normalize=False)

    def matryoshka(self, normalize: bool) -> Matryoshka | None:
        """The Matryoshka wrapping of the loss (None without matryoshka_dims); `normalize`: the model's head
        normalises its vectors."""
        if not self.matryoshka_dims:
            return None
        weights = self.matryoshka_weights or (1.0,) * len(self.matryoshka_dims)
        try:
            return Matryoshka(self.matryoshka_dims, weights, normalize)
        except RankgenError as e:
            raise RankgenError(f"LossConfig.matryoshka_dims / matryoshka_weights: {e}") from None

    def options(self) -> dict:
        every = {k: v for k, v in dataclasses.asdict(self).items() if k != "name"}
        accepted = losses.loss_option_names(self.name)
        return {k: v for k, v in every.items() if k in accepted}


def matryoshka_for(loss: LossConfig, model_config: ModelConfig) -> Matryoshka | None:
    """The loss's Matryoshka wrapping for this model (None without LossConfig.matryoshka_dims), checked before
    anything compiles: a dual encoder with one vector per text, dimensions it has."""
    spec = loss.matryoshka(normalize=bool(model_config.head is not None and model_config.head.l2_normalize))
    if spec is None:
        return None
    if model_config.kind != "dual_encoder" or model_config.num_scores != 1:
        raise RankgenError(f"LossConfig.matryoshka_dims cut a dual encoder's vectors; this run trains a "
                           f"{model_config.kind}" + (f" with {model_config.num_scores} vectors per text"
                                                     if model_config.num_scores != 1 else ""))
    dim = model_config.head.output_dim(model_config.encoder.d_model)
    if spec.dims[0] > dim:
        raise RankgenError(f"LossConfig.matryoshka_dims {list(spec.dims)}: the model's vectors have {dim} dimensions")
    return spec


def check_divisible(batch_size: int, data_axis: int, trainer: TrainerConfig) -> None:
    """The global batch must split evenly over data-parallel devices (and GradCache chunks / microbatches)."""
    parts = data_axis * max(trainer.num_chunks, trainer.accum_steps)
    if batch_size % parts:
        what = f"data axis ({data_axis})"
        if parts != data_axis:
            what += f" x {'num_chunks' if trainer.num_chunks > 1 else 'accum_steps'} ({parts // data_axis})"
        raise RankgenError(f"batch size {batch_size} is not divisible by the {what}")
