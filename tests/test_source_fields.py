"""Each data source's config class holds only what its source reads: building a source's batches (train and held-out),
its input conventions and its held-out check read every field of its class (seqio, which needs a registered task
and TensorFlow, is covered by tests/test_seqio_training.py)."""

import dataclasses

import pytest
from test_retrieval_training import tevatron_records, trec_run, write_beir, write_jsonl

from rankgen_jax.data.source_configs import (BooksData, DataConfig, ExamplesData, ListsData, PairsData,
                                             RandomData, RetrievalData, source_fields)
from rankgen_jax.data.sources import make_sources, missing_eval_data, training_conventions
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES, BatchLayout

LAYOUTS = {"triples": [BatchLayout("dual_encoder", TRIPLES)],
           "lists": [BatchLayout("dual_encoder", CANDIDATE_LISTS), BatchLayout("cross_encoder", CANDIDATE_LISTS)]}


def _fields_read(config, layouts) -> set[str]:
    """The fields of `config` (a source config) that building its sources, conventions and held-out check read."""
    read: set[str] = set()
    fields = set(source_fields(type(config)))

    class Recording(type(config)):
        def __getattribute__(self, name):
            if name in fields:
                read.add(name)
            return super().__getattribute__(name)

    recording = Recording(**{f: getattr(config, f) for f in fields})
    read.clear()  # the constructor's own type check reads every field
    data = DataConfig(recording, batch_size=2, prefix_length=16)
    for layout in layouts:
        missing_eval_data(data)
        training_conventions(data, layout)
        for source in make_sources(data, layout):
            if source is not None:
                source.batch(0)
    return read


def _lists(tmp_path) -> str:
    records = [{"query": f"query {i}", "candidates": [f"right {i}", f"wrong {i}", f"other {i}"],
                "labels": [1, 0, 0]} for i in range(4)]
    return write_jsonl(tmp_path / "lists.jsonl", records)


def _pairs(tmp_path) -> str:
    return write_jsonl(tmp_path / "pairs.jsonl", [{"a": f"a {i}", "b": f"b {i}", "labels": [1, 0]} for i in range(4)])


def _configs(tmp_path):
    """(config, layouts) per source, in each of the ways the source reads its data."""
    beir = tmp_path / "beir"
    write_beir(beir, trec_run())
    tevatron = write_jsonl(tmp_path / "train.jsonl", tevatron_records())
    return {
        "random": [(RandomData(), LAYOUTS["triples"])],
        "books": [(BooksData(continuation_length=32, holdout_documents=2), LAYOUTS["triples"])],
        "examples": [(ExamplesData(continuation_length=32, holdout_documents=2, prefix_words=48,
                                   max_continuation_words=24), LAYOUTS["triples"])],
        "lists": [(ListsData(train_file=_lists(tmp_path), eval_file=_lists(tmp_path), continuation_length=16),
                   LAYOUTS["lists"])],
        "pairs": [(PairsData(train_file=_pairs(tmp_path), eval_file=_pairs(tmp_path)), LAYOUTS["lists"])],
        "retrieval": [
            (RetrievalData(train_file=tevatron, eval_file=tevatron, qrels=str(beir), continuation_length=16,
                           hard_negatives=2), LAYOUTS["triples"] + LAYOUTS["lists"]),
            (RetrievalData(retrieval_corpus=str(beir), negatives_run=str(beir / "run.trec"), continuation_length=16,
                           hard_negatives=2), LAYOUTS["triples"] + LAYOUTS["lists"]),
        ],
    }


@pytest.mark.parametrize("kind", ["random", "books", "examples", "lists", "pairs", "retrieval"])
def test_every_field_of_a_source_config_is_read(tmp_path, kind, capsys):
    ways = _configs(tmp_path)[kind]
    read = set().union(*(_fields_read(config, layouts) for config, layouts in ways))
    assert read == set(source_fields(type(ways[0][0]))), sorted(set(source_fields(type(ways[0][0]))) - read)


def test_a_field_no_source_reads_is_caught():
    """The check can fail: a field added to a source's class that its source never reads is not among those read."""

    @dataclasses.dataclass(frozen=True)
    class WithUnread(RandomData):
        unread: int = 0

    read = _fields_read(WithUnread(), LAYOUTS["triples"])
    assert read == {"vocab_size", "continuation_length", "with_negative"}
    assert set(source_fields(WithUnread)) - read == {"unread"}
