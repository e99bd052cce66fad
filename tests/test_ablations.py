"""Ablation results: per-item accuracy, binomial and paired standard errors against plain NumPy, and the report."""

import json

import numpy as np
import pytest

from rankgen_jax.data.jsonl import write_jsonl
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.ablations import (ZERO_SHOT_ROW, accuracy_se, compare_runs, paired_difference,
                                               per_item_accuracy, write_report)
from rankgen_jax.experiments.demo import suffix_identification
from rankgen_jax.experiments.demo_folder import DemoFolder


def test_standard_errors_match_numpy():
    rng = np.random.default_rng(0)
    base_N = (rng.random(500) < 0.7).astype(float)
    # Correlated with the baseline, as two models scoring the same items are.
    run_N = np.where(rng.random(500) < 0.85, base_N, 1.0 - base_N)
    p, se = accuracy_se(run_N)
    assert p == pytest.approx(run_N.sum() / 500)
    assert se == pytest.approx(np.sqrt(p * (1 - p) / 500))
    diff, diff_se = paired_difference(run_N, base_N)
    d = run_N - base_N
    assert diff == pytest.approx(run_N.mean() - base_N.mean())
    assert diff_se == pytest.approx(np.sqrt(np.sum((d - d.mean()) ** 2) / (len(d) - 1) / len(d)))
    # Pairing removes the variance the two share: smaller than the unpaired SE of the difference.
    assert diff_se < np.hypot(se, accuracy_se(base_N)[1])
    with pytest.raises(RankgenError, match="same items: 3 against 2"):
        paired_difference(np.ones(3), np.ones(2))
    with pytest.raises(RankgenError, match="no items"):
        accuracy_se(np.array([]))


def test_per_item_accuracy_averages_to_the_jobs_metrics():
    rng = np.random.default_rng(1)
    scores = [rng.integers(0, 3, 4).astype(float).tolist() for _ in range(50)]  # many ties
    values = per_item_accuracy(scores)
    job = suffix_identification([np.asarray(s) for s in scores])
    assert set(values) == {"accuracy_2way", "accuracy_4way"}
    assert values["accuracy_2way"].mean() == pytest.approx(job["accuracy_2way"])
    assert values["accuracy_4way"].mean() == pytest.approx(job["accuracy_4way"])
    assert per_item_accuracy([[1.0, 1.0, 0.0]])["accuracy_3way"][0] == 0.5
    with pytest.raises(RankgenError, match="different numbers of candidates"):
        per_item_accuracy([[1.0, 0.0], [1.0, 0.0, 0.0]])


def _scored_run(path, correct_2way, correct_all, model="fine_tuned", items=None):
    """A job workdir of per-item scores (gold = candidate 0 of 3): the gold beats candidate 1 where correct_2way,
    and candidate 2 where correct_all (so it tops all three where both hold)."""
    path.mkdir(parents=True, exist_ok=True)
    records = []
    for i, (two, every) in enumerate(zip(correct_2way, correct_all)):
        # candidate 1 beats the gold when not two-way correct; candidate 2 when not all-way correct
        scores = [1.0, 2.0 if not two else 0.0, 3.0 if not every else 0.5]
        prefix = items[i] if items else f"prefix {i}"
        records.append({"prefix": prefix, "candidates": [f"gold {i}", f"neg a {i}", f"neg b {i}"], "scores": scores})
    write_jsonl(DemoFolder(path).scores(model), records)
    (path / "results.json").write_text(json.dumps({"train": {"steps": 7.0}}))


