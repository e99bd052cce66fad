"""The distillation demonstration: its gin is read whole before anything trains, its table and targets read the
right rows, and (slow) the job end to end with tiny models."""

import pytest
from test_cl_drd import STAGES, config, setup  # noqa: F401 (the module fixture)

from rankgen_jax.data.documents import require_documents
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from rankgen_jax.experiments import distillation_demo as demo


def _ev(values: dict[str, float], shift: float = 0.0) -> dict:
    """Measures of four queries whose values are `values[m] + shift * i` for query i."""
    per_query = {f"q{i}": {m: v + shift * i for m, v in values.items()} for i in range(4)}
    out = {"per_query": per_query}
    for m in values:
        column = [per_query[q][m] for q in per_query]
        out[m], out[m + "_se"] = sum(column) / 4, 0.01
    return out


def _results(kept_gain: float, standard_gain: float, retriever1_gain: float) -> dict:
    base = {"nDCG@10": 0.2, "RR@10": 0.15, "R@100": 0.6}

    def ev(gain, spread=0.0):
        return _ev({m: v + gain for m, v in base.items()}, spread)

    start = {"select": ev(0.0), "eval": {"test": ev(0.0)}}
    iterations = {"0": start, "1": {"stage": {"k": 2, "n_hard": 3, "n_rest": 3}, "select": ev(0.01),
                                    "eval": {"test": ev(kept_gain, 0.01)}}}
    row = {"mrr@10": 0.1, "recall@10": 0.3, "bleu_top1": 20.0, "mrr@10_se": 0.01, "recall@10_se": 0.02}
    r0 = {**row, "per_query": {f"e{i}": {"mrr@10": 0.1} for i in range(3)}}
    r1 = {**row, "per_query": {f"e{i}": {"mrr@10": 0.1 + retriever1_gain + 0.001 * i} for i in range(3)}}
    return {"bm25": {"dev": ev(-0.05), "test": ev(-0.05)}, "teacher_spec": "trained + mpnet",
            "teacher_members": {"trained": {"dev": ev(0.03), "test": ev(0.03)}},
            "teacher": {"dev": ev(0.05), "test": ev(0.05)},
            "cl_drd": {"iterations": iterations, "best_iteration": 1},
            "standard": {"dev": ev(standard_gain), "test": ev(standard_gain, 0.005)}, "standard_steps": 10,
            "dkmr2": {"table": {"retriever0": r0, "retriever1_kl": r1}}}


def test_targets_and_table_read_the_right_rows():
    met = demo.targets(_results(0.05, 0.02, 0.02))
    assert met["kept_iteration"] == 1
    assert met["cl_drd_vs_zero_shot"]["met"] and met["cl_drd_vs_zero_shot"]["difference"] == pytest.approx(0.065)
    assert met["cl_drd_vs_standard"]["met"] and met["retriever1_vs_retriever0"]["met"]
    missed = demo.targets(_results(-0.015, 0.03, -0.01))
    assert not missed["cl_drd_vs_zero_shot"]["met"] and not missed["cl_drd_vs_standard"]["met"]
    assert not missed["retriever1_vs_retriever0"]["met"]
    table = demo.table_markdown(_results(0.05, 0.02, 0.02))
    names = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| ---")]
    assert names[:8] == ["model", "BM25", "teacher member: trained", "teacher (trained + mpnet)",
                         "zero-shot student (MiniLM)", "standard distillation (KL, 10 steps)",
                         "CL-DRD iteration 1 (kept) (K=2, N_h=3, N_s=3)", "DKMR^2 model (its held-out queries)"]
    zero_shot_row = next(line for line in table.splitlines() if line.startswith("| zero-shot"))
    assert zero_shot_row.count("| - |") == 1 and "Retriever1 (KL from Ranker0)" in table


def test_the_teacher_spec_names_the_trained_member():
    assert demo.teacher_spec("trained + mpnet", "runs/x/teacher") == "runs/x/teacher + mpnet"
    assert demo.teacher_spec("mpnet", None) == "mpnet"


