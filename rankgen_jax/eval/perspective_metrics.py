"""MPTS's metrics: per perspective accuracy, ROC AUC, and precision, recall and F1 of the positive class; their
W.Avg over perspectives, each weighted by its support (its number of similar pairs).

This is the released code's definition (autoliuweijie/MPTS, main.py, `evaluate`):
`f1_score`, `precision_score`, `recall_score` with pos_label=1 (an undefined
precision or recall counts 0, scikit-learn's zero_division default), the ROC
AUC of the similarity scores (0 when undefined, a perspective whose pairs are
all of one class), and every W.Avg weighted by the perspective's support. A
perspective with no similar pair has weight 0.

The earlier two-class weighted F1 (scikit-learn's `average="weighted"` over
similar / not similar, then a plain mean over perspectives) is kept as
`two_class_weighted_f1`, a different metric under its own name.

Standard errors come from resampling the pairs (bootstrap, one set of
resamples shared by every model so that differences are paired).
"""

from __future__ import annotations

import numpy as np

from rankgen_jax.errors import RankgenError

METRICS = ("accuracy", "auc", "precision", "recall", "f1")


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


def _check_pair(labels_N, predictions_N) -> tuple[np.ndarray, np.ndarray]:
    labels_N, predictions_N = np.asarray(labels_N), np.asarray(predictions_N)
    if labels_N.shape != predictions_N.shape or labels_N.ndim != 1 or labels_N.size == 0:
        raise RankgenError(f"labels and predictions must be two equal non-empty 1-D arrays, got shapes "
                           f"{labels_N.shape} and {predictions_N.shape}")
    return labels_N, predictions_N


def _f1(true_positive, predicted, support):
    """2 TP / (predicted + support), 0 where TP is 0 (precision or recall 0 or undefined); works on arrays."""
    denominator = np.maximum(predicted + support, 1)
    return np.where(true_positive > 0, 2.0 * true_positive / denominator, 0.0)


def positive_class_scores(labels_N, predictions_N) -> dict:
    """Precision, recall and F1 of the similar class (label 1), each 0 where undefined, and its support."""
    labels_N, predictions_N = _check_pair(labels_N, predictions_N)
    truth_N, predicted_N = labels_N >= 0.5, predictions_N >= 0.5
    true_positive, predicted, support = (int(np.sum(truth_N & predicted_N)), int(predicted_N.sum()),
                                         int(truth_N.sum()))
    return {"precision": true_positive / predicted if predicted else 0.0,
            "recall": true_positive / support if support else 0.0,
            "f1": float(_f1(true_positive, predicted, support)), "support": support}


def two_class_weighted_f1(labels_N, predictions_N) -> float:
    """F1 of each class present, averaged weighted by the class's support (scikit-learn's average="weighted")."""
    labels_N, predictions_N = _check_pair(labels_N, predictions_N)
    total = 0.0
    for label in np.unique(labels_N):  # a class only predicted has support 0: no weight
        support = int(np.sum(labels_N == label))
        true_positive = int(np.sum((labels_N == label) & (predictions_N == label)))
        total += support * float(_f1(true_positive, int(np.sum(predictions_N == label)), support))
    return total / labels_N.size


def perspective_metrics(labels_NxP, scores_NxP, predictions_NxP, perspectives) -> dict:
    """Per perspective: accuracy, AUC of the scores, positive-class precision / recall / F1, support and the
    two-class weighted F1; `w_avg`: each metric averaged over perspectives weighted by support; `n`: pairs."""
    labels_NxP, scores_NxP, predictions_NxP = (np.asarray(x, np.float64) for x in
                                               (labels_NxP, scores_NxP, predictions_NxP))
    if not labels_NxP.shape == scores_NxP.shape == predictions_NxP.shape or labels_NxP.ndim != 2:
        raise RankgenError(f"labels, scores and predictions must be three equal [pairs, perspectives] arrays, got "
                           f"{labels_NxP.shape}, {scores_NxP.shape}, {predictions_NxP.shape}")
    if labels_NxP.shape[1] != len(perspectives):
        raise RankgenError(f"{labels_NxP.shape[1]} label columns for {len(perspectives)} perspectives "
                           f"{list(perspectives)}")
    out: dict = {"per_perspective": {}}
    for p, name in enumerate(perspectives):
        truth_N, predicted_N = labels_NxP[:, p] >= 0.5, predictions_NxP[:, p] >= 0.5
        auc = roc_auc(truth_N, scores_NxP[:, p])
        row = {"accuracy": float(np.mean(truth_N == predicted_N)), "auc": 0.0 if np.isnan(auc) else auc,
               **positive_class_scores(truth_N, predicted_N),
               "two_class_weighted_f1": two_class_weighted_f1(truth_N, predicted_N)}
        out["per_perspective"][name] = row
    rows = out["per_perspective"].values()
    supports = np.asarray([r["support"] for r in rows], np.float64)
    if supports.sum() == 0:
        raise RankgenError("no pair is similar from any perspective: the support-weighted average is undefined")
    out["w_avg"] = {m: float(np.dot(supports, [r[m] for r in rows]) / supports.sum()) for m in METRICS}
    out["mean_two_class_weighted_f1"] = float(np.mean([r["two_class_weighted_f1"] for r in rows]))
    out["n"] = int(labels_NxP.shape[0])
    return out


