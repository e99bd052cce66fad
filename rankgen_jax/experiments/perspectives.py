"""Multi-perspective matching on real text: do two passages share an author, a work, a form?

The corpus (data/perspectives/works.json) names each work's file, author,
title and form (play, poem, novel, prose). Stages, each skipped when its
output exists so that a rerun resumes:

1. data: every work is cut into passages of min_words..max_words words at line
   ends (preferring paragraph, then sentence ends); the last eval_fraction of
   each work's passages is held out, so no passage text is in both splits.
   Pairs are drawn per label pattern: a third from one work, a third from two
   works of one author, a third from two authors, the last two halves split
   into same form and different form. Labels [same_author, same_work,
   same_form]; same work implies the other two.
2. init: the pretrained MiniLM, imported once.
3. bi_encoder: MPTS dual encoder (mean pooling, one L2-normalised projection
   per perspective) with multi_perspective_bce; cross_encoder: [CLS] ->
   three logits with sigmoid_bce. Both start from MiniLM's encoder, their
   heads random, through the shared trainer.
4. evaluation on the held-out pairs, per perspective: accuracy of the
   probability at 0.5 and ROC AUC, for the majority class, zero-shot MiniLM
   cosine (AUC only), each model at step 0 (the trainer's initial
   parameters) and after training. WORKDIR/results.json and a printed table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.data.sources import DataConfig
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.vocab import REPO_ROOT

PERSPECTIVES = ("same_author", "same_work", "same_form")
PERSPECTIVES_DIR = REPO_ROOT / "data" / "perspectives"
DEFAULT_WORKDIR = "runs/perspectives"
MODELS = ("bi_encoder", "cross_encoder")
WORK_FIELDS = ("author", "work", "form")
# Table rows in order: baselines first, then each model before and after training.
ROWS = ("majority", "zero_shot", "bi_encoder_step0", "bi_encoder", "cross_encoder_step0", "cross_encoder")


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
    batch_size: int = 32
    eval_batch_size: int = 32
    learning_rate: float = 5e-5
    bi_encoder_minutes: float = 4.0
    cross_encoder_minutes: float = 4.0
    max_steps: int = 100_000
    # The trainer's held-out loss every this many steps (and at the start and end); 0 = never.
    train_eval_every: int = 25
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Work:
    """One text file and what the corpus says about it."""

    path: Path
    author: str
    work: str
    form: str


def _log(message: str) -> None:
    print(f"[perspectives] {message}", file=sys.stderr, flush=True)


def _write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename: a stage is "done" when its file exists, so never leave half a file.
    partial = path.with_suffix(path.suffix + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    partial.replace(path)
    return path


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- 1. corpus and passages ---------------------------------------------------------------


def load_works(works_file: str | Path) -> list[Work]:
    """The works a works.json lists, their files resolved against its folder and checked to exist."""
    path = Path(works_file)
    # A relative path in a gin file should work from any folder, as the default does.
    if not path.is_file() and not path.is_absolute() and (REPO_ROOT / path).is_file():
        path = REPO_ROOT / path
    if not path.is_file():
        raise RankgenError(f"{works_file}: no such works file")
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RankgenError(f"{works_file}: not valid JSON ({e})") from None
    if not isinstance(table, dict) or not table:
        raise RankgenError(f"{works_file}: expected a JSON object mapping text files to their author, work and form")
    works = []
    for name, info in table.items():
        if not isinstance(info, dict) or not all(isinstance(info.get(k), str) and info[k].strip() for k in WORK_FIELDS):
            raise RankgenError(f"{works_file}: entry {name!r} needs non-empty strings {', '.join(WORK_FIELDS)}")
        text_path = (path.parent / name).resolve()
        if not text_path.is_file():
            raise RankgenError(f"{works_file}: {name!r} is not a file (looked for {text_path})")
        works.append(Work(text_path, *(info[k].strip() for k in WORK_FIELDS)))
    titles = [w.work for w in works]
    if len(set(titles)) != len(titles):
        raise RankgenError(f"{works_file}: every entry must name a different work")
    return works


_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
# Verse editions print every tenth line's number at the far right; it would give the edition away.
_LINE_NUMBER = re.compile(r"\s{2,}\d{1,5}\s*$")
# A line ends a sentence when its last word does (closing quotes, brackets, _italics_ allowed).
_SENTENCE_END = re.compile(r"[.!?][\"'\u2019\u201d)\]_]*$")
# Shorter lines ending in a period are speaker tags ("Ber.") or headings ("ACT I."), not sentence ends.
_MIN_SENTENCE_LINE_WORDS = 4


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's *** START / *** END lines (all of it when they are absent)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def _line_words(text: str, chunk_words: int) -> list[list[str]]:
    """Words of each line ([] for a blank one), line numbers dropped, lines over chunk_words split."""
    lines = []
    for line in strip_gutenberg(text).splitlines():
        words = _LINE_NUMBER.sub("", line).split()
        if not words:
            lines.append([])
        for start in range(0, len(words), chunk_words):
            lines.append(words[start : start + chunk_words])
    return lines


def _ends_sentence(words: list[str]) -> bool:
    return len(words) >= _MIN_SENTENCE_LINE_WORDS and bool(_SENTENCE_END.search(words[-1]))


def passages_of_text(text: str, min_words: int = 60, max_words: int = 100) -> list[str]:
    """Passages of min_words..max_words words cut at line ends, preferring paragraph, then sentence ends."""
    # Lines are joined with single spaces (plays and poems have short lines); a passage may run
    # across a paragraph break until it has min_words, and a shorter tail is dropped.
    if not 0 < min_words < max_words:
        raise RankgenError(f"passage words need 0 < min_words < max_words, got {min_words} and {max_words}")
    # Lines of at most max - min words: a buffer below min_words then never overflows max_words.
    lines = _line_words(text, max_words - min_words)
    passages: list[str] = []
    buffer: list[list[str]] = []
    size = 0

    def emit(count: int) -> None:
        nonlocal buffer, size
        passages.append(" ".join(w for line in buffer[:count] for w in line))
        buffer = buffer[count:]
        size = sum(map(len, buffer))

    for words in lines:
        if not words:
            if size >= min_words:
                emit(len(buffer))
            continue
        if size + len(words) > max_words:
            # The last sentence end that still leaves min_words, else everything so far.
            cut, running = len(buffer), 0
            for i, line in enumerate(buffer):
                running += len(line)
                if running >= min_words and _ends_sentence(line):
                    cut = i + 1
            emit(cut)
        buffer.append(words)
        size += len(words)
    if size >= min_words:
        emit(len(buffer))
    return passages


@dataclasses.dataclass(frozen=True)
class Passages:
    """Each work's passages of one split, in reading order (index i is works[i])."""

    works: list[Work]
    texts: list[list[str]]

    def count(self) -> int:
        return sum(map(len, self.texts))


