"""The demo's per-genre comparison: held-out documents by id and folder, items per genre, the starting model's best
prefix length, and standard errors checked against plain NumPy."""

import numpy as np
import pytest

from rankgen_jax.data.documents import document_genre
from rankgen_jax.data.source_configs import BooksData, DataConfig, ExamplesData
from rankgen_jax.data.sources import corpus_split
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.suffix_comparison import (accuracy_and_se, compare_by_genre, comparison_table,
                                                paired_gain, top1_wins)
from rankgen_jax.experiments.demo import held_out_suffix_sets


def _sentences(topic: str, n: int) -> str:
    return " ".join(f"The {topic} number {i} stood by the {topic} wall and waited there." for i in range(n))


@pytest.fixture
def corpus(tmp_path):
    for folder, names in {"plays": ["a", "b", "c"], "speeches": ["d", "e"], "novels": ["f"]}.items():
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / f"{name}.txt").write_text(_sentences(f"{folder}{name}", 120), encoding="utf-8")
    (tmp_path / "loose.txt").write_text(_sentences("loose", 120), encoding="utf-8")
    return tmp_path


def test_holdout_ids_by_id_and_folder(corpus):
    config = BooksData(corpus=str(corpus), holdout_ids=("plays/b.txt", "speeches/"))
    (train, held), _ = corpus_split(config)
    assert [d.id for d in held] == ["plays/b.txt", "speeches/d.txt", "speeches/e.txt"]
    assert [d.id for d in train] == ["loose.txt", "novels/f.txt", "plays/a.txt", "plays/c.txt"]
    # Without holdout_ids: the last holdout_documents by id, as before.
    (_, held), _ = corpus_split(BooksData(corpus=str(corpus), holdout_documents=2))
    assert [d.id for d in held] == ["speeches/d.txt", "speeches/e.txt"]


def test_holdout_ids_that_match_nothing_or_everything_are_errors(corpus):
    with pytest.raises(RankgenError, match=r"holdout_ids \['plays/z.txt', 'poems/'\] name no document"):
        corpus_split(BooksData(corpus=str(corpus), holdout_ids=("plays/a.txt", "plays/z.txt", "poems/")))
    with pytest.raises(RankgenError, match="none is left to train"):
        corpus_split(BooksData(corpus=str(corpus), holdout_ids=("plays/", "speeches/", "novels/", "loose.txt")))


def test_document_genre_is_the_first_folder():
    assert document_genre("plays/othello.txt") == "plays"
    assert document_genre("speeches/x/y.txt") == "speeches"
    assert document_genre("loose.txt") == "all"


def test_held_out_items_per_genre_from_held_out_documents_only(corpus):
    config = DataConfig(ExamplesData(corpus=str(corpus), holdout_ids=("plays/a.txt", "plays/b.txt", "speeches/d.txt"),
                                     prefix_words=40, max_continuation_words=20))
    items = held_out_suffix_sets(config, num_examples=5, num_negatives=3)
    genres = [it["genre"] for it in items]
    assert genres.count("plays") == 5 and genres.count("speeches") == 5 and len(items) == 10
    assert {it["doc_id"] for it in items} <= {"plays/a.txt", "plays/b.txt", "speeches/d.txt"}
    assert all(it["genre"] == document_genre(it["doc_id"]) and len(it["candidates"]) == 4 for it in items)
    # Both plays can be drawn: items of a genre come from all of its documents' examples.
    many = held_out_suffix_sets(config, num_examples=1000, num_negatives=3)
    assert {it["doc_id"] for it in many if it["genre"] == "plays"} == {"plays/a.txt", "plays/b.txt"}
    assert held_out_suffix_sets(config, num_examples=5, num_negatives=3) == items  # deterministic


def test_top1_wins_reads_the_first_candidates_and_shares_ties():
    scores = [np.array([0.9, 0.1, 0.95]), np.array([0.2, 0.5, 0.1]), np.array([0.5, 0.5, 0.1])]
    np.testing.assert_allclose(top1_wins(scores, 2), [1.0, 0.0, 0.5])
    np.testing.assert_allclose(top1_wins(scores), [0.0, 0.0, 0.5])


