"""MPTS on its own data with its released recipe and metric: do the multi-perspective heads learn the genres?

Stages, each kept in WORKDIR and skipped when done, so that a rerun resumes:

1. data: the MPTS training file split by a seeded draw into pairs to train on
   and pairs held out to choose the epoch (select_fraction), and the test
   file; JSON-lines pair files under data/ (their ids kept);
2. init: the pretrained encoder (MiniLM), imported once;
3. baselines on test: each perspective's majority training label; every pair
   similar (what the positive-class F1 gives for nothing); zero-shot cosine
   with one threshold per perspective chosen on every training-file pair;
4. per model (bi-encoder, cross encoder): the released recipe -- `epochs`
   epochs, AdamW with a linear schedule and 10% warmup, gradient clipping,
   weight decay except on biases and LayerNorm, a checkpoint per epoch -- then
   the epoch with the best W.Avg F1 on the held-out pairs, scored on test;
5. single-perspective cross encoders (one output each) for the perspectives
   named, to set beside the multi-perspective model's F1 on the same perspective;
6. the table: W.Avg F1 (and accuracy, AUC, precision, recall) with standard
   errors from resampling the test pairs, paired differences from the
   baselines; WORKDIR/predictions/<row>.jsonl holds every test pair's labels,
   probabilities and predictions; WORKDIR/results.json everything.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.checkpoints.native import require_vocab_path
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.mpts import MPTS_RELEASED_PERSPECTIVES, read_mpts
from rankgen_jax.data.source_configs import DataConfig, PairsData
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.perspective_metrics import METRICS, bootstrap_se, resample_counts
from rankgen_jax.experiments.perspective_eval import (PairPredictions, choose_thresholds, predict_all_similar,
                                                      predict_majority, predict_model, predict_thresholded,
                                                      zero_shot_cosines)
from rankgen_jax.experiments.perspectives import MODELS, PairsFolder, matching_model_config
from rankgen_jax.experiments.stages import StageRun, aligned_table, is_done, log, mark_done, starting_checkpoint
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.resources import MPTS_DIR
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

_log = functools.partial(log, "mpts")
BASELINES = ("majority", "all_similar", "zero_shot")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MptsConfig:
    """The data, models and the released training recipe of the MPTS demonstration.

    train_file / test_file: MPTS TSV files (data/mpts/README.md); the bundled
      dev split is the training file, as the paper's 10k-pair train.tsv is not
      bundled.
    perspectives: the genre columns trained and scored (the released 12);
      empty: every column of the file.
    select_fraction: the share of training-file pairs held out to choose the
      epoch (the released code chooses on dev W.Avg F1).
    single_perspective: perspectives that also get a cross encoder of their own.
    The recipe (autoliuweijie/MPTS main.py and run scripts): epochs, batch_size,
    learning_rate, warmup_fraction, clip_grad_norm, weight_decay, adam_eps,
    bi_encoder_length (each text), cross_encoder_length (the pair), tau, seed.
    Poolings and the cross-encoder head follow the paper (Last2-Avg, CLS, one
    H x N layer); cross_encoder_projection = True is the released code's
    H x H layer before it.
    """

    train_file: str = str(MPTS_DIR / "dev.tsv.gz")
    test_file: str = str(MPTS_DIR / "test.tsv.gz")
    perspectives: tuple = MPTS_RELEASED_PERSPECTIVES
    select_fraction: float = 0.2
    init_from_hf: str = "minilm"
    init_checkpoint: str = ""
    models: tuple = MODELS
    single_perspective: tuple = ()
    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    clip_grad_norm: float = 1.0
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    bi_encoder_length: int = 128
    cross_encoder_length: int = 256
    tau: float = 0.5
    bi_encoder_pooling: str = "last2_avg"
    cross_encoder_pooling: str = "first"
    cross_encoder_projection: bool = False
    eval_batch_size: int = 64
    bootstrap_resamples: int = 1000
    seed: int = 7

    def __post_init__(self):
        if not 0.0 < self.select_fraction < 1.0:
            raise RankgenError(f"MptsConfig.select_fraction must be in (0, 1), got {self.select_fraction}")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise RankgenError(f"MptsConfig.models: unknown {unknown}; expected some of {MODELS}")
        for name in ("epochs", "batch_size", "bi_encoder_length", "cross_encoder_length", "eval_batch_size",
                     "bootstrap_resamples"):
            if getattr(self, name) < 1:
                raise RankgenError(f"MptsConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise RankgenError(f"MptsConfig.warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.perspectives:
            missing = [p for p in self.single_perspective if p not in self.perspectives]
            if missing:
                raise RankgenError(f"MptsConfig.single_perspective {missing} are not among MptsConfig.perspectives "
                                   f"{list(self.perspectives)}")

    def length(self, model: str) -> int:
        return self.bi_encoder_length if model == "bi_encoder" else self.cross_encoder_length


class MptsFolder(PairsFolder):
    """PairsFolder's layout (pairs "train", "select", "test"), with the perspectives read, each single-perspective
    model's training pairs, and each table row's predictions."""

    @property
    def perspectives(self) -> Path:
        return self.data / "perspectives.jsonl"

    def single_perspective_pairs(self, perspective: str) -> Path:
        """The training pairs with only `perspective`'s label."""
        return self.data / f"train_pairs_{perspective}.jsonl"

    def predictions(self, row: str) -> Path:
        """A table row's prediction and probability for each test pair and perspective."""
        return self.root / "predictions" / f"{row}.jsonl"


