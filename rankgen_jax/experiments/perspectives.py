"""Multi-perspective matching on real text: do two passages share an author, a work, a form?

Stages, each skipped when its output exists so that a rerun resumes:

1. data: passages of the works of data/perspectives/works.json and labelled
   pairs of them, train and held-out (perspective_pairs.py);
2. init: the pretrained MiniLM, imported once;
3. bi_encoder: MPTS dual encoder (Last2-Avg pooling, one L2-normalised
   projection per perspective) with multi_perspective_bce at tau 0.5;
   cross_encoder: [CLS] -> one linear layer of three logits with sigmoid_bce
   (MPTS settles on Last2-Avg and CLS; `bi_encoder_pooling`,
   `cross_encoder_pooling` and `cross_encoder_projection` give the other
   poolings and the earlier head with a projection before the logits). Both
   start from MiniLM's encoder, their heads random, through the shared
   trainer.
4. evaluation on the held-out pairs with MPTS's metrics
   (eval/perspective_metrics.py: per perspective the similar class's F1,
   accuracy and ROC AUC; the support-weighted W.Avg), for the majority class,
   zero-shot MiniLM cosine (a threshold per perspective chosen on the training
   pairs), each model at step 0 (the trainer's initial parameters) and after
   training. The MPTS data itself, with the released recipe: mpts.py.
   WORKDIR/results.json and a printed table.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.source_configs import DataConfig, PairsData
from rankgen_jax.data.text import load_text_encoder
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.perspective_eval import (choose_thresholds, predict_majority, predict_model,
                                                      predict_thresholded, zero_shot_cosines)
from rankgen_jax.experiments.perspective_pairs import (PERSPECTIVES, PERSPECTIVES_DIR, build_passages, label_rates,
                                                       load_works, sample_pairs)
from rankgen_jax.checkpoints.native import require_vocab_path
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import (StageRun, aligned_table, is_done, log, mark_done,
                                            starting_checkpoint)
from rankgen_jax.inference.encoder import LoadedModel, load_model
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.train.checkpointing import complete_params, resolve_model_config
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

MODELS = ("bi_encoder", "cross_encoder")
# Table rows in order: baselines first, then each model before and after training.
ROWS = ("majority", "zero_shot", "bi_encoder_step0", "bi_encoder", "cross_encoder_step0", "cross_encoder")

_log = functools.partial(log, "perspectives")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PerspectivesConfig:
    """Corpus, passage and pair sizes, models and training budgets of the perspectives demo.

    works_file: JSON object {text file (relative to this file): {"author",
      "work", "form"}}.
    same_work_share / same_author_share: shares of pairs from one work and from
      two works of one author; the rest pairs two authors.
    passage_length: tokens per passage (the cross encoder reads two).
    init_from_hf: the pretrained encoder ("minilm" or an HF folder), imported
      once; or init_checkpoint, a rankgen_jax checkpoint to start from instead.
    tau: the bi-encoder's temperature (MPTS: 0.5).
    bi_encoder_pooling / cross_encoder_pooling: HeadConfig poolings (MPTS:
      last2_avg and first, the [CLS] token).
    cross_encoder_projection: a d -> d projection between the pooled vector
      and the logits (MPTS has none: one linear layer of N outputs).
    """

    works_file: str = str(PERSPECTIVES_DIR / "works.json")
    min_words: int = 60
    max_words: int = 100
    eval_fraction: float = 0.2
    num_train_pairs: int = 3000
    num_eval_pairs: int = 600
    same_work_share: float = 1 / 3
    same_author_share: float = 1 / 3
    init_from_hf: str = "minilm"
    init_checkpoint: str = ""
    passage_length: int = 128
    tau: float = 0.5
    bi_encoder_pooling: str = "last2_avg"
    cross_encoder_pooling: str = "first"
    cross_encoder_projection: bool = False
    batch_size: int = 32
    eval_batch_size: int = 32
    learning_rate: float = 5e-5
    bi_encoder_minutes: float = 4.0
    cross_encoder_minutes: float = 4.0
    max_steps: int = 100_000
    # The trainer's held-out loss every this many steps (and at the start and end); 0 = never.
    train_eval_every: int = 25
    seed: int = 0


class PairsFolder(JobFolder):
    """Where a pairs job (this one, experiments/mpts.py) keeps its outputs under `workdir`: data/<split>_pairs.jsonl
    and a training run per model."""

    @property
    def data(self) -> Path:
        return self.root / "data"

    def pairs(self, split: str) -> Path:
        return self.data / f"{split}_pairs.jsonl"


# --- 1. data -------------------------------------------------------------------------------


def build_pair_data(cfg: PerspectivesConfig, folder: PairsFolder) -> dict:
    """Train and eval pairs (the folder's pairs("train") and pairs("eval")) and their statistics."""
    works = load_works(cfg.works_file)
    train, held = build_passages(works, cfg.min_words, cfg.max_words, cfg.eval_fraction)
    stats = {"works": len(works), "train_passages": train.count(), "eval_passages": held.count(),
             "passages_per_work": {w.work: len(t) + len(e) for w, t, e in zip(works, train.texts, held.texts)}}
    for split, part, count, stream in (("train", train, cfg.num_train_pairs, 0), ("eval", held, cfg.num_eval_pairs, 1)):
        records = sample_pairs(part, count, np.random.default_rng([cfg.seed, stream]), cfg.same_work_share,
                               cfg.same_author_share)
        write_jsonl(folder.pairs(split), records)
        stats[f"{split}_pairs"] = len(records)
        stats[f"{split}_label_rates"] = label_rates(records)
    _log(f"{len(works)} works: {stats['train_passages']} training and {stats['eval_passages']} held-out passages; "
         f"{stats['train_pairs']} / {stats['eval_pairs']} pairs; held-out positive rates "
         + ", ".join(f"{k} {v:.2f}" for k, v in stats["eval_label_rates"].items()))
    return stats


# --- 3. models and training -------------------------------------------------------------


def matching_model_config(model: str, pooling: str, num_perspectives: int, projection: bool = False) -> ModelConfig:
    """A multi-perspective matcher: "bi_encoder" (one L2-normalised d -> d projection per perspective on the pooled
    vector) or "cross_encoder" (the pooled pair -> N logits, with a d -> d projection first when `projection`)."""
    if model == "bi_encoder":
        return ModelConfig(head=HeadConfig(pooling, -1, True), kind="dual_encoder", num_scores=num_perspectives)
    if model == "cross_encoder":
        return ModelConfig(head=HeadConfig(pooling, -1 if projection else 0, False), kind="cross_encoder",
                           num_scores=num_perspectives)
    raise RankgenError(f"unknown matching model {model!r}; expected one of {MODELS}")


def model_configs(cfg: PerspectivesConfig, num_perspectives: int = len(PERSPECTIVES)) -> dict[str, ModelConfig]:
    """The gin-side configs; the trainer swaps in the init checkpoint's encoder."""
    return {"bi_encoder": matching_model_config("bi_encoder", cfg.bi_encoder_pooling, num_perspectives),
            "cross_encoder": matching_model_config("cross_encoder", cfg.cross_encoder_pooling, num_perspectives,
                                                   cfg.cross_encoder_projection)}


def _loss(cfg: PerspectivesConfig, name: str) -> LossConfig:
    if name == "bi_encoder":
        return LossConfig(name="multi_perspective_bce", tau=cfg.tau)
    return LossConfig(name="sigmoid_bce")


def _pair_length(cfg: PerspectivesConfig, name: str) -> int:
    # The cross encoder reads both passages in one input, each keeping passage_length tokens.
    return cfg.passage_length * (2 if name == "cross_encoder" else 1)


def _trainer_config(cfg: PerspectivesConfig, init: Path, name: str) -> TrainerConfig:
    minutes = cfg.bi_encoder_minutes if name == "bi_encoder" else cfg.cross_encoder_minutes
    # Encoder only: both heads differ from MiniLM's (the bi-encoder's has one projection per perspective).
    return TrainerConfig(num_steps=cfg.max_steps, max_minutes=minutes, log_every=5, eval_every=cfg.train_eval_every,
                         eval_batches=2, checkpoint_every=50, init_checkpoint=str(init), init_encoder_only=True,
                         seed=cfg.seed, encoder_overrides={"dropout_rate": 0.0})


def train_model(cfg: PerspectivesConfig, folder: PairsFolder, init: Path, name: str) -> dict:
    """One model on the training pairs through the shared trainer (resumes from its checkpoint)."""
    pairs = PairsData(vocab=require_vocab_path(init), train_file=str(folder.pairs("train")),
                      eval_file=str(folder.pairs("eval")))
    data = DataConfig(pairs, batch_size=cfg.batch_size, prefix_length=_pair_length(cfg, name), seed=cfg.seed)
    optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.learning_rate, warmup_steps=10, weight_decay=0.01)
    metrics = train(folder.model(name), trainer=_trainer_config(cfg, init, name), model_config=model_configs(cfg)[name],
                    data=data, loss=_loss(cfg, name), optimizer=optimizer)
    return {"steps": int(metrics.get("steps", 0)), "seconds": float(metrics.get("seconds", 0.0)),
            "train_loss": float(metrics.get("loss", float("nan")))}


