"""Each data source's settings as a frozen config class of its own, and DataConfig, which holds the chosen one
beside what every source reads (batch size, prefix length, seed); gin binds them
(`DataConfig.source = @ExamplesData()`, `ExamplesData.corpus = ...`). data/sources.py builds the sources."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import gin

from rankgen_jax.data.retrieval_files import DEFAULT_TITLE_JOIN
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.resources import DEMO_VOCAB


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """What one data source reads: each source's config class holds only its own fields (DataConfig.source)."""

    kind: ClassVar[str] = ""

    def __post_init__(self):
        check_field_types(self)  # gin hands values over unchecked

    def tokenizer_path(self) -> str:
        """The tokenizer a text source reads with: `vocab`, or the demo vocabulary when none was chosen."""
        return getattr(self, "vocab", "") or str(DEMO_VOCAB)

    def markers(self, default: tuple[str, str]) -> tuple[str, str]:
        """(prefix marker, suffix marker): those the config chooses, else the source's `default`."""
        chosen = getattr(self, "prefix_marker", None), getattr(self, "suffix_marker", None)
        return tuple(d if c is None else c for c, d in zip(chosen, default))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RandomData(SourceConfig):
    """Uniform random token ids of random lengths, no text: for benchmarks and tests.

    vocab_size: ids are drawn from [3, vocab_size).
    continuation_length: tokens per continuation (and negative).
    with_negative: a negative column beside each row's continuation.
    """

    kind: ClassVar[str] = "random"
    vocab_size: int = 8064
    continuation_length: int = 128
    with_negative: bool = True


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BooksData(SourceConfig):
    """Token windows of the corpus's documents: a prefix, the tokens after it, and a span elsewhere in the same
    document as its negative (quick and crude; ExamplesData cuts at sentence bounds, as RankGen does).

    corpus: a folder of .txt documents (or a file of them); ids are paths below it.
    vocab: the tokenizer: spiece.model, tokenizer.json, or a folder with one ("": the model's own, from
      TrainerConfig.init_checkpoint, else the demo vocabulary).
    holdout_documents: the last N documents (by id) form the eval source.
    holdout_ids: the documents of the eval source by id instead (a folder id such as "plays/" names all of its
      documents); each must match one.
    same_document: every row of a training batch comes from one document (RankGen's InBook setting), so
      in-batch negatives are in-book too.
    continuation_length: tokens per continuation (and negative).
    with_negative: a negative column beside each row's continuation.
    prefix_marker / suffix_marker: text put before each prefix and continuation; None: RankGen's "pre " /
      "suffi ". Recorded with the model in its input conventions.
    """

    kind: ClassVar[str] = "books"
    corpus: str = str(BUNDLED_CORPUS)
    vocab: str = ""
    holdout_documents: int = 1
    holdout_ids: tuple[str, ...] = ()
    same_document: bool = True
    continuation_length: int = 128
    with_negative: bool = True
    prefix_marker: str | None = None
    suffix_marker: str | None = None


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ExamplesData(SourceConfig):
    """RankGen examples cut from the corpus: sentence-bounded prefixes of about `prefix_words` words,
    continuations of min..max words, one InBook negative; the held-out documents are the eval source.

    corpus: a folder of .txt documents (or a file of them); ids are paths below it.
    vocab: the tokenizer: spiece.model, tokenizer.json, or a folder with one ("": the model's own, from
      TrainerConfig.init_checkpoint, else the demo vocabulary).
    holdout_documents: the last N documents (by id) form the eval source.
    holdout_ids: the documents of the eval source by id instead (a folder id such as "plays/" names all of its
      documents); each must match one.
    same_document: every row of a training batch comes from one document (RankGen's InBook setting), so
      in-batch negatives are in-book too.
    prefix_words: a prefix's word budget.
    min_continuation_words / max_continuation_words: a continuation's length in words.
    continuation_length: tokens per continuation (and negative).
    with_negative: a negative column beside each row's continuation.
    prefix_keep: "end" cuts over-long prefixes from the left, keeping the text nearest the continuation;
      "start" keeps their beginning.
    prefix_marker / suffix_marker: text put before each prefix and continuation; None: RankGen's "pre " /
      "suffi ". Recorded with the model in its input conventions, as prefix_keep is.
    recut_examples: each training epoch after the first cuts the training documents afresh (another seed, each
      prefix's word budget drawn from [prefix_words / 2, prefix_words]: see ExampleConfig.draw_prefix_words), so
      a small corpus is not seen as the same pairs epoch after epoch; held-out examples stay fixed.
    pool_leftovers: same-document training batches: a document's examples beyond its last full batch are pooled
      with the other leftovers of its genre (its first folder) and batched with them instead of being dropped
      (examples.same_document_batches); for corpora of documents shorter than a batch.
    train_file: a `generate-negatives` JSON-lines file of (prefix, continuation, generative_negative, doc_id)
      records, RankGen's (p, c, g) triples, trained on instead of the examples cut from the corpus's training
      documents (negative: the sampled continuation; `same_document` groups them by doc_id, the paper's "both",
      or mixes them, "generative" only); the corpus's held-out documents stay the eval source, and a record of a
      held-out document is refused.
    """

    kind: ClassVar[str] = "examples"
    corpus: str = str(BUNDLED_CORPUS)
    vocab: str = ""
    holdout_documents: int = 1
    holdout_ids: tuple[str, ...] = ()
    same_document: bool = True
    prefix_words: int = 256
    min_continuation_words: int = 10
    max_continuation_words: int = 128
    continuation_length: int = 128
    with_negative: bool = True
    prefix_keep: str = "end"
    prefix_marker: str | None = None
    suffix_marker: str | None = None
    recut_examples: bool = False
    pool_leftovers: bool = False
    train_file: str = ""


