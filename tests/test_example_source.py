"""RankGen examples as a trainer batch source, and truncation that keeps a prefix's end."""

import dataclasses
from collections import Counter

import numpy as np

from rankgen_jax.data.documents import require_documents
from rankgen_jax.data.example_source import ExampleTriples, build_examples
from rankgen_jax.data.examples import ExampleConfig
from rankgen_jax.data.source_configs import DataConfig, ExamplesData
from rankgen_jax.data.sources import make_sources
from rankgen_jax.data.text import TokenWindows, encode_truncated, load_text_encoder
from rankgen_jax.data.vocab import BUNDLED_CORPUS

from rankgen_jax.resources import DEMO_VOCAB



def test_encode_truncated_keeps_start_or_end():
    text = load_text_encoder(DEMO_VOCAB)
    body = text.tokenize("one two three four five six seven eight nine ten eleven twelve")
    marker = text.tokenize("pre ")
    start = encode_truncated(text, "pre ", "one two three four five six seven eight nine ten eleven twelve", 8, "start")
    end = encode_truncated(text, "pre ", "one two three four five six seven eight nine ten eleven twelve", 8, "end")
    room = 8 - len(marker) - 1
    assert len(start) == len(end) == 8 and start[-1] == end[-1] == 1  # EOS kept
    assert start[: len(marker)] == end[: len(marker)] == marker
    assert start[len(marker) : -1] == body[:room] and end[len(marker) : -1] == body[-room:]


def test_example_triples_batches_are_same_document_and_deterministic():
    docs, _ = require_documents(BUNDLED_CORPUS / "austen")
    docs = sorted(docs, key=lambda d: d.id)[:2]
    examples, _ = build_examples(docs, ExampleConfig(prefix_words=64, max_continuation_words=48, seed=3))
    text = load_text_encoder(DEMO_VOCAB)
    source = ExampleTriples(examples, TokenWindows(text, 48, 40), batch_size=8, seed=5)
    again = ExampleTriples(examples, TokenWindows(text, 48, 40), batch_size=8, seed=5)
    for index in (0, 3, source.batches_per_epoch + 1):  # also into the second epoch
        a, b = source.batch(index), again.batch(index)
        assert {k: v.shape for k, v in a.items()} == {"query_ids": (8, 48), "positive_ids": (8, 40), "negative_ids": (8, 40)}
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # Rows of one batch come from one book; epochs are reshuffled.
    epoch = source._batches(0, examples)
    for members in epoch:
        assert len({examples[i].doc_id for i in members}) == 1
    assert source._batches(1, examples) != epoch
    # A host's rows are a slice of the global batch.
    np.testing.assert_array_equal(source.batch(2, slice(4, 8))["query_ids"], source.batch(2)["query_ids"][4:8])


def test_examples_source_from_config_holds_out_whole_books():
    train, held = make_sources(DataConfig(ExamplesData(continuation_length=48, prefix_words=64, max_continuation_words=48, holdout_documents=2), batch_size=8, prefix_length=64))
    assert {e.doc_id for e in held.examples} == {"speeches/2020_donald_j_trump.txt", "speeches/2021_joseph_r_biden.txt"}
    assert not {e.doc_id for e in held.examples} & {e.doc_id for e in train.examples}


