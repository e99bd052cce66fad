"""recipe-example: documents -> split-data -> generative negatives -> training on (p, c, g) -> hard-negative suffix
identification, end to end with two small addresses and two training steps."""

import json

import pytest

pytest.importorskip("seqio")


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_recipe_example_runs_end_to_end_and_resumes(tmp_path):
    from rankgen_jax.experiments.recipe_example import TABLE_FILE, RecipeExampleConfig, run_recipe_example

    config = RecipeExampleConfig(train_documents=("speeches/1799_john_adams.txt", "speeches/1800_john_adams.txt",
                                                  "speeches/1798_john_adams.txt"),
                                 validation_documents=("speeches/1797_john_adams.txt",), max_new_tokens=24, hard_negatives=3, items_per_document=3,
                                 train_bindings=("TrainerConfig.num_steps = 2", "TrainerConfig.eval_every = 2",
                                                 "TrainerConfig.checkpoint_every = 2"))
    results = run_recipe_example(str(tmp_path), config)
    split = results["split"]["train"]
    assert split["lm_half"]["examples"] > 0 and split["negatives_half"]["examples"] > 0
    negatives = [json.loads(line) for line in (tmp_path / "negatives.jsonl").read_text().splitlines()]
    assert len(negatives) == split["negatives_half"]["examples"]
    assert all(r["generative_negative"] for r in negatives)
    assert results["train"]["steps"] == 2 and "eval/loss" in results["train"]["eval"]
    scores = results["suffix"]["scores"]
    assert set(scores) == {"model", "unigram", "lm_loglik", "avg_ull"}
    assert all(row["n"] == results["suffix"]["mined"]["items"] > 0 for row in scores.values())
    table = (tmp_path / TABLE_FILE).read_text()
    assert "split-data (train)" in table and "| avg_ull |" in table
    again = run_recipe_example(str(tmp_path), config)  # every stage done: nothing runs again
    assert again["suffix"] == results["suffix"] and set(again["seconds"]) == set(results["seconds"])
