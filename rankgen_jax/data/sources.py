"""The trainer's batch sources, by the kind of DataConfig.source: triples, candidate lists and labelled pairs.

Each source's settings are a config class of its own (data/source_configs.py). A source returns the global
batch for a step index, deterministically: the same (seed, index) always gives the same rows, so resuming
only needs the next index, and each host can build just its own rows. The sentence-bounded examples
(`data/example_source.py`), the seqio tasks (`data/seqio/source.py`, `SeqioTriples`) and the list / pair
files (`data/lists.py`) serve the same `batch(index, rows)` interface; `make_sources` picks one.

Triple sources ("random", "books", "examples", "seqio") give a dual encoder's
triples (rankgen_jax.models.batch_layout): right-padded int32 `query_ids`
[B, Lq] (prefixes, "pre " marker), `positive_ids` [B, Lc] (gold
continuations, "suffi " marker) and, with negatives, `negative_ids` [B, Lc]
(another span of the same book). List and pair sources ("lists", "pairs",
rankgen_jax.data.lists) and retrieval data ("retrieval": Tevatron files or
BEIR / qrels + a run, rankgen_jax.data.retrieval_source) build the arrays of
the BatchLayout they are given.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Protocol

import numpy as np

from rankgen_jax.data import lists, retrieval_source
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.documents import Document, ReadStats, require_documents
from rankgen_jax.data.example_source import ExampleTriples, build_examples
from rankgen_jax.data.examples import INCOMPLETE_GENERATIVE, Example, ExampleConfig, generative_example
from rankgen_jax.data.jsonl import SkippedLines, iter_jsonl, read_jsonl
from rankgen_jax.data.retrieval_files import beir_splits, is_beir_folder, read_passages, read_qrels
from rankgen_jax.data.source_configs import BooksData, DataConfig, ExamplesData
from rankgen_jax.data.text import PREFIX_MARKER, SUFFIX_MARKER, TokenWindows, load_text_encoder, pad_batch
from rankgen_jax.data.vocab import EOS_ID
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import TRIPLES, BatchLayout

# What the triple sources build, whatever the model: a dual encoder's triples.
TRIPLE_LAYOUT = BatchLayout("dual_encoder", TRIPLES)


class BatchSource(Protocol):
    batch_size: int

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]: ...


def _row_rng(seed: int, index: int, row: int) -> np.random.Generator:
    return np.random.default_rng([seed, index, row])


def _pad(sequences: list[np.ndarray], length: int) -> np.ndarray:
    out = np.zeros((len(sequences), length), np.int32)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = seq[:length]
    return out


class RandomTriples:
    """Uniform random token ids with random lengths (no text): for throughput and equivalence tests."""

    def __init__(self, config: DataConfig):
        self.config = config
        self.batch_size = config.batch_size

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        cfg, src = self.config, self.config.source
        lengths = TRIPLE_LAYOUT.lengths(cfg.prefix_length, src.continuation_length, optional=src.with_negative)
        out: dict[str, list[np.ndarray]] = {k: [] for k in lengths}
        for row in range(self.batch_size)[rows or slice(None)]:
            rng = _row_rng(cfg.seed, index, row)
            for key, max_len in lengths.items():
                n = int(rng.integers(max(2, max_len // 2), max_len + 1))
                out[key].append(np.append(rng.integers(3, src.vocab_size, n - 1), EOS_ID))
        return {k: _pad(v, lengths[k]) for k, v in out.items()}


class BookTriples:
    """Token windows of whole books: prefix, the tokens that follow it, and a span elsewhere in the same book.

    A simpler source than the sentence-bounded RankGen examples
    (`data/examples.py`): spans here are cut at token boundaries. With same_document, every row of a
    batch comes from one book (RankGen's InBook setting), so in-batch
    negatives are in-book too.
    """

    def __init__(self, config: DataConfig, documents: list[Document]):
        self.config = config
        self.batch_size = config.batch_size
        books = config.source
        self.text = load_text_encoder(books.tokenizer_path())
        # Marker pieces joined to the token windows (the released markers end in a space, which joins nothing).
        self.pre, self.suffi = (self.text.tokenize(m.strip()) if m.strip() else []
                                for m in books.markers((PREFIX_MARKER, SUFFIX_MARKER)))
        self.prefix_body = config.prefix_length - len(self.pre) - self.text.num_special
        self.cont_body = books.continuation_length - len(self.suffi) - self.text.num_special
        span = self.prefix_body + self.cont_body
        self.names, self.tokens = [], []
        for document in documents:
            name, ids = document.id, np.asarray(self.text.tokenize(" ".join(document.text.split())), np.int32)
            # Room for a prefix + continuation and a disjoint negative span.
            if len(ids) >= span + self.cont_body + 1:
                self.names.append(name)
                self.tokens.append(ids)
        if not self.tokens:
            raise RankgenError(f"{books.corpus}: no document is long enough for one example ({span} tokens)")
        sizes = np.array([len(t) for t in self.tokens], np.float64)
        self.doc_weights = sizes / sizes.sum()

    def _example(self, doc: np.ndarray, rng: np.random.Generator):
        span = self.prefix_body + self.cont_body
        start = int(rng.integers(0, len(doc) - span + 1))
        prefix = doc[start : start + self.prefix_body]
        positive = doc[start + self.prefix_body : start + span]
        # A negative that does not overlap the prefix or the gold continuation.
        candidates = [s for s in (int(rng.integers(0, len(doc) - self.cont_body + 1)) for _ in range(8))
                      if s + self.cont_body <= start or s >= start + span]
        neg_start = candidates[0] if candidates else (start + span) % (len(doc) - self.cont_body + 1)
        negative = doc[neg_start : neg_start + self.cont_body]
        return prefix, positive, negative

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        cfg, books = self.config, self.config.source
        batch_doc = int(np.random.default_rng([cfg.seed, index]).choice(len(self.tokens), p=self.doc_weights))
        out = {"query_ids": [], "positive_ids": [], "negative_ids": []}
        for row in range(self.batch_size)[rows or slice(None)]:
            rng = _row_rng(cfg.seed, index, row)
            doc = batch_doc if books.same_document else int(rng.choice(len(self.tokens), p=self.doc_weights))
            prefix, positive, negative = self._example(self.tokens[doc], rng)
            out["query_ids"].append(self.text.add_special(self.pre + prefix.tolist()))
            out["positive_ids"].append(self.text.add_special(self.suffi + positive.tolist()))
            out["negative_ids"].append(self.text.add_special(self.suffi + negative.tolist()))
        lengths = TRIPLE_LAYOUT.lengths(cfg.prefix_length, books.continuation_length, optional=books.with_negative)
        return {k: pad_batch(out[k], length, self.text.pad_id) for k, length in lengths.items()}


def missing_eval_data(config: DataConfig) -> str:
    """What to give for held-out data when the config has none ("" when it has): a run without it cannot evaluate.

    Sources built from a corpus hold documents out, random data draws with another seed, seqio reads its
    validation split; list, pair and retrieval data need their own held-out file or qrels.
    """
    src = config.source
    name = type(src).__name__
    if src.kind in ("lists", "pairs") or (src.kind == "retrieval" and src.train_file):
        return "" if src.eval_file else f"{name}.eval_file (held-out queries in the train_file's format)"
    if src.kind != "retrieval" or src.eval_qrels or not src.retrieval_corpus:
        return ""
    folder = _folder(src.qrels or _folder(src.retrieval_corpus))
    if not folder or (Path(folder) / "qrels" / f"{src.eval_split}.tsv").is_file():
        return ""
    splits = beir_splits(folder)
    return (f"{name}.eval_qrels, or a {name}.eval_split that {folder} has (it has no "
            f"qrels/{src.eval_split}.tsv; its splits: {', '.join(splits) or 'none'})")


def make_sources(config: DataConfig, layout: BatchLayout = TRIPLE_LAYOUT) -> tuple[BatchSource, BatchSource | None]:
    """(train source, eval source). Eval uses held-out documents, or another seed for random data; None where
    the config names no held-out data (missing_eval_data).

    layout: the batch the model kind and loss train on; list and pair sources
    build its arrays, triple sources always build triples.
    """
    if config.batch_size <= 0:
        raise RankgenError(f"DataConfig.batch_size must be positive, got {config.batch_size}")
    kind = config.source.kind
    if layout.joint and any(config.source.markers(("", ""))):
        raise RankgenError(f"a {layout.model_kind} reads query and candidate together, without markers: leave "
                           f"{type(config.source).__name__}.prefix_marker and suffix_marker unset")
    if kind == "random":
        return RandomTriples(config), RandomTriples(dataclasses.replace(config, seed=config.seed + 10_000))
    if kind == "books":
        (train_docs, held_docs), _ = corpus_split(config.source)
        return (BookTriples(config, train_docs),
                BookTriples(dataclasses.replace(config, seed=config.seed + 10_000), held_docs))
    if kind == "examples":
        return _example_sources(config)
    if kind == "seqio":
        return _seqio_sources(config)
    if kind in ("lists", "pairs"):
        return _record_sources(config, layout)
    return _retrieval_sources(config, layout)


def training_conventions(config: DataConfig, layout: BatchLayout = TRIPLE_LAYOUT) -> InputConventions:
    """How the sources `make_sources(config, layout)` builds read text (recorded beside the trained model).

    Every source cuts with the final special token kept ("clean"). Triples and
    dual-encoder lists: "pre " / "suffi " markers (a seqio task's own), the
    prefix cut to prefix_length keeping `prefix_keep` (the seqio tasks keep
    the start), continuations to continuation_length keeping their start.
    Cross-encoder lists (and retrieval data): no markers, the query's `prefix_keep` end. Labelled
    pairs: no markers, both passages keep their start (joint pairs: half the
    length each).
    """
    src = config.source
    markers, prefix_keep = src.markers(source_markers(config, layout)), getattr(src, "prefix_keep", "end")
    prefix_length, suffix_length = config.prefix_length, getattr(src, "continuation_length", config.prefix_length)
    if src.kind == "seqio":
        markers, prefix_keep = _seqio_markers(src.task), "start"
    elif src.kind == "pairs":
        markers, prefix_keep = ("", ""), "start"
        if layout.joint:
            prefix_length = config.prefix_length // 2
            suffix_length = config.prefix_length - prefix_length
        else:
            suffix_length = config.prefix_length
    return InputConventions(prefix_marker=markers[0], suffix_marker=markers[1], prefix_length=prefix_length,
                            suffix_length=suffix_length, prefix_keep=prefix_keep, suffix_keep="start",
                            truncation="clean")


def source_markers(config: DataConfig, layout: BatchLayout = TRIPLE_LAYOUT) -> tuple[str, str]:
    """The markers a source puts before prefixes and continuations unless DataConfig chooses others:
    RankGen's for dual encoders, none where query and candidate are read together (cross encoders)."""
    kind = config.source.kind
    if kind == "pairs" or (kind in ("lists", "retrieval") and layout.joint):
        return "", ""
    return PREFIX_MARKER, SUFFIX_MARKER


def _seqio_markers(task: str) -> tuple[str, str]:
    """The markers of a RankGen seqio task (the registry is filled by entry points; others use RankGen's)."""
    # seqio brings TensorFlow: only a seqio run, which has imported it already, gets here.
    from rankgen_jax.data.seqio.tasks import is_rankgen_task, task_markers

    return task_markers(task) if task and is_rankgen_task(task) else (PREFIX_MARKER, SUFFIX_MARKER)


def _record_sources(config: DataConfig, layout: BatchLayout) -> tuple[BatchSource, BatchSource]:
    """Candidate lists or labelled pairs from JSON-lines files (train_file, and eval_file when given)."""
    src = config.source
    if not src.train_file:
        raise RankgenError(f"{type(src).__name__} needs {type(src).__name__}.train_file")
    text = load_text_encoder(src.tokenizer_path())
    sources = []
    for path, seed in ((src.train_file, config.seed), (src.eval_file, config.seed + 10_000)):
        if not path:
            sources.append(None)
            continue
        if src.kind == "pairs":
            records = read_jsonl(path, lists.check_pair_record)
            sources.append(lists.PairBatches(records, text, config.batch_size, layout, config.prefix_length, seed,
                                             where=path))
        else:
            records = read_jsonl(path, lists.check_list_record)
            windows = TokenWindows(text, config.prefix_length, src.continuation_length, src.prefix_keep,
                                   src.markers(source_markers(config, layout)))
            sources.append(lists.ListBatches(records, windows, config.batch_size, layout, src.list_size, seed,
                                             where=path))
    return sources[0], sources[1]


def _retrieval_sources(config: DataConfig, layout: BatchLayout) -> tuple[BatchSource, BatchSource]:
    """Queries with positives and hard negatives: from Tevatron files, or passages + queries + qrels (+ a run)."""
    src = config.source
    rules = retrieval_source.SamplingRules(src.hard_negatives, src.positive_choice, src.too_few_negatives,
                                           src.title_join, src.list_labels)
    if src.train_file or src.eval_file:
        if src.retrieval_corpus:
            raise RankgenError("RetrievalData reads Tevatron files (train_file, eval_file) or "
                               "retrieval_corpus + qrels, not both")
        if not src.train_file:
            raise RankgenError("RetrievalData with Tevatron files needs RetrievalData.train_file (and, to evaluate, "
                               "RetrievalData.eval_file)")
        pools = []
        for path, qrels, split in ((src.train_file, src.qrels, src.split),
                                   (src.eval_file, src.eval_qrels or _folder(src.qrels), src.eval_split)):
            if not path:
                pools.append(None)
                continue
            judged = read_qrels(qrels, split=split if Path(qrels).is_dir() else None) if qrels else None
            pools.append(retrieval_source.tevatron_queries(path, rules, judged))
    else:
        if not src.retrieval_corpus:
            raise RankgenError("RetrievalData needs Tevatron files (RetrievalData.train_file, eval_file) or "
                               "RetrievalData.retrieval_corpus (a BEIR folder, or passages with "
                               "RetrievalData.queries and RetrievalData.qrels)")
        corpus_folder = _folder(src.retrieval_corpus)
        queries, qrels = src.queries or corpus_folder, src.qrels or corpus_folder
        eval_qrels = src.eval_qrels or _folder(qrels)
        for name, value in (("queries", queries), ("qrels", qrels), ("eval_qrels", eval_qrels)):
            if not value:
                raise RankgenError(f"RetrievalData.{name} is needed when "
                                   f"retrieval_corpus ({src.retrieval_corpus}) is not a BEIR folder"
                                   + ("" if name != "eval_qrels" else " and qrels is a file"))
        passages = read_passages(src.retrieval_corpus)
        held_out = not missing_eval_data(config)
        pools = [retrieval_source.qrels_queries(
            retrieval_source.QrelsFiles(src.retrieval_corpus, queries, judged, split, src.negatives_run),
            rules, passages) if use else None
            for judged, split, use in ((qrels, src.split, True), (eval_qrels, src.eval_split, held_out))]
    text = load_text_encoder(src.tokenizer_path())
    sources = []
    for pool, seed in zip(pools, (config.seed, config.seed + 10_000)):
        if pool is None:
            sources.append(None)
            continue
        print(pool.summary(), file=sys.stderr, flush=True)
        windows = TokenWindows(text, config.prefix_length, src.continuation_length, src.prefix_keep,
                               src.markers(source_markers(config, layout)))
        sources.append(retrieval_source.RetrievalBatches(pool, windows, config.batch_size, layout, rules,
                                                         src.list_size, seed))
    return sources[0], sources[1]


def _folder(path: str) -> str:
    """path when it is a BEIR folder (which holds its own queries and qrels), else ""."""
    return path if path and is_beir_folder(path) else ""


def _seqio_sources(config: DataConfig) -> tuple[BatchSource, BatchSource]:
    """A registered seqio task or mixture, built on the fly or read from seqio_cache_dir; each host reads its share.

    The project's tasks are registered by `import tasks` (tasks/rankgen_tasks.py), which the
    entry points do when their gin config mentions seqio; the library never imports tasks/.
    """
    # seqio brings TensorFlow (seconds to import). jax (for this host's share) is imported here too, so
    # that importing the CLI, which reaches DataConfig, does not import jax before main() sets XLA's flags.
    import jax
    import seqio

    from rankgen_jax.data.seqio.source import SeqioTriples

    src = config.source
    if not src.task:
        raise RankgenError("SeqioData needs SeqioData.task (e.g. 'rankgen_demo')")
    cached = bool(src.seqio_cache_dir)
    if cached:
        import tensorflow as tf

        if not tf.io.gfile.isdir(src.seqio_cache_dir):
            raise RankgenError(f"SeqioData.seqio_cache_dir={src.seqio_cache_dir!r}: no such folder "
                               "(write it with `rankgen-jax cache-tasks --output_cache_dir DIR`)")
        seqio.add_global_cache_dirs([src.seqio_cache_dir])
    shard = seqio.ShardInfo(jax.process_index(), jax.process_count()) if jax.process_count() > 1 else None
    lengths = TRIPLE_LAYOUT.lengths(config.prefix_length, src.continuation_length)
    return tuple(
        SeqioTriples(src.task, split, config.batch_size, lengths, seed=config.seed + offset, shard_info=shard,
                     with_negative=src.with_negative, use_cached=cached, threads=src.tfdata_threads)
        for split, offset in (("train", 0), ("validation", 10_000))
    )


def corpus_split(config: BooksData | ExamplesData) -> tuple[tuple[list[Document], list[Document]], ReadStats]:
    """((training documents, held-out documents), read stats), both sorted by id: the documents
    `holdout_ids` names, or without them the last holdout_documents by id."""
    docs, stats = require_documents(config.corpus)
    docs = sorted(docs, key=lambda d: d.id)
    if config.holdout_ids:
        held_ids = held_out_ids([d.id for d in docs], config.holdout_ids, config.corpus)
        held = [d for d in docs if d.id in held_ids]
        if len(held) == len(docs):
            raise RankgenError(f"{config.corpus}: holdout_ids hold out all {len(docs)} documents; none is left to train")
        return ([d for d in docs if d.id not in held_ids], held), stats
    held = config.holdout_documents
    if held <= 0 or held >= len(docs):
        raise RankgenError(f"{config.corpus}: holdout_documents={held} must leave documents on both sides of {len(docs)}")
    return (docs[:-held], docs[-held:]), stats


def held_out_ids(doc_ids: list[str], patterns: tuple[str, ...], where: str) -> set[str]:
    """The ids `patterns` name: an id itself, or a folder ("plays/") for every id under it;
    a pattern that names no document is a RankgenError (a typo would otherwise train on it)."""
    held, unmatched = set(), []
    for pattern in patterns:
        matches = {i for i in doc_ids if (i.startswith(pattern) if pattern.endswith("/") else i == pattern)}
        if not matches:
            unmatched.append(pattern)
        held |= matches
    if unmatched:
        raise RankgenError(f"{where}: holdout_ids {unmatched} name no document (ids are paths below the corpus "
                           f"folder, e.g. {doc_ids[0]!r}; a folder ends in '/')")
    return held


def example_config_of(config: DataConfig, negatives_per_example: int = 1, seed: int | None = None) -> ExampleConfig:
    """How source "examples" cuts documents: the ExamplesData word lengths, and the seed unless one is given."""
    src = config.source
    return ExampleConfig(prefix_words=src.prefix_words, min_continuation_words=src.min_continuation_words,
                         max_continuation_words=src.max_continuation_words,
                         negatives_per_example=negatives_per_example, seed=config.seed if seed is None else seed)


def generative_examples(path: str, held_out: set[str]) -> list[Example]:
    """The (p, c, g) examples of a `generate-negatives` file; incomplete records are skipped and counted,
    and a record of a held-out document is a RankgenError (its text would be trained on)."""
    skipped, examples = SkippedLines(), []
    for number, record in iter_jsonl(path, on_skip=skipped.add):
        example = generative_example(record)
        if example is None:
            skipped.add(INCOMPLETE_GENERATIVE, number)
        else:
            examples.append(example)
    leaked = sorted({e.doc_id for e in examples} & held_out)
    if leaked:
        raise RankgenError(f"ExamplesData.train_file {path}: records of held-out documents {leaked[:5]}: the eval "
                           "source's documents must not be trained on")
    if not examples:
        raise RankgenError(f"ExamplesData.train_file {path}: no complete (prefix, continuation, generative_negative, "
                           f"doc_id) record ({skipped.describe() or 'an empty file'})")
    if skipped.count:
        print(f"note: {path}: {skipped.count} lines skipped: {skipped.describe()}", flush=True)
    return examples


def _example_sources(config: DataConfig) -> tuple[BatchSource, BatchSource]:
    """RankGen examples cut from the corpus documents; the held-out documents (corpus_split) are the eval source."""
    src = config.source
    (train_docs, held_docs), stats = corpus_split(src)
    if src.train_file and src.recut_examples:
        raise RankgenError("ExamplesData.recut_examples cuts the corpus afresh each epoch; with train_file the "
                           "training examples are the file's records, which cannot be recut: unset one of them")
    text = load_text_encoder(src.tokenizer_path())
    example_config = example_config_of(config)

    def recut(epoch: int) -> list[Example]:
        drawn = dataclasses.replace(example_config, seed=config.seed + epoch, draw_prefix_words=True)
        return build_examples(train_docs, drawn)[0]

    sources = []
    for part, mix in ((train_docs, not src.same_document), (held_docs, True)):
        if part is train_docs and src.train_file:
            examples = generative_examples(src.train_file, {d.id for d in held_docs})
        else:
            examples, too_short = build_examples(part, example_config)
            if too_short:
                print(f"note: {too_short} documents too short for an example", flush=True)
        windows = TokenWindows(text, config.prefix_length, src.continuation_length, src.prefix_keep,
                               src.markers((PREFIX_MARKER, SUFFIX_MARKER)))
        sources.append(ExampleTriples(examples, windows, config.batch_size, config.seed, mix_documents=mix,
                                      with_negative=src.with_negative,
                                      recut=recut if src.recut_examples and part is train_docs else None,
                                      pool_leftovers=src.pool_leftovers and part is train_docs))
    print(f"{stats.summary()}; {len(sources[0].examples)} training and {len(sources[1].examples)} held-out examples; "
          f"{sources[0].dropped_examples()} training examples in no batch (a document's examples beyond its last "
          "full batch; ExamplesData.pool_leftovers batches them with their genre's)", flush=True)
    return sources[0], sources[1]
