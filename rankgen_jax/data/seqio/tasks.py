"""RankGen training data as seqio tasks, and the batch source the trainer reads them through.

What a task emits
-----------------
`register_rankgen_task` registers a `seqio.Task` whose examples are RankGen
triples, already tokenised with the model's own tokenizer:

- `query_ids`    int32 [Lq]: "pre " + prefix, with the model's special tokens
- `positive_ids` int32 [Lc]: "suffi " + gold continuation
- `negative_ids` int32 [Lc]: "suffi " + a negative continuation
- `doc_id`       string []: the document the example was cut from

Tokenising in Python (through `rankgen_jax.data.text.TextEncoder`) rather than with
seqio's `tokenize` preprocessor keeps the special tokens right for both model
families: T5 gets `ids </s>`, BERT gets `[CLS] ids [SEP]` (RoBERTa `<s> ids
</s>`). The output features are therefore declared with `add_eos=False`. When
a sequence length is given, a too-long feature is cut cleanly: it keeps its
first L-1 ids and its last id (the EOS / [SEP]), as `text.pad_batch` does.

Negatives (`negatives=`):

- "inbook": examples cut from documents by `examples.make_examples`
  (sentence-bounded prefix and continuation; the negative is the first InBook
  negative, another span of the same document).
- "generative": records of a JSON-lines file written by `rankgen-jax
  generate-negatives` (fields `prefix`, `continuation`, `generative_negative`,
  `doc_id`; the `doc_id` groups them into documents); the negative is the
  sampled continuation.
- "both": the two streams above, alternating one document at a time; a
  document's InBook and generative examples that land in the same shuffle
  block share its groups.

In every mode the trainer also sees in-batch negatives (the other rows'
continuations), which are in-book when batches are same-document.

Example order
-------------
Documents are read in a fixed order (`documents.read_documents`: sorted files,
then lines) and processed in blocks of `shuffle_block_documents` documents, so
memory stays bounded for PG19-sized corpora. Within a block, each document's
examples are shuffled and cut into groups of `group_size` consecutive examples
(`examples.same_document_batches`; a document's leftover examples are dropped),
and the groups of the block are shuffled together, all seeded by the `seed`
given to the dataset function (seqio passes the `seed` of `get_dataset`; None
means 0). The stream is therefore a sequence of whole groups, deterministic
for a seed, and every epoch repeats the same order. `mix_documents=True` cuts
the block's examples into groups regardless of document instead. The examples
themselves (spans, negatives) depend only on `ExampleConfig.seed` and the
document id, so a held-out document always gives the same validation examples.
seqio's own shuffle would break the groups: the tasks declare no shuffle
buffer and a source that orders itself, so `shuffle=True` is accepted and
changes nothing.

Splits: "train" and "validation". Validation is the last `holdout_documents`
documents of each stream in reading order (for one file per document: the
last N by file name), found with a look-behind buffer so the stream is read
once; train is everything else. Pass `validation_documents` (and
`validation_generative_negatives_jsonl`) to read validation from its own files
instead, e.g. PG19's validation/ folder; train then reads all of `documents`.

Bad input never stops a read: what `documents.read_documents` skips (empty,
binary, unreadable files, malformed JSON), documents below the word minimum or
too short for one example, and malformed or incomplete generative records are
counted in a `ReadStats` (see `scan_task`, and the log line at the end of every
pass). A split that cannot give a single example fails when it is read, with a
RankgenError naming the files, before any tf.data work starts.

Any argument of `register_rankgen_task` except `name`, `negatives` and
`markers` may be a zero-argument callable; it is called whenever the task is
read. `tasks/rankgen_tasks.py` uses that to bind data paths with gin after the
tasks are registered at import.

Reading for training: SeqioTriples
----------------------------------
`SeqioTriples` is the trainer's `BatchSource` over a task or mixture:
`batch(index)` is global batch `index` of the repeated stream
(`num_epochs=None`), padded to fixed lengths by `RankGenFeatureConverter`.
Sequential calls reuse one iterator; any other index (the first call, a
resume, an eval pass starting again at 0) rebuilds the pipeline and skips
`index` batches (`index * batch_size` examples) from the start of the stream.
The skipped examples are still generated and tokenised (about 2,200-3,300
examples per second per host on a 2-vCPU machine, at 512/128 tokens), so
resuming late in a long run costs minutes per million examples per host.

Multi-host: pass `shard_info=seqio.ShardInfo(jax.process_index(),
jax.process_count())`. Host h then tokenises only rows [h*g/n, (h+1)*g/n) of
every group of g = `group_size` examples, so `group_size` must be divisible by
the number of hosts n, and `batch_size` must be a multiple of `group_size`.
With `batch_size == group_size` (the RankGen in-book setting: one document per
batch) host h's local batch is exactly rows [h*B/n, (h+1)*B/n) of the global
batch, i.e. the trainer's `rows` slice, and the hosts' batches concatenate to
the global one. With `batch_size = m * group_size` the global batch is the
same m groups but each host's rows are its slices of each group in turn.
Mixtures are mixed one whole batch at a time (seeded, identically on every
host), so a batch never mixes domains or documents; seqio's own
`Mixture.get_dataset` mixes single examples, which is right only for
`mix_documents` tasks.

Caching with Beam (seqio.scripts.cache_tasks_main)
--------------------------------------------------
Reading uncached runs at about 2,200-3,300 examples per second per process;
seqio can instead precompute a task into TFRecords with its Beam pipeline
(`seqio.scripts.cache_tasks_main`, installed as the `seqio_cache_tasks`
command in seqio 0.0.20; it needs `pip install apache-beam`):

    PYTHONPATH=. seqio_cache_tasks --module_import=tasks \\
        --tasks=rankgen_pg19_generative --output_cache_dir=/data/seqio_cache \\
        --pipeline_options=--runner=DirectRunner          # locally
    # on Google Cloud: --pipeline_options=--runner=DataflowRunner,\\
    #   --project=P,--region=R,--temp_location=gs://B/tmp,--requirements_file=requirements.txt

gin is not parsed by that script, so bind data paths through the environment
variables `tasks/rankgen_tasks.py` reads (RANKGEN_PG19, ...) or register the
task with literal paths in a module of your own and pass that module to
--module_import. Then read with `use_cached=True` (and
`seqio.add_global_cache_dirs([...])`). The cache holds full-length token ids
(the CacheDatasetPlaceholder comes before the length trim), keyed by the
per-shard seed the pipeline chooses. Two caveats: a FunctionDataSource is one
shard, so Beam cannot parallelise the reading itself; and the pipeline
reshuffles all examples globally (`beam.Reshuffle`), so a cached task loses its
same-document groups. Cache generative or `mix_documents` tasks; read InBook
tasks uncached when batches must be same-document.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import logging
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from rankgen_jax.data import jsonl
from rankgen_jax.data.documents import (
    MALFORMED_JSON,
    TOO_SHORT,
    UNREADABLE_FILE,
    Document,
    ReadStats,
    read_documents,
)
from rankgen_jax.data.examples import Example, ExampleConfig, make_examples, same_document_batches
from rankgen_jax.data.sentences import word_count
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.text import HFTokenizerEncoder, load_text_encoder

log = logging.getLogger(__name__)

QUERY, POSITIVE, NEGATIVE, DOC_ID = "query_ids", "positive_ids", "negative_ids", "doc_id"
ID_FEATURES = (QUERY, POSITIVE, NEGATIVE)
TRAIN, VALIDATION = "train", "validation"
SPLITS = (TRAIN, VALIDATION)
NEGATIVE_KINDS = ("inbook", "generative", "both")
# Skip reasons added to documents.py's (nouns whose plural is a plain "s").
SHORT_DOCUMENT = "short document"  # passes the word minimum, but no example fits
INCOMPLETE_RECORD = "incomplete generative record"  # no prefix/continuation/generative_negative/doc_id
_GENERATIVE_FIELDS = ("prefix", "continuation", "generative_negative")


def _hide_accelerators_from_tf() -> None:
    """TF only feeds data here; keep it off the GPUs/TPUs so JAX owns all their memory."""
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):  # devices already initialised, or no such device type
            pass


_hide_accelerators_from_tf()


# ------------------------------------------------------------------------------------------
# Vocabularies
# ------------------------------------------------------------------------------------------


def _vocab_file(path: str | Path) -> Path:
    """The spiece.model or tokenizer.json named by `path` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        for name in ("spiece.model", "tokenizer.json"):
            if (p / name).is_file():
                return p / name
        raise RankgenError(f"{path}: no spiece.model or tokenizer.json in this folder")
    if not p.is_file():
        raise RankgenError(f"{path}: no such vocabulary file")
    return p


