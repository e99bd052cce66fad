"""FAISS indexes equal brute-force dot products; index_corpus + search_queries end to end (JSONL, TSV, runs)."""

import json

import faiss
import numpy as np
import pytest
from test_inference import SHARED, random_params

from rankgen_jax.checkpoints import native
from rankgen_jax.data.retrieval_files import read_run
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.retrieval.dense_index import (build_faiss_index, default_nlist, index_corpus, load_index,
                                               search_index, search_queries)

PASSAGES = [
    "the rain fell on the moor",
    "the old house stood silent",
    "she read the letter again",
    "by candle light she waited",
    "would he ever come back from the sea",
    "quarterly revenue rose by four percent",
    "analysts said on monday that shares fell",
    "the lighthouse keeper climbed the stairs",
    "a storm rolled in over the harbour",
    "the cat slept by the fire",
    "children played in the snow",
]
QUERIES = ["rain on the moor", "the keeper and the storm", "shares and revenue", "a letter by candle light"]


def brute_force(queries_QxD, vectors_NxD, k):
    scores_QxN = queries_QxD @ vectors_NxD.T
    ids_QxK = np.argsort(-scores_QxN, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores_QxN, ids_QxK, axis=1), ids_QxK


def random_vectors(seed, n, d=16):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_flat_search_equals_brute_force():
    vectors, queries = random_vectors(0, 300), random_vectors(1, 7)
    index = build_faiss_index(vectors)
    scores, ids = search_index(index, queries, 10)
    want_scores, want_ids = brute_force(queries, vectors, 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    # k past the index size is clipped; a wrong dimension is a clear error.
    assert search_index(index, queries[:1], 1000)[1].shape == (1, 300)
    with pytest.raises(RankgenError, match="8 dimensions but the index holds 16"):
        search_index(index, queries[:, :8], 5)
    with pytest.raises(RankgenError, match="row 1 holds NaN"):
        build_faiss_index(np.array([[1.0, 0.0], [np.nan, 1.0]]))
    with pytest.raises(RankgenError, match="unknown index kind"):
        build_faiss_index(vectors, kind="pq")


def test_ivf_with_all_lists_probed_is_exact(capsys):
    vectors, queries = random_vectors(2, 400), random_vectors(3, 9)
    assert default_nlist(400) == 10  # 4 * sqrt(400) = 80, clipped to 400 // 39 = 10
    index = build_faiss_index(vectors, kind="ivf", nprobe=10)
    assert index.nlist == 10 and index.nprobe == 10
    scores, ids = search_index(index, queries, 10)
    want_scores, want_ids = brute_force(queries, vectors, 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    # A too-large nlist for the data is lowered, with a note.
    assert build_faiss_index(vectors[:100], kind="ivf", nlist=50).nlist == 2
    assert "nlist 50 lowered to 2" in capsys.readouterr().err


def test_hnsw_recall_at_10():
    vectors, queries = random_vectors(4, 500), random_vectors(5, 20)
    index = build_faiss_index(vectors, kind="hnsw", hnsw_m=16)
    _, ids = search_index(index, queries, 10)
    _, want_ids = brute_force(queries, vectors, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), want_ids.tolist())])
    assert recall > 0.9


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spiece_model):
    path = tmp_path_factory.mktemp("retrieval") / "ckpt"
    native.save_params(path, SHARED, random_params(SHARED, 5), vocab=spiece_model)
    return str(path)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_index_corpus_and_search_queries_equal_brute_force(tmp_path, model_dir, capsys):
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, [{"id": f"p{i}", "text": t} for i, t in enumerate(PASSAGES)])
    with corpus.open("a", encoding="utf-8") as f:
        f.write("{not json\n")  # skipped and counted
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)])
    out = tmp_path / "index"
    config = index_corpus(model_dir, str(corpus), str(out), batch_size=8, progress=False)
    assert f"{corpus}: skipped 1 lines: 1 malformed JSON (line {len(PASSAGES) + 1})" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["ids.json", "index.faiss", "index_config.json", "vectors.npy"]
    assert json.loads((out / "ids.json").read_text()) == [f"p{i}" for i in range(len(PASSAGES))]
    assert json.loads((out / "index_config.json").read_text()) == config
    assert config["kind"] == "flat" and config["count"] == len(PASSAGES) and config["encode_kind"] == "suffix"
    assert config["max_length"] is None

    k = 4
    results = search_queries(model_dir, str(out), queries, k, out_path=str(tmp_path / "hits.jsonl"),
                             batch_size=8, progress=False)
    model = load_model(model_dir)
    assert config["dim"] == model.dim
    want_scores, want_rows = brute_force(model.encode(QUERIES, "prefix", batch_size=8),
                                         model.encode(PASSAGES, "suffix", batch_size=8), k)
    assert [r["query_id"] for r in results] == [f"q{i}" for i in range(len(QUERIES))]
    assert [r["query"] for r in results] == QUERIES
    assert [r["ids"] for r in results] == [[f"p{j}" for j in row] for row in want_rows.tolist()]
    np.testing.assert_allclose([r["scores"] for r in results], want_scores, rtol=1e-4, atol=1e-5)
    written = [json.loads(line) for line in (tmp_path / "hits.jsonl").read_text().splitlines()]
    assert written == results

    # An MS MARCO collection and queries (TSV): the ids are the pids as written ("0" stays "0"), the
    # texts lose their "pid\t" prefix, so the vectors and hits are those of the JSONL corpus.
    tsv = tmp_path / "collection.tsv"
    tsv.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(PASSAGES)), encoding="utf-8")
    queries_tsv = tmp_path / "queries.dev.tsv"
    queries_tsv.write_text("".join(f"{1000 + i}\t{t}\n" for i, t in enumerate(QUERIES)), encoding="utf-8")
    index_corpus(model_dir, str(tsv), str(tmp_path / "tsv_index"), batch_size=8, progress=False)
    assert json.loads((tmp_path / "tsv_index" / "ids.json").read_text()) == [str(i) for i in range(len(PASSAGES))]
    trec = search_queries(model_dir, str(tmp_path / "tsv_index"), str(queries_tsv), k,
                          out_path=str(tmp_path / "run.trec"), batch_size=8, progress=False, out_format="trec")
    assert [r["ids"] for r in trec] == [[str(j) for j in row] for row in want_rows.tolist()]
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == len(QUERIES) * k and lines[0].split()[:4] == ["1000", "Q0", str(want_rows[0, 0]), "1"]
    assert read_run(tmp_path / "run.trec") == {r["query_id"]: dict(zip(r["ids"], r["scores"])) for r in trec}

    # An IVF index with a single list (11 passages) searches everything: same results.
    ivf = index_corpus(model_dir, str(corpus), str(tmp_path / "ivf"), kind="ivf", batch_size=8, progress=False)
    assert ivf["kind"] == "ivf" and ivf["nlist"] == 1 and ivf["nprobe"] == 1
    again = search_queries(model_dir, str(tmp_path / "ivf"), queries, k, batch_size=8, progress=False)
    assert [r["ids"] for r in again] == [r["ids"] for r in results]

    # A non-empty output folder is refused unless overwrite.
    with pytest.raises(RankgenError, match="folder is not empty"):
        index_corpus(model_dir, str(corpus), str(out), batch_size=8, progress=False)
    index_corpus(model_dir, str(corpus), str(out), kind="hnsw", batch_size=8, overwrite=True, progress=False)
    assert load_index(str(out)).config["kind"] == "hnsw"


