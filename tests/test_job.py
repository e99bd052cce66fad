"""The main job end to end on a tiny random T5: evals before and after, plot, export, results."""

import json

from rankgen_jax.cli.main import main


def test_job_runs_end_to_end(tmp_path, capsys):
    code = main(["train", "--job", f"--workdir={tmp_path}", "--gin_file=models/t5_1_1_tiny.gin",
                 "--gin.t5_config.vocab_size=8064", "--gin.DataConfig.source='examples'",
                 "--gin.DataConfig.batch_size=8", "--gin.DataConfig.prefix_length=48",
                 "--gin.DataConfig.continuation_length=32", "--gin.DataConfig.prefix_words=48",
                 "--gin.DataConfig.max_continuation_words=24", "--gin.DataConfig.holdout_documents=2",
                 "--gin.TrainerConfig.num_steps=3", "--gin.TrainerConfig.log_every=1",
                 "--gin.TrainerConfig.eval_every=3", "--gin.OptimizerConfig.name='adamw'",
                 "--gin.OptimizerConfig.learning_rate=1e-3", "--gin.JobConfig.suffix_eval_examples=12",
                 "--gin.JobConfig.suffix_eval_negatives=4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    results = json.loads((tmp_path / "results.json").read_text())
    for name in ("unigram", "token_overlap", "fine_tuned"):
        assert results[name]["n"] == 12
        assert 0.0 <= results[name]["accuracy_2way"] <= 1.0 and 0.0 <= results[name]["mrr_5way"] <= 1.0
        assert 0.0 <= results[name]["accuracy_pairwise"] <= 1.0
    assert "zero_shot" not in results  # random init: nothing to compare before training
    assert (tmp_path / "train" / "demo_results.png").stat().st_size > 10_000
    assert (tmp_path / "hf" / "modeling_rankgen.py").is_file()
    assert "held-out suffix identification" in out.out
