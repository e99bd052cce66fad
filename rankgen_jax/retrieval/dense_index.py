"""FAISS inner-product indexes over the project's encoder vectors: build, save, load, search, in shards.

RankGen scores are raw dot products of a prefix (query tower) and a suffix
(document tower) vector, so every index here uses the inner-product metric
(no normalisation: cosine only when the model's vectors are unit length).

An index folder written by `index_corpus` holds:
- vectors.npy        the passages' vectors, float32 [rows, D], in row order (a plain .npy file);
- ids.json           passage ids, one per row, in row order (a JSON list of strings);
- index.faiss        the FAISS index (faiss.write_index) of those vectors, row i having FAISS id i;
- index_config.json  model path, index_type (or index_factory), dim, count, encode_side, max_length,
                     title_join, the input conventions the passages were read with, the IVF / HNSW
                     settings and training sample it was built with, and which shard of which corpus
                     it holds (shard_index, num_shards, shard_rule, corpus_count, corpus_digest).

Shards: with num_shards N, shard I holds the passages at positions p with
p % N == I, where p counts the corpus's usable passages (skipped lines do not
count) from 0 in file order; N runs, one per host, cover the corpus once. The
corpus is streamed twice: once to count its passages, digest them and refuse
duplicate ids, once to encode the shard's passages a chunk at a time, each
chunk's vectors appended to vectors.npy, so that memory does not grow with the
corpus except by 8 bytes a passage for the duplicate check and by what the
FAISS index itself holds (a flat index: the shard's vectors; IVF-PQ: its codes).
The index is built from vectors.npy a chunk at a time, after training (IVF, PQ)
on a seeded sample of its rows.

Search over the shards of a corpus (`search_shards`) merges their top k into
exactly the top k of one flat index over the whole corpus, in one order:
score descending, equal scores by corpus position ascending. Each shard
returns its k best and every passage tied with its k-th, so a tie at the k-th
place is resolved by position whichever shard holds the passages.

Corpus and query files are read by data/retrieval_files.py: MS MARCO / TREC
TSV (`id \t text`), JSON lines (`{"id", "text"}`, BEIR's `{"_id", "title",
"text"}`, Tevatron's), or a BEIR folder; ids are the file's strings. Results
are written as search's JSON lines, a TREC run or an MS MARCO run.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data import jsonl
from rankgen_jax.data.conventions import check_encode_side
from rankgen_jax.data.retrieval_files import (DEFAULT_RUN_TAG, DEFAULT_TITLE_JOIN, RUN_FORMATS, Passage, iter_texts,
                                              join_title, passages_file, read_queries, report_read, require_split,
                                              write_run)
from rankgen_jax.errors import RankgenError

if TYPE_CHECKING:
    # For annotations only: inference.encoder imports jax, and the CLI imports this module before it sets XLA's
    # flags.
    from rankgen_jax.inference.encoder import LoadedModel

INDEX_TYPES = ("flat", "ivf", "hnsw")
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.json"
VECTORS_FILE = "vectors.npy"
CONFIG_FILE = "index_config.json"
# 2: vectors.npy and the shard and training fields; folders of version 1 (no vectors.npy) still load.
# 3: the keys index_type and encode_side (earlier versions wrote them as kind and encode_kind; still read).
FORMAT_VERSION = 3
RENAMED_CONFIG_KEYS = {"kind": "index_type", "encode_kind": "encode_side"}
# Passage at corpus position p (0-based, usable passages in file order) goes to shard p % num_shards.
SHARD_RULE = "round_robin"
# Index settings every shard of one corpus must share, for their scores to be comparable and their rows one corpus.
SHARD_SHARED_KEYS = ("model", "corpus_count", "corpus_digest", "num_shards", "shard_rule", "metric", "dim",
                     "encode_side", "max_length", "title_join", "input_conventions")
# Training sample of an index that needs training (IVF, PQ), unless given: at most this many rows, or 256 per
# IVF list when that is more (FAISS's k-means uses at most 256 points per centroid).
DEFAULT_TRAIN_SAMPLE = 100_000
KMEANS_MAX_POINTS_PER_LIST = 256
# Rows of vectors.npy read at a time when adding them to an index (16 MiB at 256 dimensions).
ADD_CHUNK_ROWS = 16_384
# FAISS k-means wants at least this many training points per IVF list (it warns below it).
POINTS_PER_LIST = 39
DEFAULT_HNSW_M = 32
DEFAULT_EF_SEARCH = 64
# Texts per encode() call: large enough for its length bucketing to pay off, small enough for memory.
ENCODE_CHUNK_BATCHES = 16
# Batches up to 128 tokens are padded to multiples of 16 rather than powers of two: a corpus
# amortises the extra compiled shapes (8 instead of 4), and on 2000 book passages of 3-150
# words (T5 1.1 small, 2 CPU cores) padding fell from 24% to 11% of the slots and encoding
# got ~15% faster (benchmarks.encode).
ENCODE_BUCKET_STEP = 16


# ---------------------------------------------------------------------------
# Indexes


def _as_matrix(vectors: Any, what: str) -> np.ndarray:
    """A C-contiguous float32 [N, D] copy-if-needed of `vectors`; RankgenError when not 2-D and finite."""
    array = np.asarray(vectors)
    if array.ndim != 2 or array.shape[1] < 1:
        raise RankgenError(f"{what} must be a 2-D array [N, D], got shape {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
        raise RankgenError(f"{what}: row {row} holds NaN or infinite values")
    return array


def default_nlist(num_vectors: int) -> int:
    """IVF list count for N vectors: about 4 * sqrt(N), at most N / 39 (FAISS k-means needs 39 points per list)."""
    return max(1, min(round(4 * math.sqrt(num_vectors)), num_vectors // POINTS_PER_LIST))


def _faiss_reason(error: Exception) -> str:
    """The last line of a FAISS RuntimeError (the rest is a C++ stack)."""
    text = str(error).strip()
    return text.splitlines()[-1] if text else "unknown error"


def _ivf_of(index):
    """The IVF part of an index (a factory string's "IVF4096,PQ64" is an IndexIVFPQ), or None."""
    import faiss

    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:  # FAISS's answer for an index without an IVF part
        return None


@dataclasses.dataclass(frozen=True)
class IndexSpec:
    """Which FAISS index to build: an index type and its settings, or a factory string (see new_faiss_index); one
    that needs training trains on train_sample rows (all by default) drawn with train_seed."""

    index_type: str | None = None
    nlist: int | None = None
    hnsw_m: int = DEFAULT_HNSW_M
    nprobe: int | None = None
    ef_search: int = DEFAULT_EF_SEARCH
    index_factory: str | None = None
    train_sample: int | None = None
    train_seed: int = 0


@dataclasses.dataclass(frozen=True)
class TextEncoding:
    """How texts go through a dual encoder: the tower (`encode_side`: "prefix" for queries, "suffix" for
    passages), texts per encoder call, a token limit (None: the model's input conventions), input conventions
    on top of the model's own (see inference.encoder.load_model), a jax Mesh to split every batch over (None:
    one device), and the vectors' first dimensions to keep (None: all; a Matryoshka-trained model's cut,
    inference.encoder.truncate_vectors)."""

    encode_side: str
    batch_size: int = 64
    max_length: int | None = None
    conventions: dict | None = None
    mesh: Any = None
    truncate_dim: int | None = None


def new_faiss_index(dim: int, num_vectors: int, spec: IndexSpec = IndexSpec(), train_rows: int | None = None):
    """An empty inner-product index for num_vectors dim-dimensional vectors, to be trained on train_rows of them.

    index_type "flat" (the default): exact search (IndexFlatIP). "ivf": IndexIVFFlat;
    nlist defaults to default_nlist(num_vectors) and is clipped to
    train_rows / 39 (at least 1) so small corpora train cleanly; nprobe (lists
    searched) defaults to min(nlist, 8), and nprobe = nlist makes the search
    exact. "hnsw": IndexHNSWFlat with hnsw_m links per node and efSearch =
    ef_search. index_factory instead of an index_type: faiss.index_factory's string
    ("IVF4096,PQ64", "HNSW32", "OPQ16,IVF1024,PQ16", ...) with the inner-product
    metric; nprobe and ef_search apply to its IVF or HNSW part.
    train_rows defaults to num_vectors.
    """
    import faiss  # optional (the retrieval extra); each function that needs it imports it

    index_type, nlist, hnsw_m, nprobe, ef_search, index_factory = (spec.index_type, spec.nlist, spec.hnsw_m,
                                                                   spec.nprobe, spec.ef_search, spec.index_factory)
    train_rows = num_vectors if train_rows is None else train_rows
    if nprobe is not None and (isinstance(nprobe, bool) or nprobe < 1):
        raise RankgenError(f"nprobe must be a positive integer, got {nprobe!r}")
    if isinstance(ef_search, bool) or ef_search < 1:
        raise RankgenError(f"ef_search must be a positive integer, got {ef_search!r}")
    if index_factory is not None:
        if index_type is not None:
            raise RankgenError(f"give an index type ({index_type!r}) or an index factory string ({index_factory!r}), "
                               "not both")
        if nlist is not None:
            raise RankgenError(f"nlist comes from the index factory string ({index_factory!r}); drop it")
        if not isinstance(index_factory, str) or not index_factory.strip():
            raise RankgenError(f"index_factory must be a non-empty FAISS factory string, got {index_factory!r}")
        try:
            index = faiss.index_factory(int(dim), index_factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise RankgenError(f"index factory string {index_factory!r} for {dim}-dimensional vectors: FAISS "
                               f"refuses it ({_faiss_reason(e)})") from None
        ivf = _ivf_of(index)
        if ivf is not None:
            if train_rows < ivf.nlist:
                raise RankgenError(f"index factory string {index_factory!r}: {ivf.nlist} IVF lists need at least "
                                   f"{ivf.nlist} training vectors, there are {train_rows}")
            ivf.nprobe = min(ivf.nlist, 8 if nprobe is None else int(nprobe))
        if isinstance(index, faiss.IndexHNSW):
            index.hnsw.efSearch = int(ef_search)
        return index
    index_type = "flat" if index_type is None else index_type
    if index_type not in INDEX_TYPES:
        raise RankgenError(f"unknown index type {index_type!r}: expected one of {INDEX_TYPES}")
    if index_type == "flat":
        return faiss.IndexFlatIP(int(dim))
    if index_type == "ivf":
        if nlist is not None and (isinstance(nlist, bool) or nlist < 1):
            raise RankgenError(f"nlist must be a positive integer, got {nlist!r}")
        cap = max(1, train_rows // POINTS_PER_LIST)
        if nlist is not None and nlist > cap:
            print(f"note: nlist {nlist} lowered to {cap} for {train_rows} training vectors "
                  f"(k-means needs {POINTS_PER_LIST} training vectors per list)", file=sys.stderr)
        lists = min(default_nlist(num_vectors) if nlist is None else int(nlist), cap)
        quantizer = faiss.IndexFlatIP(int(dim))
        index = faiss.IndexIVFFlat(quantizer, int(dim), lists, faiss.METRIC_INNER_PRODUCT)
        if train_rows < POINTS_PER_LIST:
            # One list (nlist was clipped to 1): its centroid is just the mean, so
            # FAISS's "provide at least 39 training points" warning is noise here.
            index.cp.min_points_per_centroid = 1
        index.nprobe = min(lists, 8 if nprobe is None else int(nprobe))
        return index
    if isinstance(hnsw_m, bool) or hnsw_m < 2:
        raise RankgenError(f"hnsw_m must be an integer >= 2, got {hnsw_m!r}")
    index = faiss.IndexHNSWFlat(int(dim), int(hnsw_m), faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = int(ef_search)
    return index


def train_faiss_index(index, sample_NxD: Any) -> None:
    """Train an index that needs it (IVF, PQ) on sample_NxD; RankgenError with FAISS's reason when it cannot."""
    if index.is_trained:
        return
    try:
        index.train(_as_matrix(sample_NxD, "training vectors"))
    except RuntimeError as e:
        raise RankgenError(f"cannot train the index on {len(sample_NxD)} vectors ({_faiss_reason(e)})") from None


def build_faiss_index(
    vectors_NxD: Any,
    index_type: str | None = None,
    nlist: int | None = None,
    hnsw_m: int = DEFAULT_HNSW_M,
    nprobe: int | None = None,
    ef_search: int = DEFAULT_EF_SEARCH,
    index_factory: str | None = None,
):
    """An inner-product FAISS index holding the rows of vectors_NxD (row i gets id i), trained on all of them.

    index_type, index_factory and the settings: see new_faiss_index.
    """
    vectors_NxD = _as_matrix(vectors_NxD, "vectors")
    num, dim = vectors_NxD.shape
    if num == 0:
        raise RankgenError("no vectors to index")
    index = new_faiss_index(dim, num, IndexSpec(index_type, nlist, hnsw_m, nprobe, ef_search, index_factory))
    train_faiss_index(index, vectors_NxD)
    index.add(vectors_NxD)
    return index


def index_settings(index, index_factory: str | None = None) -> dict[str, Any]:
    """The index type and search settings of an index built by new_faiss_index (for index_config.json)."""
    import faiss

    if index_factory is not None:
        settings: dict[str, Any] = {"index_type": "factory", "index_factory": index_factory}
        ivf = _ivf_of(index)
        if ivf is not None:
            settings.update(nlist=int(ivf.nlist), nprobe=int(ivf.nprobe))
        if isinstance(index, faiss.IndexHNSW):
            settings["ef_search"] = int(index.hnsw.efSearch)
        return settings
    if isinstance(index, faiss.IndexIVF):
        return {"index_type": "ivf", "nlist": int(index.nlist), "nprobe": int(index.nprobe)}
    if isinstance(index, faiss.IndexHNSW):
        return {"index_type": "hnsw", "hnsw_m": int(index.hnsw.nb_neighbors(1)), "ef_search": int(index.hnsw.efSearch)}
    return {"index_type": "flat"}


def vector_rows(vectors_path: str | Path, rows: slice | np.ndarray) -> np.ndarray:
    """A float32 copy of some rows of a .npy file, read through a memory map that is closed again.

    Closing the map keeps the pages read out of the process's resident memory,
    so reading a large file a chunk at a time needs only a chunk of memory.
    """
    mapped = np.load(vectors_path, mmap_mode="r")
    return np.array(mapped[rows], dtype=np.float32)


def default_train_sample(num_vectors: int, ivf_lists: int = 0) -> int:
    """Rows an index trains on by default: DEFAULT_TRAIN_SAMPLE, or 256 per IVF list if more; at most all."""
    return min(num_vectors, max(DEFAULT_TRAIN_SAMPLE, KMEANS_MAX_POINTS_PER_LIST * ivf_lists))


def build_faiss_index_from_file(vectors_path: str | Path, spec: IndexSpec = IndexSpec(),
                                chunk_rows: int = ADD_CHUNK_ROWS) -> tuple[Any, dict[str, Any]]:
    """(index, settings) over the rows of a .npy [N, D] file, read chunk_rows at a time.

    An index that needs training trains on spec.train_sample rows (default:
    default_train_sample) drawn without replacement with numpy's
    default_rng(spec.train_seed), in row order; all rows when train_sample >= N.
    settings: index_settings plus train_sample (rows trained on, None when the
    index needs no training) and train_seed.
    """
    train_sample, train_seed = spec.train_sample, spec.train_seed
    if train_sample is not None and (isinstance(train_sample, bool) or not isinstance(train_sample, int)
                                     or train_sample < 1):
        raise RankgenError(f"train_sample must be a positive integer, got {train_sample!r}")
    if isinstance(train_seed, bool) or not isinstance(train_seed, int):
        raise RankgenError(f"train_seed must be an integer, got {train_seed!r}")
    shape = np.load(vectors_path, mmap_mode="r").shape
    if len(shape) != 2 or shape[0] == 0:
        raise RankgenError(f"{vectors_path}: expected a non-empty [N, D] array, got shape {shape}")
    num, dim = shape
    if spec.index_factory is not None:
        # Built once untrained to learn whether it needs training and its IVF list count.
        probe = new_faiss_index(dim, num, spec)
        needs_training, ivf = not probe.is_trained, _ivf_of(probe)
        lists = 0 if ivf is None else int(ivf.nlist)
    else:
        needs_training = spec.index_type == "ivf"
        lists = default_nlist(num) if spec.nlist is None else spec.nlist
    trained_on = None
    if needs_training:
        trained_on = min(num, default_train_sample(num, lists) if train_sample is None else train_sample)
    index = new_faiss_index(dim, num, spec, train_rows=trained_on)
    if trained_on is not None:
        rows = np.sort(np.random.default_rng(train_seed).choice(num, trained_on, replace=False))
        train_faiss_index(index, vector_rows(vectors_path, rows))
    for start in range(0, num, chunk_rows):
        index.add(_as_matrix(vector_rows(vectors_path, slice(start, start + chunk_rows)), str(vectors_path)))
    return index, {**index_settings(index, spec.index_factory), "train_sample": trained_on, "train_seed": train_seed}


def search_index(index, queries_QxD: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k'] float32, row ids [Q, k'] int64), best first, k' = min(k, index size).

    An approximate index may find fewer than k' rows for a query (IVF: too few
    vectors in the probed lists); FAISS pads those rows with id -1.
    For HNSW, efSearch is raised to k for this call when it is smaller (it
    cannot return more than efSearch results).
    """
    import faiss

    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    queries_QxD = _as_matrix(queries_QxD, "queries")
    if queries_QxD.shape[1] != index.d:
        raise RankgenError(f"queries have {queries_QxD.shape[1]} dimensions but the index holds "
                           f"{index.d}-dimensional vectors")
    if index.ntotal == 0:
        raise RankgenError("the index is empty")
    k = min(int(k), int(index.ntotal))
    params = None
    if isinstance(index, faiss.IndexHNSW) and index.hnsw.efSearch < k:
        params = faiss.SearchParametersHNSW(efSearch=k)
    scores_QxK, ids_QxK = index.search(queries_QxD, k, params=params)
    return scores_QxK.astype(np.float32, copy=False), ids_QxK.astype(np.int64, copy=False)


# ---------------------------------------------------------------------------
# Index folders


@dataclasses.dataclass
class LoadedIndex:
    """An index folder read back: the FAISS index, passage ids by row, and its config."""

    index: Any
    ids: list[str]
    config: dict[str, Any]
    path: str

    def search(self, queries_QxD: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """search_index on this index: (scores [Q, k'], row ids [Q, k'])."""
        return search_index(self.index, queries_QxD, k)


def encode_all(model, texts: list[str], side: str, max_length: int | None, batch_size: int, progress: bool,
                desc: str, mesh=None, truncate_dim: int | None = None) -> np.ndarray:
    """Vectors [N, D] of texts, encoded a chunk at a time under a progress bar (rate and ETA) on stderr; with a
    mesh, every batch is split over its data axes; with truncate_dim, their first dimensions (truncate_vectors)."""
    from rankgen_jax.inference.encoder import truncate_vectors

    vectors_NxD = np.zeros((len(texts), truncate_dim or model.dim), np.float32)
    chunk = batch_size * ENCODE_CHUNK_BATCHES
    with tqdm(total=len(texts), unit="text", desc=desc, file=sys.stderr, dynamic_ncols=True,
              disable=not progress) as bar:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            vectors_NxD[start : start + len(part)] = truncate_vectors(model.encode(
                part, side=side, max_length=max_length, batch_size=batch_size, bucket_step=ENCODE_BUCKET_STEP,
                mesh=mesh), truncate_dim, model.normalizes)
            bar.update(len(part))
    return vectors_NxD


def _require_one_vector(model: LoadedModel) -> None:
    """An index holds one vector per passage; a model with perspective heads gives several."""
    if len(model.vector_shape) != 1:
        raise RankgenError(f"{model.source}: a model with {model.vector_shape[0]} perspective heads gives "
                           f"{model.vector_shape[0]} vectors per text; a FAISS index holds one per passage")


def _check_encode_args(encode_side: str, batch_size: int) -> None:
    check_encode_side(encode_side)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise RankgenError(f"batch_size must be a positive integer, got {batch_size!r}")


def _check_shard(num_shards: int, shard_index: int) -> None:
    for name, value, low in (("num_shards", num_shards, 1), ("shard_index", shard_index, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise RankgenError(f"{name} must be an integer >= {low}, got {value!r}")
    if shard_index >= num_shards:
        raise RankgenError(f"shard_index {shard_index} is not below num_shards {num_shards} (shards count from 0)")


def shard_positions(shard_index: int, num_shards: int, corpus_count: int) -> np.ndarray:
    """Corpus positions of a shard's rows, in row order: shard_index, shard_index + num_shards, ... (SHARD_RULE)."""
    return np.arange(shard_index, corpus_count, num_shards, dtype=np.int64)


def _digest_passage(digest, passage: Passage) -> None:
    # Length-prefixed fields, so that no two different corpora give the same byte stream.
    for field in (passage.id, passage.title, passage.text):
        raw = field.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)


@dataclasses.dataclass
class CorpusScan:
    """A corpus file streamed once: its usable passages' count and digest (id, title and text of each, in order)."""

    path: str
    count: int
    digest: str
    skipped: jsonl.SkippedLines


def scan_corpus(corpus_path: str | Path, quiet: bool = False) -> CorpusScan:
    """Stream a corpus (a file or a BEIR folder): count its passages, digest them, refuse a duplicate id.

    Bad lines are skipped and counted as read_passages does (summarised on
    stderr unless quiet). A duplicate id is a RankgenError naming both lines.
    The duplicate check keeps one 64-bit hash per passage (8 bytes each, not
    the ids); equal hashes are confirmed on the ids by a second pass over the
    passages holding them, so a hash collision never refuses a corpus.
    """
    file = passages_file(corpus_path)
    skipped = jsonl.SkippedLines()
    hashes = array.array("q")
    digest = hashlib.blake2b(digest_size=16)
    for _, passage in iter_texts(file, skipped=skipped):
        # str's hash differs between processes (hash randomisation) but not within this one: enough here.
        hashes.append(hash(passage.id))
        _digest_passage(digest, passage)
    report_read(file, "passage", len(hashes), skipped, quiet)
    sorted_hashes = np.sort(np.frombuffer(hashes, np.int64))
    repeated = sorted_hashes[1:][sorted_hashes[1:] == sorted_hashes[:-1]]
    if repeated.size:
        suspects, first_line = set(repeated.tolist()), {}
        for number, passage in iter_texts(file):
            if hash(passage.id) in suspects:
                line = first_line.setdefault(passage.id, number)
                if line != number:
                    raise RankgenError(f"{file}: passage id {passage.id!r} occurs twice (lines {line} and "
                                       f"{number}); ids must be unique")
    return CorpusScan(str(file), len(hashes), digest.hexdigest(), skipped)


def _shard_passages(scan: CorpusScan, shard_index: int, num_shards: int) -> Iterator[Passage]:
    """The shard's passages, streamed again; RankgenError when the file no longer matches its scan."""
    digest = hashlib.blake2b(digest_size=16)
    position = -1
    for position, (_, passage) in enumerate(iter_texts(scan.path)):
        _digest_passage(digest, passage)
        if position % num_shards == shard_index:
            yield passage
    if position + 1 != scan.count or digest.hexdigest() != scan.digest:
        raise RankgenError(f"{scan.path}: the file changed while it was being indexed; index it again")


def _npy_header(file, rows: int, dim: int) -> None:
    np.lib.format.write_array_header_1_0(
        file, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
               "shape": (rows, dim)})


