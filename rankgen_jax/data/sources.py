"""The trainer's batch sources, by DataConfig.source: triples, candidate lists and labelled pairs.

A source returns the global batch for a step index, deterministically: the
same (seed, index) always gives the same rows, so resuming only needs the next
index, and each host can build just its own rows. The sentence-bounded
examples (`data/example_source.py`), the seqio tasks (`data/seqio/source.py`,
`SeqioTriples`) and the list / pair files (`data/lists.py`) serve the same
`batch(index, rows)` interface; `make_sources` picks one by `DataConfig.source`.

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

import gin
import numpy as np

from rankgen_jax.data import lists, retrieval_source
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.documents import Document, ReadStats, require_documents
from rankgen_jax.data.example_source import PREFIX_MARKER, SUFFIX_MARKER, ExampleTriples, build_examples
from rankgen_jax.data.examples import INCOMPLETE_GENERATIVE, Example, ExampleConfig, generative_example
from rankgen_jax.data.jsonl import SkippedLines, iter_jsonl, read_jsonl
from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, beir_splits, is_beir_folder, read_passages,
                                              read_qrels)
from rankgen_jax.data.text import load_text_encoder, pad_batch
from rankgen_jax.data.vocab import BUNDLED_CORPUS, EOS_ID
from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.models.batch_layout import TRIPLES, BatchLayout
from rankgen_jax.resources import DEMO_VOCAB
# What the triple sources build, whatever the model: a dual encoder's triples.
TRIPLE_LAYOUT = BatchLayout("dual_encoder", TRIPLES)

SOURCES = ("examples", "seqio", "books", "random", "lists", "pairs", "retrieval")
# The sources that tokenise text with DataConfig.vocab (the model's own tokenizer by default).
TEXT_SOURCES = ("books", "examples", "lists", "pairs", "retrieval")
_RANKGEN_TEXT = ("books", "examples")

# Which sources read each DataConfig field. A field set away from its default for a source that does not read it
# is an error (DataConfig.__post_init__): it would be silently ignored. The configuration reference is built
# from this table.
DATA_FIELD_SOURCES: dict[str, tuple[str, ...]] = {
    "source": SOURCES,
    "corpus": _RANKGEN_TEXT,
    "vocab": TEXT_SOURCES,
    "batch_size": SOURCES,
    "prefix_length": SOURCES,
    "continuation_length": ("examples", "seqio", "books", "random", "lists", "retrieval"),
    "with_negative": ("examples", "seqio", "books", "random"),
    "same_document": _RANKGEN_TEXT,
    "holdout_documents": _RANKGEN_TEXT,
    "holdout_ids": _RANKGEN_TEXT,
    "vocab_size": ("random",),
    "prefix_words": ("examples",),
    "min_continuation_words": ("examples",),
    "max_continuation_words": ("examples",),
    "prefix_keep": ("examples", "lists", "retrieval"),
    "prefix_marker": ("examples", "books", "lists", "retrieval"),
    "suffix_marker": ("examples", "books", "lists", "retrieval"),
    "recut_examples": ("examples",),
    "pool_leftovers": ("examples",),
    "task": ("seqio",),
    "seqio_cache_dir": ("seqio",),
    "seed": SOURCES,
    "train_file": ("examples", "lists", "pairs", "retrieval"),
    "eval_file": ("lists", "pairs", "retrieval"),
    "list_size": ("lists", "retrieval"),
    "tfdata_threads": ("seqio",),
    **{name: ("retrieval",) for name in ("retrieval_corpus", "queries", "qrels", "eval_qrels", "split", "eval_split",
                                         "negatives_run", "hard_negatives", "positive_choice", "too_few_negatives",
                                         "title_join")},
    "list_labels": ("lists", "retrieval"),
}


class BatchSource(Protocol):
    batch_size: int

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]: ...


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where training triples come from.

    source: "examples" (RankGen examples: sentence-bounded prefixes of about
      `prefix_words` words, continuations of min..max words, one InBook
      negative), "books" (token windows of the documents; quick and crude) or
      "random" (uniform random ids; for benchmarks and tests); "lists"
      (candidate lists from JSON lines: rankers and distillation) or "pairs"
      (labelled passage pairs: multi-perspective matching), read from
      `train_file` / `eval_file` (see rankgen_jax.data.lists); "retrieval"
      (queries with positive and hard-negative passages, see below).
    holdout_documents: the last N documents (by id) form the eval source.
    holdout_ids: the documents of the eval source by id instead (a folder id
      such as "plays/" names all of its documents); each must match one.
    prefix_keep: "end" cuts over-long prefixes from the left, keeping the text
      nearest the continuation; "start" keeps their beginning.
    recut_examples: source "examples": each training epoch after the first
      cuts the training documents afresh (another seed, each prefix's word
      budget drawn from [prefix_words / 2, prefix_words]: see
      ExampleConfig.draw_prefix_words), so a small corpus is not seen as the
      same pairs epoch after epoch; held-out examples stay fixed.
    pool_leftovers: source "examples", same-document training batches: a
      document's examples beyond its last full batch are pooled with the
      other leftovers of its genre (its first folder) and batched with them
      instead of being dropped (examples.same_document_batches); for corpora
      of documents shorter than a batch.
    train_file (source "examples"): a `generate-negatives` JSON-lines file of
      (prefix, continuation, generative_negative, doc_id) records, RankGen's
      (p, c, g) triples, trained on instead of the examples cut from the
      corpus's training documents (negative: the sampled continuation;
      `same_document` groups them by doc_id, the paper's "both", or mixes
      them, "generative" only); the corpus's held-out documents stay the eval
      source, and a record of a held-out document is refused.

    Source "retrieval" (rankgen_jax.data.retrieval_source has the sampling rules)
    reads either Tevatron training files, `train_file` / `eval_file`
    (`{"query_id", "query", "positive_passages", "negative_passages"}`), or
    `retrieval_corpus` (a BEIR folder, or a TSV / JSON-lines passages file)
    with `queries` (a queries file or BEIR folder; default retrieval_corpus),
    `qrels` (a qrels file, or a BEIR folder read at `split`; default
    retrieval_corpus) and `eval_qrels` (default: the qrels folder at
    `eval_split`); a query's positives are the passages its qrels judge >= 1.
    negatives_run: a run (TREC, MS MARCO or search's JSON lines) whose
      passages for a query, minus those the qrels judge relevant, are its
      negative pool; with Tevatron files, `qrels` / `eval_qrels` (optional)
      likewise keep relevant passages out of the files' negatives.
    hard_negatives: K negatives per query and step, drawn from its pool without
      replacement ([B, K, Lc] `negative_ids`; 0: in-batch negatives only);
      `with_negative` does not apply.
    positive_choice: "sample" (one of the query's positives, drawn per step and
      row) or "first" (always its first).
    too_few_negatives: a pool smaller than K: "fill" draws the missing ones
      with replacement from the pool (triples) or leaves masked slots (lists);
      "skip" leaves the query out (counted). An empty pool is always skipped.
    title_join: joins a passage's title to its text (None: titles dropped).
    list_size: candidate lists (listwise losses, cross encoders) hold
      list_size candidates (0: 1 + hard_negatives): positives (label 1) first.
    vocab: the tokenizer ("": the model's own, from TrainerConfig.init_checkpoint,
      else the demo vocabulary).
    prefix_marker / suffix_marker: text put before each prefix (query) and
      continuation (passage); None: the source's own (RankGen's "pre " /
      "suffi " for dual encoders, none for cross encoders). Recorded with the
      model in its input conventions, as prefix_keep is.
    eval_file: optional; without it (and for retrieval data without an eval
      split) the run has no eval source and TrainerConfig.eval_every must be 0.

    DATA_FIELD_SOURCES says which sources read each field; a field set for a
    source that does not read it is an error.
    list_labels: candidate lists' labels: "relevance" (1 positive, 0 negative)
      or "teacher" (the teacher scores the training file's passages carry, so
      ListMLE learns the teacher's order); teacher scores always come along as
      `teacher_scores` for KL / MarginMSE when the file has them.
    """

    source: str = "books"
    corpus: str = str(BUNDLED_CORPUS)
    vocab: str = ""  # spiece.model, tokenizer.json, or a folder with one; "": the model's own
    batch_size: int = 32
    prefix_length: int = 256
    continuation_length: int = 128
    with_negative: bool = True
    same_document: bool = True
    holdout_documents: int = 1
    holdout_ids: tuple[str, ...] = ()
    vocab_size: int = 8064  # random source only
    prefix_words: int = 256
    min_continuation_words: int = 10
    max_continuation_words: int = 128
    prefix_keep: str = "end"
    prefix_marker: str | None = None
    suffix_marker: str | None = None
    recut_examples: bool = False
    pool_leftovers: bool = False
    task: str = ""  # seqio task or mixture name (source "seqio"), e.g. "rankgen_demo"
    seqio_cache_dir: str = ""  # source "seqio": read the task(s) from this cache (`rankgen-jax cache-tasks`)
    seed: int = 0
    train_file: str = ""  # sources "lists" / "pairs" / "retrieval"; "examples": (p, c, g) records
    eval_file: str = ""
    list_size: int = 0  # candidates per list (0: the longest list in the file); padded with a mask
    tfdata_threads: int = 1  # source "seqio": tf.data threads (more where the host has idle cores)
    retrieval_corpus: str = ""  # source "retrieval" without Tevatron files: passages or a BEIR folder
    queries: str = ""
    qrels: str = ""
    eval_qrels: str = ""
    split: str = "train"
    eval_split: str = "dev"
    negatives_run: str = ""
    hard_negatives: int = 1
    positive_choice: str = "sample"
    too_few_negatives: str = "fill"
    title_join: str | None = DEFAULT_TITLE_JOIN
    list_labels: str = "relevance"

    def __post_init__(self):
        check_field_types(self)  # gin hands values over unchecked
        if self.source not in SOURCES:
            raise RankgenError(f"unknown data source {self.source!r}: expected one of {', '.join(map(repr, SOURCES))}")
        unread = [name for name, sources in DATA_FIELD_SOURCES.items()
                  if self.source not in sources and not _is_default(self, name)]
        if unread:
            shown = "; ".join(f"DataConfig.{name}={_short_repr(getattr(self, name))} is read by source "
                              f"{' / '.join(DATA_FIELD_SOURCES[name])} only" for name in unread)
            raise RankgenError(f"DataConfig.source={self.source!r} does not read {', '.join(unread)} ({shown}): "
                               "remove the binding or choose a source that reads it")

    def tokenizer_path(self) -> str:
        """The tokenizer the text sources read with: `vocab`, or the demo vocabulary when none was chosen."""
        return self.vocab or str(DEMO_VOCAB)

    def markers(self, default: tuple[str, str]) -> tuple[str, str]:
        """(prefix marker, suffix marker): those chosen, else the source's `default`."""
        return (default[0] if self.prefix_marker is None else self.prefix_marker,
                default[1] if self.suffix_marker is None else self.suffix_marker)


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"[{len(value)} items]" if isinstance(value, (list, tuple)) else text[: limit - 3] + "..."