def make_vocabulary(path: str | Path) -> seqio.Vocabulary:
    """seqio vocabulary for a model: SentencePiece (T5) for a .model file, TokenizersVocabulary for tokenizer.json."""
    file = _vocab_file(path)
    if file.suffix == ".json":
        return TokenizersVocabulary(file)
    load_text_encoder(file)  # fail now, with a clear message, if it is not a SentencePiece model
    return seqio.SentencePieceVocabulary(str(file))


class TokenizersVocabulary(seqio.Vocabulary):
    """A HF `tokenizers` tokenizer.json (BERT family) behind seqio's Vocabulary interface.

    `encode` gives ids without special tokens (seqio's convention: no EOS);
    `eos_id` is the token the tokenizer ends a text with ([SEP] or </s>), so
    `decode` stops there, and `pad_id` is the tokenizer's own padding id
    (0 for BERT, 1 for RoBERTa) rather than seqio's fixed 0.
    """

    def __init__(self, path: str | Path):
        file = _vocab_file(path)
        if file.suffix != ".json":
            raise RankgenError(f"{path}: TokenizersVocabulary needs a tokenizer.json")
        self._path = str(file.resolve())
        self._encoder: HFTokenizerEncoder | None = None
        super().__init__(extra_ids=0)
        self.encoder  # noqa: B018 - load now so a bad file fails at construction

    @property
    def encoder(self) -> HFTokenizerEncoder:
        if self._encoder is None:
            self._encoder = HFTokenizerEncoder(self._path)
        return self._encoder

    def __getstate__(self):
        # gin deep-copies configurable arguments; reload the tokenizer lazily instead of pickling it.
        state = self.__dict__.copy()
        state["_encoder"] = None
        return state

    @property
    def path(self) -> str:
        return self._path

    @property
    def bos_id(self) -> int | None:
        return self.encoder._head[0] if self.encoder._head else None

    @property
    def eos_id(self) -> int | None:
        return self.encoder._tail[-1] if self.encoder._tail else None

    @property
    def unk_id(self) -> int | None:
        token = getattr(self.encoder.tokenizer.model, "unk_token", None)
        return self.encoder.tokenizer.token_to_id(token) if token else None

    @property
    def pad_id(self) -> int:
        return self.encoder.pad_id

    @property
    def _base_vocab_size(self) -> int:
        return self.encoder.size

    def _encode(self, s: str) -> Sequence[int]:
        return self.encoder.tokenize(s)

    def _decode(self, ids) -> str:
        return self.encoder.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Scalar string -> int32 [n]; a vector of strings -> a RaggedTensor [m, None]."""

        def encode_one(text):
            return np.asarray(self._encode(text.numpy().decode("utf-8")), np.int32)

        def encode_scalar(text):
            ids = tf.py_function(encode_one, [text], tf.int32)
            ids.set_shape([None])
            return ids

        s = tf.convert_to_tensor(s)
        if s.shape.rank == 0:
            return encode_scalar(s)
        return tf.map_fn(encode_scalar, s, fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int ids [..., n] -> strings [...]."""
        ids = tf.convert_to_tensor(ids)

        def decode_all(array):
            array = array.numpy()
            flat = array.reshape(-1, array.shape[-1]) if array.ndim else array.reshape(1, 1)
            texts = [self._decode([i for i in row if i != self.pad_id]) for row in flat]
            return np.asarray(texts, object).reshape(array.shape[:-1])

        out = tf.py_function(decode_all, [ids], tf.string)
        out.set_shape(ids.shape[:-1])
        return out

    def __eq__(self, other):
        return isinstance(other, TokenizersVocabulary) and other.path == self.path

    def __hash__(self):
        return hash((TokenizersVocabulary, self._path))

    def __str__(self) -> str:
        return f"TokenizersVocabulary({self._path})"


