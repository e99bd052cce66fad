"""Multi-perspective models and baselines on labelled text pairs, measured with MPTS's metrics.

A bi-encoder scores a pair by the cosine of the two texts' vectors, one per
perspective head; a cross encoder reads both texts together and gives one
logit per perspective. Pairs are tokenised as data/lists.py's PairBatches
feeds them to the trainer, so a model is measured on the inputs it learned.
The probability is the one the losses train -- sigmoid(2 cos / tau) for the
bi-encoder (MPTS's exp(s) / (exp(s) + exp(-s)) with s = cos / tau), sigmoid of
the logit for the cross encoder -- and a pair is predicted similar when it is
above 0.5, as the released code predicts.

Every evaluation returns its metrics (eval/perspective_metrics.py) and the
rows of a predictions file: each pair's id, and per perspective its label,
probability and prediction, from which every figure can be recomputed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.perspective_metrics import best_thresholds, perspective_metrics
from rankgen_jax.inference.encoder import LoadedModel


@dataclasses.dataclass
class PairPredictions:
    """One model's [pairs, perspectives] scores, probabilities and 0/1 predictions of some labelled pairs."""

    records: list[dict]
    perspectives: tuple[str, ...]
    scores_NxP: np.ndarray
    probs_NxP: np.ndarray
    predictions_NxP: np.ndarray

    @property
    def labels_NxP(self) -> np.ndarray:
        return labels_of(self.records)

    def metrics(self) -> dict:
        return perspective_metrics(self.labels_NxP, self.scores_NxP, self.predictions_NxP, self.perspectives)

    def rows(self) -> list[dict]:
        """One JSON object per pair: its id (or position) and, per perspective, label, probability, prediction."""
        out = []
        for n, record in enumerate(self.records):
            out.append({"id": record.get("id", n), **{
                p: {"label": int(record["labels"][k] >= 0.5), "probability": round(float(self.probs_NxP[n, k]), 6),
                    "prediction": int(self.predictions_NxP[n, k])} for k, p in enumerate(self.perspectives)}})
        return out


def labels_of(records: list[dict]) -> np.ndarray:
    return np.asarray([r["labels"] for r in records], np.float64)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def pair_scores(model: LoadedModel, records: list[dict], length: int, batch_size: int) -> np.ndarray:
    """Scores [N, P] of pairs tokenised as PairBatches does: cosines per perspective (dual) or logits (cross)."""
    if model.config.kind == "cross_encoder":
        # Both texts in one input of `length` tokens, each keeping its start.
        half = length // 2
        scores = model.score_pairs([r["a"] for r in records], [[r["b"]] for r in records], half, length - half,
                                   batch_size, query_keep="start")
        return np.stack(scores).reshape(len(records), -1)
    if model.config.kind != "dual_encoder":
        raise RankgenError(f"{model.source}: cannot score pairs with a {model.config.kind!r} model")
    # Each distinct text is encoded once; pairs may share texts.
    index: dict[str, int] = {}
    for r in records:
        for key in ("a", "b"):
            index.setdefault(r[key], len(index))
    vectors = _unit(model.encode(list(index), "raw", length, batch_size, keep="start", truncation="clean"))
    if vectors.ndim == 2:
        vectors = vectors[:, None, :]  # one vector: one cosine for every perspective
    a_NxPxD = vectors[[index[r["a"]] for r in records]]
    b_NxPxD = vectors[[index[r["b"]] for r in records]]
    return np.sum(a_NxPxD * b_NxPxD, axis=-1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def predict_model(model: LoadedModel, records: list[dict], perspectives, length: int, batch_size: int,
                  tau: float) -> PairPredictions:
    """A trained model's probabilities -- sigmoid(2 cos / tau) (bi-encoder), sigmoid(logit) (cross) -- and
    predictions (probability > 0.5)."""
    scores_NxP = pair_scores(model, records, length, batch_size)
    if scores_NxP.shape[1] != len(perspectives):
        raise RankgenError(f"{model.source}: {scores_NxP.shape[1]} outputs per pair for {len(perspectives)} "
                           f"perspectives {list(perspectives)}")
    logits_NxP = 2.0 * scores_NxP / tau if model.config.kind == "dual_encoder" else scores_NxP
    probs_NxP = _sigmoid(logits_NxP)
    return PairPredictions(records, tuple(perspectives), logits_NxP, probs_NxP, (probs_NxP > 0.5).astype(np.int64))


def predict_majority(train_records: list[dict], records: list[dict], perspectives) -> PairPredictions:
    """Each perspective's majority training label for every pair (one score for all: AUC 0.5)."""
    majority_P = (labels_of(train_records).mean(axis=0) > 0.5).astype(np.float64)
    probs_NxP = np.broadcast_to(majority_P, (len(records), len(majority_P))).copy()
    return PairPredictions(records, tuple(perspectives), np.zeros_like(probs_NxP), probs_NxP,
                           probs_NxP.astype(np.int64))


def predict_all_similar(records: list[dict], perspectives) -> PairPredictions:
    """Every pair similar from every perspective: the floor of the positive-class F1, 2 r / (1 + r) at rate r."""
    ones_NxP = np.ones((len(records), len(perspectives)))
    return PairPredictions(records, tuple(perspectives), ones_NxP, ones_NxP, ones_NxP.astype(np.int64))


def zero_shot_cosines(model: LoadedModel, records: list[dict], length: int, batch_size: int) -> np.ndarray:
    """[N] a pretrained single-vector encoder's cosine of each pair."""
    return pair_scores(model, records, length, batch_size)[:, 0]


def predict_thresholded(cosines_N: np.ndarray, thresholds_P: np.ndarray, records: list[dict],
                        perspectives) -> PairPredictions:
    """One score for every perspective (a zero-shot cosine), similar from perspective p when it is at least
    thresholds_P[p]; the "probability" recorded is the cosine itself."""
    scores_NxP = np.repeat(np.asarray(cosines_N, np.float64)[:, None], len(thresholds_P), axis=1)
    return PairPredictions(records, tuple(perspectives), scores_NxP, scores_NxP,
                           (scores_NxP >= thresholds_P[None, :]).astype(np.int64))


def choose_thresholds(cosines_N: np.ndarray, records: list[dict]) -> np.ndarray:
    """[P] per perspective, the cosine threshold with the best positive-class F1 on these pairs."""
    return best_thresholds(labels_of(records), cosines_N)
