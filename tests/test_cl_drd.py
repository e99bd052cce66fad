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
from rankgen_jax.data.retrieval_files import read_beir, read_queries
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
                  eval_depth=100, report_splits=("test",), encode_batch_size=16, query_batch=5, num_shards=2)
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
        student = load_model(str(workdir / ("student0" if t == 1 else "iter1/student")),
                             conventions=results["reading_conventions"])
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
        row = results["iterations"][str(t)]
        assert set(row["eval"]) == {"test"}, "the dev split selects; only test is reported"
        for split, ev in (("dev", row["select"]), ("test", row["eval"]["test"])):
            assert (workdir / f"iter{t}" / "eval" / f"{split}.trec").is_file()
            assert 0 <= ev["nDCG@10"] <= 1 and ev["nDCG@10_se"] > 0 and ev["queries"] == 8
    table = (workdir / "cl_drd_table.md").read_text()
    assert table.count("\n") == 5 and "| start |" in table and "(selection)" in table
    assert results["selection_queries"].endswith("at split 'dev'")
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
        if "iter2" in str(workdir_arg):
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
    with pytest.raises(RankgenError, match="select_metric"):
        cl_drd.ClDrdConfig(select_metric="AP")
    with pytest.raises(RankgenError, match=r"eval_depth=20 ranks fewer passages than the measures read \(100\)"):
        cl_drd.ClDrdConfig(eval_depth=20)
    with pytest.raises(RankgenError, match="watch_every"):
        cl_drd.ClDrdConfig(watch_every=-1)
    with pytest.raises(RankgenError, match="not both"):
        cl_drd.ClDrdConfig(select_holdout=5, select_queries="q.jsonl")
    assert cl_drd.ClDrdConfig().rank_source == "list"


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


def test_model_selection_never_reads_the_reported_queries(setup, uninterrupted):
    workdir, results = uninterrupted
    # The kept iteration is the best on the dev queries; test is evaluated and never read to choose.
    select = {int(t): row["select"]["RR@10"] for t, row in results["iterations"].items()}
    assert results["best_iteration"] == max(sorted(select), key=lambda t: select[t])
    assert results["selection"]["metric"] == "RR@10" and "selection queries" in results["selection"]["why"]
    # choose_iteration reads "select" only: reported values that favour another iteration change nothing.
    iterations = {str(t): {"select": {"RR@10": v, "per_query": {"a": {"RR@10": v}, "b": {"RR@10": v / 2}}},
                           "eval": {"test": {"RR@10": 1.0 - v}}} for t, v in enumerate((0.1, 0.5, 0.3))}
    assert cl_drd.choose_iteration(iterations, "RR@10", selected=True)["iteration"] == 1
    assert cl_drd.choose_iteration(iterations, "RR@10", selected=False)["iteration"] == 2
    # Selecting on the reported split is refused before anything runs.
    with pytest.raises(RankgenError, match="model selection on the evaluation data"):
        cl_drd.run_cl_drd(str(setup / "run_refused"), config(setup, eval_split="dev", report_splits=()))
    with pytest.raises(RankgenError, match="needs selection queries"):
        cl_drd.run_cl_drd(str(setup / "run_refused"), config(setup, select_split="none", stop_when_no_gain=True))
    assert not (setup / "run_refused" / "data").exists()