class DeferredVocabulary(seqio.Vocabulary):
    """A vocabulary whose path is looked up each time it is used, so a task can register before gin binds it."""

    def __init__(self, path_fn: Callable[[], str | Path | None]):
        self._path_fn = path_fn
        self._loaded: dict[str, seqio.Vocabulary] = {}
        super().__init__(extra_ids=0)

    @property
    def vocabulary(self) -> seqio.Vocabulary:
        path = self._path_fn()
        if not path:
            raise RankgenError("no vocabulary path is set for this task")
        key = str(path)
        if key not in self._loaded:
            self._loaded[key] = make_vocabulary(key)
        return self._loaded[key]

    # Everything seqio asks of a vocabulary goes to the resolved one.
    bos_id = property(lambda self: self.vocabulary.bos_id)
    eos_id = property(lambda self: self.vocabulary.eos_id)
    unk_id = property(lambda self: self.vocabulary.unk_id)
    pad_id = property(lambda self: self.vocabulary.pad_id)
    extra_ids = property(lambda self: self.vocabulary.extra_ids)
    vocab_size = property(lambda self: self.vocabulary.vocab_size)
    _base_vocab_size = property(lambda self: self.vocabulary._base_vocab_size)

    def _encode(self, s):
        return self.vocabulary._encode(s)

    def _decode(self, ids):
        return self.vocabulary._decode(ids)

    def _encode_tf(self, s):
        return self.vocabulary._encode_tf(s)

    def _decode_tf(self, ids):
        return self.vocabulary._decode_tf(ids)

    def encode(self, s):
        return self.vocabulary.encode(s)

    def decode(self, ids):
        return self.vocabulary.decode(ids)

    def encode_tf(self, s):
        return self.vocabulary.encode_tf(s)

    def decode_tf(self, ids):
        return self.vocabulary.decode_tf(ids)

    def __eq__(self, other):
        if isinstance(other, DeferredVocabulary) and other._path_fn is self._path_fn:
            return True
        if not isinstance(other, seqio.Vocabulary):
            return False
        other = other.vocabulary if isinstance(other, DeferredVocabulary) else other
        return self.vocabulary == other

    def __hash__(self):
        return hash((DeferredVocabulary, self._path_fn))

    def __str__(self) -> str:
        return f"DeferredVocabulary({self._path_fn})"


# ------------------------------------------------------------------------------------------
# Task specs
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankGenTaskSpec:
    """Everything a registered RankGen task reads, with deferred arguments resolved and checked."""

    name: str
    negatives: str
    documents: tuple[str, ...] | None
    vocab_path: str
    example_config: ExampleConfig
    generative_negatives_jsonl: str | None
    holdout_documents: int
    markers: tuple[str, str]
    group_size: int
    mix_documents: bool
    validation_documents: tuple[str, ...] | None
    validation_generative_negatives_jsonl: str | None
    shuffle_block_documents: int

    @property
    def reads_documents(self) -> bool:
        return self.negatives in ("inbook", "both")

    @property
    def reads_generative(self) -> bool:
        return self.negatives in ("generative", "both")

    @property
    def min_document_words(self) -> int:
        """A lower bound on the words one example needs; shorter documents are skipped without splitting them."""
        config = self.example_config
        return config.min_prefix_words + config.min_continuation_words + config.negatives_per_example


_TASK_ARGS: dict[str, dict[str, Any]] = {}


def _resolve(value):
    """A deferred argument's value (call it), or the value itself."""
    return value() if callable(value) and not isinstance(value, type) else value


def _paths(value) -> tuple[str, ...] | None:
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, (str, Path)):
        return (str(value),)
    return tuple(str(v) for v in value)


def is_rankgen_task(name: str) -> bool:
    """Whether `name` was registered by `register_rankgen_task`."""
    return name in _TASK_ARGS