def build_passages(works: list[Work], cfg: PerspectivesConfig) -> tuple[Passages, Passages]:
    """(train, eval) passages: the last eval_fraction of each work is held out; no text is in both."""
    if not 0 < cfg.eval_fraction < 1:
        raise RankgenError(f"PerspectivesConfig.eval_fraction must be in (0, 1), got {cfg.eval_fraction}")
    seen: set[str] = set()
    train, held = [], []
    for work in works:
        try:
            text = work.path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as e:
            raise RankgenError(f"{work.path}: cannot read as UTF-8 text ({e})") from None
        # A passage that repeats an earlier one (a refrain, a repeated notice) is dropped, so
        # the splits share no text even across works.
        texts = [t for t in passages_of_text(text, cfg.min_words, cfg.max_words) if not (t in seen or seen.add(t))]
        # Both splits get at least one passage of every work that has two.
        num_eval = min(max(1, round(cfg.eval_fraction * len(texts))), len(texts) - 1) if len(texts) > 1 else 0
        train.append(texts[: len(texts) - num_eval])
        held.append(texts[len(texts) - num_eval :])
    return Passages(works, train), Passages(works, held)


# --- pairs --------------------------------------------------------------------------------


def pair_labels(a: Work, b: Work) -> tuple[float, float, float]:
    """[same_author, same_work, same_form] of two works."""
    return float(a.author == b.author), float(a.work == b.work), float(a.form == b.form)


