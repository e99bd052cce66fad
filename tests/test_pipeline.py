"""The metric -> ranker -> retriever pipeline end to end on tiny models and a tiny corpus."""

import json

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.errors import RankgenError
from rankgen_jax.train.gin_parsing import parse_gin
from rankgen_jax.experiments.pipeline import (RETRIEVERS1, PipelineConfig, _ranker_lists, _ranking_metrics,
                                              format_table, hard_negative_pools, run_pipeline, stage_steps)
from rankgen_jax.retrieval.sparse import TfidfIndex
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from test_inference import SHARED, random_params


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """Three short documents cut from the bundled books (the last one is held out)."""
    folder = tmp_path_factory.mktemp("corpus")
    books = sorted(p for p in BUNDLED_CORPUS.rglob("*.txt"))[:3]
    for i, book in enumerate(books):
        words = book.read_text(encoding="utf-8").split()
        (folder / f"doc{i}.txt").write_text(" ".join(words[2000:4500]), encoding="utf-8")
    return folder


def test_pipeline_runs_end_to_end(tmp_path, tiny_corpus, spiece_model):
    init = tmp_path / "init"
    native.save_params(init, SHARED, random_params(SHARED, 3), vocab=spiece_model)
    cfg = PipelineConfig(corpus=str(tiny_corpus), holdout_documents=1, prefix_words=48, num_train_queries=24,
                         num_eval_queries=8, init_from_hf="", init_checkpoint=str(init), query_length=32,
                         candidate_length=24, pool_size=6, ranker_list_size=3, rerank_depth=5,
                         curriculum=((2, (2, 2, 2)), (6, (6, 0, 0))), retriever_batch_size=8, ranker_batch_size=8,
                         distill_batch_size=8, max_steps=2, teacher_batch_size=16, hard_negative_pool_size=4,
                         rankers=("listmle", "kl", "bce"), hard_negative_pool="tfidf")
    results = run_pipeline(str(tmp_path / "run"), cfg)
    table = results["table"]
    assert set(table) == {"tfidf", "zero_shot", "retriever0", *cfg.ranker_names, *RETRIEVERS1}
    assert cfg.ranker_names == ("ranker0_listmle", "ranker0_kl", "ranker0_bce")
    # DKMR^2's retriever: two independent towers reading the first token, started from the one encoder.
    retriever0 = native.load_model_config(tmp_path / "run" / "retriever0")
    assert not retriever0.shared_towers and (retriever0.head.pooling, retriever0.head.projection_dim) == ("first", 0)
    # Its hard negatives are drawn from each query's top-4 TF-IDF pool without the gold.
    corpus = [json.loads(l) for l in (tmp_path / "run" / "data" / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(l) for l in (tmp_path / "run" / "data" / "train_queries.jsonl").read_text().splitlines()]
    written = [json.loads(l) for l in (tmp_path / "run" / "data" / "retriever0_train.jsonl").read_text().splitlines()]
    index = TfidfIndex([p["text"] for p in corpus])
    _, top = index.search([q["query"] for q in queries], 5)
    for q, record, row in zip(queries, written, top):
        want = [corpus[j]["id"] for j in row if corpus[j]["id"] != q["gold"]][:4]
        assert [p["docid"] for p in record["negative_passages"]] == want
        assert record["positive_passages"][0]["docid"] == q["gold"]
    for name, row in table.items():
        assert row["n"] == 8, name
        assert 0.0 <= row["recall@1"] <= row["recall@10"] <= 1.0 and 0.0 <= row["mrr@10"] <= 1.0, name
        assert 0.0 <= row["bleu_top1"] <= 100.0
    # Every training stage ran through the trainer for its 2 steps and wrote its checkpoint.
    for stage in ("retriever0", *cfg.ranker_names, "retriever1_kl", "retriever1_metric", "retriever1_cldrd_stage1",
                  "retriever1_cldrd_stage2"):
        assert native.is_checkpoint_dir(tmp_path / "run" / stage), stage
        steps = [json.loads(l)["step"] for l in (tmp_path / "run" / stage / "metrics.jsonl").read_text().splitlines()]
        assert max(steps) == 2, stage
    assert native.load_model_config(tmp_path / "run" / "ranker0_listmle").kind == "cross_encoder"
    # Retriever0's in-batch softmax reads the [CLS] towers' raw dot products (DPR's scale of 1).
    recorded = json.loads((tmp_path / "run" / "retriever0" / "run_config.json").read_text())
    assert recorded["loss"]["logit_scale"] == 1.0
    # Training pools hold the gold and the metric's scores; the gold scores highest (BLEU 100 against itself).
    pools = [json.loads(l) for l in (tmp_path / "run" / "data" / "pools_train.jsonl").read_text().splitlines()]
    assert len(pools) == 24
    for p in pools:
        assert p["gold"] in p["ids"] and len(p["ids"]) == 6
        assert p["labels"][p["ids"].index(p["gold"])] == pytest.approx(100.0) == max(p["labels"])
    teacher = [json.loads(l) for l in (tmp_path / "run" / "data" / "pools_train_teacher.jsonl").read_text().splitlines()]
    assert all(len(t["teacher_scores"]) == 6 and np.all(np.isfinite(t["teacher_scores"])) for t in teacher)
    assert "retriever0" in format_table(table)
    # A second call resumes: nothing is retrained, the table is read back.
    again = run_pipeline(str(tmp_path / "run"), cfg)
    assert again["table"] == table


def test_hard_negative_pools_are_the_sparse_top_k_without_the_gold():
    corpus = [{"id": f"p{i}", "text": t} for i, t in enumerate([
        "the rain on the moor", "a letter by candle light", "rain and wind on the moor at night",
        "the harbour keeper", "wind over the moor", "candle light in the house"])]
    queries = [{"query": "rain on the moor at night", "gold": "p2"}, {"query": "a candle in the house", "gold": "p5"}]
    tfidf = hard_negative_pools(PipelineConfig(hard_negative_pool="tfidf", hard_negative_pool_size=3), queries,
                                corpus)
    _, top = TfidfIndex([p["text"] for p in corpus]).search([q["query"] for q in queries], 4)
    assert tfidf == [[corpus[j]["id"] for j in row if corpus[j]["id"] != q["gold"]][:3] for q, row in zip(queries, top)]
    concepts = hard_negative_pools(PipelineConfig(hard_negative_pool="concepts", hard_negative_pool_size=2), queries,
                                   corpus)
    # Concept matching counts the query's (non-stopword) words a passage holds: rain, moor, night / candle, house.
    assert concepts == [["p0", "p4"], ["p1", "p0"]]
    assert PipelineConfig().hard_negative_pool == "concepts", "the pool DKMR^2 found better is the default"
    assert hard_negative_pools(PipelineConfig(hard_negative_pool="tfidf_top1"), queries, corpus) == [
        pool[:1] for pool in tfidf]
    for bad, message in (({"retriever_towers": "three"}, "retriever_towers"), ({"hard_negative_pool": "bm25"},
                         "hard_negative_pool"), ({"rankers": ("listmle", "listmle")}, "distinct rankers")):
        with pytest.raises(RankgenError, match=message):
            PipelineConfig(**bad)


def test_retriever0_temperature_fits_its_towers():
    """Raw [CLS] dot products of two independent towers: DPR's softmax reads them unscaled; MiniLM's shared towers
    give unit vectors, whose cosines need sentence-transformers' scale of 20."""
    assert PipelineConfig().retriever0_logit_scale == 1.0
    assert PipelineConfig(retriever_towers="shared_start").retriever0_logit_scale == 20.0
    assert PipelineConfig(logit_scale=5.0).retriever0_logit_scale == 5.0
    with pytest.raises(RankgenError, match="logit_scale must be >= 0"):
        PipelineConfig(logit_scale=-1.0)


def test_stages_train_epochs():
    cfg = PipelineConfig(retriever_epochs=3, max_steps=1000)
    assert stage_steps(cfg, 100, 32, 3) == 9
    assert stage_steps(PipelineConfig(max_steps=5), 100, 32, 3) == 5
    assert stage_steps(cfg, 10, 32, 1) == 1
    with pytest.raises(RankgenError, match="ranker_epochs must be >= 1"):
        PipelineConfig(ranker_epochs=0)


def test_ranker_lists_put_the_gold_first():
    pool = {"ids": ["a", "g", "b", "c"], "gold": "g", "candidates": ["A", "G", "B", "C"], "labels": [3.0, 100.0, 7.0, 1.0]}
    (metric,) = _ranker_lists([{**pool, "query": "q"}], 3, binary=False)
    assert metric == {"query": "q", "candidates": ["G", "A", "B"], "labels": [100.0, 3.0, 7.0]}
    (binary,) = _ranker_lists([{**pool, "query": "q"}], 3, binary=True)
    assert binary["labels"] == [1.0, 0.0, 0.0]


def test_ranking_metrics_go_through_evaluate_run():
    """The results table's MRR@10 / recall of the gold: trec_eval's RR@10 and R@k of each ranked list."""
    queries = [{"qid": "t0", "gold": "p1", "reference": "the rain fell"},
               {"qid": "t1", "gold": "p9", "reference": "the sea"},
               {"qid": "t2", "gold": "p0", "reference": "the rain fell"}]
    ranked = [["p0", "p1", "p2"], [], ["p0"]]
    metrics = _ranking_metrics(queries, ranked, {"p0": "the rain fell", "p1": "x", "p2": "y"})
    assert metrics["mrr@10"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    assert metrics["recall@1"] == pytest.approx(1 / 3) and metrics["recall@10"] == pytest.approx(2 / 3)
    assert metrics["n"] == 3


def test_pipeline_config_errors(tmp_path):
    with pytest.raises(RankgenError, match="is not a rankgen_jax checkpoint"):
        run_pipeline(str(tmp_path / "run"), PipelineConfig(init_checkpoint=str(tmp_path / "nothing"),
                                                           corpus=str(BUNDLED_CORPUS), num_train_queries=4,
                                                           num_eval_queries=4))
    with pytest.raises(RankgenError, match="gin config"):
        parse_gin(["pipelines/demo_minilm.gin"], ["PipelineConfig.no_such_field = 1"])
    parse_gin(["pipelines/demo_minilm.gin"], [])
    assert PipelineConfig().pool_size == 30


def test_retriever1_can_learn_from_any_teacher(tmp_path):
    """PipelineConfig.teacher replaces Ranker0 as Retriever1's teacher: here a file of scores, copied onto the
    pools; a pair it lacks has no score (NaN), never a made-up one."""
    from rankgen_jax.experiments.pipeline import PipelineFolder, teacher_scores

    (tmp_path / "data").mkdir()
    pools = [{"qid": "train0", "query": "q zero", "ids": ["p1", "p2"], "candidates": ["a", "b"]},
             {"qid": "train1", "query": "q one", "ids": ["p2", "p3"], "candidates": ["b", "c"]}]
    (tmp_path / "data" / "pools_train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pools))
    (tmp_path / "data" / "corpus.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n"
                                                            for i, t in ((1, "a"), (2, "b"), (3, "c"))))
    (tmp_path / "scores.trec").write_text("train0 Q0 p1 1 2.5 t\ntrain0 Q0 p2 2 1.5 t\ntrain1 Q0 p3 1 0.5 t\n")
    out = teacher_scores(PipelineConfig(teacher=str(tmp_path / "scores.trec")), PipelineFolder(tmp_path))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written[0]["teacher_scores"] == [2.5, 1.5]
    assert np.isnan(written[1]["teacher_scores"][0]) and written[1]["teacher_scores"][1] == 0.5
