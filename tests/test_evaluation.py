"""Metrics with ties, the unigram-overlap baseline, JSONL scoring with a model or the baseline, and `score`."""

import json

import numpy as np
import pytest
from test_inference import SHARED, TEXTS, random_params

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import build_parser, main, run_command
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.ranking import accuracy, mrr, reciprocal_rank, score_file, top1
from rankgen_jax.retrieval.sparse import unigram_overlap_scores, unigrams
from rankgen_jax.inference.encoder import load_model

PREFIX = "The old lighthouse keeper climbed the stairs, lantern in hand, to watch the storm."
GOLD = "At the top of the lighthouse the keeper set the lantern down and watched the storm."
NEGATIVE = "Quarterly revenue rose by four percent, analysts said on Monday."


def test_ranks_and_ties():
    assert reciprocal_rank([0.1, 0.9, 0.5], 0) == pytest.approx(1 / 3)
    assert top1([0.1, 0.9, 0.5], 0) == 0.0 and top1([0.1, 0.9, 0.5], 1) == 1.0
    # Ties count as a uniformly random order: gold tied with one other at the top.
    assert top1([1.0, 1.0, 0.0], 0) == 0.5
    assert reciprocal_rank([1.0, 1.0, 0.0], 0) == pytest.approx((1 + 1 / 2) / 2)
    # One candidate above, two others tied with the gold: rank 2, 3 or 4.
    assert top1([2.0, 1.0, 1.0, 1.0], 1) == 0.0
    assert reciprocal_rank([2.0, 1.0, 1.0, 1.0], 1) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    # A constant scorer gets exactly chance level.
    assert top1([0.0] * 4, 2) == 0.25
    assert reciprocal_rank([0.0] * 4, 2) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    # NaN is the lowest score.
    assert reciprocal_rank([float("nan"), 0.5], 0) == 0.5 and top1([0.3, float("nan")], 0) == 1.0


def test_accuracy_and_mrr_over_queries():
    scores = [[0.9, 0.1], [0.2, 0.8, 0.5], np.array([3.0, 3.0])]
    gold = [0, 2, 1]
    assert accuracy(scores, gold) == pytest.approx((1 + 0 + 0.5) / 3)
    assert mrr(scores, gold) == pytest.approx((1 + 1 / 2 + 0.75) / 3)
    assert np.isnan(accuracy([], [])) and np.isnan(mrr([], []))
    with pytest.raises(ValueError, match="2 score lists but 1"):
        mrr(scores[:2], gold[:1])
    with pytest.raises(ValueError, match="out of range"):
        top1([1.0, 2.0], 2)


def test_unigram_overlap_is_f1_of_word_sets():
    assert unigrams("Don't STOP_now, the end.") == {"don", "t", "stop", "now", "the", "end"}
    candidates = ["The cat sat!", "Dogs bark loudly", "", "THE MAT, the cat."]
    scores = unigram_overlap_scores("The cat sat on the mat.", candidates)
    # Prefix words {the, cat, sat, on, mat}; "the cat sat": precision 1, recall 3/5 -> F1 0.75.
    np.testing.assert_allclose(scores, [0.75, 0.0, 0.0, 0.75])
    # Identical word sets score 1; a subset of one word of five: p 1, r 1/5 -> F1 1/3.
    np.testing.assert_allclose(unigram_overlap_scores("a b c d e", ["e d c b a", "c"]), [1.0, 1 / 3])
    assert unigram_overlap_scores("", ["anything"]).tolist() == [0.0]
    # Suffix identification where the gold continuation reuses the prefix's words.
    gold_first = unigram_overlap_scores(PREFIX, [GOLD, NEGATIVE])
    assert gold_first[0] > 0.4 and gold_first[1] == 0.0


def write_jsonl(path, lines):
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return str(path)


GOOD = [
    {"prefix": PREFIX, "candidates": [NEGATIVE, GOLD], "label": 1},
    {"prefix": "The cat sat on the mat.", "candidates": ["the cat sat", "a dog ran", "the cat sat"], "label": 2, "id": "x"},
    {"prefix": "Rain fell all night.", "candidates": ["Stocks fell.", "Nothing else."]},  # unlabelled
    {"prefix": "Snow.", "candidates": ["Ice.", "Fire."], "label": 0},
]
MALFORMED = [
    "not json at all",
    '["a", "list"]',
    {"prefix": "p", "candidates": []},
    {"prefix": "p", "candidates": ["a", 3]},
    {"prefix": "p", "candidates": ["a", "b"], "label": 2},
    {"prefix": "p", "candidates": ["a", "b"], "label": True},
    {"candidates": ["a"]},
]