def pattern_weights(same_work_share: float, same_author_share: float) -> dict[tuple, float]:
    """Share of pairs per label pattern: cross-work shares split evenly into same and different form."""
    rest = 1.0 - same_work_share - same_author_share
    if same_work_share < 0 or same_author_share < 0 or rest < -1e-9:
        raise RankgenError(f"pair shares must be >= 0 and sum to at most 1, got same_work_share={same_work_share} "
                           f"and same_author_share={same_author_share}")
    rest = max(rest, 0.0)
    return {(1.0, 1.0, 1.0): same_work_share,
            (1.0, 0.0, 1.0): same_author_share / 2, (1.0, 0.0, 0.0): same_author_share / 2,
            (0.0, 0.0, 1.0): rest / 2, (0.0, 0.0, 0.0): rest / 2}


def _work_pairs(passages: Passages) -> dict[tuple, list[tuple[int, int]]]:
    """Ordered (work, work) index pairs per label pattern; one work pairs with itself if it has two passages."""
    works, texts = passages.works, passages.texts
    by_pattern: dict[tuple, list[tuple[int, int]]] = {}
    for i, a in enumerate(works):
        for j, b in enumerate(works):
            usable = len(texts[i]) >= 2 if i == j else bool(texts[i]) and bool(texts[j])
            if usable:
                by_pattern.setdefault(pair_labels(a, b), []).append((i, j))
    return by_pattern


def _allocate(weights: list[float], count: int) -> list[int]:
    """Split count in proportion to weights (largest remainders), so pattern shares are exact."""
    total = sum(weights)
    exact = np.asarray(weights, np.float64) * count / total
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: count - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def sample_pairs(passages: Passages, count: int, rng: np.random.Generator, same_work_share: float = 1 / 3,
                 same_author_share: float = 1 / 3) -> list[dict]:
    """count labelled pairs {"a", "b", "labels", "works"}: a label pattern in its share, two works, two passages."""
    weights = pattern_weights(same_work_share, same_author_share)
    by_pattern = _work_pairs(passages)
    # A pattern without any work pair in this corpus gives its share to the others.
    patterns = [p for p, w in weights.items() if w > 0 and p in by_pattern]
    if not patterns:
        raise RankgenError("the corpus gives no passage pairs for the configured shares: it needs works with "
                           "at least two passages, or two works")
    plan = [p for p, n in zip(patterns, _allocate([weights[p] for p in patterns], count)) for _ in range(n)]
    rng.shuffle(plan)
    records, used = [], set()
    for pattern in plan:
        candidates = by_pattern[pattern]
        # A repeated pair teaches and measures nothing new: redraw a few times, then accept it.
        for _ in range(20):
            i, j = candidates[int(rng.integers(len(candidates)))]
            if i == j:
                a, b = (int(x) for x in rng.choice(len(passages.texts[i]), size=2, replace=False))
            else:
                a, b = int(rng.integers(len(passages.texts[i]))), int(rng.integers(len(passages.texts[j])))
            if (i, a, j, b) not in used:
                break
        used.add((i, a, j, b))
        records.append({"a": passages.texts[i][a], "b": passages.texts[j][b], "labels": list(pattern),
                        "works": [passages.works[i].work, passages.works[j].work]})
    return records