def encode_shard(model, scan: CorpusScan, out: Path, shard_index: int, num_shards: int, encoding: TextEncoding,
                 title_join: str | None, progress: bool) -> int:
    """Encode a shard's passages into out/vectors.npy and out/ids.json, a chunk at a time; returns its row count.

    Memory holds one chunk of texts and vectors: each chunk's vectors are
    appended to the .npy file (its header, written first, has the row count the
    scan gives) and its ids to the JSON list.
    """
    rows = len(shard_positions(shard_index, num_shards, scan.count))
    chunk_size = encoding.batch_size * ENCODE_CHUNK_BATCHES
    written = 0
    with (open(out / VECTORS_FILE, "wb") as vectors_file, open(out / IDS_FILE, "w", encoding="utf-8") as ids_file,
          tqdm(total=rows, unit="text", desc=f"index shard {shard_index}/{num_shards}", file=sys.stderr,
               dynamic_ncols=True, disable=not progress) as bar):
        _npy_header(vectors_file, rows, encoding.truncate_dim or model.dim)
        ids_file.write("[")
        ids: list[str] = []
        texts: list[str] = []

        def flush() -> None:
            nonlocal written
            vectors_NxD = encode_all(model, texts, encoding.encode_side, encoding.max_length, encoding.batch_size,
                                     False, "", encoding.mesh, encoding.truncate_dim)
            vectors_file.write(np.ascontiguousarray(vectors_NxD, dtype="<f4").tobytes())
            ids_file.write(("," if written else "") + ",".join(json.dumps(i, ensure_ascii=False) for i in ids))
            written += len(ids)
            bar.update(len(ids))
            ids.clear()
            texts.clear()

        for passage in _shard_passages(scan, shard_index, num_shards):
            ids.append(passage.id)
            texts.append(join_title(passage.title, passage.text, title_join))
            if len(texts) == chunk_size:
                flush()
        if texts:
            flush()
        ids_file.write("]")
    return written