def resample_counts(num_pairs: int, resamples: int, seed: int) -> np.ndarray:
    """[R, N] how often each pair is drawn in each of R bootstrap resamples of the N pairs."""
    rng = np.random.default_rng(seed)
    draws_RxN = rng.integers(0, num_pairs, size=(resamples, num_pairs))
    counts_RxN = np.zeros((resamples, num_pairs), np.float64)
    np.add.at(counts_RxN, (np.arange(resamples)[:, None], draws_RxN), 1.0)
    return counts_RxN


def resampled_w_avg_f1(labels_NxP, predictions_NxP, counts_RxN) -> np.ndarray:
    """[R] the W.Avg F1 of each resample, computed from counts (a pair drawn k times counts k times)."""
    truth_NxP = (np.asarray(labels_NxP) >= 0.5).astype(np.float64)
    predicted_NxP = (np.asarray(predictions_NxP) >= 0.5).astype(np.float64)
    true_positive_RxP = counts_RxN @ (truth_NxP * predicted_NxP)
    support_RxP, predicted_RxP = counts_RxN @ truth_NxP, counts_RxN @ predicted_NxP
    f1_RxP = _f1(true_positive_RxP, predicted_RxP, support_RxP)
    return np.sum(support_RxP * f1_RxP, axis=1) / np.maximum(support_RxP.sum(axis=1), 1.0)


def bootstrap_se(labels_NxP, predictions_NxP, counts_RxN, baseline_predictions_NxP=None) -> float:
    """The standard error of the W.Avg F1 over the resamples, or of its difference from a baseline's (paired:
    both models scored on the same resamples)."""
    values_R = resampled_w_avg_f1(labels_NxP, predictions_NxP, counts_RxN)
    if baseline_predictions_NxP is not None:
        values_R = values_R - resampled_w_avg_f1(labels_NxP, baseline_predictions_NxP, counts_RxN)
    return float(np.std(values_R, ddof=1))


def best_thresholds(labels_NxP, scores_N) -> np.ndarray:
    """[P] per perspective, the threshold on one score for all perspectives (e.g. a zero-shot cosine) whose
    prediction "similar when score >= threshold" has the highest positive-class F1 (the lowest such on ties)."""
    truth_NxP = np.asarray(labels_NxP, np.float64) >= 0.5
    scores_N = np.asarray(scores_N, np.float64)
    order = np.argsort(-scores_N, kind="stable")
    sorted_scores, sorted_truth = scores_N[order], truth_NxP[order]
    # Predicting the top k similar: TP = cumulative positives, predicted = k; a threshold must take whole ties,
    # so only k at the end of a run of equal scores is allowed.
    true_positive_KxP = np.cumsum(sorted_truth, axis=0)
    predicted_K = np.arange(1, len(scores_N) + 1, dtype=np.float64)[:, None]
    f1_KxP = _f1(true_positive_KxP, predicted_K, truth_NxP.sum(axis=0)[None, :])
    run_end_K = np.append(sorted_scores[1:] != sorted_scores[:-1], True)
    f1_KxP[~run_end_K] = -1.0
    best_k = np.asarray([np.flatnonzero(col == col.max())[-1] for col in f1_KxP.T])
    return sorted_scores[best_k]