def test_watching_measures_the_selection_queries_and_changes_no_result(setup, uninterrupted):
    """watch_every: each student's training measures a nano set of the dev (selection) queries, never of test; its
    last measures equal index + search + evaluate of the saved student; and the student is the unwatched one."""
    from rankgen_jax.eval.retrieval_metrics import evaluate_files
    from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, search_queries
    from rankgen_jax.runtime import partitioning

    workdir, _ = uninterrupted
    watched = setup / "run_watched"
    # Iteration 1 alone: its stage, epochs and rate are the unwatched run's iteration 1.
    results = cl_drd.run_cl_drd(str(watched), config(setup, stages=STAGES[:1], epochs=(2,), learning_rates=(1e-3,),
                                                     watch_every=1, watch_queries=4, watch_distractors=3))
    nano = read_beir(watched / "data" / "nano", split="dev")
    dev, test = (set(read_queries(setup / "beir", split=split).ids) for split in ("dev", "test"))
    assert len(nano.queries) == 4 and set(nano.queries.ids) <= dev and not set(nano.queries.ids) & test
    training = results["iterations"]["1"]["training"]
    assert training["watch_seconds_this_run"] > 0
    student = watched / "iter1" / "student"
    rows = {r["step"]: r for r in map(json.loads, (student / "metrics.jsonl").read_text().splitlines())
            if "retrieval/nano@dev/RR@10" in r}
    assert sorted(rows) == list(range(training["steps"] + 1))
    model, mesh = load_model(str(student)), partitioning.make_mesh(-1, 1)
    index_corpus(model, str(watched / "data" / "nano"), str(setup / "watched_index"),
                 encoding=TextEncoding("suffix", batch_size=16, mesh=mesh), progress=False)
    search_queries(model, str(setup / "watched_index"), str(watched / "data" / "nano"), 100,
                   encoding=TextEncoding("prefix", batch_size=16, mesh=mesh), split="dev",
                   out_path=str(setup / "watched.trec"), out_format="trec", progress=False)
    expected = evaluate_files(str(setup / "watched.trec"), str(watched / "data" / "nano"), ["nDCG@10", "RR@10", "R@100"],
                              split="dev")
    for measure in ("nDCG@10", "RR@10", "R@100"):
        assert rows[training["steps"]][f"retrieval/nano@dev/{measure}"] == pytest.approx(expected[measure], abs=1e-6)
    # Watching changes no result: the student is, to the bit, the unwatched run's.
    digests = [native.tree_digest(native.restore_params(run / "iter1" / "student")[1]) for run in (watched, workdir)]
    assert digests[0] == digests[1]
    with pytest.raises(RankgenError, match="watch_every needs selection queries"):
        cl_drd.run_cl_drd(str(setup / "run_unwatchable"), config(setup, select_split="none", watch_every=1))
    assert not (setup / "run_unwatchable" / "data").exists()


def test_held_out_training_queries_select(setup):
    """select_holdout: training queries drawn out of training into the selection set (MS MARCO's way, whose
    dev.small is what the paper reports)."""
    job = cl_drd.Job(setup / "run_holdout", config(setup, select_holdout=3))
    counts = job.prepare_data()
    assert counts["select_holdout"] == 3 and counts["train_queries"] == 16 - 3
    queries, qrels = job.select_files()
    held = {json.loads(line)["id"] for line in queries.read_text().splitlines()}
    trained = {json.loads(line)["id"] for line in (job.data / "train_queries.jsonl").read_text().splitlines()}
    assert len(held) == 3 and not held & trained
    assert {line.split()[0] for line in qrels.read_text().splitlines()} == held
    assert job.selection_set().name == cl_drd.HOLDOUT
    # Watching the held-out queries: their nano set, from the files the job wrote.
    watching = cl_drd.Job(job.root, config(setup, select_holdout=3, watch_every=1, watch_queries=2,
                                           watch_distractors=2))
    assert watching.watched_set().sets == (f"{watching.watch_folder}@{cl_drd.HOLDOUT}",)
    nano = read_beir(watching.watch_folder, split=cl_drd.HOLDOUT)
    assert len(nano.queries) == 2 and set(nano.queries.ids) <= held
    with pytest.raises(RankgenError, match="leaves fewer than one batch"):
        cl_drd.Job(setup / "run_holdout2", config(setup, select_holdout=9)).prepare_data()


def test_every_iteration_reads_text_the_same_way(uninterrupted):
    """The start and every later student index, retrieve and evaluate with one set of input conventions: the
    training lengths, query_keep and markers (not each checkpoint's own record)."""
    workdir, results = uninterrupted
    want = results["reading_conventions"]
    assert (want["prefix_length"], want["suffix_length"], want["truncation"]) == (24, 24, "clean")
    for t in range(3):
        for shard in (0, 1):
            built = json.loads((workdir / f"iter{t}" / "index" / f"shard{shard}" / "index_config.json").read_text())
            recorded = {k: v for k, v in built["input_conventions"].items() if k != "format_version"}
            assert recorded == want, (t, shard)