def test_report_marks_differences_beyond_the_noise(tmp_path):
    rng = np.random.default_rng(2)
    n = 400
    base2, base3 = rng.random(n) < 0.6, rng.random(n) < 0.4
    better2 = base2 | (rng.random(n) < 0.5)  # about +20 points: far beyond the noise
    noisy2 = np.where(rng.random(n) < 0.03, ~base2, base2)  # a few flips both ways: within it
    _scored_run(tmp_path / "baseline", base2, base3)
    _scored_run(tmp_path / "baseline", base2 & False, base3 & False, model="zero_shot")
    _scored_run(tmp_path / "better", better2, base3)
    _scored_run(tmp_path / "noisy", noisy2, base3)
    runs = [{"name": "baseline", "workdir": str(tmp_path / "baseline"), "changed": {}},
            {"name": "better", "workdir": str(tmp_path / "better"), "changed": {"DataConfig.batch_size": 128}},
            {"name": "noisy", "workdir": str(tmp_path / "noisy"), "changed": {"ExamplesData.same_document": False}}]
    comparison = write_report(runs, "baseline", tmp_path / "out")
    rows = {r["name"]: r for r in comparison["runs"]}
    assert list(rows) == ["baseline", "better", "noisy", ZERO_SHOT_ROW]
    assert comparison["n"] == n and comparison["metrics"] == ["accuracy_2way", "accuracy_3way"]
    expected = {"baseline": (base2, base2 & base3), "better": (better2, better2 & base3), "noisy": (noisy2, noisy2 & base3)}
    for name, (correct2, correct3) in expected.items():
        for metric, correct, base in (("accuracy_2way", correct2, base2), ("accuracy_3way", correct3, base2 & base3)):
            got = rows[name]["metrics"][metric]
            d = correct.astype(float) - base
            assert got["value"] == pytest.approx(correct.mean())
            assert got["se"] == pytest.approx(np.sqrt(correct.mean() * (1 - correct.mean()) / n))
            assert got["diff"] == pytest.approx(d.mean())
            assert got["diff_se"] == pytest.approx(d.std(ddof=1) / np.sqrt(n))
            assert got["exceeds_noise"] == (name != "baseline" and abs(d.mean()) > 2 * d.std(ddof=1) / np.sqrt(n))
    assert rows["better"]["metrics"]["accuracy_2way"]["exceeds_noise"]
    assert not rows["noisy"]["metrics"]["accuracy_2way"]["exceeds_noise"]
    assert rows[ZERO_SHOT_ROW]["metrics"]["accuracy_2way"]["value"] == 0.0
    assert rows[ZERO_SHOT_ROW]["metrics"]["accuracy_2way"]["exceeds_noise"]
    assert rows["baseline"]["steps"] == 7

    table = (tmp_path / "out" / "ablations.md").read_text()
    better_line = next(line for line in table.splitlines() if line.startswith("| better |"))
    assert "| batch_size=128 | 7 | 0.7" in better_line and better_line.endswith("| yes |")
    assert "(baseline)" in next(line for line in table.splitlines() if line.startswith("| baseline |"))
    assert "- `DataConfig.batch_size`: against the baseline, 128 (accuracy_2way +" in table
    assert "the effect exceeds the noise on accuracy_2way (128), accuracy_3way (128)." in table
    assert "- `ExamplesData.same_document`: against the baseline, false (" in table and "within the noise" in table
    assert json.loads((tmp_path / "out" / "ablations.json").read_text())["runs"][1]["name"] == "better"
    assert (tmp_path / "out" / "ablations.png").stat().st_size > 0


def test_runs_must_share_their_items(tmp_path):
    _scored_run(tmp_path / "a", [True, False], [True, True])
    _scored_run(tmp_path / "b", [True, True], [True, True], items=["other prefix", "prefix 1"])
    runs = [{"name": "a", "workdir": str(tmp_path / "a")}, {"name": "b", "workdir": str(tmp_path / "b")}]
    with pytest.raises(RankgenError, match="held-out items differ from the baseline's"):
        compare_runs(runs, "a")
    with pytest.raises(RankgenError, match="baseline run 'c' is not among the runs"):
        compare_runs(runs, "c")
    with pytest.raises(RankgenError, match="no suffix_eval_scores_fine_tuned.jsonl"):
        compare_runs([{"name": "x", "workdir": str(tmp_path / "none")}], "x")
