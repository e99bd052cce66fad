"""FAISS inner-product indexes over the project's encoder vectors: build, save, load, search.

RankGen scores are raw dot products of a prefix (query tower) and a suffix
(document tower) vector, so every index here uses the inner-product metric
(no normalisation: cosine only when the model's vectors are unit length).

An index folder written by `index_corpus` holds:
- index.faiss        the FAISS index (faiss.write_index);
- ids.json           passage ids, one per index row, in row order;
- index_config.json  model path, kind, dim, count, encode_kind, max_length,
                     title_join, the input conventions the passages were read with,
                     and the IVF / HNSW settings it was built with.

Corpus and query files are read by data/retrieval_files.py: MS MARCO / TREC
TSV (`id \t text`), JSON lines (`{"id", "text"}`, BEIR's `{"_id", "title",
"text"}`, Tevatron's), or a BEIR folder; ids are the file's strings. Results
are written as search's JSON lines, a TREC run or an MS MARCO run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.retrieval_files import (DEFAULT_RUN_TAG, DEFAULT_TITLE_JOIN, RUN_FORMATS, read_passages,
                                              read_queries, write_run)
from rankgen_jax.errors import RankgenError

INDEX_KINDS = ("flat", "ivf", "hnsw")
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.json"
CONFIG_FILE = "index_config.json"
FORMAT_VERSION = 1
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


def build_faiss_index(
    vectors_NxD: Any,
    kind: str = "flat",
    nlist: int | None = None,
    hnsw_m: int = DEFAULT_HNSW_M,
    nprobe: int | None = None,
    ef_search: int = DEFAULT_EF_SEARCH,
):
    """An inner-product FAISS index holding the rows of vectors_NxD (row i gets id i).

    kind "flat": exact search (IndexFlatIP). "ivf": IndexIVFFlat trained on the
    vectors themselves; nlist defaults to default_nlist(N) and is clipped to
    N / 39 (at least 1) so small corpora train cleanly; nprobe (lists searched)
    defaults to min(nlist, 8), and nprobe = nlist makes the search exact.
    "hnsw": IndexHNSWFlat with hnsw_m links per node and efSearch = ef_search.
    """
    import faiss  # optional (the retrieval extra); each function that needs it imports it

    if kind not in INDEX_KINDS:
        raise RankgenError(f"unknown index kind {kind!r}: expected one of {INDEX_KINDS}")
    vectors_NxD = _as_matrix(vectors_NxD, "vectors")
    num, dim = vectors_NxD.shape
    if num == 0:
        raise RankgenError("no vectors to index")
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf":
        if nlist is not None and (isinstance(nlist, bool) or nlist < 1):
            raise RankgenError(f"nlist must be a positive integer, got {nlist!r}")
        cap = max(1, num // POINTS_PER_LIST)
        if nlist is not None and nlist > cap:
            print(f"note: nlist {nlist} lowered to {cap} for {num} vectors "
                  f"(k-means needs {POINTS_PER_LIST} training vectors per list)", file=sys.stderr)
        lists = default_nlist(num) if nlist is None else min(int(nlist), cap)
        if nprobe is not None and (isinstance(nprobe, bool) or nprobe < 1):
            raise RankgenError(f"nprobe must be a positive integer, got {nprobe!r}")
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        if num < POINTS_PER_LIST:
            # One list (nlist was clipped to 1): its centroid is just the mean, so
            # FAISS's "provide at least 39 training points" warning is noise here.
            index.cp.min_points_per_centroid = 1
        index.train(vectors_NxD)
        index.nprobe = min(lists, 8 if nprobe is None else int(nprobe))
    else:
        if isinstance(hnsw_m, bool) or hnsw_m < 2:
            raise RankgenError(f"hnsw_m must be an integer >= 2, got {hnsw_m!r}")
        if isinstance(ef_search, bool) or ef_search < 1:
            raise RankgenError(f"ef_search must be a positive integer, got {ef_search!r}")
        index = faiss.IndexHNSWFlat(dim, int(hnsw_m), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = int(ef_search)
    index.add(vectors_NxD)
    return index


def index_settings(index) -> dict[str, Any]:
    """The kind and search settings of an index built by build_faiss_index (for index_config.json)."""
    import faiss

    if isinstance(index, faiss.IndexIVF):
        return {"kind": "ivf", "nlist": int(index.nlist), "nprobe": int(index.nprobe)}
    if isinstance(index, faiss.IndexHNSW):
        return {"kind": "hnsw", "hnsw_m": int(index.hnsw.nb_neighbors(1)), "ef_search": int(index.hnsw.efSearch)}
    return {"kind": "flat"}


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


def encode_all(model, texts: list[str], kind: str, max_length: int | None, batch_size: int, progress: bool,
                desc: str) -> np.ndarray:
    """Vectors [N, D] of texts, encoded a chunk at a time under a progress bar (rate and ETA) on stderr."""
    vectors_NxD = np.zeros((len(texts), model.dim), np.float32)
    chunk = batch_size * ENCODE_CHUNK_BATCHES
    with tqdm(total=len(texts), unit="text", desc=desc, file=sys.stderr, dynamic_ncols=True,
              disable=not progress) as bar:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            vectors_NxD[start : start + len(part)] = model.encode(
                part, kind=kind, max_length=max_length, batch_size=batch_size, bucket_step=ENCODE_BUCKET_STEP)
            bar.update(len(part))
    return vectors_NxD


def _require_one_vector(model, model_dir: str) -> None:
    """An index holds one vector per passage; a model with perspective heads gives several."""
    if len(model.vector_shape) != 1:
        raise RankgenError(f"{model_dir}: a model with {model.vector_shape[0]} perspective heads gives "
                           f"{model.vector_shape[0]} vectors per text; a FAISS index holds one per passage")


def _check_encode_args(encode_kind: str, batch_size: int) -> None:
    from rankgen_jax.inference.encoder import ENCODE_KINDS  # starts jax, see load_model's import below

    if encode_kind not in ENCODE_KINDS:
        raise RankgenError(f"unknown encode kind {encode_kind!r}: expected one of {sorted(ENCODE_KINDS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise RankgenError(f"batch_size must be a positive integer, got {batch_size!r}")


def index_corpus(
    model_dir: str,
    corpus_path: str,
    out_dir: str,
    kind: str = "flat",
    batch_size: int = 64,
    encode_kind: str = "suffix",
    max_length: int | None = None,
    overwrite: bool = False,
    nlist: int | None = None,
    hnsw_m: int = DEFAULT_HNSW_M,
    nprobe: int | None = None,
    ef_search: int = DEFAULT_EF_SEARCH,
    progress: bool = True,
    title_join: str | None = DEFAULT_TITLE_JOIN,
    conventions: dict | None = None,
) -> dict[str, Any]:
    """Encode a corpus file (or a BEIR folder's corpus) with a dual encoder and write an index folder; returns its
    index_config.

    Passages go through the document tower ("suffix") by default, as RankGen
    continuations do, read with the model's input conventions (`conventions`
    on top, see load_model; one stderr line names them); a title joins its
    text as retrieval_files.join_title does with title_join (None: titles
    dropped). A non-empty out_dir is refused unless overwrite.
    """
    # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
    from rankgen_jax.inference.encoder import load_model

    # Imported before the (slow) encoding, so a missing retrieval extra fails at once.
    import faiss

    if kind not in INDEX_KINDS:
        raise RankgenError(f"unknown index kind {kind!r}: expected one of {INDEX_KINDS}")
    _check_encode_args(encode_kind, batch_size)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RankgenError(f"{out_dir}: exists and is not a folder")
    # Checked before the (slow) encoding, so a wrong folder fails at once.
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RankgenError(f"{out_dir}: folder is not empty; choose another or pass overwrite (--overwrite)")
    # Duplicate ids are refused here: search results would be ambiguous.
    passages = read_passages(corpus_path)
    ids, texts = passages.ids, passages.joined(title_join)
    model = load_model(model_dir, conventions=conventions)
    _require_one_vector(model, model_dir)
    print(model.conventions_note(), file=sys.stderr)
    vectors_NxD = encode_all(model, texts, encode_kind, max_length, batch_size, progress, "index")
    index = build_faiss_index(vectors_NxD, kind, nlist=nlist, hnsw_m=hnsw_m, nprobe=nprobe, ef_search=ef_search)
    out.mkdir(parents=True, exist_ok=True)
    # The config goes first and comes back last: a run that dies mid-write
    # leaves a folder load_index refuses, never an old config over new files.
    (out / CONFIG_FILE).unlink(missing_ok=True)
    faiss.write_index(index, str(out / INDEX_FILE))
    (out / IDS_FILE).write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
    config = {
        "format_version": FORMAT_VERSION,
        "model": str(Path(model_dir).resolve()),
        "corpus": str(Path(corpus_path).resolve()),
        "metric": "inner_product",
        "dim": int(model.dim),
        "count": len(ids),
        "encode_kind": encode_kind,
        "max_length": max_length,
        "title_join": title_join,
        "input_conventions": model.conventions.to_dict(),
        **index_settings(index),
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return config


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
    config = _read_json(folder / CONFIG_FILE)
    if not isinstance(config, dict) or not all(key in config for key in ("kind", "dim", "count")):
        raise RankgenError(f"{folder / CONFIG_FILE}: expected an object with kind, dim and count")
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


def search_queries(
    model_dir: str,
    index_dir: str,
    queries_path: str,
    k: int,
    out_path: str | None = None,
    encode_kind: str = "prefix",
    batch_size: int = 64,
    max_length: int | None = None,
    progress: bool = True,
    split: str | None = None,
    out_format: str = "jsonl",
    run_tag: str = DEFAULT_RUN_TAG,
    conventions: dict | None = None,
) -> list[dict[str, Any]]:
    """Top-k passages for each query of a file: [{"query_id", "query", "ids", "scores"}], best first.

    Queries go through the query tower ("prefix") by default, read with the
    model's input conventions (`conventions` on top; one stderr line names
    them). The queries of a BEIR folder are those its split's qrels judge
    (default "test"). With out_path, the results are also written there in
    out_format: "jsonl" (these records), "trec" or "msmarco" (run files;
    retrieval_files.run_lines).
    """
    # Imports jax: not at the top, so that the CLI imports this module before it sets XLA's flags.
    from rankgen_jax.inference.encoder import load_model

    _check_encode_args(encode_kind, batch_size)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    if out_path is not None and Path(out_path).resolve() == Path(queries_path).resolve():
        raise RankgenError(f"{out_path}: the output would overwrite the queries file")
    if out_format not in RUN_FORMATS:
        raise RankgenError(f"unknown output format {out_format!r}: expected one of {RUN_FORMATS}")
    loaded = load_index(index_dir)
    query_file = read_queries(queries_path, split=split)
    query_ids, queries = query_file.ids, query_file.joined(DEFAULT_TITLE_JOIN)
    model = load_model(model_dir, conventions=conventions)
    _require_one_vector(model, model_dir)
    print(model.conventions_note(), file=sys.stderr)
    built = loaded.config.get("input_conventions")
    if built is not None and built != model.conventions.to_dict():
        print(f"note: {index_dir} was built with other input conventions ({built}); the queries are read with "
              "those above", file=sys.stderr)
    if model.dim != loaded.index.d:
        raise RankgenError(f"{model_dir}: the model gives {model.dim}-dimensional vectors but the index in "
                           f"{index_dir} holds {loaded.index.d}-dimensional ones "
                           f"(built with {loaded.config.get('model')})")
    built_with = loaded.config.get("model")
    if built_with and Path(built_with) != Path(model_dir).resolve():
        # Same size vectors from another model are silently meaningless; say so, but allow moved folders.
        print(f"note: {index_dir} was built with {built_with}, searching with {model_dir}", file=sys.stderr)
    vectors_QxD = encode_all(model, queries, encode_kind, max_length, batch_size, progress, "queries")
    scores_QxK, rows_QxK = loaded.search(vectors_QxD, k)
    results = []
    for query_id, query, scores_K, rows_K in zip(query_ids, queries, scores_QxK, rows_QxK):
        found = rows_K >= 0  # FAISS pads with -1 when an approximate index finds fewer than k
        results.append({
            "query_id": query_id,
            "query": query,
            "ids": [loaded.ids[r] for r in rows_K[found]],
            "scores": [float(s) for s in scores_K[found]],
        })
    if out_path is not None:
        write_run(out_path, results, out_format, run_tag)
    return results