def test_standard_errors_match_plain_numpy():
    rng = np.random.default_rng(0)
    new_N = (rng.random(50) < 0.7).astype(float)
    old_N = (rng.random(50) < 0.5).astype(float)
    p, se = accuracy_and_se(new_N)
    n = len(new_N)
    assert p == pytest.approx(np.sum(new_N) / n)
    assert se == pytest.approx(np.sqrt(np.var(new_N) / n))  # for 0/1 values var = p (1 - p)
    gain, gain_se = paired_gain(new_N, old_N)
    d = new_N - old_N
    assert gain == pytest.approx(np.sum(d) / n)
    assert gain_se == pytest.approx(np.sqrt(np.sum((d - d.mean()) ** 2) / (n - 1)) / np.sqrt(n))
    with pytest.raises(RankgenError, match="paired gain"):
        paired_gain(new_N[:1], old_N[:1])
    with pytest.raises(RankgenError, match="paired gain"):
        paired_gain(new_N, old_N[:-1])


def _scores_winning(wins, num_candidates=3):
    """Score lists whose gold (candidate 0) wins against all the others exactly where `wins` is true."""
    return [np.array([1.0] + [0.0] * (num_candidates - 1)) if w else np.array([0.0] + [1.0] * (num_candidates - 1))
            for w in wins]


def test_compare_by_genre_takes_the_best_length_per_genre():
    genres = ["a"] * 4 + ["b"] * 4
    tuned = _scores_winning([1, 1, 1, 1, 1, 1, 0, 0])
    base = {32: _scores_winning([0, 0, 0, 0, 1, 1, 1, 0]), 64: _scores_winning([1, 1, 1, 0, 1, 0, 0, 0])}
    report = compare_by_genre(genres, tuned, base)
    assert set(report) == {"a", "b"} and report["a"]["n"] == 4
    a, b = report["a"]["vs 2"], report["b"]["vs 2"]
    assert a["best_length"] == 64 and a["best_zero_shot"]["accuracy"] == 0.75 and a["fine_tuned"]["accuracy"] == 1.0
    assert b["best_length"] == 32 and b["best_zero_shot"]["accuracy"] == 0.75 and b["fine_tuned"]["accuracy"] == 0.5
    assert a["zero_shot"][32]["accuracy"] == 0.0 and b["zero_shot"][64]["accuracy"] == 0.25
    gain, se = paired_gain(np.array([1, 1, 1, 1.0]), np.array([1, 1, 1, 0.0]))
    assert a["gain"] == pytest.approx(gain) and a["gain_se"] == pytest.approx(se)
    assert a["clear"] is False  # +0.25 with se 0.25: not two standard errors
    # "vs 1" reads the gold and the first negative only: here it wins wherever it wins against all.
    assert report["a"]["vs 1"]["fine_tuned"]["accuracy"] == 1.0
    # Equal accuracies: the shorter prefix is the best reading.
    tie = compare_by_genre(["a"] * 2, _scores_winning([1, 0]), {64: _scores_winning([0, 1]), 32: _scores_winning([1, 0])})
    assert tie["a"]["vs 1"]["best_length"] == 32


def test_a_clear_gain_and_the_table():
    genres = ["plays"] * 40
    tuned = _scores_winning([1] * 36 + [0] * 4, num_candidates=11)
    base = {length: _scores_winning([1] * 20 + [0] * 20, num_candidates=11) for length in (32, 128)}
    report = compare_by_genre(genres, tuned, base)
    row = report["plays"]["vs 10"]
    assert row["gain"] == pytest.approx(0.4) and row["clear"] is True
    table = comparison_table(report, 128)
    lines = table.splitlines()
    assert lines[0] == ("| genre | n | negatives | zero-shot @32 | zero-shot @128 | best zero-shot | fine-tuned @128 "
                        "| gain | > 2 SE |")
    assert lines[2].startswith("| plays | 40 | vs 1 | 0.500 ± 0.079 | 0.500 ± 0.079 | 0.500 ± 0.079 (@32) "
                               "| 0.900 ± 0.047 | +0.400 ± ")
    assert lines[3].endswith("| yes |") and len(lines) == 4
    # The same table from the report as results.json holds it (lengths as strings).
    import json
    assert comparison_table(json.loads(json.dumps(report)), 128) == table


def test_compare_by_genre_rejects_mismatched_lists():
    with pytest.raises(RankgenError, match="2 genres, 1 fine-tuned"):
        compare_by_genre(["a", "a"], _scores_winning([1]), {32: _scores_winning([1, 0])})
    with pytest.raises(RankgenError, match="at one prefix length"):
        compare_by_genre(["a"], _scores_winning([1]), {})