def test_score_file_unigram_labelled_unlabelled_and_malformed(tmp_path):
    lines = [GOOD[0], MALFORMED[0], GOOD[1], "", MALFORMED[1], GOOD[2], *MALFORMED[2:], GOOD[3]]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    result = score_file(None, path, str(tmp_path / "out.jsonl"), method="unigram")
    # Labelled: gold wins (1, 1); gold tied with candidate 0 at the top (1/2, 3/4); all zero, two candidates (1/2, 3/4).
    assert result["n"] == 3 and result["scored"] == 4
    assert result["accuracy"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert result["mrr"] == pytest.approx((1 + 0.75 + 0.75) / 3)
    assert result["skipped"] == len(MALFORMED) and result["skipped_lines"] == [2, 5, 7, 8, 9, 10, 11]
    # Each reason once, with its count and line numbers, in the order the reasons first appear.
    assert result["skipped_reasons"] == (
        "1 malformed JSON (line 2); 1 not a JSON object (line 5); 2 candidates not a non-empty list of strings "
        "(line 7, 8); 2 label not an index into the candidates (line 9, 10); 1 no string prefix (line 11)")
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [{k: v for k, v in w.items() if k != "scores"} for w in written] == GOOD
    for record, w in zip(GOOD, written):
        np.testing.assert_allclose(w["scores"], unigram_overlap_scores(record["prefix"], record["candidates"]), rtol=1e-6)
    # Nothing labelled: no metrics, still scored and written.
    only = score_file(None, write_jsonl(tmp_path / "u.jsonl", [GOOD[2]]), method="unigram")
    assert only["n"] == 0 and only["accuracy"] is None and only["mrr"] is None and only["scored"] == 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spiece_model):
    path = tmp_path_factory.mktemp("eval") / "ckpt"
    native.save_params(path, SHARED, random_params(SHARED, 3), vocab=spiece_model)
    return str(path)


def test_score_file_with_model(tmp_path, model_dir):
    model = load_model(model_dir)
    records = [{"prefix": TEXTS[i], "candidates": TEXTS[i + 1 : i + 4], "label": i % 3} for i in range(5)]
    records.append({"prefix": TEXTS[7], "candidates": TEXTS[8:10]})
    result = score_file(model, write_jsonl(tmp_path / "in.jsonl", records + ["{broken"]), str(tmp_path / "out.jsonl"))
    want = model.score([r["prefix"] for r in records], [r["candidates"] for r in records])
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(written) == 6 and result["skipped"] == 1 and result["n"] == 5
    for w, s in zip(written, want):
        np.testing.assert_allclose(w["scores"], s, rtol=1e-5, atol=1e-6)
    assert result["accuracy"] == pytest.approx(accuracy(want[:5], [r["label"] for r in records[:5]]))
    assert result["mrr"] == pytest.approx(mrr(want[:5], [r["label"] for r in records[:5]]))
    with pytest.raises(RankgenError, match="needs a `model`"):
        score_file(None, str(tmp_path / "in.jsonl"))
    with pytest.raises(RankgenError, match="no such file"):
        score_file(model, str(tmp_path / "missing.jsonl"))
    with pytest.raises(RankgenError, match="overwrite the input"):
        score_file(model, str(tmp_path / "in.jsonl"), str(tmp_path / "in.jsonl"))


def test_score_cli_last_line_is_json(tmp_path, model_dir, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", [*GOOD, MALFORMED[0]])
    run_command(["score", "--input", path, "--method", "unigram"])
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary) == {"n", "accuracy", "mrr", "pairwise_accuracy"} and summary["n"] == 3
    assert summary["accuracy"] == pytest.approx(2 / 3)
    assert f"note: skipped 1 line(s) of {path}: 1 malformed JSON (line {len(GOOD) + 1})" in err
    # Pairwise, ties lose: the gold beats its one negative (1), beats one and ties one (1/2), ties its one (0).
    assert summary["pairwise_accuracy"] == pytest.approx((1 + 0.5 + 0) / 3)

    run_command(["score", "--model", model_dir, "--input", path, "--output", str(tmp_path / "o.jsonl"),
                 "--batch_size", "4"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary) == {"n", "accuracy", "mrr", "pairwise_accuracy"} and summary["n"] == 3
    assert 0 <= summary["accuracy"] <= 1 and 0 <= summary["pairwise_accuracy"] <= 1
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 4

    with pytest.raises(RankgenError, match="the --method model needs --model"):
        run_command(["score", "--input", path])


def test_score_through_rankgen_jax_main(tmp_path, capsys):
    assert "score" in build_parser().format_help()
    path = write_jsonl(tmp_path / "in.jsonl", GOOD)
    assert main(["score", "--input", path, "--method", "unigram"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == 3
    assert main(["score", "--input", str(tmp_path / "missing.jsonl"), "--method", "unigram"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
