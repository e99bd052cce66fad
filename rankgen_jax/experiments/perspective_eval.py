"""The perspectives demo's evaluation: per-perspective accuracy and ROC AUC of held-out passage pairs.

A bi-encoder scores a pair by the cosine of the two passages' vectors, one
per perspective head; a cross encoder reads both passages together and gives
one logit per perspective. Pairs are tokenised as data/lists.py's PairBatches
feeds them to the trainer, so a model is measured on the inputs it learned.
"""

from __future__ import annotations

import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.perspective_pairs import PERSPECTIVES
from rankgen_jax.inference.encoder import LoadedModel


def _labels(records: list[dict]) -> np.ndarray:
    return np.asarray([r["labels"] for r in records], np.float64)


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
    train_PxN, eval_PxN = _labels(train_records), _labels(eval_records)
    majority_N = (train_PxN.mean(axis=0) >= 0.5).astype(np.float64)
    probs_PxN = np.broadcast_to(majority_N, eval_PxN.shape)
    return perspective_metrics(eval_PxN, np.zeros_like(eval_PxN), probs_PxN)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def pair_scores(model: LoadedModel, records: list[dict], length: int, batch_size: int) -> np.ndarray:
    """Scores [P, N] of pairs tokenised as PairBatches does: cosines per perspective (dual) or logits (cross)."""
    if model.config.kind == "cross_encoder":
        # Both passages in one input of `length` tokens, each keeping its start.
        half = length // 2
        scores = model.score_pairs([r["a"] for r in records], [[r["b"]] for r in records], half, length - half,
                                   batch_size, query_keep="start")
        return np.stack(scores).reshape(len(records), -1)
    if model.config.kind != "dual_encoder":
        raise RankgenError(f"{model.source}: cannot score pairs with a {model.config.kind!r} model")
    # Each distinct passage is encoded once; held-out pairs reuse passages.
    index: dict[str, int] = {}
    for r in records:
        for key in ("a", "b"):
            index.setdefault(r[key], len(index))
    vectors = _unit(model.encode(list(index), "raw", length, batch_size, keep="start", truncation="clean"))
    if vectors.ndim == 2:
        vectors = vectors[:, None, :]  # one vector: one cosine for every perspective
    a_PxNxD = vectors[[index[r["a"]] for r in records]]
    b_PxNxD = vectors[[index[r["b"]] for r in records]]
    return np.sum(a_PxNxD * b_PxNxD, axis=-1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def evaluate_model(model: LoadedModel, records: list[dict], length: int, batch_size: int, tau: float) -> dict:
    """Per-perspective metrics of a model's probabilities: sigmoid(2 cos / tau) (bi-encoder), sigmoid(logit) (cross)."""
    scores_PxN = pair_scores(model, records, length, batch_size)
    # The probabilities the losses train: logit = 2 s with s = cos / tau, or the cross encoder's logit.
    logits_PxN = 2.0 * scores_PxN / tau if model.config.kind == "dual_encoder" else scores_PxN
    return perspective_metrics(_labels(records), logits_PxN, _sigmoid(logits_PxN))


def evaluate_zero_shot(model: LoadedModel, records: list[dict], length: int, batch_size: int) -> dict:
    """A pretrained encoder's own cosine as the score of every perspective (AUC only: it is no probability)."""
    cosine_Px1 = pair_scores(model, records, length, batch_size)
    return perspective_metrics(_labels(records), np.repeat(cosine_Px1[:, :1], len(PERSPECTIVES), axis=1), None)