def label_rates(records: list[dict]) -> dict[str, float]:
    """Share of positive labels per perspective."""
    labels_PxN = np.asarray([r["labels"] for r in records], np.float64)
    return {name: float(labels_PxN[:, n].mean()) for n, name in enumerate(PERSPECTIVES)}


def build_pair_data(cfg: PerspectivesConfig, out: Path) -> dict:
    """Train and eval pairs (out/train_pairs.jsonl, out/eval_pairs.jsonl) and their statistics."""
    works = load_works(cfg.works_file)
    train, held = build_passages(works, cfg)
    stats = {"works": len(works), "train_passages": train.count(), "eval_passages": held.count(),
             "passages_per_work": {w.work: len(t) + len(e) for w, t, e in zip(works, train.texts, held.texts)}}
    for split, part, count, stream in (("train", train, cfg.num_train_pairs, 0), ("eval", held, cfg.num_eval_pairs, 1)):
        records = sample_pairs(part, count, np.random.default_rng([cfg.seed, stream]), cfg.same_work_share,
                               cfg.same_author_share)
        _write_jsonl(out / f"{split}_pairs.jsonl", records)
        stats[f"{split}_pairs"] = len(records)
        stats[f"{split}_label_rates"] = label_rates(records)
    _log(f"{len(works)} works: {stats['train_passages']} training and {stats['eval_passages']} held-out passages; "
         f"{stats['train_pairs']} / {stats['eval_pairs']} pairs; held-out positive rates "
         + ", ".join(f"{k} {v:.2f}" for k, v in stats["eval_label_rates"].items()))
    return stats


# --- 2-3. models and training -------------------------------------------------------------


def model_configs(num_perspectives: int = len(PERSPECTIVES)) -> dict[str, ModelConfig]:
    """The gin-side configs; the trainer swaps in the init checkpoint's encoder."""
    return {
        "bi_encoder": ModelConfig(head=HeadConfig("mean", -1, True), kind="dual_encoder", num_scores=num_perspectives),
        "cross_encoder": ModelConfig(head=HeadConfig("first", -1, False), kind="cross_encoder",
                                     num_scores=num_perspectives),
    }


def _loss(cfg: PerspectivesConfig, name: str):
    from rankgen_jax.train.config import LossConfig

    if name == "bi_encoder":
        return LossConfig(name="multi_perspective_bce", tau=cfg.tau)
    return LossConfig(name="sigmoid_bce")


def _pair_length(cfg: PerspectivesConfig, name: str) -> int:
    # The cross encoder reads both passages in one input, each keeping passage_length tokens.
    return cfg.passage_length * (2 if name == "cross_encoder" else 1)


def _trainer_config(cfg: PerspectivesConfig, init: Path, name: str):
    from rankgen_jax.train.config import TrainerConfig

    minutes = cfg.bi_encoder_minutes if name == "bi_encoder" else cfg.cross_encoder_minutes
    # Encoder only: both heads differ from MiniLM's (the bi-encoder's has one projection per perspective).
    return TrainerConfig(num_steps=cfg.max_steps, max_minutes=minutes, log_every=5, eval_every=cfg.train_eval_every,
                         eval_batches=2, checkpoint_every=50, init_checkpoint=str(init), init_encoder_only=True,
                         seed=cfg.seed, encoder_overrides={"dropout_rate": 0.0})