def task_spec(name: str) -> RankGenTaskSpec:
    """The resolved spec of a task registered by `register_rankgen_task`; RankgenError for unset or bad values."""
    if name not in _TASK_ARGS:
        raise RankgenError(f"{name!r} is not a registered RankGen task")
    args = {key: _resolve(value) for key, value in _TASK_ARGS[name].items()}

    def optional_path(key):
        return str(args[key]) if args[key] else None

    spec = RankGenTaskSpec(
        name=name,
        negatives=args["negatives"],
        documents=_paths(args["documents"]),
        vocab_path=str(args["vocab_path"]) if args["vocab_path"] else "",
        example_config=args["example_config"],
        generative_negatives_jsonl=optional_path("generative_negatives_jsonl"),
        holdout_documents=int(args["holdout_documents"]),
        markers=tuple(args["markers"]),
        group_size=int(args["group_size"]),
        mix_documents=bool(args["mix_documents"]),
        validation_documents=_paths(args["validation_documents"]),
        validation_generative_negatives_jsonl=optional_path("validation_generative_negatives_jsonl"),
        shuffle_block_documents=int(args["shuffle_block_documents"]),
    )
    problems = []
    if not spec.vocab_path:
        problems.append("no vocabulary path is set")
    if spec.reads_documents and spec.documents is None:
        problems.append(f"negatives={spec.negatives!r} reads documents, but none are set")
    if spec.reads_generative and spec.generative_negatives_jsonl is None:
        problems.append(f"negatives={spec.negatives!r} reads a generative-negatives JSONL, but none is set")
    if not isinstance(spec.example_config, ExampleConfig):
        problems.append(f"example_config must be an ExampleConfig, got {type(spec.example_config).__name__}")
    elif spec.reads_documents and spec.example_config.negatives_per_example < 1:
        problems.append("InBook negatives need example_config.negatives_per_example >= 1")
    if spec.group_size < 1:
        problems.append(f"group_size must be >= 1, got {spec.group_size}")
    if spec.holdout_documents < 0:
        problems.append(f"holdout_documents must be >= 0, got {spec.holdout_documents}")
    if spec.shuffle_block_documents < 1:
        problems.append(f"shuffle_block_documents must be >= 1, got {spec.shuffle_block_documents}")
    if len(spec.markers) != 2 or not all(isinstance(m, str) for m in spec.markers):
        problems.append(f"markers must be two strings (prefix, continuation), got {spec.markers!r}")
    if problems:
        raise RankgenError(f"task {name!r}: " + "; ".join(problems))
    return spec


# ------------------------------------------------------------------------------------------
# The example stream (plain Python: no TF below this line until the dataset function)
# ------------------------------------------------------------------------------------------


def _usable_documents(sources: Sequence[str], spec: RankGenTaskSpec, stats: ReadStats) -> Iterator[Document]:
    """Readable documents with at least the words one example needs; the rest are counted."""
    for doc in read_documents(list(sources), stats):
        if word_count(doc.text) < spec.min_document_words:
            stats.skip(TOO_SHORT, doc.id)
            continue
        yield doc


def _split(items: Iterable, split: str, holdout: int) -> Iterator:
    """train: all items but the last `holdout`; validation: the last `holdout` (a look-behind buffer, one pass)."""
    buffer: collections.deque = collections.deque()
    for item in items:
        buffer.append(item)
        if len(buffer) > holdout:
            first = buffer.popleft()
            if split == TRAIN:
                yield first
    if split == VALIDATION:
        yield from buffer


def _inbook_units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[list[Example]]:
    """Each usable document's examples (InBook negatives), for one split."""
    if spec.validation_documents is not None:
        docs = _usable_documents(spec.documents if split == TRAIN else spec.validation_documents, spec, stats)
    else:
        # Only documents that leave the look-behind buffer are split into sentences, so reading the
        # validation split costs one pass over the files but no example building for train documents.
        docs = _split(_usable_documents(spec.documents, spec, stats), split, spec.holdout_documents)
    for doc in docs:
        examples = make_examples(doc, spec.example_config)
        if examples:
            yield examples
        else:
            stats.skip(SHORT_DOCUMENT, doc.id)


def _generative_records(path: str, stats: ReadStats) -> Iterator[Example]:
    """Complete records of a generate-negatives JSONL as Examples whose one negative is the generative one."""
    p = Path(path)
    if not p.is_file():
        raise RankgenError(f"{path}: no such generative-negatives file")
    stats.files += 1

    def skip(reason: str, number: int) -> None:
        stats.skip(INCOMPLETE_RECORD if reason == jsonl.NOT_AN_OBJECT else MALFORMED_JSON, f"{p}:{number}")

    try:
        for number, record in jsonl.iter_jsonl(p, on_skip=skip):
            example = _generative_example(record)
            if example is None:
                stats.skip(INCOMPLETE_RECORD, f"{p}:{number}")
            else:
                yield example
    except RankgenError:  # the file exists, so a truncated or corrupt .gz: keep what was read
        stats.skip(UNREADABLE_FILE, str(p))


