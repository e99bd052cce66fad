"""FAISS indexes equal brute-force dot products; index_corpus + search_queries end to end (JSONL, TSV, runs, shards)."""

import json
import shutil

import faiss
import numpy as np
import pytest
from test_inference import SHARED, random_params

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.data.retrieval_files import read_run
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.retrieval import dense_index
from rankgen_jax.retrieval.dense_index import (IndexSpec, TextEncoding, build_faiss_index, check_shards, default_nlist,
                                               index_corpus, index_folders, index_settings, load_index, scan_corpus,
                                               search_index, search_queries, search_shards)

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
    with pytest.raises(RankgenError, match="unknown index type"):
        build_faiss_index(vectors, index_type="pq")


def test_ivf_with_all_lists_probed_is_exact(capsys):
    vectors, queries = random_vectors(2, 400), random_vectors(3, 9)
    assert default_nlist(400) == 10  # 4 * sqrt(400) = 80, clipped to 400 // 39 = 10
    index = build_faiss_index(vectors, index_type="ivf", nprobe=10)
    assert index.nlist == 10 and index.nprobe == 10
    scores, ids = search_index(index, queries, 10)
    want_scores, want_ids = brute_force(queries, vectors, 10)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    # A too-large nlist for the data is lowered, with a note.
    assert build_faiss_index(vectors[:100], index_type="ivf", nlist=50).nlist == 2
    assert "nlist 50 lowered to 2" in capsys.readouterr().err


def test_hnsw_recall_at_10():
    vectors, queries = random_vectors(4, 500), random_vectors(5, 20)
    index = build_faiss_index(vectors, index_type="hnsw", hnsw_m=16)
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
    config = index_corpus(
        model_dir, str(corpus), str(out), encoding=TextEncoding("suffix", batch_size=8), progress=False
    )
    assert f"{corpus}: skipped 1 lines: 1 malformed JSON (line {len(PASSAGES) + 1})" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["ids.json", "index.faiss", "index_config.json", "vectors.npy"]
    assert json.loads((out / "ids.json").read_text()) == [f"p{i}" for i in range(len(PASSAGES))]
    assert json.loads((out / "index_config.json").read_text()) == config
    assert config["index_type"] == "flat" and config["count"] == len(PASSAGES) and config["encode_side"] == "suffix"
    assert config["max_length"] is None

    k = 4
    results = search_queries(
        model_dir,
        str(out),
        queries,
        k,
        encoding=TextEncoding("prefix", batch_size=8),
        out_path=str(tmp_path / "hits.jsonl"),
        progress=False,
    )
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
    # A loaded model searches as its folder does; the conventions given apply to a copy, not the caller's model.
    before = model.conventions
    loaded = search_queries(model, str(out), queries, k, encoding=TextEncoding("prefix", batch_size=8,
                                                                               conventions={"prefix_length": 4}),
                            progress=False)
    assert model.conventions == before and before.prefix_length != 4
    short = search_queries(model_dir, str(out), queries, k, encoding=TextEncoding("prefix", batch_size=8,
                                                                                  conventions={"prefix_length": 4}),
                           progress=False)
    assert [r["ids"] for r in loaded] == [r["ids"] for r in short] != [r["ids"] for r in results]
    assert [r["ids"] for r in search_queries(model, str(out), queries, k, progress=False)] == [
        r["ids"] for r in results]

    # An MS MARCO collection and queries (TSV): the ids are the pids as written ("0" stays "0"), the
    # texts lose their "pid\t" prefix, so the vectors and hits are those of the JSONL corpus.
    tsv = tmp_path / "collection.tsv"
    tsv.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(PASSAGES)), encoding="utf-8")
    queries_tsv = tmp_path / "queries.dev.tsv"
    queries_tsv.write_text("".join(f"{1000 + i}\t{t}\n" for i, t in enumerate(QUERIES)), encoding="utf-8")
    index_corpus(
        model_dir, str(tsv), str(tmp_path / "tsv_index"), encoding=TextEncoding("suffix", batch_size=8), progress=False
    )
    assert json.loads((tmp_path / "tsv_index" / "ids.json").read_text()) == [str(i) for i in range(len(PASSAGES))]
    trec = search_queries(
        model_dir,
        str(tmp_path / "tsv_index"),
        str(queries_tsv),
        k,
        encoding=TextEncoding("prefix", batch_size=8),
        out_path=str(tmp_path / "run.trec"),
        out_format="trec",
        progress=False,
    )
    assert [r["ids"] for r in trec] == [[str(j) for j in row] for row in want_rows.tolist()]
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == len(QUERIES) * k and lines[0].split()[:4] == ["1000", "Q0", str(want_rows[0, 0]), "1"]
    assert read_run(tmp_path / "run.trec") == {r["query_id"]: dict(zip(r["ids"], r["scores"])) for r in trec}

    # An IVF index with a single list (11 passages) searches everything: same results.
    ivf = index_corpus(
        model_dir,
        str(corpus),
        str(tmp_path / "ivf"),
        index=IndexSpec(index_type="ivf"),
        encoding=TextEncoding("suffix", batch_size=8),
        progress=False,
    )
    assert ivf["index_type"] == "ivf" and ivf["nlist"] == 1 and ivf["nprobe"] == 1
    again = search_queries(
        model_dir, str(tmp_path / "ivf"), queries, k, encoding=TextEncoding("prefix", batch_size=8), progress=False
    )
    assert [r["ids"] for r in again] == [r["ids"] for r in results]

    # A non-empty output folder is refused unless overwrite.
    with pytest.raises(RankgenError, match="folder is not empty"):
        index_corpus(model_dir, str(corpus), str(out), encoding=TextEncoding("suffix", batch_size=8), progress=False)
    index_corpus(
        model_dir,
        str(corpus),
        str(out),
        index=IndexSpec(index_type="hnsw"),
        encoding=TextEncoding("suffix", batch_size=8),
        overwrite=True,
        progress=False,
    )
    assert load_index(str(out)).config["index_type"] == "hnsw"