def index_corpus(
    model: str | LoadedModel,
    corpus_path: str,
    out_dir: str,
    index: IndexSpec = IndexSpec(),
    encoding: TextEncoding = TextEncoding("suffix"),
    title_join: str | None = DEFAULT_TITLE_JOIN,
    num_shards: int = 1,
    shard_index: int = 0,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Encode a corpus file (or a BEIR folder's corpus), or one shard of it, with a dual encoder (a model folder, or a
    loaded model) and write an index folder; returns its index_config.

    Passages go through the document tower ("suffix") by default, as RankGen
    continuations do, read with the model's input conventions (the encoding's
    `conventions` on top, see load_model; one stderr line names them); a title
    joins its text as retrieval_files.join_title does with title_join (None:
    titles dropped). The corpus is streamed (see the module docstring): shard
    shard_index of num_shards takes the passages at positions p % num_shards
    == shard_index. index.index_type ("flat" by default, "ivf", "hnsw") or
    index.index_factory (a FAISS factory string) picks the index; one that
    needs training trains on index.train_sample rows drawn with
    index.train_seed (build_faiss_index_from_file). A non-empty out_dir is
    refused unless overwrite.
    """
    # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
    from rankgen_jax.inference.encoder import as_loaded_model

    # Imported before the (slow) encoding, so a missing retrieval extra fails at once.
    import faiss

    _check_shard(num_shards, shard_index)
    spec = index
    if spec.index_factory is None and spec.index_type is not None and spec.index_type not in INDEX_TYPES:
        raise RankgenError(f"unknown `index_type` {spec.index_type!r}: expected one of {INDEX_TYPES}",
                           names=("index_type",))
    encode_side, batch_size, max_length = encoding.encode_side, encoding.batch_size, encoding.max_length
    _check_encode_args(encode_side, batch_size)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RankgenError(f"{out_dir}: exists and is not a folder")
    # Checked before the (slow) encoding, so a wrong folder fails at once.
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RankgenError(f"{out_dir}: folder is not empty; choose another or pass `overwrite`", names=("overwrite",))
    # Duplicate ids are refused here, before encoding: search results would be ambiguous.
    scan = scan_corpus(corpus_path)
    if shard_index >= scan.count:
        raise RankgenError(f"{corpus_path}: shard {shard_index} of {num_shards} would be empty: the corpus has only "
                           f"{scan.count} passages")
    model = as_loaded_model(model, encoding.conventions)
    _require_one_vector(model)
    print(model.conventions_note(), file=sys.stderr)
    if spec.index_factory is not None:
        # Checked for the model's dimension before the (slow) encoding: FAISS refuses e.g. PQ48 on 64 dimensions.
        rows = len(shard_positions(shard_index, num_shards, scan.count))
        new_faiss_index(model.dim, rows, spec, train_rows=min(rows, spec.train_sample or rows))
    out.mkdir(parents=True, exist_ok=True)
    # The config goes first and comes back last: a run that dies mid-write
    # leaves a folder load_index refuses, never an old config over new files.
    (out / CONFIG_FILE).unlink(missing_ok=True)
    count = encode_shard(model, scan, out, shard_index, num_shards, encoding, title_join,
                         progress)
    built, settings = build_faiss_index_from_file(out / VECTORS_FILE, spec)
    faiss.write_index(built, str(out / INDEX_FILE))
    config = {
        "format_version": FORMAT_VERSION,
        "model": str(Path(model.source).resolve()),
        "corpus": str(Path(scan.path).resolve()),
        "metric": "inner_product",
        "dim": int(encoding.truncate_dim or model.dim),
        "truncate_dim": encoding.truncate_dim,
        "count": count,
        "encode_side": encode_side,
        "max_length": max_length,
        "title_join": title_join,
        "input_conventions": model.conventions.to_dict(),
        **settings,
        "num_shards": num_shards,
        "shard_index": shard_index,
        "shard_rule": SHARD_RULE,
        "corpus_count": scan.count,
        "corpus_digest": scan.digest,
        "vectors_file": VECTORS_FILE,
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return config


def index_written(index_dir: str | os.PathLike) -> bool:
    """Whether index_corpus finished index_dir (it writes the config file last), so a resumed job may skip it."""
    return (Path(index_dir) / CONFIG_FILE).is_file()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RankgenError(f"{path}: cannot read JSON ({e})") from None


def load_index(index_dir: str) -> LoadedIndex:
    """An index folder written by index_corpus; RankgenError naming the file when one is missing or they disagree."""
    import faiss

    folder = Path(index_dir)
    if not folder.is_dir():
        raise RankgenError(f"{index_dir}: no such index folder")
    for name in (CONFIG_FILE, INDEX_FILE, IDS_FILE):
        if not (folder / name).is_file():
            raise RankgenError(f"{folder / name}: missing (is {index_dir} a folder written by index_corpus?)")
    config = read_index_config(folder / CONFIG_FILE)
    ids = _read_json(folder / IDS_FILE)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RankgenError(f"{folder / IDS_FILE}: expected a JSON list of passage id strings")
    try:
        index = faiss.read_index(str(folder / INDEX_FILE))
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else "unknown error"
        raise RankgenError(f"{folder / INDEX_FILE}: not a readable FAISS index ({reason})") from None
    if index.ntotal != len(ids) or index.ntotal != config["count"]:
        raise RankgenError(f"{index_dir}: {INDEX_FILE} holds {index.ntotal} vectors, {IDS_FILE} {len(ids)} ids "
                           f"and {CONFIG_FILE} says {config['count']}; the folder is mixed up, rebuild it")
    if index.d != config["dim"]:
        raise RankgenError(f"{index_dir}: {INDEX_FILE} holds {index.d}-dimensional vectors "
                           f"but {CONFIG_FILE} says dim {config['dim']}")
    return LoadedIndex(index=index, ids=ids, config=config, path=str(index_dir))


def read_index_config(path: Path) -> dict[str, Any]:
    """An index_config.json, with the keys of earlier versions under their current names."""
    config = _read_json(path)
    if isinstance(config, dict):
        config = {RENAMED_CONFIG_KEYS.get(key, key): value for key, value in config.items()}
    if not isinstance(config, dict) or not all(key in config for key in ("index_type", "dim", "count")):
        raise RankgenError(f"{path}: expected an object with index_type (or kind), dim and count")
    return config


def index_folders(index_dirs: str | Sequence[str]) -> list[str]:
    """The index folders named: each path an index folder, or a folder whose subfolders are (the shards).

    RankgenError for a path that is neither.
    """
    paths = [index_dirs] if isinstance(index_dirs, (str, Path)) else list(index_dirs)
    if not paths:
        raise RankgenError("no index folder given")
    folders = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise RankgenError(f"{path}: no such index folder")
        if (path / CONFIG_FILE).is_file():
            folders.append(str(path))
            continue
        inside = sorted(str(sub) for sub in path.iterdir() if (sub / CONFIG_FILE).is_file())
        if not inside:
            raise RankgenError(f"{path}: neither an index folder (no {CONFIG_FILE}) nor a folder of them "
                               "(no subfolder holds one)")
        folders.extend(inside)
    return folders


def _shard_of(config: dict) -> tuple[int, int]:
    """(shard_index, num_shards) of an index config; a folder from before shards is shard 0 of 1."""
    return int(config.get("shard_index", 0)), int(config.get("num_shards", 1))


def check_shards(folders: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """(folder, config) of each shard of one corpus, by shard index; RankgenError for a bad set.

    The shards must agree on SHARD_SHARED_KEYS (model, corpus, encoding and
    input conventions) and cover shards 0 .. N-1 exactly once. Only the
    configs are read.
    """
    shards = []
    for folder in folders:
        for name in (INDEX_FILE, IDS_FILE):
            if not (Path(folder) / name).is_file():
                raise RankgenError(f"{Path(folder) / name}: missing (is {folder} a folder written by index_corpus?)")
        path = Path(folder) / CONFIG_FILE
        config = read_index_config(path)
        try:
            index, num = _shard_of(config)
        except (TypeError, ValueError):
            raise RankgenError(f"{path}: shard_index and num_shards must be integers") from None
        shards.append((folder, config, index, num))
    first_folder, first = shards[0][0], shards[0][1]
    for folder, config, _, _ in shards[1:]:
        for key in SHARD_SHARED_KEYS:
            if config.get(key) != first.get(key):
                raise RankgenError(f"{folder} and {first_folder} are not shards of one index: their {key} "
                                   f"differs ({config.get(key)!r} and {first.get(key)!r})")
    num_shards = shards[0][3]
    by_index: dict[int, str] = {}
    for folder, _, index, num in shards:
        if not 0 <= index < num_shards:
            raise RankgenError(f"{folder}: shard {index} is outside 0..{num_shards - 1}")
        if index in by_index:
            raise RankgenError(f"shard {index} of {num_shards} is given twice: {by_index[index]} and {folder}")
        by_index[index] = folder
    missing = [i for i in range(num_shards) if i not in by_index]
    if missing:
        raise RankgenError(f"shards {missing} of {num_shards} are missing (given: "
                           f"{', '.join(f'{i}: {by_index[i]}' for i in sorted(by_index))}); search needs them all")
    corpus_count = first.get("corpus_count")
    for folder, config, index, _ in shards:
        if corpus_count is not None and config["count"] != len(shard_positions(index, num_shards, corpus_count)):
            raise RankgenError(f"{folder}: holds {config['count']} passages, but shard {index} of {num_shards} of a "
                               f"{corpus_count}-passage corpus has "
                               f"{len(shard_positions(index, num_shards, corpus_count))}")
    return [(folder, config) for folder, config, _, _ in sorted(shards, key=lambda shard: shard[2])]


def _search_with_ties(index, queries_QxD: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query (scores, rows) of its k best rows and of every further row tied with its k-th, best first.

    The index is asked for k + 1 rows, then twice as many for the queries whose
    last row still ties with their k-th, until it does not or all rows are in.
    """
    total = int(index.ntotal)
    k = min(k, total)
    results: list[Any] = [None] * len(queries_QxD)
    pending = np.arange(len(queries_QxD))
    want = min(k + 1, total)
    while pending.size:
        scores_QxW, rows_QxW = search_index(index, queries_QxD[pending], want)
        kth_Q = scores_QxW[:, k - 1]
        if want < total:
            again_Q = (rows_QxW[:, -1] >= 0) & (scores_QxW[:, -1] == kth_Q)
        else:
            again_Q = np.zeros(len(pending), bool)
        for j in np.flatnonzero(~again_Q):
            keep = rows_QxW[j] >= 0  # FAISS pads with -1 when an approximate index finds fewer
            keep &= (np.arange(want) < k) | (scores_QxW[j] >= kth_Q[j])
            results[pending[j]] = (scores_QxW[j][keep], rows_QxW[j][keep])
        pending = pending[again_Q]
        want = min(2 * want, total)
    return results