def _generative_example(record: object) -> Example | None:
    if not isinstance(record, dict):
        return None
    texts = [record.get(key) for key in _GENERATIVE_FIELDS]
    if not all(isinstance(t, str) and t.strip() for t in texts):
        return None
    doc_id = record.get("doc_id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        return None  # without a document the record cannot join a same-document group
    prefix, continuation, negative = texts
    return Example(str(doc_id), prefix, continuation, (negative,), (0, 0), (0, 0), ((0, 0),))


def _generative_units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[list[Example]]:
    """Runs of consecutive records with the same doc_id (one document each), for one split."""

    def runs(path):
        for _, group in itertools.groupby(_generative_records(path, stats), key=lambda e: e.doc_id):
            stats.documents += 1
            yield list(group)

    if spec.validation_generative_negatives_jsonl is not None:
        path = spec.generative_negatives_jsonl if split == TRAIN else spec.validation_generative_negatives_jsonl
        yield from runs(path)
    else:
        yield from _split(runs(spec.generative_negatives_jsonl), split, spec.holdout_documents)


def _alternate(streams: Sequence[Iterator]) -> Iterator:
    """One item from each stream in turn until all are exhausted."""
    live = list(streams)
    while live:
        for stream in list(live):
            try:
                yield next(stream)
            except StopIteration:
                live.remove(stream)


def _units(spec: RankGenTaskSpec, split: str, stats: ReadStats) -> Iterator[list[Example]]:
    streams = []
    if spec.reads_documents:
        streams.append(_inbook_units(spec, split, stats))
    if spec.reads_generative:
        streams.append(_generative_units(spec, split, stats))
    return _alternate(streams)


def _block_seed(seed: int, block: int) -> int:
    return int(np.random.SeedSequence([seed % (1 << 64), block]).generate_state(1, np.uint64)[0] >> 1)


def _grouped_examples(spec: RankGenTaskSpec, units: Iterator[list[Example]], seed: int) -> Iterator[Example]:
    """Documents' examples in whole groups of `group_size`, shuffled block by block (see the module docstring)."""
    for block_index in itertools.count():
        block = list(itertools.islice(units, spec.shuffle_block_documents))
        if not block:
            return
        examples = [example for unit in block for example in unit]
        for group in same_document_batches(
            examples, spec.group_size, _block_seed(seed, block_index), mix_documents=spec.mix_documents
        ):
            yield from group


def _check_split_readable(spec: RankGenTaskSpec, split: str) -> None:
    """RankgenError now (not deep inside tf.data) when a split cannot give one example.

    Reads only as far as needed: holdout+1 usable documents per stream (so
    both splits get one), or one from a split's own validation files.
    """
    if split not in SPLITS:
        raise RankgenError(f"task {spec.name!r} has splits {SPLITS}, not {split!r}")
    checks = []
    if spec.reads_documents:
        own = spec.validation_documents is not None
        sources = spec.documents if (split == TRAIN or not own) else spec.validation_documents

        def documents(sources=sources):
            stats = ReadStats()
            usable = (d for d in _usable_documents(sources, spec, stats) if make_examples(d, spec.example_config))
            return usable, stats

        checks.append((", ".join(sources), own, documents))
    if spec.reads_generative:
        own = spec.validation_generative_negatives_jsonl is not None
        path = spec.generative_negatives_jsonl
        if split == VALIDATION and own:
            path = spec.validation_generative_negatives_jsonl

        def records(path=path):
            stats = ReadStats()
            return (g for _, g in itertools.groupby(_generative_records(path, stats), key=lambda e: e.doc_id)), stats

        checks.append((path, own, records))
    for where, own, open_stream in checks:
        if not own and spec.holdout_documents == 0 and split == VALIDATION:
            raise RankgenError(
                f"task {spec.name!r} has no validation data in {where}: "
                "holdout_documents=0 and no separate validation files"
            )
        needed = 1 if own else spec.holdout_documents + 1
        stream, stats = open_stream()
        found = sum(1 for _ in itertools.islice(stream, needed))
        if found == 0:
            raise RankgenError(f"task {spec.name!r} ({split}): no usable document in {where} ({stats.summary()})")
        if found < needed:
            raise RankgenError(
                f"task {spec.name!r}: {where} has {found} usable document{'s' if found > 1 else ''}; "
                f"holdout_documents={spec.holdout_documents} needs at least {needed} (one left for training)"
            )


@dataclasses.dataclass
class TaskScan:
    """What one pass over a split gives: whole-group examples, documents used, and skipped input."""

    examples: int
    documents: int
    dropped_examples: int
    stats: ReadStats


def scan_task(name: str, split: str = TRAIN, seed: int = 0) -> TaskScan:
    """One pass over a RankGen task's split in plain Python (no tokenising): counts and ReadStats."""
    spec = task_spec(name)
    _check_split_readable(spec, split)
    stats = ReadStats()
    units = list(_units(spec, split, stats))
    emitted = sum(1 for _ in _grouped_examples(spec, iter(units), seed))
    total = sum(len(unit) for unit in units)
    return TaskScan(examples=emitted, documents=len(units), dropped_examples=total - emitted, stats=stats)


# ------------------------------------------------------------------------------------------
# seqio: source, preprocessors, registration
# ------------------------------------------------------------------------------------------

# The generator hands examples to tf.data in chunks: each element crossing from Python costs
# a few hundred microseconds, as much as making and tokenising the example (docs/performance.md).
# A chunk is each id feature's values end to end plus their lengths; `_unchunk` splits it.
_CHUNK_EXAMPLES = 64
_LENGTHS = "_lengths"
_CHUNK_SIGNATURE = {
    **{key: tf.TensorSpec([None], tf.int32) for key in ID_FEATURES},
    **{key + _LENGTHS: tf.TensorSpec([None], tf.int32) for key in ID_FEATURES},
    DOC_ID: tf.TensorSpec([None], tf.string),
}


def _chunks(examples: Iterator[dict], size: int = _CHUNK_EXAMPLES) -> Iterator[dict]:
    """Examples ({id feature: int32 ids, DOC_ID: str}) grouped `size` at a time into one flat chunk each."""
    while True:
        taken = list(itertools.islice(examples, size))
        if not taken:
            return
        chunk = {DOC_ID: np.array([e[DOC_ID] for e in taken], dtype=object)}
        for key in ID_FEATURES:
            chunk[key] = np.concatenate([e[key] for e in taken]).astype(np.int32, copy=False)
            chunk[key + _LENGTHS] = np.array([len(e[key]) for e in taken], np.int32)
        yield chunk


def _unchunk(chunks: tf.data.Dataset) -> tf.data.Dataset:
    """The examples of `_chunks`' chunks, one element each, in order."""

    def ragged(chunk):
        rows = {key: tf.RaggedTensor.from_row_lengths(chunk[key], chunk[key + _LENGTHS]) for key in ID_FEATURES}
        return {**rows, DOC_ID: chunk[DOC_ID]}

    # Unbatched, each row is a plain tensor typed as a ragged one of rank 0; seqio wants TensorSpecs.
    plain = lambda example: {key: tf.identity(value) for key, value in example.items()}  # noqa: E731
    return chunks.map(ragged).unbatch().map(plain)


class RankGenDataSource(seqio.FunctionDataSource):
    """A FunctionDataSource that takes ShardInfo itself: each host tokenises only its rows of every group."""

    def __init__(self, dataset_fn, splits: Iterable[str] = SPLITS):
        super().__init__(dataset_fn=dataset_fn, splits=splits, caching_permitted=True)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    @property
    def performs_internal_shuffling(self) -> bool:
        # The source orders whole same-document groups by seed; seqio must not shuffle examples.
        return True

    def get_dataset(self, split: str = TRAIN, shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False,
                    num_epochs=1) -> tf.data.Dataset:
        del sequence_length, use_cached, num_epochs  # seqio handles these around the source
        return self._dataset_fn(split=split, shuffle_files=shuffle, seed=seed, shard_info=shard_info)


def _make_dataset_fn(name: str) -> Callable[..., tf.data.Dataset]:
    def dataset_fn(split: str, shuffle_files: bool = False, seed: int | None = None,
                   shard_info: seqio.ShardInfo | None = None) -> tf.data.Dataset:
        """RankGen triples of task `name`, tokenised, in seeded same-document groups."""
        del shuffle_files  # the order is set by `seed` alone (see the module docstring)
        spec = task_spec(name)
        _check_split_readable(spec, split)
        text = load_text_encoder(spec.vocab_path)
        seed = 0 if seed is None else int(seed)
        shards = shard_info.num_shards if shard_info else 1
        shard = shard_info.index if shard_info else 0
        if spec.group_size % shards:
            raise RankgenError(
                f"task {name!r}: group_size={spec.group_size} is not divisible by the {shards} data shards (hosts)"
            )
        rows_per_shard = spec.group_size // shards
        pre, suffi = spec.markers

        def ids(s: str) -> np.ndarray:
            return np.asarray(text.add_special(text.tokenize(s)), np.int32)

        def examples():
            stats = ReadStats()
            for i, example in enumerate(_grouped_examples(spec, _units(spec, split, stats), seed)):
                # Host `shard` owns a contiguous block of rows in every group (decided before
                # tokenising, so the other hosts' rows cost no tokenizer time here).
                if (i % spec.group_size) // rows_per_shard != shard:
                    continue
                yield {
                    QUERY: ids(pre + example.prefix),
                    POSITIVE: ids(suffi + example.continuation),
                    NEGATIVE: ids(suffi + example.negatives[0]),
                    DOC_ID: example.doc_id,
                }
            log.info("%s (%s): %s", name, split, stats.summary())

        return _unchunk(tf.data.Dataset.from_generator(lambda: _chunks(examples()), output_signature=_CHUNK_SIGNATURE))

    return dataset_fn


def _trim_keeping_last(ids: tf.Tensor, length: int) -> tf.Tensor:
    """The first length-1 ids and the last one (EOS / [SEP]) of a too-long 1-D tensor; shorter ones unchanged."""
    n = tf.shape(ids)[0]
    return tf.concat([ids[: tf.minimum(n, length) - 1], ids[-1:]], axis=0) if length > 0 else ids[:0]


def trim_keeping_last_token(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int] | None = None
) -> tf.data.Dataset:
    """seqio post-cache preprocessor: cut id features to `sequence_length` keeping their final special token."""
    if not sequence_length:
        return dataset
    lengths = {k: int(v) for k, v in sequence_length.items() if k in ID_FEATURES and v is not None}

    def trim(example):
        return {k: _trim_keeping_last(v, lengths[k]) if k in lengths else v for k, v in example.items()}

    return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