@gin.configurable
@dataclasses.dataclass(frozen=True)
class SeqioData(SourceConfig):
    """A registered seqio task or mixture (tasks/), built on the fly or read from a cache; each host reads its
    share, and the task's validation split is the eval source.

    task: the task or mixture name, e.g. "rankgen_demo".
    seqio_cache_dir: read the task(s) from this cache (`rankgen-jax cache-tasks`).
    continuation_length: tokens per continuation (and negative).
    with_negative: a negative column beside each row's continuation.
    tfdata_threads: tf.data threads (more where the host has idle cores).
    """

    kind: ClassVar[str] = "seqio"
    task: str = ""
    seqio_cache_dir: str = ""
    continuation_length: int = 128
    with_negative: bool = True
    tfdata_threads: int = 1


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ListsData(SourceConfig):
    """Candidate lists from JSON-lines files (rankgen_jax.data.lists): rankers and distillation.

    train_file: the training lists.
    eval_file: held-out lists; without it the run has no eval source and TrainerConfig.eval_every must be 0.
    vocab: the tokenizer: spiece.model, tokenizer.json, or a folder with one ("": the model's own, from
      TrainerConfig.init_checkpoint, else the demo vocabulary).
    list_size: candidates per list (0: the longest list in the file); shorter lists are padded with a mask.
    continuation_length: tokens per candidate.
    prefix_keep: "end" cuts over-long queries from the left; "start" keeps their beginning.
    prefix_marker / suffix_marker: text put before each query and candidate; None: RankGen's "pre " / "suffi "
      for dual encoders, none for cross encoders. Recorded with the model in its input conventions.
    """

    kind: ClassVar[str] = "lists"
    train_file: str = ""
    eval_file: str = ""
    vocab: str = ""
    list_size: int = 0
    continuation_length: int = 128
    prefix_keep: str = "end"
    prefix_marker: str | None = None
    suffix_marker: str | None = None


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PairsData(SourceConfig):
    """Labelled passage pairs from JSON-lines files (rankgen_jax.data.lists): multi-perspective matching. Each
    passage has DataConfig.prefix_length tokens (read together: half of it each).

    train_file: the training pairs.
    eval_file: held-out pairs; without it the run has no eval source and TrainerConfig.eval_every must be 0.
    vocab: the tokenizer: spiece.model, tokenizer.json, or a folder with one ("": the model's own, from
      TrainerConfig.init_checkpoint, else the demo vocabulary).
    """

    kind: ClassVar[str] = "pairs"
    train_file: str = ""
    eval_file: str = ""
    vocab: str = ""


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RetrievalData(SourceConfig):
    """Queries with positive and hard-negative passages (rankgen_jax.data.retrieval_source has the sampling rules).

    Reads either Tevatron training files or passages with queries and qrels; a query's positives are the
    passages its qrels judge >= 1.

    train_file / eval_file: Tevatron training files (`{"query_id", "query", "positive_passages",
      "negative_passages"}`); without a held-out one the run has no eval source and TrainerConfig.eval_every
      must be 0.
    retrieval_corpus: instead of Tevatron files, a BEIR folder, or a TSV / JSON-lines passages file.
    queries: a queries file or BEIR folder ("": retrieval_corpus).
    qrels: a qrels file, or a BEIR folder read at `split` ("": retrieval_corpus).
    eval_qrels: the held-out queries' qrels ("": the qrels folder at `eval_split`).
    split / eval_split: the splits a BEIR folder's qrels are read at, for training and held-out queries.
    negatives_run: a run (TREC, MS MARCO or search's JSON lines) whose passages for a query, minus those the
      qrels judge relevant, are its negative pool; with Tevatron files, `qrels` / `eval_qrels` (optional)
      likewise keep relevant passages out of the files' negatives.
    hard_negatives: K negatives per query and step, drawn from its pool without replacement ([B, K, Lc]
      `negative_ids`; 0: in-batch negatives only).
    positive_choice: "sample" (one of the query's positives, drawn per step and row) or "first" (always its
      first).
    too_few_negatives: a pool smaller than K: "fill" draws the missing ones with replacement from the pool
      (triples) or leaves masked slots (lists); "skip" leaves the query out (counted). An empty pool is always
      skipped.
    title_join: joins a passage's title to its text (None: titles dropped).
    list_size: candidate lists (listwise losses, cross encoders) hold list_size candidates (0: 1 +
      hard_negatives): positives (label 1) first.
    list_labels: "relevance" (1 positive, 0 negative) or "teacher" (the teacher scores the training file's
      passages carry); teacher scores always come along as `teacher_scores` for KL / MarginMSE.
    vocab: the tokenizer: spiece.model, tokenizer.json, or a folder with one ("": the model's own, from
      TrainerConfig.init_checkpoint, else the demo vocabulary).
    continuation_length: tokens per passage.
    prefix_keep: "end" cuts over-long queries from the left; "start" keeps their beginning.
    prefix_marker / suffix_marker: text put before each query and passage; None: RankGen's "pre " / "suffi "
      for dual encoders, none for cross encoders. Recorded with the model in its input conventions.
    """

    kind: ClassVar[str] = "retrieval"
    train_file: str = ""
    eval_file: str = ""
    retrieval_corpus: str = ""
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
    list_size: int = 0
    list_labels: str = "relevance"
    vocab: str = ""
    continuation_length: int = 128
    prefix_keep: str = "end"
    prefix_marker: str | None = None
    suffix_marker: str | None = None