def test_recut_epochs_pair_the_text_afresh_and_resume_by_index():
    docs, _ = require_documents(BUNDLED_CORPUS / "austen")
    docs = sorted(docs, key=lambda d: d.id)[:2]
    config = ExampleConfig(prefix_words=64, max_continuation_words=48, seed=3)
    examples, _ = build_examples(docs, config)
    text = load_text_encoder(DEMO_VOCAB)
    cuts = []

    def recut(epoch):
        cuts.append(epoch)
        found, _ = build_examples(docs, dataclasses.replace(config, seed=3 + epoch, draw_prefix_words=True))
        return found[: len(found) // 2] if epoch == 2 else found  # epoch 2 short: its batches start over

    def triples(**kw):
        return ExampleTriples(examples, TokenWindows(text, 48, 40), batch_size=8, seed=5, **kw)

    plain, source, fresh = triples(), triples(recut=recut), triples(recut=recut)
    n = source.batches_per_epoch
    # The first epoch is the examples given.
    for index in (0, n - 1):
        for key, value in plain.batch(index).items():
            np.testing.assert_array_equal(source.batch(index)[key], value)
    # Later epochs are recut: other prefixes than the plain source's epoch, yet one document per batch.
    plain_queries = {tuple(row) for i in range(n) for row in plain.batch(n + i)["query_ids"]}
    recut_queries = {tuple(row) for i in range(n) for row in source.batch(n + i)["query_ids"]}
    assert len(recut_queries & plain_queries) < 0.5 * len(recut_queries)
    _, _, batches = source._cached_epoch
    assert len(batches) == n
    # A short epoch repeats its batches to the first epoch's length.
    second = [source.batch(2 * n + i)["query_ids"] for i in range(n)]
    period = len(source._batches(2, recut(2)))
    assert period < n
    np.testing.assert_array_equal(second[period], second[0])
    # Resuming at a later index builds that epoch alone and gives the same batch.
    cuts.clear()
    np.testing.assert_array_equal(fresh.batch(2 * n + 3)["positive_ids"], source.batch(2 * n + 3)["positive_ids"])
    assert cuts == [2]


def test_pooled_leftovers_train_on_the_short_documents_too():
    """The bundled addresses are shorter than a batch of 32: same-document batches alone leave most of them out;
    ExamplesData.pool_leftovers batches the leftovers with their genre's and leaves the held-out side alone."""
    config = DataConfig(ExamplesData(continuation_length=48, holdout_documents=2), batch_size=32, prefix_length=64)
    plain_train, plain_held = make_sources(config)
    pooled_train, pooled_held = make_sources(config.with_source(pool_leftovers=True))

    def genres_used(source):
        return Counter(source.examples[i].doc_id.split("/")[0] for b in source._batches(0, source.examples) for i in b)

    plain, pooled = genres_used(plain_train), genres_used(pooled_train)
    assert pooled["speeches"] > 2 * plain["speeches"] and pooled_train.dropped_examples() < plain_train.dropped_examples()
    assert sum(pooled.values()) == len(pooled_train.examples) - pooled_train.dropped_examples()
    for b in pooled_train._batches(0, pooled_train.examples):
        assert len({pooled_train.examples[i].doc_id.split("/")[0] for i in b}) == 1
    assert pooled_held._batches(0, pooled_held.examples) == plain_held._batches(0, plain_held.examples)


def test_generative_records_train_as_triples_grouped_or_mixed(tmp_path):
    """ExamplesData.train_file with source "examples": the (p, c, g) records train, same-document ("both") or mixed
    ("generative"); bad records are skipped; records of held-out documents are refused."""
    import json

    import pytest

    from rankgen_jax.errors import RankgenError

    records = [{"doc_id": doc, "prefix": f"The prefix {doc} {k}.", "continuation": f"The gold {doc} {k}.",
                "generative_negative": f"The sampled text {doc} {k}."}
               for doc in ("novels/a.txt", "novels/b.txt") for k in range(8)]
    path = tmp_path / "triples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"doc_id": "x", "prefix": "no gold"}\n'
                    + "not json\n", encoding="utf-8")
    config = DataConfig(ExamplesData(continuation_length=16, holdout_documents=2, train_file=str(path)), batch_size=4, prefix_length=16)
    text = load_text_encoder(DEMO_VOCAB)
    for same_document in (True, False):
        train, held = make_sources(config.with_source(same_document=same_document))
        assert [(e.prefix, e.continuation, e.negatives) for e in train.examples] == [
            (r["prefix"], r["continuation"], (r["generative_negative"],)) for r in records]
        groups = [{train.examples[i].doc_id for i in members} for members in train._batches(0, train.examples)]
        assert len(groups) == 4 and (all(len(g) == 1 for g in groups) if same_document else any(len(g) > 1 for g in groups))
        first = train.examples[train._batches(0, train.examples)[0][0]]
        want = encode_truncated(text, "suffi ", first.negatives[0], 16)
        assert train.batch(0)["negative_ids"][0, : len(want)].tolist() == want
        # The eval source is still the corpus's held-out documents, with InBook negatives.
        assert {e.doc_id for e in held.examples} == {"speeches/2020_donald_j_trump.txt", "speeches/2021_joseph_r_biden.txt"}
    leaked = tmp_path / "leaked.jsonl"
    leaked.write_text(json.dumps({**records[0], "doc_id": "speeches/2021_joseph_r_biden.txt"}) + "\n", encoding="utf-8")
    with pytest.raises(RankgenError, match="records of held-out documents"):
        make_sources(config.with_source(train_file=str(leaked)))
    with pytest.raises(RankgenError, match="cannot be recut"):
        make_sources(config.with_source(recut_examples=True))
