"""The end-to-end retrieval example on a tiny configuration: its BEIR folder, its 2-shard indexes, its TREC runs
and its table, checked with the project's readers and against ir_measures run directly on the written files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import ir_measures
import pytest

from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
from rankgen_jax.data.retrieval_files import read_beir, read_passages, read_qrels, read_run
from rankgen_jax.experiments.retrieval_example import MATRYOSHKA_MODEL, MEASURES, MODELS, NUM_SHARDS, TABLE_FILE, \
    RetrievalExampleConfig, bundled_books, run_retrieval_example
from rankgen_jax.testing import build_tiny_rankgen

TINY_COLLECTION = BooksCollectionConfig(passages_per_book=12, prefix_words=48, max_continuation_words=40, dev_books=1)


@pytest.fixture(scope="module")
def example(tmp_path_factory, spiece_model):
    root = tmp_path_factory.mktemp("retrieval_example")
    checkpoint = build_tiny_rankgen(root / "tiny_ckpt", spiece_model)
    config = RetrievalExampleConfig(init_checkpoint=checkpoint, collection=TINY_COLLECTION, train_steps=3,
                                    eval_every=2, matryoshka_dims=(32, 16, 8),
                                    batch_size=8, prefix_length=32, continuation_length=32, learning_rate=1e-3,
                                    logit_scale=1.0, mined_negatives=3, mining_depth="2-20")
    workdir = root / "work"
    return workdir, run_retrieval_example(str(workdir), config)


def _beir_qrels(path: Path) -> list[tuple[str, str, int]]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["query-id", "corpus-id", "score"]
    return [(q, d, int(s)) for q, d, s in rows[1:]]


def test_collection_reads_back_with_disjoint_splits(example):
    workdir, results = example
    beir = workdir / "beir"
    corpus = read_passages(beir, quiet=True)
    assert len(corpus) == results["collection"]["passages"] == 7 * 12
    assert "austen-emma-0000" in corpus.rows and corpus.titles[corpus.rows["austen-emma-0000"]] == "Emma"
    splits = {}
    for split in ("train", "test"):
        data = read_beir(beir, split=split)
        splits[split] = data.qrels
        assert set(data.qrels.labels) == set(data.queries.ids)
        for qid, labels in data.qrels.labels.items():
            assert list(labels) == [qid[len("q-"):]] and labels[qid[len("q-"):]] == 1
            assert qid[len("q-"):] in corpus.rows
    assert not set(splits["train"].labels) & set(splits["test"].labels)
    book = lambda qid: qid[len("q-"):].rsplit("-", 1)[0]  # noqa: E731
    train_books = {book(q) for q in splits["train"].labels}
    test_books = {book(q) for q in splits["test"].labels}
    assert not train_books & test_books and len(test_books) == 2
    # Deterministic: a second build writes the same files.
    again = build_books_collection(bundled_books(), workdir / "beir_again", TINY_COLLECTION)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        assert (workdir / "beir_again" / name).read_bytes() == (beir / name).read_bytes()
    assert again["test_books"] == results["collection"]["test_books"]


@pytest.mark.parametrize("model", MODELS)
def test_shards_runs_and_measures(example, model):
    workdir, results = example
    beir = workdir / "beir"
    corpus_ids = read_passages(beir, quiet=True).ids
    shard_ids = []
    for shard in range(NUM_SHARDS):
        folder = workdir / model / "index" / f"shard{shard}"
        config = json.loads((folder / "index_config.json").read_text())
        assert (config["shard_index"], config["num_shards"]) == (shard, NUM_SHARDS)
        shard_ids.append(json.loads((folder / "ids.json").read_text()))
    assert all(shard_ids) and sorted(shard_ids[0] + shard_ids[1]) == sorted(corpus_ids)
    assert not set(shard_ids[0]) & set(shard_ids[1])

    run_path = workdir / model / "test.trec"
    lines = [line.split() for line in run_path.read_text().splitlines()]
    by_query: dict[str, list[list[str]]] = {}
    for fields in lines:
        assert len(fields) == 6 and fields[1] == "Q0"
        by_query.setdefault(fields[0], []).append(fields)
    test_qrels = _beir_qrels(beir / "qrels" / "test.tsv")
    assert set(by_query) == {q for q, _, _ in test_qrels}
    for rows in by_query.values():
        assert [int(r[3]) for r in rows] == list(range(1, len(rows) + 1))
        assert len({r[2] for r in rows}) == len(rows) == len(corpus_ids)  # k=100 >= the tiny corpus
        scores = [float(r[4]) for r in rows]
        assert scores == sorted(scores, reverse=True)
    assert read_run(run_path).keys() == by_query.keys()

    reference = ir_measures.calc_aggregate(
        [ir_measures.parse_measure(m) for m in MEASURES],
        [ir_measures.Qrel(q, d, s) for q, d, s in test_qrels],
        [ir_measures.ScoredDoc(f[0], f[2], float(f[4])) for f in lines])
    ours = results["test"][model]
    for measure in MEASURES:
        assert ours[measure] == pytest.approx(reference[ir_measures.parse_measure(measure)], abs=1e-9)
    assert ours["queries"] == len(by_query) and read_qrels(beir, split="test").labels.keys() == by_query.keys()


def test_table_has_the_four_models_the_dev_curves_and_the_dimensions(example):
    workdir, results = example
    table = (workdir / TABLE_FILE).read_text().split("\n\n")
    rows = table[0].splitlines()
    assert rows[0] == "| model | nDCG@10 | RR@10 | R@100 |"
    assert [row.split("|")[1].strip() for row in rows[2:]] == [*MODELS, MATRYOSHKA_MODEL]
    saved = json.loads((workdir / "results.json").read_text())
    assert saved["test"].keys() == {*MODELS, MATRYOSHKA_MODEL}
    # Measured on the dev book during training, at steps 0, 2 and the last; nothing read the test split.
    for name in ("in_batch", "hard_negatives", MATRYOSHKA_MODEL):
        assert sorted(map(int, saved["dev_curve"][name])) == [0, 2, 3]
        assert saved["dev_eval_cost"][name]["evaluations"] == 3 and 0 < saved["dev_eval_cost"][name]["share"] < 1
    assert all(not key.startswith("retrieval/") or "@dev/" in key or key == "retrieval/seconds"
               for line in (workdir / "train_in_batch" / "metrics.jsonl").read_text().splitlines()
               for key in json.loads(line))
    assert saved["dimensions"].keys() == {"zero_shot", "in_batch", MATRYOSHKA_MODEL}
    for row in saved["dimensions"].values():
        assert list(row) == ["32", "16", "8"]
        assert all(0 <= cut["mean"] <= 1 and len(cut["per_query"]) == saved["collection"]["test_queries"]
                   for cut in row.values())
    # The whole vector's mean is the per-query values' mean.
    whole = saved["dimensions"]["in_batch"]["32"]
    assert whole["mean"] == pytest.approx(sum(whole["per_query"].values()) / len(whole["per_query"]))
    assert "| model | d = 32 | d = 16 | d = 8 |" in (workdir / TABLE_FILE).read_text()
