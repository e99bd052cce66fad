"""MPTS's metrics against scikit-learn and the released code's definition, on random and hand-made cases."""

import warnings

import numpy as np
import pytest
from sklearn import metrics as skm

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.perspective_metrics import (best_thresholds, bootstrap_se, perspective_metrics,
                                                  resample_counts, resampled_w_avg_f1, roc_auc,
                                                  two_class_weighted_f1)


def released_evaluate(labels_NxP, scores_NxP, predictions_NxP):
    """main.py's `evaluate` (autoliuweijie/MPTS) restated with scikit-learn: per perspective, pos_label=1 scores
    and roc_curve + auc (NaN -> 0), each averaged weighted by the number of positive pairs."""
    per, weights = [], []
    for p in range(labels_NxP.shape[1]):
        y, s, yhat = labels_NxP[:, p].astype(int), scores_NxP[:, p], predictions_NxP[:, p].astype(int)
        with warnings.catch_warnings():  # roc_curve warns when a perspective has one class
            warnings.simplefilter("ignore")
            fpr, tpr, _ = skm.roc_curve(y, s, pos_label=1)
            auc = skm.auc(fpr, tpr)
        per.append({"accuracy": skm.accuracy_score(y, yhat), "auc": 0.0 if np.isnan(auc) else auc,
                    "precision": skm.precision_score(y, yhat, pos_label=1, zero_division=0),
                    "recall": skm.recall_score(y, yhat, pos_label=1, zero_division=0),
                    "f1": skm.f1_score(y, yhat, pos_label=1, zero_division=0)})
        weights.append(y.sum())
    weights = np.asarray(weights, float)
    return per, {m: float(np.dot(weights, [r[m] for r in per]) / weights.sum()) for m in per[0]}


def _random_case(seed, n=120, p=5):
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, p)) < rng.uniform(0.05, 0.7, p)).astype(float)
    scores = rng.normal(size=(n, p)) + labels * rng.uniform(0, 2, p)
    scores[:10] = np.round(scores[:10])  # some ties
    predictions = (scores > 0.5).astype(float)
    return labels, scores, predictions


@pytest.mark.parametrize("seed", range(6))
def test_the_w_avg_metrics_equal_the_released_definition(seed):
    labels, scores, predictions = _random_case(seed)
    if seed == 5:
        labels[:, 2] = 0.0  # a perspective with no similar pair: AUC undefined, weight 0
        predictions[:, 3] = 0.0  # a perspective never predicted similar: precision undefined -> 0
    names = [f"p{i}" for i in range(labels.shape[1])]
    out = perspective_metrics(labels, scores, predictions, names)
    per, w_avg = released_evaluate(labels, scores, predictions)
    for name, want in zip(names, per):
        got = out["per_perspective"][name]
        for metric, value in want.items():
            assert got[metric] == pytest.approx(value, abs=1e-12), (seed, name, metric)
        assert got["support"] == int(labels[:, names.index(name)].sum())
        assert got["two_class_weighted_f1"] == pytest.approx(
            skm.f1_score(labels[:, names.index(name)], predictions[:, names.index(name)], average="weighted",
                         zero_division=0))
    for metric, value in w_avg.items():
        assert out["w_avg"][metric] == pytest.approx(value, abs=1e-12), (seed, metric)


def test_a_case_computed_by_hand():
    # Perspective A: labels 1 1 0 0, predictions 1 0 1 0 -> TP 1, P 2, R 1/2, F1 1/2, support 2.
    # Perspective B: labels 1 0 0 0, predictions 1 1 1 1 -> precision 1/4, recall 1, F1 2/5, support 1.
    labels = np.array([[1, 1], [1, 0], [0, 0], [0, 0]], float)
    predictions = np.array([[1, 1], [0, 1], [1, 1], [0, 1]], float)
    scores = predictions.copy()
    out = perspective_metrics(labels, scores, predictions, ["A", "B"])
    assert out["per_perspective"]["A"]["f1"] == pytest.approx(0.5)
    assert out["per_perspective"]["B"]["f1"] == pytest.approx(0.4)
    assert out["per_perspective"]["B"]["precision"] == pytest.approx(0.25)
    # W.Avg F1 = (2 x 0.5 + 1 x 0.4) / 3; accuracy (2 x 0.5 + 1 x 0.25) / 3.
    assert out["w_avg"]["f1"] == pytest.approx(1.4 / 3)
    assert out["w_avg"]["accuracy"] == pytest.approx(1.25 / 3)
    # The two-class weighted F1 of "all similar" on a one-third-positive perspective, against MPTS's F1.
    third = np.array([[1], [0], [0]], float)
    all_similar = np.ones_like(third)
    row = perspective_metrics(third, all_similar, all_similar, ["X"])["per_perspective"]["X"]
    assert row["f1"] == pytest.approx(0.5) and row["two_class_weighted_f1"] == pytest.approx(1 / 6)


