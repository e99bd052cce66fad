"""The suffix-identification benchmarks' readers: items built by the paper's rules (App. C.4; StoryCloze as the
released preprocess_story_cloze.py builds it), bad records skipped and counted, and `score` reading the output."""

import csv
import json

import numpy as np
import pytest

from rankgen_jax.cli.main import main
from rankgen_jax.data.suffix_benchmarks import benchmark_items
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.sparse import unigram_overlap_scores

HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "x"},
    {"ind": 92, "ctx_a": "How to cook rice. Rinse the rice.", "ctx_b": "", "label": 0,
     "endings": ["Boil water.", "Eat it raw.", "Throw it away.", "Paint it."]},
]


def test_hellaswag_items_put_ctx_b_before_each_ending_and_skip_bad_records(tmp_path):
    lines = [json.dumps(r) for r in HELLASWAG]
    lines += [json.dumps({**HELLASWAG[0], "ind": 7, "label": ""}),  # a test-split record: no answer
              json.dumps({**HELLASWAG[0], "ind": 8, "endings": ["one", "two"]}),
              "{not json",
              json.dumps({**HELLASWAG[0], "ind": 9, "label": 4})]
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    items, skipped = benchmark_items("hellaswag", path)
    assert items == [
        {"id": "hellaswag-24", "prefix": "A man is sitting on a roof.",
         "candidates": ["he " + e for e in HELLASWAG[0]["endings"]], "label": 3},
        {"id": "hellaswag-92", "prefix": "How to cook rice. Rinse the rice.",
         "candidates": HELLASWAG[1]["endings"], "label": 0},
    ]
    assert skipped.by_reason == {"no label (a test-split record)": [3], "endings are not 4 texts": [4],
                                 "malformed JSON": [5], "label is not an ending's index": [6]}


def _storycloze_rows():
    header = ["InputStoryid", "InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4",
              "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding"]
    return [header,
            ["s1", "Tom was hungry.", "He opened the fridge.", "It was empty.", "He went out, sadly.",
             "He bought food.", "He flew to Mars.", "1"],
            ["s2", "Ann ran.", "She fell.", "She cried.", "Her mom came.", "Her mom laughed.",
             "Her mom hugged her.", "2"],
            ["s3", "A.", "B.", "C.", "D.", "E.", "F.", "3"],
            ["s4", "A.", "", "C.", "D.", "E.", "F.", "1"]]


def test_storycloze_items_follow_the_released_preprocessing(tmp_path):
    rows = _storycloze_rows()
    path = tmp_path / "cloze.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    items, skipped = benchmark_items("storycloze", path)
    # The released rule (preprocess_story_cloze.py): prefix = " ".join(row[1:5]); the right ending is row[4 + answer].
    for item, row in zip(items, rows[1:3]):
        assert item["prefix"] == " ".join(row[1:5])
        assert item["candidates"][item["label"]] == row[4 + int(row[-1])]
        assert item["candidates"][1 - item["label"]] == row[4 + 3 - int(row[-1])]
        assert item["id"] == row[0]
    assert len(items) == 2
    assert skipped.by_reason == {"AnswerRightEnding is not 1 or 2": [4], "a story id, sentence or ending is empty": [5]}

    wrong = tmp_path / "wrong.csv"
    wrong.write_text("id,sentence\n1,a\n", encoding="utf-8")
    with pytest.raises(RankgenError, match="header lacks InputStoryid"):
        benchmark_items("storycloze", wrong)


def test_chapterbreak_items_per_split_with_bad_examples_counted(tmp_path):
    good = {"ctx": "The chapter ends here.", "pos": "Chapter II. Morning came.", "negs": [f"neg {k}." for k in range(5)]}
    data = {"pg19": {"123": [good, {"ctx": "x", "pos": "", "negs": ["a"]}], "456": [good]},
            "ao3": {"9": [dict(good, negs="not a list")]}}
    path = tmp_path / "chapterbreak_ctx_256.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    items, skipped = benchmark_items("chapterbreak", path, "pg19")
    assert [it["id"] for it in items] == ["pg19/123/0", "pg19/456/0"]
    assert items[0]["candidates"] == [good["pos"], *good["negs"]] and items[0]["label"] == 0
    assert items[0]["prefix"] == good["ctx"]
    assert skipped.by_reason == {"no ctx or pos text": [2]} and "example 2" in skipped.describe()
    with pytest.raises(RankgenError, match="no usable chapterbreak record"):
        benchmark_items("chapterbreak", path, "ao3")
    path.write_text(json.dumps({"pg19": {}}), encoding="utf-8")
    with pytest.raises(RankgenError, match="no ChapterBreak split 'ao3' \\(found: pg19\\)"):
        benchmark_items("chapterbreak", path, "ao3")


def test_suffix_benchmark_cli_writes_what_score_reads(tmp_path, capsys):
    # Endings sharing 3, 2, 1 and 0 words with the prefix: unigram overlap has no ties to break.
    records = [{"ind": label + 1, "ctx_a": "the red fox runs home", "ctx_b": "then", "label": label,
                "endings": ["the red fox sleeps", "the red cat", "the dog", "a cow"]} for label in (0, 2)]
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{bad\n", encoding="utf-8")
    out = tmp_path / "items.jsonl"
    assert main(["suffix-benchmark", "--benchmark", "hellaswag", "--input", str(path), "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["items"] == 2 and summary["skipped"] == 1 and summary["candidates"] == [4]
    assert "note: skipped 1 line(s)" in stderr and "malformed JSON (line 3)" in stderr
    assert main(["score", "--input", str(out), "--method", "unigram"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    items = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    wins = []
    for item in items:
        scores = unigram_overlap_scores(item["prefix"], item["candidates"])
        assert len(set(scores.tolist())) == len(scores)  # no ties, so accuracy is argmax == label
        wins.append(float(np.argmax(scores) == item["label"]))
    assert scored["n"] == 2 and scored["accuracy"] == pytest.approx(np.mean(wins))
    assert main(["suffix-benchmark", "--benchmark", "storycloze", "--input", str(tmp_path / "none.csv"),
                 "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