def initial_params(cfg: PerspectivesConfig, init: Path, name: str) -> tuple[ModelConfig, dict]:
    """The config and parameters the trainer starts `name` from: init's encoder, the head random (seed)."""
    trainer = _trainer_config(cfg, init, name)
    # An empty folder is never a run to resume, so the trainer's own resolution runs as for a new run.
    with tempfile.TemporaryDirectory() as empty:
        config, params, _ = resolve_model_config(RunFolder.at(empty), trainer, model_configs(cfg)[name])
    return config, complete_params(params, config, str(init), trainer.seed)


# --- 4. evaluation and driver ------------------------------------------------------------


def initial_model(cfg: PerspectivesConfig, init: Path, name: str) -> LoadedModel:
    """`name` as the trainer starts it (initial_params), ready to score pairs."""
    config, params = initial_params(cfg, init, name)
    return LoadedModel.from_params(config, params, load_text_encoder(require_vocab_path(init)), f"{name} at step 0")


def _evaluate(cfg: PerspectivesConfig, model: LoadedModel, name: str, records: list[dict]) -> dict:
    return predict_model(model, records, PERSPECTIVES, _pair_length(cfg, name), cfg.eval_batch_size,
                         cfg.tau).metrics()


def _zero_shot(cfg: PerspectivesConfig, init: Path, train_records: list[dict], eval_records: list[dict]) -> dict:
    """The pretrained encoder's cosine, one threshold per perspective chosen on the training pairs."""
    encoder = load_model(str(init))
    cosines = functools.partial(zero_shot_cosines, encoder, length=cfg.passage_length, batch_size=cfg.eval_batch_size)
    thresholds = choose_thresholds(cosines(train_records), train_records)
    return predict_thresholded(cosines(eval_records), thresholds, eval_records, PERSPECTIVES).metrics()