def rank_flat(passages_PxD: Any, queries_QxD: Any, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each query's (passage rows, scores) of its k best, by an exact (flat) index of passages_PxD held in memory,
    best first, equal scores by row: what `search` returns for one flat index of the same vectors."""
    index = build_faiss_index(passages_PxD, "flat")
    ranked = []
    for scores_K, rows_K in _search_with_ties(index, _as_matrix(queries_QxD, "queries"), int(k)):
        order = np.lexsort((rows_K, -scores_K))[: int(k)]
        ranked.append((rows_K[order], scores_K[order]))
    return ranked


def search_shards(shards: Sequence[tuple[str, dict[str, Any]]], queries_QxD: Any,
                  k: int) -> list[tuple[list[str], list[float]]]:
    """(ids, scores) of each query's top k over the shards of one corpus (check_shards' list), best first.

    One shard is loaded at a time. The merged order is score descending, equal
    scores by corpus position ascending (see the module docstring), the same
    for any number of shards: for flat shards the result is that of one flat
    index over the whole corpus.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    queries_QxD = _as_matrix(queries_QxD, "queries")
    num_queries = len(queries_QxD)
    found_scores: list[list[np.ndarray]] = [[] for _ in range(num_queries)]
    found_positions: list[list[np.ndarray]] = [[] for _ in range(num_queries)]
    found_ids: list[list[str]] = [[] for _ in range(num_queries)]
    for folder, config in shards:
        loaded = load_index(folder)
        shard_index, num_shards = _shard_of(config)
        for q, (scores_K, rows_K) in enumerate(_search_with_ties(loaded.index, queries_QxD, int(k))):
            found_scores[q].append(scores_K)
            found_positions[q].append(shard_index + rows_K * num_shards)
            found_ids[q].extend(loaded.ids[r] for r in rows_K)
        del loaded  # one shard's index in memory at a time
    results = []
    for q in range(num_queries):
        scores_C = np.concatenate(found_scores[q])
        order = np.lexsort((np.concatenate(found_positions[q]), -scores_C))[: int(k)]
        results.append(([found_ids[q][c] for c in order], [float(scores_C[c]) for c in order]))
    return results


