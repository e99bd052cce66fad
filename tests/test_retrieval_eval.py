"""Retrieval evaluation inside training: its nano sets, its ranking, its settings, and its measures against
`evaluate` on the run the saved model gives through `index` and `search` (8 fake devices, FSDP)."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.data.retrieval_files import read_beir, write_beir
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.retrieval_metrics import evaluate_files
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.retrieval.bm25 import bm25_search
from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, search_queries
from rankgen_jax.retrieval.nano import NanoSpec, build_nano_set
from rankgen_jax.testing import build_tiny_rankgen
from rankgen_jax.train.retrieval_eval import RetrievalEvalConfig, ranked_run, set_name

WORDS = ("river stone garden letter winter candle harbour meadow violin orchard lantern ribbon falcon quarry "
         "thimble saddle compass pepper marble anchor").split()


def _small_beir(path, passages: int = 30, queries: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    corpus = [{"_id": f"p{i}", "title": "", "text": " ".join(rng.choice(WORDS, 8))} for i in range(passages)]
    asked = [{"_id": f"q{i}", "text": corpus[3 * i]["text"].split(" ", 4)[-1]} for i in range(queries)]
    # Query i: passage 3i relevant, passage 3i + 1 judged not relevant; the last query judges nothing relevant.
    qrels = [(f"q{i}", f"p{3 * i}", int(i < queries - 1)) for i in range(queries)]
    qrels += [(f"q{i}", f"p{3 * i + 1}", 0) for i in range(queries)]
    return write_beir(path, corpus, asked, {"test": qrels})


def test_a_nano_set_is_the_sampled_queries_their_judged_passages_and_bm25_distractors(tmp_path):
    beir = _small_beir(tmp_path / "beir")
    spec = NanoSpec(queries=4, distractors=3, seed=5)
    summary = build_nano_set(beir, "test", tmp_path / "nano", spec)
    # Independently: the queries with a relevant passage, sampled as the spec says; BM25's top 3 from `bm25`.
    judged = [f"q{i}" for i in range(7)]
    rows = sorted(np.random.default_rng(5).choice(len(judged), size=4, replace=False))
    sampled = [judged[r] for r in rows]
    top = {r["query_id"]: r["ids"] for r in bm25_search(str(beir), str(beir), 3, split="test", progress=False)}
    expected = {f"p{3 * int(q[1:]) + k}" for q in sampled for k in (0, 1)} | {p for q in sampled for p in top[q]}
    nano = read_beir(tmp_path / "nano", split="test")
    assert sorted(nano.queries.ids) == sorted(sampled)
    assert set(nano.passages.ids) == expected and summary["corpus"] == len(expected)
    assert nano.qrels.labels == {q: {f"p{3 * int(q[1:])}": 1, f"p{3 * int(q[1:]) + 1}": 0} for q in sampled}
    # Written once: the same settings reuse it, others are refused.
    assert build_nano_set(beir, "test", tmp_path / "nano", spec) == summary
    with pytest.raises(RankgenError, match="choose another folder"):
        build_nano_set(beir, "test", tmp_path / "nano", NanoSpec(queries=5, distractors=3, seed=5))


def test_a_nano_set_of_separate_files_is_the_folders_and_joins_titles_as_asked(tmp_path):
    """Passages, queries and qrels as files of their own (CL-DRD's held-out selection queries) give the set the
    BEIR folder gives; a title_join other than the default is applied as the set is written."""
    beir = _small_beir(tmp_path / "beir")
    spec = NanoSpec(queries=4, distractors=3, seed=5)
    build_nano_set(beir, "test", tmp_path / "folder", spec)
    files = dict(queries=beir / "queries.jsonl", qrels=beir / "qrels" / "test.tsv")
    summary = build_nano_set(beir / "corpus.jsonl", "test", tmp_path / "files", spec, **files)
    assert summary["queries_file"] == str(files["queries"].resolve()) and summary["queries"] == 4
    by_folder, by_files = (read_beir(tmp_path / name, split="test") for name in ("folder", "files"))
    assert by_files.passages.ids == by_folder.passages.ids and by_files.queries.ids == by_folder.queries.ids
    assert by_files.qrels.labels == by_folder.qrels.labels
    # Reused only when built the same way: without the files, or dropping titles, is another set.
    assert build_nano_set(beir / "corpus.jsonl", "test", tmp_path / "files", spec, **files) == summary
    with pytest.raises(RankgenError, match="choose another folder"):
        build_nano_set(beir / "corpus.jsonl", "test", tmp_path / "files", spec)
    with pytest.raises(RankgenError, match="choose another folder"):
        build_nano_set(beir, "test", tmp_path / "folder", spec, title_join=None)
    # Titles: joined into the text with the job's title_join, none left for a reader to join again.
    titled = [{"_id": f"p{i}", "title": f"T{i}", "text": f"body {i}"} for i in range(6)]
    write_beir(tmp_path / "titled", titled, [{"_id": "q0", "text": "body"}], {"test": [("q0", "p0", 1)]})
    build_nano_set(tmp_path / "titled", "test", tmp_path / "joined", NanoSpec(queries=1, distractors=2),
                   title_join=" :: ")
    joined = read_beir(tmp_path / "joined", split="test").passages
    assert joined.titles == [""] * len(joined) and joined.texts[joined.rows["p0"]] == "T0 :: body 0"


def test_the_run_ranks_by_inner_product_as_search_does():
    rng = np.random.default_rng(0)
    queries_QxD, passages_PxD = rng.normal(size=(3, 4)), rng.normal(size=(9, 4))
    passages_PxD[7] = passages_PxD[2]  # a tie: search puts the earlier row first
    queries_QxD[0] = 10 * passages_PxD[2]  # the tie is the first query's top two
    ids = [f"d{i}" for i in range(9)]
    run = ranked_run(["a", "b", "c"], ids, queries_QxD, passages_PxD, 4)
    assert list(run["a"])[:2] == ["d2", "d7"]
    for qid, q in zip("abc", queries_QxD.astype(np.float32)):
        scores = passages_PxD.astype(np.float32) @ q
        order = np.lexsort((np.arange(9), -scores))[:4]  # score descending, then row ascending
        assert list(run[qid]) == [ids[j] for j in order]
        assert list(run[qid].values()) == pytest.approx(scores[order].tolist(), rel=1e-5)


def test_encoding_with_fsdp_sharded_parameters_matches_replicated_ones(spiece_model):
    """The training state's parameters are encoded with as training shards them (here FSDP over 8 devices); the
    vectors are those of replicated parameters, up to float rounding."""
    from rankgen_jax.data.text import load_text_encoder
    from rankgen_jax.inference.encoder import LoadedModel
    from rankgen_jax.models.factory import abstract_variables
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.testing import random_params, tiny_rankgen_config

    config = tiny_rankgen_config()
    params = random_params(config, seed=0)
    mesh = partitioning.make_mesh(-1, 1)
    shardings = partitioning.logical_shardings(abstract_variables(config)["params"], mesh,
                                               partitioning.rules_by_name("fsdp"))
    sharded = partitioning.device_put_tree(params, shardings)
    assert any(not leaf.sharding.is_fully_replicated for leaf in jax.tree_util.tree_leaves(sharded))
    text = load_text_encoder(spiece_model)
    texts = [" ".join(np.random.default_rng(i).choice(WORDS, 3 + i)) for i in range(11)]
    vectors = [LoadedModel(config=config, params=p, text=text).encode(texts, side="suffix", batch_size=8, mesh=mesh)
               for p in (sharded, jax.device_put(params))]
    assert not np.array_equal(vectors[0], 0 * vectors[0])
    np.testing.assert_allclose(vectors[0], vectors[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("changes, message", [
    (dict(sets=("beir",)), "not PATH@SPLIT"),
    (dict(sets=("a@test", "nano:b@dev", "x/a@test")), "names a set twice"),
    (dict(sets=("a@test",), depth=50), "ranks fewer passages"),
    (dict(sets=("a@test",), keep_best="MAP"), "names no measured metric"),
    (dict(sets=("a@test",), keep_best="b@test/nDCG@10"), "names no measured metric"),
    (dict(keep_best="nDCG@10"), "needs a set"),
])
def test_settings_that_would_measure_wrongly_fail_at_once(changes, message):
    with pytest.raises(RankgenError, match=message):
        RetrievalEvalConfig(**changes)


def test_sets_are_named_by_folder_and_split():
    assert set_name("data/scifact@test") == "scifact@test"
    assert set_name("nano:/x/msmarco@dev") == "nano-msmarco@dev"
    assert RetrievalEvalConfig(sets=("a@test", "nano:a@test"), keep_best="nano-a@test/RR@10").best_metric() == (
        "nano-a@test", "RR@10")


def _word_collection(path, passages: int = 60, held_out: int = 20, seed: int = 1):
    """Passages of random words (titled by nothing, so that no two read alike); query i is passage i's first half,
    judging passage i; the last `held_out` queries are the test split, the others the train split."""
    rng = np.random.default_rng(seed)
    corpus = [{"_id": f"p{i}", "title": "", "text": " ".join(rng.choice(WORDS, 12))} for i in range(passages)]
    asked = [{"_id": f"q{i}", "text": " ".join(c["text"].split()[:6])} for i, c in enumerate(corpus)]
    split = {"train": range(passages - held_out), "test": range(passages - held_out, passages)}
    return write_beir(path, corpus, asked, {name: [(f"q{i}", f"p{i}", 1) for i in rows] for name, rows in split.items()})


def _settings(root, init):
    from rankgen_jax.data.source_configs import DataConfig, RetrievalData
    from rankgen_jax.train.config import LossConfig, TrainerConfig
    from rankgen_jax.train.optimizers import OptimizerConfig

    beir = root / "beir"
    evaluation = RetrievalEvalConfig(sets=(f"{beir}@test", f"nano:{beir}@test"), keep_best="nDCG@10",
                                     nano_queries=5, nano_distractors=3, encode_batch_size=16, dims=(8,))
    trainer = TrainerConfig(num_steps=4, log_every=2, eval_every=2, checkpoint_every=2, keep_checkpoints=3,
                            init_checkpoint=init, async_checkpoints=False)
    data = DataConfig(RetrievalData(retrieval_corpus=str(beir), split="train", continuation_length=32,
                                    hard_negatives=0), batch_size=8, prefix_length=32)
    # The tiny model's 32 dimensions, and their first 8 trained to work alone (Matryoshka).
    loss = LossConfig(name="in_batch_softmax", matryoshka_dims=(32, 8))
    return trainer, data, loss, OptimizerConfig(name="adamw", learning_rate=1e-3), evaluation


@pytest.fixture(scope="module")
def trained(tmp_path_factory, spiece_model):
    from rankgen_jax.train.loop import train

    root = tmp_path_factory.mktemp("retrieval_eval")
    _word_collection(root / "beir")
    init = build_tiny_rankgen(root / "init", spiece_model)
    trainer, data, loss, optimizer, evaluation = _settings(root, init)
    metrics = train(root / "run", trainer=trainer, data=data, loss=loss, optimizer=optimizer, retrieval=evaluation)
    return root, init, metrics


def _retrieval_rows(run) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if any(k.startswith("retrieval/") for k in r)}


def test_in_training_measures_equal_evaluate_on_the_saved_models_run(trained):
    """The run's own measures against `index`, `search` and `evaluate` on the saved model, encoding on the same 8
    devices (so that the vectors are the same to the last bit)."""
    from rankgen_jax.runtime import partitioning

    root, init, metrics = trained
    rows = _retrieval_rows(root / "run")
    assert sorted(rows) == [0, 2, 4]
    assert metrics["retrieval_eval_seconds"] > 0
    mesh = partitioning.make_mesh(-1, 1)
    sets = {"beir@test": root / "beir", "nano-beir@test": root / "run" / "retrieval_sets" / "nano-beir@test"}
    for step in (0, 2, 4):
        # Step 0's model is the starting checkpoint, read as the run reads text.
        model = load_model(str(root / "run"), step=4) if step == 0 else load_model(str(root / "run"), step=step)
        if step == 0:
            model.params = load_model(str(init)).params
        for name, folder in sets.items():
            index = root / f"index_{step}_{name}"
            index_corpus(model, str(folder), str(index), encoding=TextEncoding("suffix", batch_size=16, mesh=mesh),
                         progress=False)
            run_file = root / f"run_{step}_{name}.trec"
            search_queries(model, str(index), str(folder), 100,
                           encoding=TextEncoding("prefix", batch_size=16, mesh=mesh), split="test",
                           out_path=str(run_file), out_format="trec", progress=False)
            expected = evaluate_files(str(run_file), str(folder), ["nDCG@10", "RR@10", "R@100"], split="test")
            for measure in ("nDCG@10", "RR@10", "R@100"):
                assert rows[step][f"retrieval/{name}/{measure}"] == pytest.approx(expected[measure], abs=1e-6)
        # The first 8 dimensions, as `index` and `search` with --truncate_dim 8 rank them.
        name, folder = "beir@test", sets["beir@test"]
        index = root / f"index_{step}_{name}_dim8"
        index_corpus(model, str(folder), str(index),
                     encoding=TextEncoding("suffix", batch_size=16, mesh=mesh, truncate_dim=8), progress=False)
        run_file = root / f"run_{step}_{name}_dim8.trec"
        search_queries(model, str(index), str(folder), 100,
                       encoding=TextEncoding("prefix", batch_size=16, mesh=mesh, truncate_dim=8), split="test",
                       out_path=str(run_file), out_format="trec", progress=False)
        expected = evaluate_files(str(run_file), str(folder), ["nDCG@10"], split="test")
        assert rows[step][f"retrieval/{name}/dim8/nDCG@10"] == pytest.approx(expected["nDCG@10"], abs=1e-6)
    # The nano set: its 5 queries, each query's relevant passage and 3 BM25 distractors (some shared).
    nano = read_beir(sets["nano-beir@test"], split="test")
    assert len(nano.queries) == 5 and 5 < len(nano.passages) <= 20


def test_the_best_step_is_kept_as_a_checkpoint(trained):
    root, init, _ = trained
    rows = _retrieval_rows(root / "run")
    values = [rows[s]["retrieval/beir@test/nDCG@10"] for s in (0, 2, 4)]
    best_step = (0, 2, 4)[int(np.argmax(values))]  # the first of equal values: a later one must beat it
    record = json.loads((root / "run" / "best.json").read_text())
    assert record == {"metric": "beir@test/nDCG@10", "value": max(values), "step": best_step}
    _, best_params = native.restore_params(root / "run" / "best")
    _, step_params = native.restore_params(init if best_step == 0 else root / "run", None if best_step == 0
                                           else best_step)
    for got, want in zip(*(sorted(native.tree_digest(p).items()) for p in (best_params, step_params))):
        assert got == want


def test_a_resumed_run_keeps_its_best_as_an_unbroken_one_does(trained, tmp_path):
    """Two steps, stopped, resumed to four: the same measures, the same best.json and best/ as the run that went
    through (training is deterministic here)."""
    from rankgen_jax.train.loop import train

    root, init, _ = trained
    settings = json.loads((root / "run" / "run_config.json").read_text())
    assert settings["trainer"]["num_steps"] == 4
    trainer, data, loss, optimizer, evaluation = _settings(root, init)
    train(tmp_path / "run", trainer=dataclasses.replace(trainer, num_steps=2), data=data, loss=loss,
          optimizer=optimizer, retrieval=evaluation)
    first = json.loads((tmp_path / "run" / "best.json").read_text())
    train(tmp_path / "run", trainer=trainer, data=data, loss=loss, optimizer=optimizer, retrieval=evaluation)
    whole, resumed = _retrieval_rows(root / "run"), _retrieval_rows(tmp_path / "run")
    assert sorted(resumed) == [0, 2, 4]
    for step in (0, 2, 4):
        for key, value in whole[step].items():
            if key.startswith("retrieval/") and not key.endswith("/seconds") and key != "retrieval/seconds":
                assert resumed[step][key] == pytest.approx(value, abs=1e-6)
    record = json.loads((tmp_path / "run" / "best.json").read_text())
    assert record == json.loads((root / "run" / "best.json").read_text())
    # The test can tell: a resume that forgot the best before it would keep step 4's measure, not better than it.
    assert record["step"] < 4
    assert first["step"] in (0, 2) and (record["step"] == first["step"] or record["value"] > first["value"])
    assert native.latest_step(tmp_path / "run" / "best") == record["step"]


def test_an_exports_card_carries_the_measures_the_run_took(trained, tmp_path):
    """The card lists the exported step's, the last and the best measures, and the hub reads the exported step's as
    the model-index's evaluation results."""
    import huggingface_hub

    from rankgen_jax.checkpoints.convert import export_hf

    root, _, _ = trained
    rows = _retrieval_rows(root / "run")
    record = json.loads((root / "run" / "best.json").read_text())
    for source, step in ((root / "run", 4), (root / "run" / "best", record["step"])):
        out = tmp_path / source.name
        export_hf(str(source), str(out), overwrite=True)
        text = (out / "README.md").read_text()
        assert "## Retrieval measured during training" in text
        value = rows[step]["retrieval/beir@test/nDCG@10"]
        assert f"| beir@test | nDCG@10 | {value:.4f} |" in text
        card = huggingface_hub.ModelCard.load(out / "README.md")
        results = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
        assert results[("beir@test", "nDCG@10")] == pytest.approx(value)
        assert results[("nano-beir@test", "RR@10")] == pytest.approx(rows[step]["retrieval/nano-beir@test/RR@10"])
        assert f"best nDCG@10 (step {record['step']})" in text
        assert "Trained with a Matryoshka loss on the first 32, 8 dimensions" in text
