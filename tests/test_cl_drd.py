"""CL-DRD end to end on a tiny BEIR folder with tiny models: each iteration's candidates are the previous student's
top N (re-derived here by encoding the corpus), its lists are Sec. 2.2.1's groups of those candidates, a run
killed mid-iteration resumes to the same artefacts, and shards merge to the unsharded candidates."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from test_inference import SHARED

from rankgen_jax.checkpoints import native
from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
from rankgen_jax.data.curriculum import CurriculumStage, curriculum_groups
from rankgen_jax.data.retrieval_files import read_queries
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from rankgen_jax.data.documents import require_documents
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments import cl_drd
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.retrieval import resumable
from rankgen_jax.testing import random_params

STAGES = ((2, 4, 2, 2), (6, 0, 0, 0))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, spiece_model):
    root = tmp_path_factory.mktemp("cl_drd")
    books = [d for d in require_documents(BUNDLED_CORPUS)[0] if d.id.startswith("austen/")][:4]
    build_books_collection(books, root / "beir", BooksCollectionConfig(passages_per_book=8, test_books=1, dev_books=1,
                                                                        prefix_words=32, max_continuation_words=24))
    native.save_params(root / "student", SHARED, random_params(SHARED, 5), vocab=spiece_model)
    ranker = ModelConfig(encoder=SHARED.encoder, head=HeadConfig(pooling="first", projection_dim=0),
                         kind="cross_encoder")
    native.save_params(root / "teacher", ranker, random_params(ranker, 6), vocab=spiece_model)
    return root


def config(setup, **overrides) -> cl_drd.ClDrdConfig:
    fields = dict(corpus=str(setup / "beir"), student=str(setup / "student"), teacher=str(setup / "teacher"),
                  stages=STAGES, depth=10, epochs=(2, 1), learning_rates=(1e-3, 1e-3), warmup_steps=1, batch_size=8,
                  query_length=24, passage_length=24, teacher_query_length=24, teacher_passage_length=24,
                  eval_depth=20, report_splits=("test",), encode_batch_size=16, query_batch=5, num_shards=2)
    fields.update(overrides)
    return cl_drd.ClDrdConfig(**fields)


@pytest.fixture(scope="module")
def uninterrupted(setup):
    workdir = setup / "run_a"
    return workdir, cl_drd.run_cl_drd(str(workdir), config(setup))


def _candidates(workdir, t):
    return [json.loads(line) for line in (workdir / f"iter{t}" / "candidates.jsonl").read_text().splitlines()]


def test_candidates_are_the_previous_students_top_n(setup, uninterrupted):
    workdir, results = uninterrupted
    queries = read_queries(str(workdir / "data" / "train_queries.jsonl"))
    corpus = [json.loads(line) for line in (setup / "beir" / "corpus.jsonl").read_text().splitlines()]
    for t in (1, 2):
        student = load_model(str(workdir / ("student0" if t == 1 else "iter1/student")))
        passages = student.encode([(p["title"] + " " + p["text"]) for p in corpus], side="suffix")
        query_vectors = student.encode(queries.texts, side="prefix")
        scores = query_vectors.astype(np.float64) @ passages.T.astype(np.float64)
        by_query = {r["query_id"]: r for r in _candidates(workdir, t)}
        assert len(by_query) == len(queries.ids) == results["data"]["train_queries"]
        for row, qid in enumerate(queries.ids):
            order = sorted(range(len(corpus)), key=lambda j: (-scores[row, j], j))[:10]
            ranked = sorted((p for p in by_query[qid]["positive_passages"] + by_query[qid]["negative_passages"]
                             if "rank" in p), key=lambda p: p["rank"])
            assert [p["docid"] for p in ranked] == [corpus[j]["_id"] for j in order], (t, qid)
            assert all(np.isfinite(p["score"]) for p in ranked)


def test_lists_are_the_groups_of_the_teachers_ranking(uninterrupted):
    workdir, results = uninterrupted
    position = {q["id"]: p for p, q in enumerate(json.loads(line) for line in
                                                  (workdir / "data" / "train_queries.jsonl").read_text().splitlines())}
    for t, stage in ((1, CurriculumStage(*STAGES[0])), (2, CurriculumStage(*STAGES[1]))):
        candidates = {r["query_id"]: r for r in _candidates(workdir, t)}
        lists = [json.loads(line) for line in (workdir / f"iter{t}" / "train_lists.jsonl").read_text().splitlines()]
        assert len(lists) == results["iterations"][str(t)]["lists"]["lists"] == len(candidates)
        for record in lists:
            ranked = sorted((p for p in candidates[record["query_id"]]["positive_passages"]
                             + candidates[record["query_id"]]["negative_passages"] if "rank" in p),
                            key=lambda p: p["rank"])
            indices, labels = curriculum_groups([p["score"] for p in ranked], stage,
                                                np.random.default_rng([0, t, position[record["query_id"]]]))
            assert record["docids"] == [ranked[i]["docid"] for i in indices]
            assert record["labels"] == pytest.approx(labels.tolist())
            assert record["student_ranks"] == [ranked[i]["rank"] for i in indices]
            assert len(record["candidates"]) == stage.list_size


def test_each_iteration_trains_and_evaluates(uninterrupted):
    workdir, results = uninterrupted
    assert sorted(results["iterations"], key=int) == ["0", "1", "2"]
    for t in (1, 2):
        steps = [json.loads(line)["step"] for line in (workdir / f"iter{t}" / "student" / "metrics.jsonl")
                 .read_text().splitlines() if "train/loss" in line]
        assert max(steps) == results["iterations"][str(t)]["training"]["steps"] == (2 if t == 1 else 1) * 2
    for t in range(3):
        for split in ("dev", "test"):
            ev = results["iterations"][str(t)]["eval"][split]
            assert (workdir / f"iter{t}" / "eval" / f"{split}.trec").is_file()
            assert 0 <= ev["nDCG@10"] <= 1 and ev["nDCG@10_se"] > 0 and ev["queries"] == 8
    table = (workdir / "cl_drd_table.md").read_text()
    assert table.count("\n") == 5 and "| start |" in table.replace("| 0 | start", "| start")
    # A finished job reruns to the same results, training nothing.
    again = cl_drd.run_cl_drd(str(workdir), config(workdir.parent))
    assert again["iterations"] == results["iterations"]


def _artefacts(workdir: Path) -> dict:
    """Every artefact an iteration leaves, by relative path (timings and absolute paths left out)."""
    out = {}
    for path in sorted(workdir.rglob("*")):
        rel = str(path.relative_to(workdir))
        if path.suffix in (".jsonl", ".trec", ".npy") or path.name in ("ids.json", "train_lists.json") or (
                path.parent.name == "eval" and path.suffix == ".json"):
            if "student" in rel.split("/")[-2:][0] or path.name == "metrics.jsonl":
                continue
            out[rel] = path.read_bytes()
    return out


def test_a_run_killed_mid_iteration_resumes_to_the_same_artefacts(setup, uninterrupted, monkeypatch):
    workdir = setup / "run_b"
    real_progress = resumable.write_progress
    real_train = cl_drd.train
    calls = []

    def dies_while_scoring(path, record):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed while the teacher scores iteration 1")
        real_progress(path, record)

    def dies_while_training(workdir_arg, trainer, **kwargs):
        if "iter2" in workdir_arg:
            import dataclasses

            real_train(workdir_arg, trainer=dataclasses.replace(trainer, num_steps=1), **kwargs)
            raise KeyboardInterrupt("killed after step 1 of iteration 2's training")
        return real_train(workdir_arg, trainer=trainer, **kwargs)

    monkeypatch.setattr(resumable, "write_progress", dies_while_scoring)
    with pytest.raises(KeyboardInterrupt, match="teacher"):
        cl_drd.run_cl_drd(str(workdir), config(setup))
    monkeypatch.setattr(resumable, "write_progress", real_progress)
    monkeypatch.setattr(cl_drd, "train", dies_while_training)
    with pytest.raises(KeyboardInterrupt, match="iteration 2"):
        cl_drd.run_cl_drd(str(workdir), config(setup))
    assert native.is_checkpoint_dir(workdir / "iter2" / "student")
    monkeypatch.setattr(cl_drd, "train", real_train)
    resumed = cl_drd.run_cl_drd(str(workdir), config(setup))
    want = _artefacts(uninterrupted[0])
    got = _artefacts(workdir)
    assert sorted(got) == sorted(want) and len(want) > 20
    for rel in want:
        assert got[rel] == want[rel], rel
    _, params_a = native.restore_params(uninterrupted[0] / "iter2" / "student")
    _, params_b = native.restore_params(workdir / "iter2" / "student")
    for a, b in zip(jax.tree_util.tree_leaves(params_a), jax.tree_util.tree_leaves(params_b), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for t in ("0", "1", "2"):
        assert resumed["iterations"][t]["eval"] == uninterrupted[1]["iterations"][t]["eval"]


def test_one_shard_gives_the_candidates_of_two(setup, uninterrupted):
    workdir = setup / "run_c"
    cfg = config(setup, num_shards=1, stages=STAGES[:1], epochs=(2,), learning_rates=(1e-3,))
    cl_drd.run_cl_drd(str(workdir), cfg)
    one, two = _candidates(workdir, 1), _candidates(uninterrupted[0], 1)
    assert [r["query_id"] for r in one] == [r["query_id"] for r in two]
    for a, b in zip(one, two):
        for side in ("positive_passages", "negative_passages"):
            assert [(p["docid"], p.get("rank")) for p in a[side]] == [(p["docid"], p.get("rank")) for p in b[side]]
            np.testing.assert_allclose([p["score"] for p in a[side]], [p["score"] for p in b[side]], rtol=1e-5,
                                       atol=1e-6)


def test_config_errors():
    with pytest.raises(RankgenError, match="depth=5 retrieves too few"):
        cl_drd.ClDrdConfig(depth=5)
    with pytest.raises(RankgenError, match="epochs has 2 entries for 3 stages"):
        cl_drd.ClDrdConfig(epochs=(1, 1))
    with pytest.raises(RankgenError, match="rank_source"):
        cl_drd.ClDrdConfig(rank_source="corpus")
    with pytest.raises(RankgenError, match="stop_metric"):
        cl_drd.ClDrdConfig(stop_metric="AP")


def test_shard_workers_give_the_coordinators_artefacts(setup, uninterrupted, monkeypatch):
    """A coordinator with shard_workers trains and evaluates; two workers (threads here, hosts in a real run)
    encode, retrieve and score their shards: the artefacts are those of one process doing everything."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(cl_drd, "WAIT_SECONDS", 0.2)
    workdir = setup / "run_d"
    cfg = config(setup, shard_workers=True)
    with ThreadPoolExecutor(2) as pool:
        workers = [pool.submit(cl_drd.run_shard_worker, str(workdir), i, cfg) for i in range(2)]
        cl_drd.run_cl_drd(str(workdir), cfg)
        for worker in workers:
            worker.result()
    want, got = _artefacts(uninterrupted[0]), _artefacts(workdir)
    assert sorted(got) == sorted(want)
    for rel in want:
        assert got[rel] == want[rel], rel
    with pytest.raises(RankgenError, match="shard_index 2 is outside 0..1"):
        cl_drd.run_shard_worker(str(workdir), 2, cfg)