def test_load_index_errors(tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    vectors = random_vectors(6, 5, d=4)
    faiss.write_index(build_faiss_index(vectors), str(folder / "index.faiss"))
    (folder / "ids.json").write_text(json.dumps([str(i) for i in range(5)]))
    with pytest.raises(RankgenError, match="index_config.json: missing"):
        load_index(str(folder))
    config = {"kind": "flat", "dim": 4, "count": 5}
    (folder / "index_config.json").write_text(json.dumps(config))
    loaded = load_index(str(folder))
    assert loaded.ids == ["0", "1", "2", "3", "4"] and loaded.search(vectors[:1], 1)[1][0, 0] == int(
        np.argmax(vectors @ vectors[0]))
    (folder / "ids.json").write_text(json.dumps(["0", "1"]))
    with pytest.raises(RankgenError, match="holds 5 vectors, ids.json 2 ids"):
        load_index(str(folder))
    (folder / "ids.json").write_text(json.dumps([str(i) for i in range(5)]))
    (folder / "index_config.json").write_text(json.dumps({**config, "dim": 8}))
    with pytest.raises(RankgenError, match="4-dimensional vectors but index_config.json says dim 8"):
        load_index(str(folder))
    (folder / "index_config.json").write_text("{bad")
    with pytest.raises(RankgenError, match="index_config.json: cannot read JSON"):
        load_index(str(folder))
    (folder / "index_config.json").write_text(json.dumps(config))
    (folder / "index.faiss").write_bytes(b"not an index")
    with pytest.raises(RankgenError, match="not a readable FAISS index"):
        load_index(str(folder))
    with pytest.raises(RankgenError, match="no such index folder"):
        load_index(str(tmp_path / "nowhere"))