def register_rankgen_task(
    name: str,
    documents: str | Sequence[str] | Callable | None,
    vocab_path: str | Callable,
    *,
    negatives: str = "inbook",
    example_config: ExampleConfig | Callable = ExampleConfig(),
    generative_negatives_jsonl: str | Callable | None = None,
    holdout_documents: int | Callable = 1,
    markers: tuple[str, str] = ("pre ", "suffi "),
    group_size: int | Callable = 32,
    mix_documents: bool | Callable = False,
    validation_documents: str | Sequence[str] | Callable | None = None,
    validation_generative_negatives_jsonl: str | Callable | None = None,
    shuffle_block_documents: int | Callable = 256,
) -> seqio.Task:
    """Register (or re-register, replacing) a RankGen triples task; see the module docstring.

    documents: folder(s)/file(s) for `documents.read_documents` (None for "generative").
    vocab_path: spiece.model, tokenizer.json, or a folder with one (the model's own tokenizer).
    group_size: consecutive examples from one document; make the trainer's batch a multiple of it.
    Deferred arguments (zero-argument callables) are resolved whenever the task is read.
    """
    if negatives not in NEGATIVE_KINDS:
        raise RankgenError(f"negatives must be one of {NEGATIVE_KINDS}, got {negatives!r}")
    _TASK_ARGS[name] = dict(
        negatives=negatives, documents=documents, vocab_path=vocab_path, example_config=example_config,
        generative_negatives_jsonl=generative_negatives_jsonl, holdout_documents=holdout_documents,
        markers=tuple(markers), group_size=group_size, mix_documents=mix_documents,
        validation_documents=validation_documents,
        validation_generative_negatives_jsonl=validation_generative_negatives_jsonl,
        shuffle_block_documents=shuffle_block_documents,
    )
    vocabulary = DeferredVocabulary(vocab_path) if callable(vocab_path) else make_vocabulary(vocab_path)
    output_features = {key: seqio.Feature(vocabulary, add_eos=False, dtype=tf.int32) for key in ID_FEATURES}
    output_features[DOC_ID] = seqio.Feature(
        seqio.PassThroughVocabulary(size=0), add_eos=False, required=False, dtype=tf.string, rank=0
    )
    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=RankGenDataSource(_make_dataset_fn(name)),
        output_features=output_features,
        # Length trimming needs `sequence_length`, so it runs after the cache point.
        preprocessors=[seqio.CacheDatasetPlaceholder(), trim_keeping_last_token],
        shuffle_buffer_size=None,
    )