# --- 1. data -------------------------------------------------------------------------------


def build_data(cfg: MptsConfig, folder: MptsFolder) -> dict:
    """The folder's pairs ("train", "select", "test") and perspectives; returns their statistics."""
    source = read_mpts(cfg.train_file, cfg.perspectives)
    test = read_mpts(cfg.test_file, source.perspectives)
    order = np.random.default_rng(cfg.seed).permutation(len(source.records))
    num_select = max(1, round(cfg.select_fraction * len(order)))
    parts = {"train": [source.records[i] for i in sorted(order[num_select:])],
             "select": [source.records[i] for i in sorted(order[:num_select])], "test": test.records}
    if len(parts["train"]) < cfg.batch_size:
        raise RankgenError(f"{cfg.train_file}: {len(parts['train'])} pairs left to train on, fewer than one batch "
                           f"of {cfg.batch_size}")
    for name, records in parts.items():
        write_jsonl(folder.pairs(name), records)
    write_jsonl(folder.perspectives, [{"perspectives": list(source.perspectives)}])
    texts = {name: {t for r in records for t in (r["a"], r["b"])} for name, records in parts.items()}
    stats = {"perspectives": list(source.perspectives),
             "pairs": {name: len(records) for name, records in parts.items()},
             "support": {name: dict(zip(source.perspectives, np.sum([r["labels"] for r in records], 0).tolist()))
                         for name, records in parts.items()},
             "skipped_rows": {cfg.train_file: source.skipped.by_reason, cfg.test_file: test.skipped.by_reason},
             "texts_in_train_and_test": len((texts["train"] | texts["select"]) & texts["test"]),
             "texts_in_train_and_select": len(texts["train"] & texts["select"])}
    _log(f"{stats['pairs']['train']} pairs to train on, {stats['pairs']['select']} to choose the epoch, "
         f"{stats['pairs']['test']} test pairs; {len(source.perspectives)} perspectives; skipped rows: "
         f"{source.skipped.count} + {test.skipped.count}")
    return stats


def _perspectives(folder: MptsFolder) -> tuple[str, ...]:
    return tuple(read_jsonl(folder.perspectives)[0]["perspectives"])


def _only(records: list[dict], index: int) -> list[dict]:
    return [{**r, "labels": [r["labels"][index]]} for r in records]


# --- 4-5. training and the epoch choice ---------------------------------------------------


def steps_per_epoch(cfg: MptsConfig, num_pairs: int) -> int:
    # A partial last batch is dropped: each epoch is a fresh shuffle, so every pair is still trained on.
    return num_pairs // cfg.batch_size


def optimizer_config(cfg: MptsConfig, total_steps: int) -> OptimizerConfig:
    """AdamW, linear decay to 0 after ceil(warmup_fraction x steps) of warmup, clipping; decay only on
    kernels and embeddings (OptimizerConfig.weight_decay), i.e. not on biases and LayerNorm, as released."""
    return OptimizerConfig(name="adamw", learning_rate=cfg.learning_rate, schedule="linear",
                           warmup_steps=math.ceil(cfg.warmup_fraction * total_steps), weight_decay=cfg.weight_decay,
                           eps=cfg.adam_eps, clip_grad_norm=cfg.clip_grad_norm)


