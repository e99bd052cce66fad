"""The perspectives demo's evaluation: per-perspective weighted F1, accuracy and ROC AUC of held-out passage pairs.

A bi-encoder scores a pair by the cosine of the two passages' vectors, one
per perspective head; a cross encoder reads both passages together and gives
one logit per perspective. Pairs are tokenised as data/lists.py's PairBatches
feeds them to the trainer, so a model is measured on the inputs it learned.

MPTS's metric is the weighted F1 of each perspective: a pair is predicted
similar when its probability is at least 0.5 (cos >= 0 for the bi-encoder,
sigmoid >= 0.5 for the cross encoder), and the F1 of the two classes
(similar, not similar) is averaged weighted by each class's support, as
scikit-learn's `f1_score(average="weighted")` defines it (an undefined
precision or recall counts 0). Every pair is labelled in every perspective,
so the perspectives' supports are equal and their weighted average is the
plain mean (`mean_weighted_f1`).
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


def weighted_f1(labels_N, predictions_N) -> float:
    """F1 of each class present, averaged weighted by the class's support (scikit-learn's average="weighted")."""
    labels_N, predictions_N = np.asarray(labels_N), np.asarray(predictions_N)
    if labels_N.shape != predictions_N.shape or labels_N.ndim != 1 or labels_N.size == 0:
        raise RankgenError(f"weighted F1 needs two equal non-empty 1-D arrays, got shapes {labels_N.shape} "
                           f"and {predictions_N.shape}")
    total = 0.0
    for label in np.unique(labels_N):  # a class only predicted has support 0: no weight
        support = int(np.sum(labels_N == label))
        true_positive = int(np.sum((labels_N == label) & (predictions_N == label)))
        predicted = int(np.sum(predictions_N == label))
        # F1 = 2 TP / (predicted + support); 0 when there is no true positive (precision or recall 0 or undefined).
        total += support * (2.0 * true_positive / (predicted + support) if true_positive else 0.0)
    return total / labels_N.size


def perspective_metrics(labels_PxN: np.ndarray, scores_PxN: np.ndarray, probs_PxN: np.ndarray | None) -> dict:
    """Per perspective: weighted F1 and accuracy of the prediction probability >= 0.5 (None without
    probabilities) and ROC AUC of the scores; `mean_weighted_f1` over the perspectives."""
    labels_PxN = np.asarray(labels_PxN, np.float64)
    out = {}
    for n, name in enumerate(PERSPECTIVES):
        accuracy = f1 = None
        if probs_PxN is not None:
            predicted_P, truth_P = probs_PxN[:, n] >= 0.5, labels_PxN[:, n] >= 0.5
            accuracy = float(np.mean(predicted_P == truth_P))
            f1 = weighted_f1(truth_P, predicted_P)
        out[name] = {"weighted_f1": f1, "accuracy": accuracy, "auc": roc_auc(labels_PxN[:, n], scores_PxN[:, n])}
    f1s = [out[name]["weighted_f1"] for name in PERSPECTIVES]
    out["mean_weighted_f1"] = None if probs_PxN is None else float(np.mean(f1s))
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