def test_its_gin_is_read_whole_before_anything_trains(tmp_path, monkeypatch):
    """The first training run (the teacher's) refuses gin bindings nothing has read: ClDrdConfig's and
    PipelineConfig's must be read before it."""
    from rankgen_jax.cli.training import DISTILLATION_DEMO_GIN
    from rankgen_jax.experiments.gin_runs import gin_config
    from rankgen_jax.train import gin_parsing

    class Started(Exception):
        pass

    def first_stage(*args, **kwargs):
        gin_parsing.check_bindings_used()  # what train() checks before it compiles
        raise Started

    monkeypatch.setattr(demo, "StageRun", first_stage)
    with gin_config([DISTILLATION_DEMO_GIN], []), pytest.raises(Started):
        demo.run_distillation_demo(str(tmp_path / "demo"))


@pytest.mark.slow
def test_the_demonstration_runs_end_to_end(setup, tmp_path):  # noqa: F811
    """Tiny models: the collection, BM25, a trained teacher, CL-DRD, standard distillation, the table."""
    books = [d for d in require_documents(BUNDLED_CORPUS)[0] if d.id.startswith("austen/")][:4]
    cfg = demo.DistillationDemoConfig(passages_per_book=8, test_books=1, dev_books=1, prefix_words=32,
                                      max_continuation_words=24, student=str(setup / "student"),
                                      teacher=f"trained + {setup / 'teacher'}",
                                      teacher_steps=2, teacher_batch_size=8, dkmr2=False)
    results = demo.run_distillation_demo(str(tmp_path / "demo"), cfg, config(setup, num_shards=1), books=books)
    table = (tmp_path / "demo" / demo.TABLE_FILE).read_text()
    assert "| BM25 |" in table and "standard distillation (KL, 6 steps)" in table and "CL-DRD iteration 2" in table
    assert set(results["targets"]) == {"kept_iteration", "cl_drd_vs_zero_shot", "cl_drd_vs_standard"}
    assert results["standard"]["test"]["queries"] == 8
    # The ensemble's members each have a row; the teacher's row combines their scores as the teacher does.
    assert set(results["teacher_members"]) == {"trained", str(setup / "teacher")}
    assert f"teacher (trained + {setup / 'teacher'})" in table


def test_standard_lists_draw_from_the_students_top_n_afresh_each_epoch():
    """Reference: for epoch e and query position i, the rows drawn are sorted(choice(N, L)) of a generator seeded
    (seed, e, i) over the candidates in the student's rank order; "top" keeps the first L."""
    import numpy as np

    candidates = []
    for q in range(3):
        passages = [{"docid": f"d{q}-{r}", "text": f"t{r}", "title": "", "score": float(-r), "rank": r + 1}
                    for r in range(12)]
        passages.append({"docid": f"gold{q}", "text": "g", "title": "", "score": 9.0})  # unranked: never listed
        candidates.append({"query": f"q{q}", "positive_passages": passages[-1:], "negative_passages": passages[:-1]})
    drawn = demo.standard_lists(candidates, 4, 2, "drawn", seed=7)
    assert len(drawn) == 6
    for epoch in range(2):
        for i in range(3):
            rows = np.sort(np.random.default_rng([7, epoch, i]).choice(12, 4, replace=False))
            record = drawn[epoch * 3 + i]
            assert record["docids"] == [f"d{i}-{r}" for r in rows]
            assert record["teacher_scores"] == [float(-r) for r in rows]
    assert drawn[0]["docids"] != drawn[3]["docids"], "each epoch draws afresh"
    top = demo.standard_lists(candidates, 4, 1, "top", seed=7)
    assert [r["docids"] for r in top] == [[f"d{i}-{r}" for r in range(4)] for i in range(3)]
    with pytest.raises(Exception, match="standard_lists"):
        demo.DistillationDemoConfig(standard_lists="all")