def train_model(cfg: PerspectivesConfig, root: Path, init: Path, name: str) -> dict:
    """One model on the training pairs through the shared trainer (resumes from its checkpoint)."""
    from rankgen_jax.checkpoints.native import require_vocab_path as checkpoint_vocab
    from rankgen_jax.train.optimizers import OptimizerConfig
    from rankgen_jax.train.loop import train

    data = DataConfig(source="pairs", vocab=checkpoint_vocab(init), train_file=str(root / "data" / "train_pairs.jsonl"),
                      eval_file=str(root / "data" / "eval_pairs.jsonl"), batch_size=cfg.batch_size,
                      prefix_length=_pair_length(cfg, name), seed=cfg.seed)
    optimizer = OptimizerConfig(name="adamw", learning_rate=cfg.learning_rate, warmup_steps=10, weight_decay=0.01)
    metrics = train(str(root / name), trainer=_trainer_config(cfg, init, name), model_config=model_configs()[name],
                    data=data, loss=_loss(cfg, name), optimizer=optimizer)
    return {"steps": int(metrics.get("steps", 0)), "seconds": float(metrics.get("seconds", 0.0)),
            "train_loss": float(metrics.get("loss", float("nan")))}


def initial_params(cfg: PerspectivesConfig, init: Path, name: str) -> tuple[ModelConfig, dict]:
    """The config and parameters the trainer starts `name` from: init's encoder, the head random (seed)."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.train.checkpointing import complete_params, resolve_model_config

    trainer = _trainer_config(cfg, init, name)
    # An empty folder is never a run to resume, so the trainer's own resolution runs as for a new run.
    with tempfile.TemporaryDirectory() as empty:
        config, params, _ = resolve_model_config(native.as_path(empty), trainer, model_configs()[name])
    return config, complete_params(params, config, str(init), trainer.seed)


# --- 4. evaluation ------------------------------------------------------------------------


def roc_auc(labels_N, scores_N) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting half; NaN if one class."""
    positive_N = np.asarray(labels_N, np.float64) >= 0.5
    scores_N = np.asarray(scores_N, np.float64)
    num_pos, num_neg = int(positive_N.sum()), int((~positive_N).sum())
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    # Mann-Whitney: ranks of the scores, tied scores sharing their average rank.
    _, inverse, counts = np.unique(scores_N, return_inverse=True, return_counts=True)
    first_rank = np.cumsum(counts) - counts + 1
    ranks_N = (first_rank + (counts - 1) / 2.0)[inverse]
    return float((ranks_N[positive_N].sum() - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg))


def perspective_metrics(labels_PxN: np.ndarray, scores_PxN: np.ndarray, probs_PxN: np.ndarray | None) -> dict:
    """Per perspective: accuracy of probability > 0.5 (None without probabilities) and ROC AUC of the scores."""
    labels_PxN = np.asarray(labels_PxN, np.float64)
    out = {}
    for n, name in enumerate(PERSPECTIVES):
        accuracy = None
        if probs_PxN is not None:
            accuracy = float(np.mean((probs_PxN[:, n] > 0.5) == (labels_PxN[:, n] >= 0.5)))
        out[name] = {"accuracy": accuracy, "auc": roc_auc(labels_PxN[:, n], scores_PxN[:, n])}
    out["n"] = int(labels_PxN.shape[0])
    return out


def majority_baseline(train_records: list[dict], eval_records: list[dict]) -> dict:
    """Predict each perspective's majority training label for every pair (AUC 0.5: one score for all)."""
    train_PxN = np.asarray([r["labels"] for r in train_records], np.float64)
    eval_PxN = np.asarray([r["labels"] for r in eval_records], np.float64)
    majority_N = (train_PxN.mean(axis=0) >= 0.5).astype(np.float64)
    probs_PxN = np.broadcast_to(majority_N, eval_PxN.shape)
    return perspective_metrics(eval_PxN, np.zeros_like(eval_PxN), probs_PxN)


@functools.lru_cache(maxsize=8)
def _apply_fn(config: ModelConfig):
    """The jitted model on [B, L] ids (mask from the pad id, as in training)."""
    import jax
    from rankgen_jax.models.factory import build_model

    model = build_model(config)
    return jax.jit(lambda params, ids, types: model.apply({"params": params}, ids, None, types))