def test_load_index_errors(tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    vectors = random_vectors(6, 5, d=4)
    faiss.write_index(build_faiss_index(vectors), str(folder / "index.faiss"))
    (folder / "ids.json").write_text(json.dumps([str(i) for i in range(5)]))
    with pytest.raises(RankgenError, match="index_config.json: missing"):
        load_index(str(folder))
    config = {"index_type": "flat", "dim": 4, "count": 5}
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


# ---------------------------------------------------------------------------
# Shards, factory strings, streaming

# 31 distinct passages, so that 2 and 3 shards are uneven (16 + 15; 11 + 10 + 10). Distinct: the same text
# encoded in two batches of other shapes can differ by float rounding, and so swap places with its twin.
SHARD_PASSAGES = [f"{PASSAGES[i % 11]} and {PASSAGES[(i // 11 + 5 * i + 1) % 11]}" for i in range(31)]
assert len(set(SHARD_PASSAGES)) == 31


def write_shard_folder(folder, vectors, ids, shard_index, num_shards, corpus_count, **config):
    """An index folder as index_corpus writes one shard of it, from given vectors (ties can be made exact)."""
    folder.mkdir(parents=True)
    faiss.write_index(build_faiss_index(vectors), str(folder / "index.faiss"))
    (folder / "ids.json").write_text(json.dumps(ids))
    (folder / "index_config.json").write_text(json.dumps({
        "index_type": "flat", "dim": vectors.shape[1], "count": len(ids), "model": "m", "corpus_digest": "d",
        "corpus_count": corpus_count, "num_shards": num_shards, "shard_index": shard_index,
        "shard_rule": "round_robin", **config}))
    return str(folder)


def reference_top_k(queries_QxD, vectors_NxD, k):
    """Top k by score descending, equal scores by position ascending, in float64 (scores here are exact)."""
    scores_QxN = queries_QxD.astype(np.float64) @ vectors_NxD.astype(np.float64).T
    order_QxK = np.stack([np.lexsort((np.arange(len(vectors_NxD)), -row))[:k] for row in scores_QxN])
    return order_QxK, np.take_along_axis(scores_QxN, order_QxK, axis=1)


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_search_shards_merges_exactly_with_ties(tmp_path, num_shards):
    # Small integer vectors: many exactly equal scores, also across shard boundaries and at the k-th place.
    rng = np.random.default_rng(7)
    vectors = rng.integers(-1, 2, size=(40, 3)).astype(np.float32)
    queries = rng.integers(-1, 2, size=(25, 3)).astype(np.float32)
    ids = [f"doc-{i:02d}" for i in range(40)]
    folders = [write_shard_folder(tmp_path / f"shard{s}", vectors[s::num_shards], ids[s::num_shards], s, num_shards,
                                  40) for s in range(num_shards)]
    shards = check_shards(index_folders(str(tmp_path)))
    assert [f for f, _ in shards] == folders
    for k in (1, 5, 17, 40, 60):
        want_rows, want_scores = reference_top_k(queries, vectors, k)
        got = search_shards(shards, queries, k)
        assert [g[0] for g in got] == [[ids[r] for r in row] for row in want_rows.tolist()]
        np.testing.assert_allclose([g[1] for g in got], want_scores, atol=1e-6)
        assert [search_shards(shards, queries[q : q + 1], k)[0] for q in range(3)] == got[:3]  # one at a time


def test_check_shards_refuses_bad_sets(tmp_path):
    vectors = random_vectors(8, 9, d=4)
    ids = [str(i) for i in range(9)]
    for s in range(3):
        write_shard_folder(tmp_path / "ok" / f"s{s}", vectors[s::3], ids[s::3], s, 3, 9)
    ok = [str(tmp_path / "ok" / f"s{s}") for s in range(3)]
    assert len(check_shards(index_folders(ok))) == 3
    with pytest.raises(RankgenError, match=r"shards \[1\] of 3 are missing"):
        check_shards([ok[0], ok[2]])
    with pytest.raises(RankgenError, match="shard 2 of 3 is given twice"):
        check_shards(ok + [ok[2]])
    other = write_shard_folder(tmp_path / "other", vectors[1::3], ids[1::3], 1, 3, 9, model="another")
    with pytest.raises(RankgenError, match="are not shards of one index: their model differs"):
        check_shards([ok[0], other, ok[2]])
    other = write_shard_folder(tmp_path / "other2", vectors[1::3], ids[1::3], 1, 3, 9, corpus_digest="e")
    with pytest.raises(RankgenError, match="their corpus_digest differs"):
        check_shards([ok[0], other, ok[2]])
    short = write_shard_folder(tmp_path / "short", vectors[1:7:3], ids[1:7:3], 1, 3, 9)
    with pytest.raises(RankgenError, match="holds 2 passages, but shard 1 of 3 of a 9-passage corpus has 3"):
        check_shards([ok[0], short, ok[2]])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RankgenError, match="neither an index folder"):
        index_folders(str(tmp_path / "empty"))
    (tmp_path / "ok" / "s1" / "index.faiss").unlink()
    with pytest.raises(RankgenError, match="index.faiss: missing"):
        check_shards(ok)


