"""RankGen examples from real books: sentence-bounded spans, lengths, InBook negatives, determinism, batching."""

import dataclasses
import math
from collections import Counter
from pathlib import Path

import pytest

from rankgen_jax.data.documents import Document
from rankgen_jax.data.examples import Example, ExampleConfig, dropped_examples, make_examples, same_document_batches
from rankgen_jax.data.sentences import split_sentences, word_count
from rankgen_jax.errors import RankgenError

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"
BOOKS = ["austen/persuasion.txt", "botchan/botchan.txt"]


def load(doc_id: str) -> Document:
    return Document(doc_id, (CORPUS / doc_id).read_text(encoding="utf-8-sig"))


@pytest.fixture(scope="module")
def books() -> dict[str, Document]:
    return {doc_id: load(doc_id) for doc_id in BOOKS}


def disjoint(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[1] <= b[0] or b[1] <= a[0]


def check_invariants(doc: Document, examples: list[Example], config: ExampleConfig) -> float:
    """Assert every invariant of `make_examples`; return the fraction of negatives within the length tolerance."""
    sentences = split_sentences(doc.text)

    def text(span):
        assert 0 <= span[0] < span[1] <= len(sentences)
        return " ".join(sentences[span[0] : span[1]])

    within = []
    for e in examples:
        assert e.doc_id == doc.id
        # Sentence-bounded: each text is exactly its span's sentences.
        assert e.prefix == text(e.prefix_span)
        assert e.continuation == text(e.continuation_span)
        assert e.prefix_span[1] == e.continuation_span[0]  # the continuation follows the prefix directly
        assert config.min_prefix_words <= word_count(e.prefix) <= config.prefix_words
        gold = word_count(e.continuation)
        assert config.min_continuation_words <= gold <= config.max_continuation_words
        assert len(e.negatives) == len(e.negative_spans) == config.negatives_per_example
        for i, (negative, span) in enumerate(zip(e.negatives, e.negative_spans)):
            assert negative == text(span)  # from the same document, sentence-bounded
            assert disjoint(span, e.prefix_span) and disjoint(span, e.continuation_span)
            assert all(disjoint(span, other) for other in e.negative_spans[i + 1 :])
            assert 1 <= word_count(negative) <= config.max_continuation_words
            within.append(abs(word_count(negative) - gold) <= config.length_tolerance * gold)
    return sum(within) / len(within) if within else 1.0


@pytest.mark.parametrize("doc_id", BOOKS)
def test_invariants_on_real_books(books, doc_id):
    doc = books[doc_id]
    config = ExampleConfig()
    examples = make_examples(doc, config)
    # Non-overlapping prefixes cover the book: about one example per 256 words.
    assert len(examples) >= 0.9 * word_count(doc.text) / config.prefix_words
    assert check_invariants(doc, examples, config) >= 0.95
    starts = [e.prefix_span[0] for e in examples]
    assert all(e.prefix_span[1] <= nxt for e, nxt in zip(examples, starts[1:]))
    # Continuation lengths spread over the range (target drawn uniformly in [10, 128]).
    lengths = [word_count(e.continuation) for e in examples]
    assert min(lengths) < 25 and max(lengths) > 110
    assert 45 < sum(lengths) / len(lengths) < 80


def test_stride_and_several_negatives(books):
    doc = books["botchan/botchan.txt"]
    config = ExampleConfig(prefix_words=128, negatives_per_example=3, prefix_stride_sentences=2, seed=3)
    examples = make_examples(doc, config)
    assert check_invariants(doc, examples, config) >= 0.9
    starts = [e.prefix_span[0] for e in examples]
    assert all(s % 2 == 0 for s in starts) and starts == sorted(set(starts))
    # Overlapping prefixes give many more examples than non-overlapping ones.
    assert len(examples) > 3 * len(make_examples(doc, dataclasses.replace(config, prefix_stride_sentences=0)))


def test_tight_tolerance_is_mostly_met(books):
    doc = books["austen/persuasion.txt"]
    config = ExampleConfig(length_tolerance=0.2, min_continuation_words=40, max_continuation_words=60)
    examples = make_examples(doc, config)
    assert len(examples) > 100
    assert check_invariants(doc, examples, config) >= 0.8


def test_deterministic_for_a_seed(books):
    doc = books["botchan/botchan.txt"]
    first = make_examples(doc, ExampleConfig(seed=5))
    assert first == make_examples(doc, ExampleConfig(seed=5))
    other_seed = make_examples(doc, ExampleConfig(seed=6))
    assert [e.continuation_span for e in first] != [e.continuation_span for e in other_seed]
    assert [e.negative_spans for e in first] != [e.negative_spans for e in other_seed]
    # The document id is part of the seed: the same text under another id is cut differently.
    renamed = make_examples(Document("other-id", doc.text), ExampleConfig(seed=5))
    assert [e.negative_spans for e in first] != [e.negative_spans for e in renamed]


def test_drawn_prefix_words_cut_other_pairs(books):
    doc = books["austen/persuasion.txt"]
    plain = make_examples(doc, ExampleConfig(seed=5))
    plain_ends = {e.prefix_span[1] for e in plain}
    for seed in range(3):
        config = ExampleConfig(seed=seed, draw_prefix_words=True)
        drawn = make_examples(doc, config)
        assert drawn == make_examples(doc, config)
        assert check_invariants(doc, drawn, config) >= 0.95
        words = [word_count(e.prefix) for e in drawn]
        # Budgets drawn uniformly from [128, 256] words: prefixes of every length in between.
        assert min(words) < 140 and max(words) > 245 and 170 < sum(words) / len(words) < 210
        # Prefixes end, and continuations start, at other sentences than the fixed budget's.
        assert len({e.prefix_span[1] for e in drawn} & plain_ends) < 0.3 * len(drawn)


def numbered_document(doc_id: str, sentences: int, words_per_sentence: int = 8) -> Document:
    """Synthetic text: `sentences` sentences of `words_per_sentence` words each."""
    filler = " ".join(["word"] * (words_per_sentence - 2))
    return Document(doc_id, " ".join(f"Sentence {i} {filler}." for i in range(sentences)))


def test_short_documents_give_no_examples():
    config = ExampleConfig(prefix_words=64, min_continuation_words=10, max_continuation_words=20)
    assert make_examples(Document("empty", ""), config) == []
    assert make_examples(Document("one", "Just one short sentence."), config) == []
    # A prefix fits (8 sentences = 64 words) but nothing is left for the continuation.
    assert make_examples(numbered_document("prefix-only", 8), config) == []
    # Prefix + continuation but no room left for a disjoint negative.
    assert make_examples(numbered_document("no-negative", 10), config) == []
    enough = make_examples(numbered_document("enough", 14), config)
    assert len(enough) == 1 and enough[0].prefix_span == (0, 8)
    assert make_examples(numbered_document("no negatives needed", 10), dataclasses.replace(config, negatives_per_example=0))


def test_overlong_sentences_are_skipped_not_cut():
    """A sentence longer than the continuation maximum is never cut: examples around it are skipped."""
    config = ExampleConfig(prefix_words=20, min_continuation_words=5, max_continuation_words=10, negatives_per_example=0)
    six = "One two three four five six."
    text = "A b c d e f g h i. J k l m n o p q r. " + " ".join(["Giant"] + ["giant"] * 29) + ". " + " ".join([six] * 4)
    examples = make_examples(Document("d", text), config)
    # Prefix (0, 2) would need the 31-word sentence as its continuation: skipped; that sentence
    # alone is over the prefix budget: skipped; the prefix of sentences 3-5 takes the last one.
    assert [(e.prefix_span, e.continuation_span) for e in examples] == [((3, 6), (6, 7))]
    assert examples[0].continuation == six


def test_json_round_trip(books):
    example = make_examples(books["botchan/botchan.txt"], ExampleConfig())[0]
    plain = example.to_json()
    assert set(plain) == {"doc_id", "prefix", "continuation", "negatives"}
    assert isinstance(plain["negatives"], list)
    assert Example.from_json(example.to_json(with_spans=True)) == example


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"prefix_words": 0}, "prefix_words"),
        ({"min_continuation_words": 50, "max_continuation_words": 20}, "min_continuation_words"),
        ({"negatives_per_example": -1}, "negatives_per_example"),
        ({"length_tolerance": -0.1}, "length_tolerance"),
        ({"prefix_stride_sentences": -2}, "prefix_stride_sentences"),
        ({"min_prefix_fraction": 0}, "min_prefix_fraction"),
    ],
)
def test_bad_config(fields, message):
    with pytest.raises(RankgenError, match=message):
        ExampleConfig(**fields)