def register_mixture(name: str, tasks: Sequence[str], rates: Sequence[float | Callable] | None = None) -> seqio.Mixture:
    """Register (or replace) a mixture of tasks, e.g. the paper's "all" model over several domains.

    rates: relative rates, one per task (default equal); a callable takes the Task and returns its rate.
    """
    rates = list(rates) if rates is not None else [1.0] * len(tasks)
    if len(rates) != len(tasks):
        raise RankgenError(f"mixture {name!r}: {len(tasks)} tasks but {len(rates)} rates")
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, list(zip(tasks, rates)))


# ------------------------------------------------------------------------------------------
# Feature converter and the trainer's batch source
# ------------------------------------------------------------------------------------------


class RankGenFeatureConverter(seqio.FeatureConverter):
    """Task features -> the trainer's arrays: id features trimmed (keeping the last token) and padded; strings dropped.

    pad_id: the tokenizer's padding id (the vocabulary's `pad_id`: 0 for T5 and BERT, 1 for RoBERTa).
    with_negative: False drops `negative_ids` (training with in-batch negatives only).
    """

    TASK_FEATURES = {key: seqio.FeatureConverter.FeatureSpec(dtype=tf.int32) for key in ID_FEATURES}
    MODEL_FEATURES = dict(TASK_FEATURES)
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pad_id: int = 0, with_negative: bool = True, **kwargs):
        if kwargs.pop("pack", False):
            raise RankgenError("RankGenFeatureConverter does not pack: every row is one query or candidate")
        keys = ID_FEATURES if with_negative else ID_FEATURES[:2]
        # Instance attributes shadow the class ones: the feature set depends on with_negative.
        self.TASK_FEATURES = {key: seqio.FeatureConverter.FeatureSpec(dtype=tf.int32) for key in keys}
        self.MODEL_FEATURES = dict(self.TASK_FEATURES)
        self._pad_id = int(pad_id)
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        pad_id = self._pad_id

        def convert(example):
            out = {}
            for key in self.MODEL_FEATURES:
                length = int(task_feature_lengths[key])
                ids = _trim_keeping_last(example[key], length)
                ids = tf.pad(ids, [[0, length - tf.shape(ids)[0]]], constant_values=pad_id)
                out[key] = tf.ensure_shape(ids, [length])
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
        return {key: task_feature_lengths[key] for key in self.MODEL_FEATURES}


# Sources whose tf.data pipeline may still be running. Its prefetch threads call back into
# Python (the examples come from a generator; HF tokenizers run in tf.py_function); left
# alive into interpreter shutdown, they abort ("terminate called without an active
# exception", exit 134) or hang the process after a clean run.
_OPEN_SOURCES: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_sources() -> None:
    for source in list(_OPEN_SOURCES):
        source.close()