def test_factory_strings():
    vectors, queries = random_vectors(9, 400), random_vectors(10, 9)
    index = build_faiss_index(vectors, index_factory="IVF4,PQ4x4", nprobe=4)
    assert isinstance(index, faiss.IndexIVFPQ) and index.metric_type == faiss.METRIC_INNER_PRODUCT
    assert index_settings(index, "IVF4,PQ4x4") == {"index_type": "factory", "index_factory": "IVF4,PQ4x4", "nlist": 4,
                                                    "nprobe": 4}
    # All lists probed, PQ codes of 4 x 4 bits: approximate scores, but most of the true top 10 found.
    _, ids = search_index(index, queries, 10)
    _, want_ids = brute_force(queries, vectors, 10)
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), want_ids.tolist())]) > 0.3
    # IVF with flat lists and every list probed is exact.
    index = build_faiss_index(vectors, index_factory="IVF5,Flat", nprobe=5)
    np.testing.assert_array_equal(search_index(index, queries, 10)[1], want_ids)
    assert index_settings(build_faiss_index(vectors, index_factory="HNSW8"), "HNSW8")["ef_search"] == 64
    with pytest.raises(RankgenError, match="FAISS refuses it"):
        build_faiss_index(vectors, index_factory="IVF4,PQ5")  # 16 dimensions do not split into 5 sub-vectors
    with pytest.raises(RankgenError, match="not both"):
        build_faiss_index(vectors, index_type="ivf", index_factory="IVF4,Flat")
    with pytest.raises(RankgenError, match="1000 IVF lists need at least 1000 training vectors, there are 400"):
        build_faiss_index(vectors, index_factory="IVF1000,Flat")