# --- batching --------------------------------------------------------------


@pytest.fixture(scope="module")
def pool() -> list[Example]:
    """Examples of three synthetic documents: 23, 11 and 3 examples."""
    config = ExampleConfig(prefix_words=40, min_continuation_words=8, max_continuation_words=16)
    examples = []
    for doc_id, sentences in [("a", 118), ("b", 58), ("c", 18)]:
        examples += make_examples(numbered_document(doc_id, sentences), config)
    return examples


def test_pool_sizes(pool):
    assert Counter(e.doc_id for e in pool) == {"a": 23, "b": 11, "c": 3}


def test_same_document_batches(pool):
    batches = list(same_document_batches(pool, batch_size=5, seed=0))
    assert all(len(b) == 5 and len({e.doc_id for e in b}) == 1 for b in batches)
    # a: 4 full batches, b: 2, c (3 examples < 5): none.
    assert Counter(b[0].doc_id for b in batches) == {"a": 4, "b": 2}
    flat = [id(e) for b in batches for e in b]
    assert len(flat) == len(set(flat)) == len(pool) - dropped_examples(pool, 5)
    assert dropped_examples(pool, 5) == 3 + 1 + 3
    # Batches of different documents are interleaved, not book after book.
    assert [b[0].doc_id for b in batches] != sorted(b[0].doc_id for b in batches)