def _is_default(config: DataConfig, name: str) -> bool:
    """Whether a field holds its declared default (a list counts as the tuple it stands for, as gin writes one)."""
    field = DataConfig.__dataclass_fields__[name]
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    value = getattr(config, name)
    return (tuple(value) == tuple(default)) if isinstance(value, (list, tuple)) else value == default


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
        cfg = self.config
        lengths = TRIPLE_LAYOUT.lengths(cfg.prefix_length, cfg.continuation_length, optional=cfg.with_negative)
        out: dict[str, list[np.ndarray]] = {k: [] for k in lengths}
        for row in range(self.batch_size)[rows or slice(None)]:
            rng = _row_rng(cfg.seed, index, row)
            for key, max_len in lengths.items():
                n = int(rng.integers(max(2, max_len // 2), max_len + 1))
                out[key].append(np.append(rng.integers(3, cfg.vocab_size, n - 1), EOS_ID))
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
        self.text = load_text_encoder(config.tokenizer_path())
        # Marker pieces joined to the token windows (the released markers end in a space, which joins nothing).
        self.pre, self.suffi = (self.text.tokenize(m.strip()) if m.strip() else []
                                for m in config.markers((PREFIX_MARKER, SUFFIX_MARKER)))
        self.prefix_body = config.prefix_length - len(self.pre) - self.text.num_special
        self.cont_body = config.continuation_length - len(self.suffi) - self.text.num_special
        span = self.prefix_body + self.cont_body
        self.names, self.tokens = [], []
        for document in documents:
            name, ids = document.id, np.asarray(self.text.tokenize(" ".join(document.text.split())), np.int32)
            # Room for a prefix + continuation and a disjoint negative span.
            if len(ids) >= span + self.cont_body + 1:
                self.names.append(name)
                self.tokens.append(ids)
        if not self.tokens:
            raise RankgenError(f"{config.corpus}: no document is long enough for one example ({span} tokens)")
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
        cfg = self.config
        batch_doc = int(np.random.default_rng([cfg.seed, index]).choice(len(self.tokens), p=self.doc_weights))
        out = {"query_ids": [], "positive_ids": [], "negative_ids": []}
        for row in range(self.batch_size)[rows or slice(None)]:
            rng = _row_rng(cfg.seed, index, row)
            doc = batch_doc if cfg.same_document else int(rng.choice(len(self.tokens), p=self.doc_weights))
            prefix, positive, negative = self._example(self.tokens[doc], rng)
            out["query_ids"].append(self.text.add_special(self.pre + prefix.tolist()))
            out["positive_ids"].append(self.text.add_special(self.suffi + positive.tolist()))
            out["negative_ids"].append(self.text.add_special(self.suffi + negative.tolist()))
        lengths = TRIPLE_LAYOUT.lengths(cfg.prefix_length, cfg.continuation_length, optional=cfg.with_negative)
        return {k: pad_batch(out[k], length, self.text.pad_id) for k, length in lengths.items()}


def missing_eval_data(config: DataConfig) -> str:
    """What to give for held-out data when the config has none ("" when it has): a run without it cannot evaluate.

    Sources built from a corpus hold documents out, random data draws with another seed, seqio reads its
    validation split; list, pair and retrieval data need their own held-out file or qrels.
    """
    if config.source in ("lists", "pairs") or (config.source == "retrieval" and config.train_file):
        return "" if config.eval_file else "DataConfig.eval_file (held-out queries in the train_file's format)"
    if config.source != "retrieval" or config.eval_qrels or not config.retrieval_corpus:
        return ""
    folder = _folder(config.qrels or _folder(config.retrieval_corpus))
    if not folder or (Path(folder) / "qrels" / f"{config.eval_split}.tsv").is_file():
        return ""
    splits = beir_splits(folder)
    return (f"DataConfig.eval_qrels, or a DataConfig.eval_split that {folder} has (it has no "
            f"qrels/{config.eval_split}.tsv; its splits: {', '.join(splits) or 'none'})")


def make_sources(config: DataConfig, layout: BatchLayout = TRIPLE_LAYOUT) -> tuple[BatchSource, BatchSource | None]:
    """(train source, eval source). Eval uses held-out documents, or another seed for random data; None where
    the config names no held-out data (missing_eval_data).

    layout: the batch the model kind and loss train on; list and pair sources
    build its arrays, triple sources always build triples.
    """
    if config.batch_size <= 0:
        raise RankgenError(f"DataConfig.batch_size must be positive, got {config.batch_size}")
    if layout.joint and any(config.markers(("", ""))):
        raise RankgenError(f"a {layout.model_kind} reads query and candidate together, without markers: leave "
                           "DataConfig.prefix_marker and suffix_marker unset")
    if config.source == "random":
        return RandomTriples(config), RandomTriples(dataclasses.replace(config, seed=config.seed + 10_000))
    if config.source == "books":
        (train_docs, held_docs), _ = corpus_split(config)
        return (BookTriples(config, train_docs),
                BookTriples(dataclasses.replace(config, seed=config.seed + 10_000), held_docs))
    if config.source == "examples":
        return _example_sources(config)
    if config.source == "seqio":
        return _seqio_sources(config)
    if config.source in ("lists", "pairs"):
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
    markers, prefix_keep = config.markers(source_markers(config, layout)), config.prefix_keep
    prefix_length, suffix_length = config.prefix_length, config.continuation_length
    if config.source == "seqio":
        markers, prefix_keep = _seqio_markers(config.task), "start"
    elif config.source == "pairs":
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
    if config.source == "pairs" or (config.source in ("lists", "retrieval") and layout.joint):
        return "", ""
    return PREFIX_MARKER, SUFFIX_MARKER


def _seqio_markers(task: str) -> tuple[str, str]:
    """The markers of a RankGen seqio task (the registry is filled by entry points; others use RankGen's)."""
    # seqio brings TensorFlow: only a seqio run, which has imported it already, gets here.
    from rankgen_jax.data.seqio.tasks import is_rankgen_task, task_markers

    return task_markers(task) if task and is_rankgen_task(task) else (PREFIX_MARKER, SUFFIX_MARKER)


def _record_sources(config: DataConfig, layout: BatchLayout) -> tuple[BatchSource, BatchSource]:
    """Candidate lists or labelled pairs from JSON-lines files (train_file, and eval_file when given)."""
    if not config.train_file:
        raise RankgenError(f"DataConfig.source={config.source!r} needs DataConfig.train_file")
    text = load_text_encoder(config.tokenizer_path())
    sources = []
    for path, seed in ((config.train_file, config.seed), (config.eval_file, config.seed + 10_000)):
        if not path:
            sources.append(None)
            continue
        if config.source == "pairs":
            records = read_jsonl(path, lists.check_pair_record)
            sources.append(lists.PairBatches(records, text, config.batch_size, layout, config.prefix_length, seed,
                                             where=path))
        else:
            records = read_jsonl(path, lists.check_list_record)
            sources.append(lists.ListBatches(
                records, text, config.batch_size, layout, config.prefix_length, config.continuation_length,
                config.list_size, seed, query_keep=config.prefix_keep, where=path,
                markers=config.markers(source_markers(config, layout))))
    return sources[0], sources[1]


def _retrieval_sources(config: DataConfig, layout: BatchLayout) -> tuple[BatchSource, BatchSource]:
    """Queries with positives and hard negatives: from Tevatron files, or passages + queries + qrels (+ a run)."""
    rules = retrieval_source.SamplingRules(config.hard_negatives, config.positive_choice, config.too_few_negatives,
                                           config.title_join, config.list_labels)
    if config.train_file or config.eval_file:
        if config.retrieval_corpus:
            raise RankgenError("DataConfig.source='retrieval' reads Tevatron files (train_file, eval_file) or "
                               "retrieval_corpus + qrels, not both")
        if not config.train_file:
            raise RankgenError("DataConfig.source='retrieval' with Tevatron files needs DataConfig.train_file "
                               "(and, to evaluate, DataConfig.eval_file)")
        pools = []
        for path, qrels, split in ((config.train_file, config.qrels, config.split),
                                   (config.eval_file, config.eval_qrels or _folder(config.qrels), config.eval_split)):
            if not path:
                pools.append(None)
                continue
            judged = read_qrels(qrels, split=split if Path(qrels).is_dir() else None) if qrels else None
            pools.append(retrieval_source.tevatron_queries(path, rules, judged))
    else:
        if not config.retrieval_corpus:
            raise RankgenError("DataConfig.source='retrieval' needs Tevatron files (DataConfig.train_file, "
                               "eval_file) or DataConfig.retrieval_corpus (a BEIR folder, or passages with "
                               "DataConfig.queries and DataConfig.qrels)")
        corpus_folder = _folder(config.retrieval_corpus)
        queries, qrels = config.queries or corpus_folder, config.qrels or corpus_folder
        eval_qrels = config.eval_qrels or _folder(qrels)
        for name, value in (("queries", queries), ("qrels", qrels), ("eval_qrels", eval_qrels)):
            if not value:
                raise RankgenError(f"DataConfig.source='retrieval': DataConfig.{name} is needed when "
                                   f"retrieval_corpus ({config.retrieval_corpus}) is not a BEIR folder"
                                   + ("" if name != "eval_qrels" else " and qrels is a file"))
        passages = read_passages(config.retrieval_corpus)
        held_out = not missing_eval_data(config)
        pools = [retrieval_source.qrels_queries(
            retrieval_source.QrelsFiles(config.retrieval_corpus, queries, judged, split, config.negatives_run),
            rules, passages) if use else None
            for judged, split, use in ((qrels, config.split, True), (eval_qrels, config.eval_split, held_out))]
    text = load_text_encoder(config.tokenizer_path())
    sources = []
    for pool, seed in zip(pools, (config.seed, config.seed + 10_000)):
        if pool is None:
            sources.append(None)
            continue
        print(pool.summary(), file=sys.stderr, flush=True)
        sources.append(retrieval_source.RetrievalBatches(
            pool, text, config.batch_size, layout, config.prefix_length, config.continuation_length, rules,
            config.list_size, seed, query_keep=config.prefix_keep, markers=config.markers(source_markers(config, layout))))
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

    if not config.task:
        raise RankgenError("DataConfig.source='seqio' needs DataConfig.task (e.g. 'rankgen_demo')")
    cached = bool(config.seqio_cache_dir)
    if cached:
        import tensorflow as tf

        if not tf.io.gfile.isdir(config.seqio_cache_dir):
            raise RankgenError(f"DataConfig.seqio_cache_dir={config.seqio_cache_dir!r}: no such folder "
                               "(write it with `rankgen-jax cache-tasks --output_cache_dir DIR`)")
        seqio.add_global_cache_dirs([config.seqio_cache_dir])
    shard = seqio.ShardInfo(jax.process_index(), jax.process_count()) if jax.process_count() > 1 else None
    lengths = TRIPLE_LAYOUT.lengths(config.prefix_length, config.continuation_length)
    return tuple(
        SeqioTriples(config.task, split, config.batch_size, lengths, seed=config.seed + offset, shard_info=shard,
                     with_negative=config.with_negative, use_cached=cached, threads=config.tfdata_threads)
        for split, offset in (("train", 0), ("validation", 10_000))
    )


def corpus_split(config: DataConfig) -> tuple[tuple[list[Document], list[Document]], ReadStats]:
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
    """How source "examples" cuts documents: the config's word lengths, and its seed unless one is given."""
    return ExampleConfig(prefix_words=config.prefix_words, min_continuation_words=config.min_continuation_words,
                         max_continuation_words=config.max_continuation_words,
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
        raise RankgenError(f"DataConfig.train_file {path}: records of held-out documents {leaked[:5]}: the eval "
                           "source's documents must not be trained on")
    if not examples:
        raise RankgenError(f"DataConfig.train_file {path}: no complete (prefix, continuation, generative_negative, "
                           f"doc_id) record ({skipped.describe() or 'an empty file'})")
    if skipped.count:
        print(f"note: {path}: {skipped.count} lines skipped: {skipped.describe()}", flush=True)
    return examples


def _example_sources(config: DataConfig) -> tuple[BatchSource, BatchSource]:
    """RankGen examples cut from the corpus documents; the held-out documents (corpus_split) are the eval source."""
    (train_docs, held_docs), stats = corpus_split(config)
    if config.train_file and config.recut_examples:
        raise RankgenError("DataConfig.recut_examples cuts the corpus afresh each epoch; with train_file the "
                           "training examples are the file's records, which cannot be recut: unset one of them")
    text = load_text_encoder(config.tokenizer_path())
    example_config = example_config_of(config)

    def recut(epoch: int) -> list[Example]:
        drawn = dataclasses.replace(example_config, seed=config.seed + epoch, draw_prefix_words=True)
        return build_examples(train_docs, drawn)[0]

    sources = []
    for part, mix in ((train_docs, not config.same_document), (held_docs, True)):
        if part is train_docs and config.train_file:
            examples = generative_examples(config.train_file, {d.id for d in held_docs})
        else:
            examples, too_short = build_examples(part, example_config)
            if too_short:
                print(f"note: {too_short} documents too short for an example", flush=True)
        sources.append(ExampleTriples(examples, text, config.batch_size, config.prefix_length,
                                      config.continuation_length, config.seed, mix_documents=mix,
                                      with_negative=config.with_negative, prefix_keep=config.prefix_keep,
                                      markers=config.markers((PREFIX_MARKER, SUFFIX_MARKER)),
                                      recut=recut if config.recut_examples and part is train_docs else None,
                                      pool_leftovers=config.pool_leftovers and part is train_docs))
    print(f"{stats.summary()}; {len(sources[0].examples)} training and {len(sources[1].examples)} held-out examples; "
          f"{sources[0].dropped_examples()} training examples in no batch (a document's examples beyond its last "
          "full batch; DataConfig.pool_leftovers batches them with their genre's)", flush=True)
    return sources[0], sources[1]
