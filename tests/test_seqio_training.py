"""The trainer fed by a seqio task (the demo task over the bundled books)."""

import pytest

from rankgen_jax.cli.main import main
from rankgen_jax.data.source_configs import DataConfig, SeqioData
from rankgen_jax.data.sources import make_sources
from rankgen_jax.errors import RankgenError
from rankgen_jax.train.metric_writers import read_metrics


def test_train_from_seqio_demo_task(tmp_path, capsys):
    # No `import tasks` here: `rankgen-jax train` registers the project's tasks because the config names seqio.
    code = main(["train", f"--workdir={tmp_path}", "--gin_file=models/t5_1_1_tiny.gin",
                 "--gin.t5_config.vocab_size=8064", "--gin.DataConfig.source=@SeqioData()",
                 "--gin.SeqioData.task='rankgen_demo'", "--gin.DataConfig.batch_size=8",
                 "--gin.DataConfig.prefix_length=64", "--gin.SeqioData.continuation_length=32",
                 "--gin.rankgen_task_options.group_size=8", "--gin.rankgen_task_options.prefix_words=48",
                 "--gin.rankgen_task_options.max_continuation_words=24",
                 "--gin.TrainerConfig.num_steps=3", "--gin.TrainerConfig.log_every=1",
                 "--gin.TrainerConfig.eval_every=3", "--gin.TrainerConfig.eval_batches=1",
                 "--gin.OptimizerConfig.name='adamw'", "--gin.OptimizerConfig.learning_rate=1e-3"])
    assert code == 0, capsys.readouterr().err
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    assert [r["step"] for r in records if "eval/loss" in r] == [0, 3]
    # Trained from scratch: the task's tokenizer is saved with the model, which then loads and reads text.
    from pathlib import Path

    from rankgen_jax.checkpoints import native
    from rankgen_jax.resources import DEMO_VOCAB

    assert (Path(native.vocab_path(tmp_path)) / "spiece.model").read_bytes() == Path(DEMO_VOCAB).read_bytes()


def test_an_unregistered_task_says_which_module_registers_the_project_tasks():
    pytest.importorskip("seqio")
    with pytest.raises(RankgenError, match="no seqio task or mixture named 'rankgen_no_such_task' is registered; "
                                           "the project's tasks are registered by `import tasks`"):
        make_sources(DataConfig(SeqioData(task="rankgen_no_such_task")))