def test_batches_deterministic_and_seeded(pool):
    def key(batches):
        return [[(e.doc_id, e.prefix_span) for e in b] for b in batches]

    first = key(same_document_batches(pool, 4, seed=1))
    assert first == key(same_document_batches(pool, 4, seed=1))
    assert first != key(same_document_batches(pool, 4, seed=2))


def test_batches_keep_remainder(pool):
    batches = list(same_document_batches(pool, batch_size=5, seed=0, drop_remainder=False))
    assert all(len({e.doc_id for e in b}) == 1 for b in batches)
    assert sorted(len(b) for b in batches) == [1, 3, 3] + [5] * 6
    assert sorted(id(e) for b in batches for e in b) == sorted(id(e) for e in pool)


def test_pooled_leftovers_are_batched_with_their_kind():
    """Documents shorter than a batch: their leftovers fill batches of their own kind (first folder), full batches
    stay single-document, and only each kind's last remainder is dropped."""
    config = ExampleConfig(prefix_words=40, min_continuation_words=8, max_continuation_words=16)
    pool = []
    for doc_id, sentences in [("speeches/a", 58), ("speeches/b", 58), ("speeches/c", 18), ("plays/d", 118),
                              ("plays/e", 18)]:
        pool += make_examples(numbered_document(doc_id, sentences), config)
    sizes = Counter(e.doc_id for e in pool)
    assert sizes == {"speeches/a": 11, "speeches/b": 11, "speeches/c": 3, "plays/d": 23, "plays/e": 3}
    plain = list(same_document_batches(pool, batch_size=5, seed=0))
    pooled = list(same_document_batches(pool, batch_size=5, seed=0, pool_leftovers=True))
    assert all(len(b) == 5 for b in pooled)
    assert all(len({e.doc_id.split("/")[0] for e in b}) == 1 for b in pooled)
    # Leftovers: speeches 1 + 1 + 3 = 5 (one batch, none dropped), plays 3 + 3 = 6 (one batch, 1 dropped).
    mixed = [b for b in pooled if len({e.doc_id for e in b}) > 1]
    assert sorted(b[0].doc_id.split("/")[0] for b in mixed) == ["plays", "speeches"]
    assert len(pooled) == len(plain) + 2
    assert dropped_examples(pool, 5) == 11 and dropped_examples(pool, 5, pool_leftovers=True) == 1
    flat = [id(e) for b in pooled for e in b]
    assert len(flat) == len(set(flat)) == len(pool) - 1
    # The full single-document batches are the plain ones; pooling only adds.
    key = lambda batches: sorted(tuple(sorted((e.doc_id, e.prefix_span) for e in b)) for b in batches)  # noqa: E731
    assert set(key(plain)) <= set(key(pooled))
    assert key(pooled) == key(same_document_batches(pool, batch_size=5, seed=0, pool_leftovers=True))


def test_mixed_document_batches(pool):
    batches = list(same_document_batches(pool, batch_size=6, seed=0, mix_documents=True))
    assert len(batches) == len(pool) // 6 and all(len(b) == 6 for b in batches)
    assert any(len({e.doc_id for e in b}) > 1 for b in batches)
    assert dropped_examples(pool, 6, mix_documents=True) == len(pool) % 6
    with pytest.raises(RankgenError, match="batch_size"):
        next(same_document_batches(pool, batch_size=0, seed=0))


def test_tolerance_bound_is_meaningful(books):
    """Without length matching a random span would often miss the tolerance: the measured fraction means something."""
    doc = books["austen/persuasion.txt"]
    examples = make_examples(doc, ExampleConfig(length_tolerance=0.1))
    fraction = check_invariants(doc, examples, ExampleConfig(length_tolerance=0.1))
    assert fraction >= 0.7
    # Gold lengths vary a lot, so matching is non-trivial: most pairs of golds differ by > 10%.
    golds = [word_count(e.continuation) for e in examples]
    mismatched = sum(abs(a - b) > 0.1 * a for a, b in zip(golds, golds[1:]))
    assert mismatched > 0.5 * (len(golds) - 1)
    assert math.isclose(ExampleConfig(prefix_words=255).min_prefix_words, 128)