def test_skipped_queries_and_lists_are_reported(setup, tmp_path, capsys):
    row = {"teacher": [{"passages_without_teacher_score": 3, "skipped": {"no positive passage with a teacher "
                                                                        "score": 2}},
                       {"passages_without_teacher_score": 0, "skipped": {"no positive passage with a teacher "
                                                                        "score": 5}}],
           "lists": {"skipped": {cl_drd.TOO_FEW_CANDIDATES: 4}}}
    cl_drd._log_skips(2, row)
    err = capsys.readouterr().err
    assert "iteration 2: 3 candidate passages left out" in err
    assert "iteration 2: 7 training queries skipped: no positive passage with a teacher score" in err
    assert f"iteration 2: 4 training lists skipped: {cl_drd.TOO_FEW_CANDIDATES}" in err
    # A training query the qrels judge nothing relevant for is counted and said, not dropped silently.
    beir = tmp_path / "beir"
    import shutil

    shutil.copytree(setup / "beir", beir)
    qrels = beir / "qrels" / "train.tsv"
    lines = qrels.read_text().splitlines()
    qrels.write_text("\n".join(lines[:2] + [lines[2].rsplit("\t", 1)[0] + "\t0"] + lines[3:]) + "\n")
    counts = cl_drd.Job(tmp_path / "run", config(setup, corpus=str(beir))).prepare_data()
    assert counts["skipped"] == {cl_drd.NO_RELEVANT_PASSAGE: 1} and counts["train_queries"] == 15
    assert f"1 training queries skipped: {cl_drd.NO_RELEVANT_PASSAGE}" in capsys.readouterr().err


def test_pi_is_the_current_students_ranking_at_each_step(uninterrupted):
    """Eq. 2's pi, by default, ranks each list by the student being trained: one step's loss on an iteration's
    lists, from the student's own scores, equals the NumPy reference with ranks from those scores, not the frozen
    retrieval ranks."""
    from test_list_losses import ref_lambdarank

    from rankgen_jax.losses.registry import get_loss

    workdir, results = uninterrupted
    recorded = json.loads((workdir / "iter1" / "student" / "run_config.json").read_text())
    assert recorded["loss"]["name"] == "lambdarank_mrr" and recorded["loss"]["rank_source"] == "list"
    lists = [json.loads(line) for line in (workdir / "iter1" / "train_lists.jsonl").read_text().splitlines()][:4]
    student = load_model(str(workdir / "student0"), conventions=results["reading_conventions"])
    query_BxD = student.encode([r["query"] for r in lists], side="prefix")
    candidates_BxCxD = np.stack([student.encode(r["candidates"], side="suffix") for r in lists])
    scale = results["config"]["logit_scale"]
    batch = {"labels": np.array([r["labels"] for r in lists], np.float32),
             "student_ranks": np.array([r["student_ranks"] for r in lists], np.float32)}
    outputs = {"query": query_BxD, "candidates": candidates_BxCxD}
    loss, _ = get_loss("lambdarank_mrr")(outputs, batch, {}, rank_source="list", logit_scale=scale)
    scores = np.einsum("bd,bcd->bc", query_BxD.astype(np.float64), candidates_BxCxD.astype(np.float64)) * scale
    want, _ = ref_lambdarank(scores, batch)
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    frozen, _ = ref_lambdarank(scores, batch, student_ranks=batch["student_ranks"])
    assert abs(frozen - want) > 1e-4, "the frozen retrieval ranks would give another loss on these lists"


def test_paired_difference_over_queries():
    """Mean and standard error of per-query differences (NumPy reference); one query has no standard error."""
    a = {"per_query": {"q1": {"RR@10": 0.5}, "q2": {"RR@10": 1.0}, "q3": {"RR@10": 0.0}}}
    b = {"per_query": {"q3": {"RR@10": 0.25}, "q1": {"RR@10": 0.5}, "q2": {"RR@10": 0.2}, "q4": {"RR@10": 1.0}}}
    d = np.array([0.0, 0.8, -0.25])
    assert cl_drd.paired_difference(a, b, "RR@10") == pytest.approx((d.mean(), d.std(ddof=1) / np.sqrt(3)))
    mean, se = cl_drd.paired_difference({"per_query": {"q1": {"RR@10": 0.5}}}, b, "RR@10")
    assert mean == 0.0 and np.isnan(se)