def search_queries(
    model: str | LoadedModel,
    index_dir: str | Sequence[str],
    queries_path: str,
    k: int,
    encoding: TextEncoding = TextEncoding("prefix"),
    split: str | None = None,
    out_path: str | None = None,
    out_format: str = "jsonl",
    run_tag: str = DEFAULT_RUN_TAG,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Top-k passages for each query of a file: [{"query_id", "query", "ids", "scores"}], best first, by a dual
    encoder (a model folder, or a loaded model).

    index_dir: an index folder, the shard folders of one corpus, or a folder
    holding them (index_folders); shards are checked (check_shards) and merged
    (search_shards). Queries go through the query tower ("prefix") by default,
    read with the model's input conventions (the encoding's `conventions` on top; one stderr
    line names them). The queries of a BEIR folder are those its split's qrels
    judge; the split must be named (retrieval_files.require_split). With out_path, the results are also written there
    in out_format: "jsonl" (these records), "trec" or "msmarco" (run files;
    retrieval_files.run_lines).
    """
    # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
    from rankgen_jax.inference.encoder import as_loaded_model

    encode_side, batch_size, max_length = encoding.encode_side, encoding.batch_size, encoding.max_length
    _check_encode_args(encode_side, batch_size)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    if out_path is not None and Path(out_path).resolve() == Path(queries_path).resolve():
        raise RankgenError(f"{out_path}: the output would overwrite the queries file")
    if out_format not in RUN_FORMATS:
        raise RankgenError(f"unknown output format {out_format!r}: expected one of {RUN_FORMATS}")
    require_split(queries_path, split)
    shards = check_shards(index_folders(index_dir))
    where = shards[0][0] if len(shards) == 1 else f"the {len(shards)} shards in {', '.join(f for f, _ in shards)}"
    built = shards[0][1]
    query_file = read_queries(queries_path, split=split)
    query_ids, queries = query_file.ids, query_file.joined(DEFAULT_TITLE_JOIN)
    model = as_loaded_model(model, encoding.conventions)
    _require_one_vector(model)
    print(model.conventions_note(), file=sys.stderr)
    built_conventions = built.get("input_conventions")
    if built_conventions is not None and built_conventions != model.conventions.to_dict():
        print(f"note: {where} was built with other input conventions ({built_conventions}); the queries are read "
              "with those above", file=sys.stderr)
    if built.get("truncate_dim") != encoding.truncate_dim:
        raise RankgenError(f"{where} holds vectors cut to {built.get('truncate_dim') or 'no'} dimensions; search with "
                           f"the same `truncate_dim` (now {encoding.truncate_dim})", names=("truncate_dim",))
    if (encoding.truncate_dim or model.dim) != built["dim"]:
        raise RankgenError(f"{model.source}: the model gives {model.dim}-dimensional vectors but the index in "
                           f"{where} holds {built['dim']}-dimensional ones (built with {built.get('model')})")
    built_with = built.get("model")
    if built_with and Path(built_with) != Path(model.source).resolve():
        # Same size vectors from another model are silently meaningless; say so, but allow moved folders.
        print(f"note: {where} was built with {built_with}, searching with {model.source}", file=sys.stderr)
    vectors_QxD = encode_all(model, queries, encode_side, max_length, batch_size, progress, "queries", encoding.mesh,
                             encoding.truncate_dim)
    results = [{"query_id": query_id, "query": query, "ids": ids, "scores": scores}
               for query_id, query, (ids, scores) in zip(query_ids, queries, search_shards(shards, vectors_QxD, k))]
    if out_path is not None:
        write_run(out_path, results, out_format, run_tag)
    return results