def test_sharded_index_equals_unsharded(tmp_path, model_dir, capsys):
    corpus = tmp_path / "corpus.jsonl"
    records = [{"_id": f"austen-{i:04d}", "title": "T" if i % 4 == 0 else "", "text": t}
               for i, t in enumerate(SHARD_PASSAGES)]
    write_jsonl(corpus, records[:5])
    with corpus.open("a", encoding="utf-8") as f:
        f.write("{not json\n")  # skipped: positions count usable passages only
        f.write("".join(json.dumps(r) + "\n" for r in records[5:]))
    queries = write_jsonl(tmp_path / "queries.jsonl", [{"id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)])
    texts = [("T " if i % 4 == 0 else "") + t for i, t in enumerate(SHARD_PASSAGES)]
    ids = [r["_id"] for r in records]

    whole = tmp_path / "whole"
    config = index_corpus(
        model_dir, str(corpus), str(whole), encoding=TextEncoding("suffix", batch_size=4), progress=False
    )
    assert config["num_shards"] == 1 and config["shard_index"] == 0 and config["corpus_count"] == len(ids)
    # Streaming equals encoding everything in memory: the same vectors, loaded with plain numpy.
    model = load_model(model_dir)
    in_memory = model.encode(texts, "suffix", batch_size=8)
    np.testing.assert_allclose(np.load(whole / "vectors.npy"), in_memory, rtol=1e-5, atol=1e-5)
    assert json.loads((whole / "ids.json").read_text()) == ids

    k = 7
    want = search_queries(
        model_dir, str(whole), queries, k, encoding=TextEncoding("prefix", batch_size=8), progress=False
    )
    want_scores, want_rows = brute_force(model.encode(QUERIES, "prefix", batch_size=8), in_memory, k)
    assert [r["ids"] for r in want] == [[ids[j] for j in row] for row in want_rows.tolist()]
    for num_shards in (2, 3):
        root = tmp_path / f"shards{num_shards}"
        for s in range(num_shards):
            # Through the command line, as each host would run it; shard 1 of 2 with the flags' old spellings.
            old_flags = num_shards == 2 and s == 1
            flags = ["--kind", "flat", "--encode_kind", "suffix"] if old_flags else ["--index_type", "flat",
                                                                                     "--encode_side", "suffix"]
            capsys.readouterr()
            assert main(["index", "--model", model_dir, "--corpus", str(corpus), "--out", str(root / f"s{s}"),
                         "--num_shards", str(num_shards), "--shard_index", str(s), "--batch_size", "4",
                         "--no_progress", *flags]) == 0
            notes = [line for line in capsys.readouterr().err.splitlines() if "is deprecated" in line]
            assert notes == (["note: --kind is deprecated and will be removed; use --index_type",
                              "note: --encode_kind is deprecated and will be removed; use --encode_side"]
                             if old_flags else [])
        if num_shards == 2:
            # Shard 1 as earlier versions wrote its config (kind, encode_kind): it still loads and merges.
            path = root / "s1" / "index_config.json"
            cfg = json.loads(path.read_text())
            cfg["kind"], cfg["encode_kind"] = cfg.pop("index_type"), cfg.pop("encode_side")
            path.write_text(json.dumps(cfg))
            assert load_index(str(root / "s1")).config["index_type"] == "flat"
        shard_ids = [json.loads((root / f"s{s}" / "ids.json").read_text()) for s in range(num_shards)]
        assert shard_ids == [ids[s::num_shards] for s in range(num_shards)]  # disjoint, covering, by position
        assert sorted(sum(shard_ids, [])) == sorted(ids)
        for s in range(num_shards):
            cfg = json.loads((root / f"s{s}" / "index_config.json").read_text())
            assert (cfg["shard_index"], cfg["num_shards"], cfg["corpus_digest"]) == (s, num_shards,
                                                                                       config["corpus_digest"])
            np.testing.assert_allclose(np.load(root / f"s{s}" / "vectors.npy"), in_memory[s::num_shards],
                                       rtol=1e-5, atol=1e-5)
        got = search_queries(
            model_dir, str(root), queries, k, encoding=TextEncoding("prefix", batch_size=8), progress=False
        )
        assert [r["ids"] for r in got] == [r["ids"] for r in want]
        np.testing.assert_allclose([r["scores"] for r in got], [r["scores"] for r in want], rtol=0, atol=1e-6)
        listed = search_queries(
            model_dir,
            [str(root / f"s{s}") for s in range(num_shards)],
            queries,
            k,
            encoding=TextEncoding("prefix", batch_size=8),
            progress=False,
        )
        assert listed == got
        if num_shards == 2:
            for flag in ("--encode_side", "--encode_kind"):
                hits = tmp_path / f"hits{flag}.jsonl"
                assert main(["search", "--model", model_dir, "--index", str(root), "--queries", queries, "--k", str(k),
                             flag, "prefix", "--output", str(hits), "--no_progress"]) == 0
                assert [json.loads(line)["ids"] for line in hits.read_text().splitlines()] == [r["ids"] for r in got]
            assert "note: --encode_kind is deprecated" in capsys.readouterr().err
    capsys.readouterr()

    # A shard's vectors equal `rankgen-jax encode` of its passages.
    texts_file = write_jsonl(tmp_path / "shard1_texts.jsonl", [{"text": t} for t in texts[1::2]])
    assert main(["encode", "--model", model_dir, "--input", texts_file, "--side", "suffix",
                 "--output", str(tmp_path / "shard1.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "shards2" / "s1" / "vectors.npy"), np.load(tmp_path / "shard1.npy"),
                               rtol=1e-5, atol=1e-5)

    # A factory string, trained on a seeded sample of stated size, recorded; all lists probed it is exact.
    factory = index_corpus(
        model_dir,
        str(corpus),
        str(tmp_path / "ivf"),
        index=IndexSpec(nprobe=2, index_factory="IVF2,Flat", train_sample=20, train_seed=3),
        encoding=TextEncoding("suffix", batch_size=4),
        progress=False,
    )
    assert {
        key: factory[key] for key in ("index_type", "index_factory", "nlist", "nprobe", "train_sample", "train_seed")
    } == {
        "index_type": "factory",
        "index_factory": "IVF2,Flat",
        "nlist": 2,
        "nprobe": 2,
        "train_sample": 20,
        "train_seed": 3,
    }
    assert isinstance(load_index(str(tmp_path / "ivf")).index, faiss.IndexIVFFlat)
    again = search_queries(
        model_dir, str(tmp_path / "ivf"), queries, k, encoding=TextEncoding("prefix", batch_size=8), progress=False
    )
    assert [r["ids"] for r in again] == [r["ids"] for r in want]
    assert index_corpus(
        model_dir,
        str(corpus),
        str(tmp_path / "ivf_all"),
        index=IndexSpec(index_type="ivf"),
        encoding=TextEncoding("suffix", batch_size=4),
        progress=False,
    )["train_sample"] == len(ids)

    # Bad requests fail before encoding; shards of two different corpora are refused.
    with pytest.raises(RankgenError, match="shard_index 3 is not below num_shards 3"):
        index_corpus(model_dir, str(corpus), str(tmp_path / "bad"), num_shards=3, shard_index=3)
    with pytest.raises(RankgenError, match="shard 31 of 40 would be empty: the corpus has only 31 passages"):
        index_corpus(model_dir, str(corpus), str(tmp_path / "bad"), num_shards=40, shard_index=31)
    with pytest.raises(RankgenError, match="FAISS refuses it"):
        index_corpus(
            model_dir, str(corpus), str(tmp_path / "bad"), index=IndexSpec(index_factory="NotAnIndex"), progress=False
        )
    assert not (tmp_path / "bad").exists()
    smaller = write_jsonl(tmp_path / "smaller.jsonl", records[:-1])
    index_corpus(
        model_dir,
        smaller,
        str(tmp_path / "mixed" / "s1"),
        encoding=TextEncoding("suffix", batch_size=4),
        num_shards=2,
        shard_index=1,
        progress=False,
    )
    shutil.copytree(tmp_path / "shards2" / "s0", tmp_path / "mixed" / "s0")
    with pytest.raises(RankgenError, match="their corpus_count differs"):
        search_queries(model_dir, str(tmp_path / "mixed"), queries, k, progress=False)


def test_scan_corpus_refuses_duplicates_and_survives_hash_collisions(tmp_path, monkeypatch):
    corpus = tmp_path / "c.tsv"
    corpus.write_text("a\tone\nb\ttwo\nc\tthree\n")
    scan = scan_corpus(str(corpus))
    assert scan.count == 3 and scan.skipped.count == 0
    # Every id hashing alike: the ids themselves decide, so distinct ids pass and a duplicate names its lines.
    monkeypatch.setattr(dense_index, "hash", lambda value: 0, raising=False)
    assert scan_corpus(str(corpus)).digest == scan.digest
    corpus.write_text("a\tone\nb\ttwo\nbad line\na\tthree\n")
    with pytest.raises(RankgenError, match=r"passage id 'a' occurs twice \(lines 1 and 4\)"):
        scan_corpus(str(corpus))
    monkeypatch.undo()
    with pytest.raises(RankgenError, match=r"passage id 'a' occurs twice \(lines 1 and 4\)"):
        scan_corpus(str(corpus))
    corpus.write_text("a\tone\nb\ttwo\nc\tTHREE\n")
    assert scan_corpus(str(corpus)).digest != scan.digest  # texts count, not only ids