# Each source's config class, by the source's name.
SOURCE_CONFIGS: dict[str, type[SourceConfig]] = {
    cls.kind: cls for cls in (ExamplesData, SeqioData, BooksData, RandomData, ListsData, PairsData, RetrievalData)}
SOURCES = tuple(SOURCE_CONFIGS)
# The sources that tokenise text (their config's `vocab`; the model's own tokenizer by default).
TEXT_SOURCES = tuple(kind for kind, cls in SOURCE_CONFIGS.items() if "vocab" in cls.__dataclass_fields__)


def source_fields(cls: type[SourceConfig]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# Where each field of the one flat DataConfig of earlier versions lives now: a gin file that binds one of them on
# DataConfig gets a message naming the new binding (gin_parsing), and a model card reads an earlier run's
# operative config with it.
MOVED_DATA_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(kind for kind, cls in SOURCE_CONFIGS.items() if name in source_fields(cls))
    for name in dict.fromkeys(name for cls in SOURCE_CONFIGS.values() for name in source_fields(cls))}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where training batches come from: the data source with its own settings, and what every source reads.

    source: the source and its settings, one of ExamplesData, SeqioData, BooksData, RandomData, ListsData,
      PairsData and RetrievalData; in gin `DataConfig.source = @ExamplesData()`, then `ExamplesData.corpus = ...`.
    batch_size: rows per global batch (queries, prefixes, lists or pairs).
    prefix_length: tokens per prefix (query); labelled pairs: per passage.
    seed: the batches' draw; the eval source draws with seed + 10000.
    """

    source: SourceConfig = dataclasses.field(default_factory=BooksData)
    batch_size: int = 32
    prefix_length: int = 256
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.source, str):
            named = SOURCE_CONFIGS.get(self.source)
            raise RankgenError(f"DataConfig.source={self.source!r}: a source is now its config object"
                               + (f", DataConfig.source = @{named.__name__}() (its settings bound on "
                                  f"{named.__name__})" if named else
                                  f"; one of {', '.join('@' + c.__name__ + '()' for c in SOURCE_CONFIGS.values())}"))
        check_field_types(self)

    def with_source(self, **changes) -> DataConfig:
        """A copy whose source config has these fields changed."""
        return dataclasses.replace(self, source=dataclasses.replace(self.source, **changes))