def test_cli_runs_the_gin_configured_job_and_refuses_a_missing_input(tmp_path, capsys):
    from rankgen_jax.cli.main import main

    assert main(["cl-drd", "--workdir", str(tmp_path / "run"), "--gin.ClDrdConfig.stages=((2, 4, 2, 2),)",
                 "--gin.ClDrdConfig.epochs=(1,)", "--gin.ClDrdConfig.learning_rates=(1e-3,)",
                 "--gin.ClDrdConfig.depth=10"]) == 2
    assert "ClDrdConfig.corpus is required" in capsys.readouterr().err


@pytest.mark.slow
def test_the_books_example_writes_its_table(setup, tmp_path):
    """cl-drd-example end to end with tiny models: BM25, the teacher, CL-DRD, the table with SEs and rates."""
    from rankgen_jax.experiments.cl_drd_example import ClDrdExampleConfig, run_cl_drd_example

    books = [d for d in require_documents(BUNDLED_CORPUS)[0] if d.id.startswith("austen/")][:4]
    example = ClDrdExampleConfig(passages_per_book=8, test_books=1, dev_books=1, prefix_words=32,
                                 max_continuation_words=24, student=str(setup / "student"), teacher_steps=2,
                                 teacher_batch_size=8, teacher_list_size=4, teacher_query_length=24,
                                 teacher_passage_length=24, mined_negatives=6, rerank_depth=5)
    results = run_cl_drd_example(str(tmp_path / "example"), example, config(setup, num_shards=1), corpus=books)
    table = (tmp_path / "example" / "cl_drd_example_table.md").read_text()
    assert "| BM25 |" in table and "teacher re-ranking" in table and table.count("\n") == 2 + 2 + 3
    assert set(results["bm25"]) == {"dev", "test"} and results["bm25"]["test"]["queries"] == 8
    assert all(v is not None and v > 0 for v in results["rates"].values())


def test_the_books_example_reads_every_binding_of_its_gin_before_anything_trains(tmp_path, monkeypatch):
    """Its first training run (the teacher's) refuses gin bindings nothing has read: ClDrdConfig's must be read
    before it, not when CL-DRD starts."""
    from rankgen_jax.cli.training import CL_DRD_EXAMPLE_GIN
    from rankgen_jax.experiments import cl_drd_example
    from rankgen_jax.experiments.gin_runs import gin_config
    from rankgen_jax.train import gin_parsing

    class Started(Exception):
        pass

    def first_stage(*args, **kwargs):
        gin_parsing.check_bindings_used()  # what train() checks before it compiles
        raise Started

    monkeypatch.setattr(cl_drd_example, "StageRun", first_stage)
    with gin_config([CL_DRD_EXAMPLE_GIN], ["ClDrdExampleConfig.teacher_steps = 2"]), pytest.raises(Started):
        cl_drd_example.run_cl_drd_example(str(tmp_path / "example"))