def _run_batches(config: ModelConfig, params, ids_RxL: np.ndarray, types_RxL: np.ndarray | None, pad_id: int,
                 batch_size: int) -> np.ndarray:
    """Model outputs of every row, in fixed [batch_size, L] batches (one compiled shape)."""
    fn = _apply_fn(config)
    outputs = []
    for start in range(0, len(ids_RxL), batch_size):
        ids = ids_RxL[start : start + batch_size]
        fill = batch_size - len(ids)
        # Filler rows are all padding; their outputs are dropped.
        ids = np.concatenate([ids, np.full((fill, ids.shape[1]), pad_id, np.int32)])
        types = None
        if types_RxL is not None:
            types = np.concatenate([types_RxL[start : start + batch_size], np.zeros((fill, ids.shape[1]), np.int32)])
        outputs.append(np.asarray(fn(params, ids, types), np.float32)[: batch_size - fill])
    return np.concatenate(outputs)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def pair_scores(config: ModelConfig, params: dict, text, records: list[dict], length: int,
                batch_size: int) -> np.ndarray:
    """Scores [P, N] of pairs tokenised as PairBatches does: cosines per perspective (dual) or logits (cross)."""
    import jax
    from rankgen_jax.models.factory import to_model_layout
    from rankgen_jax.data.text import encode_pair_truncated, encode_truncated, pad_batch

    params = jax.device_put(to_model_layout(params, config))
    if config.kind == "cross_encoder":
        half = length // 2
        pairs = [encode_pair_truncated(text, r["a"], r["b"], half, length - half, "start") for r in records]
        ids_PxL = pad_batch([p[0] for p in pairs], length, text.pad_id)
        types_PxL = pad_batch([p[1] for p in pairs], length, 0) if any(any(p[1]) for p in pairs) else None
        scores = _run_batches(config, params, ids_PxL, types_PxL, text.pad_id, batch_size)
        return scores.reshape(len(records), -1)
    if config.kind != "dual_encoder":
        raise RankgenError(f"cannot score pairs with a {config.kind!r} model")
    # Each distinct passage is encoded once; held-out pairs reuse passages.
    index: dict[str, int] = {}
    for r in records:
        for key in ("a", "b"):
            index.setdefault(r[key], len(index))
    ids_UxL = pad_batch([encode_truncated(text, "", t, length) for t in index], length, text.pad_id)
    vectors = _unit(_run_batches(config, params, ids_UxL, None, text.pad_id, batch_size))
    if vectors.ndim == 2:
        vectors = vectors[:, None, :]  # one vector: one cosine for every perspective
    a_PxNxD = vectors[[index[r["a"]] for r in records]]
    b_PxNxD = vectors[[index[r["b"]] for r in records]]
    return np.sum(a_PxNxD * b_PxNxD, axis=-1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def evaluate_params(cfg: PerspectivesConfig, config: ModelConfig, params: dict, vocab: str, name: str,
                    records: list[dict]) -> dict:
    """Per-perspective metrics of a model's probabilities: sigmoid(2 cos / tau) (bi-encoder), sigmoid(logit) (cross)."""
    from rankgen_jax.data.text import load_text_encoder

    scores_PxN = pair_scores(config, params, load_text_encoder(vocab), records, _pair_length(cfg, name),
                             cfg.eval_batch_size)
    # The probabilities the losses train: logit = 2 s with s = cos / tau, or the cross encoder's logit.
    logits_PxN = 2.0 * scores_PxN / cfg.tau if config.kind == "dual_encoder" else scores_PxN
    labels_PxN = np.asarray([r["labels"] for r in records], np.float64)
    return perspective_metrics(labels_PxN, logits_PxN, _sigmoid(logits_PxN))


def evaluate_zero_shot(cfg: PerspectivesConfig, init: Path, records: list[dict]) -> dict:
    """The pretrained encoder's own cosine as the score of every perspective (AUC only: it is no probability)."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.checkpoints.native import require_vocab_path as checkpoint_vocab
    from rankgen_jax.data.text import load_text_encoder

    config, params = native.restore_params(init)
    if config.kind != "dual_encoder":
        raise RankgenError(f"{init}: zero-shot scoring needs a dual encoder, the checkpoint is a {config.kind!r}")
    cosine_Px1 = pair_scores(config, params, load_text_encoder(checkpoint_vocab(init)), records, cfg.passage_length,
                             cfg.eval_batch_size)
    labels_PxN = np.asarray([r["labels"] for r in records], np.float64)
    return perspective_metrics(labels_PxN, np.repeat(cosine_Px1[:, :1], len(PERSPECTIVES), axis=1), None)


def format_table(table: dict) -> str:
    """The results as an aligned text table: accuracy and AUC per perspective, one row per model."""
    short = {"same_author": "author", "same_work": "work", "same_form": "form"}
    columns = [(p, m) for p in PERSPECTIVES for m in ("accuracy", "auc")]
    header = f"{'model':<22}" + "".join(f"{short[p] + (' acc' if m == 'accuracy' else ' AUC'):>12}" for p, m in columns)
    lines = [header]
    for name, row in table.items():
        cells = []
        for p, m in columns:
            value = row[p][m]
            cells.append(f"{'-':>12}" if value is None or np.isnan(value) else f"{value:>12.3f}")
        lines.append(f"{name:<22}" + "".join(cells))
    return "\n".join(lines)


# --- driver -------------------------------------------------------------------------------


def _done(workdir: Path) -> bool:
    return (workdir / "stage_done").is_file()


def run_perspectives(workdir: str, cfg: PerspectivesConfig | None = None) -> dict:
    """Run (or resume) every stage and evaluate; returns the results, also in workdir/results.json."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.checkpoints.native import require_vocab_path as checkpoint_vocab
    from rankgen_jax.experiments.demo import starting_checkpoint

    cfg = cfg or PerspectivesConfig()
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results_file = root / "results.json"
    results = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else {}
    timings = results.setdefault("seconds", {})
    table = results.setdefault("table", {})
    training = results.setdefault("training", {})

    def save() -> None:
        results_file.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    def timed(name: str, fn, *args):
        t0 = time.time()
        _log(f"stage {name}")
        value = fn(*args)
        timings[name] = timings.get(name, 0.0) + time.time() - t0
        return value

    data = root / "data"
    if not (data / "train_pairs.jsonl").is_file() or not (data / "eval_pairs.jsonl").is_file():
        results["data"] = timed("data", build_pair_data, cfg, data)
        save()
    train_records, eval_records = _read_jsonl(data / "train_pairs.jsonl"), _read_jsonl(data / "eval_pairs.jsonl")
    init = starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, root, "PerspectivesConfig.init_checkpoint")
    vocab = checkpoint_vocab(init)

    def evaluate(row: str, fn, *args) -> None:
        if row not in table:
            table[row] = timed(f"eval_{row}", fn, *args)
            _log(f"{row}: " + ", ".join(f"{p} AUC {table[row][p]['auc']:.3f}" for p in PERSPECTIVES))
            save()

    evaluate("majority", majority_baseline, train_records, eval_records)
    evaluate("zero_shot", evaluate_zero_shot, cfg, init, eval_records)
    for name in MODELS:
        evaluate(f"{name}_step0", lambda n=name: evaluate_params(cfg, *initial_params(cfg, init, n), vocab, n,
                                                                 eval_records))
        if not _done(root / name):
            training[name] = timed(f"train_{name}", train_model, cfg, root, init, name)
            (root / name / "stage_done").write_text("done\n")
            save()
        evaluate(name, lambda n=name: evaluate_params(cfg, *native.restore_params(root / n), vocab, n, eval_records))
    results["table"] = {row: table[row] for row in ROWS if row in table}
    results["wall_seconds_this_run"] = time.time() - started
    save()
    print(format_table(results["table"]))
    return results