def train_epochs(cfg: MptsConfig, workdir: RunFolder, init: Path, model: str, train_file: Path,
                 num_perspectives: int) -> dict:
    """`epochs` epochs through the shared trainer, a checkpoint kept at the end of every epoch."""
    per_epoch = steps_per_epoch(cfg, len(read_jsonl(train_file)))
    total = per_epoch * cfg.epochs
    trainer = TrainerConfig(num_steps=total, log_every=max(1, per_epoch // 2), checkpoint_every=per_epoch,
                            keep_checkpoints=cfg.epochs, init_checkpoint=str(init), init_encoder_only=True,
                            seed=cfg.seed)
    data = DataConfig(PairsData(vocab=require_vocab_path(init), train_file=str(train_file)), batch_size=cfg.batch_size, prefix_length=cfg.length(model), seed=cfg.seed)
    loss = LossConfig(name="multi_perspective_bce", tau=cfg.tau) if model == "bi_encoder" else \
        LossConfig(name="sigmoid_bce")
    metrics = train(workdir, trainer=trainer, data=data, loss=loss, optimizer=optimizer_config(cfg, total),
                    model_config=_model_config(cfg, model, num_perspectives))
    return {"steps": int(metrics.get("steps", 0)), "steps_per_epoch": per_epoch,
            "seconds": float(metrics.get("seconds", 0.0)), "train_loss": float(metrics.get("loss", float("nan")))}


def _model_config(cfg: MptsConfig, model: str, num_perspectives: int):
    pooling = cfg.bi_encoder_pooling if model == "bi_encoder" else cfg.cross_encoder_pooling
    return matching_model_config(model, pooling, num_perspectives, cfg.cross_encoder_projection)


def choose_epoch(cfg: MptsConfig, workdir: RunFolder, model: str, select: list[dict], perspectives,
                 per_epoch: int) -> dict:
    """Each epoch's W.Avg metrics on the held-out pairs; the first best F1 is kept (the released code's strict >)."""
    scores = []
    for epoch in range(1, cfg.epochs + 1):
        predictions = predict_checkpoint(cfg, workdir, model, select, perspectives, epoch * per_epoch)
        scores.append({**predictions.metrics()["w_avg"], "share_predicted_similar":
                       float(predictions.predictions_NxP.mean())})
        _log(f"{workdir.root.name} epoch {epoch}: held-out W.Avg F1 {scores[-1]['f1']:.4f}, "
             f"AUC {scores[-1]['auc']:.4f}")
    best = int(np.argmax([s["f1"] for s in scores])) + 1
    return {"select_w_avg_f1": [s["f1"] for s in scores], "select_w_avg": scores, "epoch": best,
            "step": best * per_epoch}


def predict_checkpoint(cfg: MptsConfig, workdir: RunFolder, model: str, records: list[dict], perspectives,
                       step: int) -> PairPredictions:
    """The predictions of `model`'s checkpoint at `step` for these pairs."""
    return predict_model(load_model(str(workdir), _model_kind(model), step=step), records, perspectives,
                         cfg.length(model), cfg.eval_batch_size, cfg.tau)


def _model_kind(model: str) -> str:
    return "dual_encoder" if model == "bi_encoder" else "cross_encoder"


# --- driver and table ------------------------------------------------------------------------


def _save_predictions(folder: MptsFolder, row: str, predictions: PairPredictions) -> dict:
    write_jsonl(folder.predictions(row), predictions.rows())
    return predictions.metrics()


def _load_predictions(folder: MptsFolder, row: str, records: list[dict], perspectives) -> PairPredictions:
    rows = read_jsonl(folder.predictions(row))
    if [r["id"] for r in rows] != [r["id"] for r in records]:
        raise RankgenError(f"{folder.predictions(row)}: its pairs are not the test pairs")
    probs = np.asarray([[r[p]["probability"] for p in perspectives] for r in rows])
    predicted = np.asarray([[r[p]["prediction"] for p in perspectives] for r in rows])
    return PairPredictions(records, tuple(perspectives), probs, probs, predicted)


def run_mpts(workdir: str, cfg: MptsConfig | None = None) -> dict:
    """Run (or resume) every stage; returns the results, also in workdir/results.json."""
    cfg = cfg or MptsConfig()
    folder = MptsFolder(workdir)
    run = StageRun(folder, "mpts")
    results = run.results
    if not folder.perspectives.is_file():
        results["data"] = run.stage("data", build_data, cfg, folder)
    perspectives = _perspectives(folder)
    train_records, select, test = (read_jsonl(folder.pairs(n)) for n in ("train", "select", "test"))
    init = starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, folder, "MptsConfig.init_checkpoint")
    table = results.setdefault("table", {})
    selection = results.setdefault("selection", {})
    training = results.setdefault("training", {})

    def evaluate(row: str, predict) -> None:
        run.evaluate(table, row, lambda: _save_predictions(folder, row, predict()),
                     describe=lambda m: f"W.Avg F1 {m['w_avg']['f1']:.4f}")

    evaluate("majority", lambda: predict_majority(train_records, test, perspectives))
    evaluate("all_similar", lambda: predict_all_similar(test, perspectives))

    def zero_shot() -> PairPredictions:
        encoder = load_model(str(init))
        thresholds = choose_thresholds(zero_shot_cosines(encoder, train_records + select, cfg.bi_encoder_length,
                                                         cfg.eval_batch_size), train_records + select)
        results["zero_shot_thresholds"] = dict(zip(perspectives, thresholds.tolist()))
        cosines = zero_shot_cosines(encoder, test, cfg.bi_encoder_length, cfg.eval_batch_size)
        return predict_thresholded(cosines, thresholds, test, perspectives)

    evaluate("zero_shot", zero_shot)
    jobs = [(m, m, perspectives, None) for m in cfg.models]
    jobs += [(f"single_{p}", "cross_encoder", (p,), perspectives.index(p)) for p in cfg.single_perspective]
    for row, model, names, column in jobs:
        workdir_model = folder.model(row)
        train_file = folder.pairs("train")
        if column is not None:
            train_file = write_jsonl(folder.single_perspective_pairs(names[0]), _only(train_records, column))
        if not is_done(workdir_model):
            training[row] = run.timed(f"train_{row}", train_epochs, cfg, workdir_model, init, model, train_file,
                                      len(names))
            run.save()
        if row not in selection:
            held = select if column is None else _only(select, column)
            selection[row] = run.timed(f"select_{row}", choose_epoch, cfg, workdir_model, model, held, names,
                                       training[row]["steps_per_epoch"])
            mark_done(workdir_model)
            run.save()
        rows = test if column is None else _only(test, column)
        evaluate(row, lambda: predict_checkpoint(cfg, workdir_model, model, rows, names, selection[row]["step"]))
    results["summary"] = summarise(cfg, folder, test, perspectives, [r for r, *_ in jobs])
    run.finish()
    print(format_table(results["summary"]))
    return results