class SeqioTriples:
    """The trainer's BatchSource over a seqio task or mixture: `batch(index)` is global batch `index`.

    lengths: {"query_ids": Lq, "positive_ids": Lc, "negative_ids": Lc} (negative defaults to positive).
    seed: orders the stream (passed to the task's source; seqio shuffles nothing).
    shard_info: this host's share (multi-host); `batch` then returns the local batch, see the module docstring.
    use_cached: read a Beam-cached copy of the task(s) (loses same-document groups).
    threads: tf.data threads of the pipeline. One suits a host whose cores all run the
      train step (see `_dataset`); a TPU VM, whose cores are free, can give it more.
    """

    def __init__(
        self,
        task_or_mixture_name: str,
        split: str,
        batch_size: int,
        lengths: Mapping[str, int],
        seed: int = 0,
        shard_info: seqio.ShardInfo | None = None,
        *,
        with_negative: bool = True,
        use_cached: bool = False,
        threads: int = 1,
    ):
        try:
            provider = seqio.get_mixture_or_task(task_or_mixture_name)
        except ValueError:
            known = sorted(n for n in list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names()))
            raise RankgenError(
                f"no seqio task or mixture named {task_or_mixture_name!r} (import `tasks` to register RankGen's); "
                f"registered: {', '.join(known) or 'none'}"
            ) from None
        self.name, self.split, self.seed = task_or_mixture_name, split, int(seed)
        self.shard_info, self.use_cached, self.with_negative = shard_info, use_cached, with_negative
        hosts = shard_info.num_shards if shard_info else 1
        if batch_size < 1 or batch_size % hosts:
            raise RankgenError(f"batch_size={batch_size} must be positive and divisible by the {hosts} hosts")
        self.batch_size = int(batch_size)
        self.local_batch_size = self.batch_size // hosts
        if threads < 1:
            raise RankgenError(f"tf.data threads must be >= 1, got {threads} (DataConfig.tfdata_threads)")
        self.threads = int(threads)
        self._tasks, self._weights = self._tasks_and_weights(provider)
        for task in self._tasks:
            self._check_grouping(task.name, hosts)
        keys = ID_FEATURES if with_negative else ID_FEATURES[:2]
        lengths = dict(lengths)
        lengths.setdefault(NEGATIVE, lengths.get(POSITIVE))
        missing = [k for k in ID_FEATURES if not lengths.get(k)]
        if missing:
            raise RankgenError(f"SeqioTriples lengths need {', '.join(missing)}; got {dict(lengths)}")
        self._task_lengths = {k: int(lengths[k]) for k in ID_FEATURES}
        self.lengths = {k: self._task_lengths[k] for k in keys}
        self.vocabulary = provider.output_features[QUERY].vocabulary
        self.pad_id = int(self.vocabulary.pad_id)
        self.vocab_size = int(self.vocabulary.vocab_size)
        self.converter = RankGenFeatureConverter(pad_id=self.pad_id, with_negative=with_negative)
        self._iterator: Iterator | None = None
        self._next_index: int | None = None

    def _tasks_and_weights(self, provider) -> tuple[list[seqio.Task], list[float]]:
        """The tasks to read with their normalised rates; zero-rate tasks are never opened."""
        if isinstance(provider, seqio.Task):
            pairs = [(provider, 1.0)]
        else:
            pairs = [(task, float(provider.get_rate(task))) for task in provider.tasks]
        pairs = [(task, rate) for task, rate in pairs if rate > 0 and self.split in task.splits]
        if not pairs:
            raise RankgenError(f"{self.name!r} has no task with a positive rate and a {self.split!r} split")
        total = sum(rate for _, rate in pairs)
        return [task for task, _ in pairs], [rate / total for _, rate in pairs]

    def _check_grouping(self, task_name: str, hosts: int) -> None:
        """Batches must be whole same-document groups, and every host must own whole rows of each group."""
        if not is_rankgen_task(task_name):
            return
        spec = task_spec(task_name)
        if spec.group_size % hosts:
            raise RankgenError(
                f"task {task_name!r}: group_size={spec.group_size} is not divisible by the {hosts} hosts"
            )
        if not spec.mix_documents and self.batch_size % spec.group_size:
            raise RankgenError(
                f"task {task_name!r}: batch_size={self.batch_size} is not a multiple of its "
                f"group_size={spec.group_size}, so batches would split same-document groups"
            )

    def _dataset(self, start: int):
        """Numpy iterator over local batches from global batch `start` on (rebuilt from the stream's beginning)."""
        batched = []
        for task in self._tasks:
            ds = task.get_dataset(
                sequence_length=self._task_lengths, split=self.split, use_cached=self.use_cached, shuffle=False,
                seed=self.seed, shard_info=self.shard_info, num_epochs=None,
            )
            ds = self.converter(ds, self.lengths)
            batched.append(ds.batch(self.local_batch_size, drop_remainder=True))
        if len(batched) == 1:
            ds = batched[0]
        else:
            # Whole batches are drawn from one task at a time, with the same seed on every host.
            ds = tf.data.Dataset.sample_from_datasets(batched, weights=self._weights, seed=self.seed,
                                                      stop_on_empty_dataset=True)
        # A jump re-reads the stream from its start: `start` batches (start * batch_size examples) are skipped.
        # One tf.data thread by default: it reads ~2,200 examples/s, 25x what a 2-core step
        # consumes, and tf.data's default pool (a thread per core) preempts XLA's threads mid-op:
        # the real-data step was 4-10% slower than on synthetic batches with it, ~3.5% with one
        # (docs/benchmarks.md).
        options = tf.data.Options()
        options.threading.private_threadpool_size = self.threads
        options.threading.max_intra_op_parallelism = 1
        return ds.skip(start).prefetch(2).with_options(options).as_numpy_iterator()

    def close(self) -> None:
        """Stop the tf.data pipeline now (done at exit for every open source); `batch` reopens it."""
        self._iterator = None
        self._next_index = None
        _OPEN_SOURCES.discard(self)

    def batch(self, index: int, rows: slice | None = None) -> dict[str, np.ndarray]:
        """Global batch `index` (its `rows`); with shard_info, this host's local batch (`rows` must match its size)."""
        if index < 0:
            raise RankgenError(f"batch index must be >= 0, got {index}")
        if self._iterator is None or index != self._next_index:
            self._iterator = self._dataset(index)
            _OPEN_SOURCES.add(self)
        try:
            out = next(self._iterator)
        except StopIteration:
            self._iterator = None
            raise RankgenError(
                f"{self.name!r} ({self.split}) gives no complete batch of {self.local_batch_size} rows: "
                "too few examples for one group (see scan_task)"
            ) from None
        self._next_index = index + 1
        if self.shard_info is not None:
            if rows is not None and len(range(self.batch_size)[rows]) != self.local_batch_size:
                raise RankgenError(
                    f"rows {rows} do not match this host's {self.local_batch_size} rows "
                    f"of the {self.batch_size}-row batch"
                )
            return out
        return {k: v[rows] for k, v in out.items()} if rows is not None else out