def _describe(row: dict) -> str:
    return ", ".join(f"{p} F1 {row['per_perspective'][p]['f1']:.3f} AUC {row['per_perspective'][p]['auc']:.3f}"
                     for p in PERSPECTIVES) + f"; W.Avg F1 {row['w_avg']['f1']:.3f}"


def run_perspectives(workdir: str, cfg: PerspectivesConfig | None = None) -> dict:
    """Run (or resume) every stage and evaluate; returns the results, also in workdir/results.json."""
    cfg = cfg or PerspectivesConfig()
    folder = PairsFolder(workdir)
    run = StageRun(folder, "perspectives")
    results = run.results
    table = results.setdefault("table", {})
    training = results.setdefault("training", {})

    if not folder.pairs("train").is_file() or not folder.pairs("eval").is_file():
        results["data"] = run.timed("data", build_pair_data, cfg, folder)
        run.save()
    train_records, eval_records = read_jsonl(folder.pairs("train")), read_jsonl(folder.pairs("eval"))
    init = starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, folder, "PerspectivesConfig.init_checkpoint")

    run.evaluate(table, "majority", lambda: predict_majority(train_records, eval_records, PERSPECTIVES).metrics(),
                 describe=_describe)
    run.evaluate(table, "zero_shot", _zero_shot, cfg, init, train_records, eval_records, describe=_describe)
    for name in MODELS:
        run.evaluate(table, f"{name}_step0", lambda n=name: _evaluate(cfg, initial_model(cfg, init, n), n, eval_records),
                     describe=_describe)
        if not is_done(folder.model(name)):
            training[name] = run.timed(f"train_{name}", train_model, cfg, folder, init, name)
            mark_done(folder.model(name))
            run.save()
        kind = model_configs(cfg)[name].kind
        run.evaluate(table, name, lambda n=name: _evaluate(cfg, load_model(str(folder.model(n)), kind), n,
                                                           eval_records),
                     describe=_describe)
    results["table"] = {row: table[row] for row in ROWS if row in table}
    run.finish()
    print(format_table(results["table"]))
    return results


_METRIC_HEADERS = {"f1": "F1", "accuracy": "acc", "auc": "AUC"}


def format_table(table: dict) -> str:
    """The results as an aligned text table: F1 (of the similar class), accuracy and AUC per perspective and
    the W.Avg F1 (MPTS's metric), one row per model."""
    short = {"same_author": "author", "same_work": "work", "same_form": "form"}
    columns = [(p, m) for p in PERSPECTIVES for m in _METRIC_HEADERS]
    headers = [f"{short[p]} {_METRIC_HEADERS[m]}" for p, m in columns] + ["W.Avg F1"]
    rows = {name: [row["per_perspective"][p][m] for p, m in columns] + [row["w_avg"]["f1"]]
            for name, row in table.items()}
    return aligned_table(rows, headers, name_width=22, cell_width=11)