def test_bad_shapes_and_no_support_are_errors():
    with pytest.raises(RankgenError, match="equal"):
        perspective_metrics(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((2, 2)), ["a", "b"])
    with pytest.raises(RankgenError, match="3 perspectives"):
        perspective_metrics(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), ["a", "b", "c"])
    with pytest.raises(RankgenError, match="no pair is similar"):
        perspective_metrics(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), ["a", "b"])
    with pytest.raises(RankgenError, match="1-D"):
        two_class_weighted_f1([1, 0], [1])


def test_roc_auc_matches_hand_computed_cases_and_scikit_learn():
    # Positives 0.9 and 0.4 against negatives 0.8 and 0.4: wins 0.9>0.8, 0.9>0.4, tie 0.4=0.4 -> 2.5 / 4.
    assert roc_auc([1, 0, 1, 0], [0.9, 0.8, 0.4, 0.4]) == pytest.approx(0.625)
    assert roc_auc([1, 0, 1, 0], [5.0] * 4) == 0.5
    assert np.isnan(roc_auc([1, 1], [0.1, 0.2]))
    rng = np.random.default_rng(0)
    labels, scores = rng.integers(0, 2, 200), rng.integers(0, 10, 200).astype(float)
    assert roc_auc(labels, scores) == pytest.approx(skm.roc_auc_score(labels, scores))


def test_resampled_w_avg_f1_equals_the_metric_on_each_resample():
    labels, scores, predictions = _random_case(7, n=40, p=3)
    counts = resample_counts(40, 25, seed=1)
    assert counts.shape == (25, 40) and np.all(counts.sum(axis=1) == 40)
    got = resampled_w_avg_f1(labels, predictions, counts)
    for r in range(25):
        rows = np.repeat(np.arange(40), counts[r].astype(int))
        want = perspective_metrics(labels[rows], scores[rows], predictions[rows], ["a", "b", "c"])["w_avg"]["f1"]
        assert got[r] == pytest.approx(want, abs=1e-12)
    # All ones: the metric itself.
    whole = perspective_metrics(labels, scores, predictions, ["a", "b", "c"])["w_avg"]["f1"]
    assert resampled_w_avg_f1(labels, predictions, np.ones((1, 40)))[0] == pytest.approx(whole)
    # The paired SE of a model against itself is 0; against another it is the SD of the differences.
    assert bootstrap_se(labels, predictions, counts, predictions) == 0.0
    other = 1.0 - predictions
    diffs = got - resampled_w_avg_f1(labels, other, counts)
    assert bootstrap_se(labels, predictions, counts, other) == pytest.approx(np.std(diffs, ddof=1))


def test_best_thresholds_maximise_f1_by_brute_force():
    rng = np.random.default_rng(3)
    labels = (rng.random((80, 4)) < [0.1, 0.3, 0.6, 0.9]).astype(float)
    scores = np.round(rng.normal(size=80) + labels[:, 1], 1)  # ties
    thresholds = best_thresholds(labels, scores)
    for p in range(4):
        f1 = lambda t: skm.f1_score(labels[:, p], scores >= t, zero_division=0)  # noqa: E731
        best = max(f1(t) for t in np.unique(scores))
        assert f1(thresholds[p]) == pytest.approx(best), p
        assert thresholds[p] in scores
