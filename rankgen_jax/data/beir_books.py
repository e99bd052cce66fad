"""A small BEIR-format retrieval collection built from books: prefixes as queries, gold continuations as passages.

Each book gives RankGen examples (data/examples.py: a sentence-bounded prefix and its gold continuation); the
continuations become the corpus, with ids "<book slug>-<passage number>" (e.g. "austen-emma-0042") and the
book's title, the prefixes become queries ("q-" + the passage id of their gold continuation), and each query's
qrels judge its gold continuation 1. The last `test_books` books (by id) are the test split, the others the
train split (with dev_books, the books before the test books a dev split), so no book is in two splits; the
corpus holds the passages of every split (BEIR's layout: one corpus, qrels per split). Everything is deterministic for a given configuration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np

from rankgen_jax.data.documents import Document, require_documents
from rankgen_jax.data.examples import ExampleConfig, make_examples
from rankgen_jax.data.retrieval_files import write_beir
from rankgen_jax.errors import RankgenError


@dataclasses.dataclass(frozen=True)
class BooksCollectionConfig:
    """passages_per_book: examples kept per book (drawn with `seed`, then in book order); test_books: the last
    books (sorted by id) whose queries form the test split; dev_books: the books just before those, a dev split
    (none by default)."""

    passages_per_book: int = 60
    test_books: int = 2
    dev_books: int = 0
    prefix_words: int = 128
    min_continuation_words: int = 10
    max_continuation_words: int = 64
    seed: int = 0


def book_slug(doc_id: str) -> str:
    """A document id as an id part: "austen/emma" -> "austen-emma"."""
    stem = doc_id.rsplit(".", 1)[0] if doc_id.endswith((".txt", ".jsonl", ".gz")) else doc_id
    return "-".join(part for part in stem.replace("\\", "/").replace("_", "-").split("/") if part).lower()


def book_title(doc_id: str) -> str:
    """A readable title from a document id: its last path part, capitalised ("austen/prideprejudice" -> "Prideprejudice")."""
    return doc_id.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0].replace("_", " ").capitalize()


def _book_examples(doc: Document, config: BooksCollectionConfig):
    examples = make_examples(doc, ExampleConfig(prefix_words=config.prefix_words,
                                                min_continuation_words=config.min_continuation_words,
                                                max_continuation_words=config.max_continuation_words,
                                                negatives_per_example=0, seed=config.seed))
    if len(examples) > config.passages_per_book:
        rng = np.random.default_rng([config.seed, sum(doc.id.encode())])
        chosen = np.sort(rng.choice(len(examples), size=config.passages_per_book, replace=False))
        examples = [examples[i] for i in chosen]
    return examples


def build_books_collection(documents: Sequence[Document] | str | Path, out_dir: str | Path,
                           config: BooksCollectionConfig = BooksCollectionConfig()) -> dict:
    """Write the BEIR folder out_dir (corpus.jsonl, queries.jsonl, qrels/train.tsv, qrels/test.tsv); returns its
    summary {"passages", "train_queries", "test_queries", "train_books", "test_books"}."""
    if not isinstance(documents, (list, tuple)):
        documents, _ = require_documents(documents)
    books = sorted(documents, key=lambda d: d.id)
    if not 1 <= config.test_books or config.dev_books < 0 or config.test_books + config.dev_books >= len(books):
        raise RankgenError(f"test_books={config.test_books} and dev_books={config.dev_books} must leave at least one "
                           f"of the {len(books)} books for training and hold out at least one for test")
    slugs = [book_slug(d.id) for d in books]
    if len(set(slugs)) != len(slugs):
        raise RankgenError(f"two books give the same id part: {slugs}")
    out = Path(out_dir)
    corpus, queries, qrels = [], [], {"train": [], "test": []}
    split_of = {d.id: "test" for d in books[len(books) - config.test_books :]}
    split_of.update({d.id: "dev" for d in books[len(books) - config.test_books - config.dev_books :
                                                len(books) - config.test_books]})
    if config.dev_books:
        qrels["dev"] = []
    for doc, slug in zip(books, slugs):
        examples = _book_examples(doc, config)
        if not examples:
            raise RankgenError(f"book {doc.id!r} gives no example (prefix_words={config.prefix_words})")
        split = split_of.get(doc.id, "train")
        for number, example in enumerate(examples):
            passage_id = f"{slug}-{number:04d}"
            corpus.append({"_id": passage_id, "title": book_title(doc.id), "text": example.continuation})
            queries.append({"_id": f"q-{passage_id}", "text": example.prefix})
            qrels[split].append((f"q-{passage_id}", passage_id))
    write_beir(out, corpus, queries, {split: [(q, p, 1) for q, p in pairs] for split, pairs in qrels.items()})
    summary = {"folder": str(out), "passages": len(corpus), "train_queries": len(qrels["train"]),
               "test_queries": len(qrels["test"]),
               "train_books": [book_slug(d.id) for d in books if d.id not in split_of],
               "test_books": [book_slug(d.id) for d in books if split_of.get(d.id) == "test"]}
    if config.dev_books:
        summary.update(dev_queries=len(qrels["dev"]),
                       dev_books=[book_slug(d.id) for d in books if split_of.get(d.id) == "dev"])
    return summary