def summarise(cfg: MptsConfig, folder: MptsFolder, test: list[dict], perspectives, models: list[str]) -> dict:
    """W.Avg metrics of every row with bootstrap SEs over the test pairs; paired differences from the baselines;
    each single-perspective model against the multi-perspective cross encoder on its perspective."""
    counts_RxN = resample_counts(len(test), cfg.bootstrap_resamples, cfg.seed)
    loaded = {row: _load_predictions(folder, row, test, perspectives)
              for row in (*BASELINES, *[m for m in models if not m.startswith("single_")])}
    labels = loaded["majority"].labels_NxP
    summary: dict = {"rows": {}, "single_perspective": {}, "n": len(test), "resamples": cfg.bootstrap_resamples}
    for row, predictions in loaded.items():
        metrics = predictions.metrics()
        entry = {**metrics["w_avg"], "f1_se": bootstrap_se(labels, predictions.predictions_NxP, counts_RxN)}
        for base in BASELINES:
            if row != base:
                entry[f"f1_minus_{base}"] = metrics["w_avg"]["f1"] - loaded[base].metrics()["w_avg"]["f1"]
                entry[f"f1_minus_{base}_se"] = bootstrap_se(labels, predictions.predictions_NxP, counts_RxN,
                                                            loaded[base].predictions_NxP)
        summary["rows"][row] = entry
    for row in (m for m in models if m.startswith("single_") and "cross_encoder" in loaded):
        name = row[len("single_"):]
        column = perspectives.index(name)
        single = _load_predictions(folder, row, [{**r, "labels": [r["labels"][column]]} for r in test], (name,))
        multi_NxP = loaded["cross_encoder"].predictions_NxP[:, [column]]
        single_f1 = single.metrics()["w_avg"]["f1"]
        multi_f1 = loaded["cross_encoder"].metrics()["per_perspective"][name]["f1"]
        summary["single_perspective"][name] = {
            "single_f1": single_f1, "multi_f1": multi_f1, "single_minus_multi": single_f1 - multi_f1,
            "single_minus_multi_se": bootstrap_se(labels[:, [column]], single.predictions_NxP, counts_RxN, multi_NxP)}
    return summary


def format_table(summary: dict) -> str:
    """W.Avg metrics per row, with the F1's SE and its paired differences from the baselines."""
    short = {"accuracy": "acc", "auc": "AUC", "precision": "P", "recall": "R", "f1": "F1"}
    headers = [*(f"W.Avg {short[m]}" for m in METRICS), "F1 SE", *(f"- {b}" for b in BASELINES)]
    rows = {row: [*(e[m] for m in METRICS), e["f1_se"], *(e.get(f"f1_minus_{b}") for b in BASELINES)]
            for row, e in summary["rows"].items()}
    text = aligned_table(rows, headers, name_width=18, cell_width=14)
    for name, e in summary["single_perspective"].items():
        text += (f"\n{name}: single-perspective F1 {e['single_f1']:.3f}, multi-perspective {e['multi_f1']:.3f}, "
                 f"difference {e['single_minus_multi']:+.3f} ± {e['single_minus_multi_se']:.3f}")
    return text
