"""The trainer end to end: outputs, SIGKILL resume reproducing losses, SIGTERM save, guards and clear errors."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.models.configs import ModelConfig, t5_config
from rankgen_jax.train.metric_writers import read_metrics
from rankgen_jax.models.factory import init_params

RANDOM_IDS = ["--gin.DataConfig.source=@RandomData()", "--gin.RandomData.vocab_size=128",
              "--gin.RandomData.continuation_length=8"]
# Tiny model on random ids: fast steps, so the subprocess tests spend their time on real work. TINY_MODEL: the same
# without the data source, for tests that choose one.
TINY = [
    "--gin_file=models/t5_1_1_tiny.gin",
    "--gin.t5_config.vocab_size=128",
    *RANDOM_IDS,
    "--gin.DataConfig.batch_size=8",
    "--gin.DataConfig.prefix_length=16",
    "--gin.OptimizerConfig.name='adamw'",
    "--gin.OptimizerConfig.learning_rate=0.001",
    "--gin.TrainerConfig.log_every=1",
]
TINY_MODEL = [arg for arg in TINY if arg not in RANDOM_IDS]


def _losses_by_step(workdir: Path, name: str = "metrics.jsonl") -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for record in read_metrics(workdir / name):
        if "train/loss" in record:
            out.setdefault(record["step"], []).append(record["train/loss"])
    return out


def _train_cmd(workdir, *extra):
    return [sys.executable, "-m", "rankgen_jax.cli.main", "train", f"--workdir={workdir}", *TINY, *extra]


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """Environment for the trainer subprocesses: a persistent compilation cache, so only the first one compiles."""
    return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def _wait_for_checkpoint(workdir: Path, step: int, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (workdir / "checkpoints" / str(step)).is_dir() or proc.poll() is not None:
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint {step} after {timeout}s")


def test_in_process_run_writes_everything(tmp_path, capsys):
    code = main(["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=6",
                 "--gin.TrainerConfig.eval_every=3", "--gin.TrainerConfig.checkpoint_every=3",
                 "--gin.TrainerConfig.profile_start_step=2", "--gin.TrainerConfig.profile_num_steps=2"])
    assert code == 0, capsys.readouterr().err
    records = read_metrics(tmp_path / "metrics.jsonl")
    train = [r for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in evals] == [0, 3, 6]  # step 0: the starting point
    for key in ("train/loss", "train/accuracy", "train/positive_score", "train/negative_score",
                "train/grad_norm", "train/learning_rate"):
        assert np.isfinite(train[-1][key]), key
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert "TrainerConfig.num_steps = 6" in (tmp_path / "config.gin").read_text()
    assert "OptimizerConfig" in (tmp_path / "operative_config.gin").read_text()
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [3, 6]
    config, params = native.restore_params(tmp_path)
    assert config.encoder.vocab_size == 128 and "projection_layer" in params
    assert list((tmp_path / "profile").rglob("*.xplane.pb")), "profiler trace missing"


def test_sigkill_then_resume_reproduces_losses(tmp_path, cache_env):
    steps = 40
    common = [f"--gin.TrainerConfig.num_steps={steps}", "--gin.TrainerConfig.checkpoint_every=2"]
    reference = tmp_path / "reference"
    subprocess.run(_train_cmd(reference, *common), check=True, capture_output=True, timeout=300, env=cache_env)
    ref = _losses_by_step(reference)
    assert sorted(ref) == list(range(1, steps + 1))

    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(_train_cmd(interrupted, *common), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=cache_env)
    _wait_for_checkpoint(interrupted, 10, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    before = _losses_by_step(interrupted)
    assert 10 <= max(before) < steps, "the kill must land mid-run"

    resumed = subprocess.run(_train_cmd(interrupted, *common), capture_output=True, text=True, timeout=300,
                             env=cache_env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    after = _losses_by_step(interrupted)
    # One row per step: the rows the killed run wrote after its last checkpoint were set aside, not repeated.
    assert {step: len(v) for step, v in after.items()} == {step: 1 for step in range(1, steps + 1)}
    superseded = _losses_by_step(interrupted, "metrics_superseded.jsonl")
    resumed_from = int(resumed.stderr.split("resuming from")[1].split()[0].rsplit("/", 1)[1])
    assert sorted(superseded) == [step for step in sorted(before) if step > resumed_from]
    assert superseded, "the kill must land after a checkpoint's step, so that some steps are trained again"
    # Every logged loss, before the kill (kept or set aside) and after the resume, equals the uninterrupted run's.
    for step, values in [*after.items(), *superseded.items()]:
        np.testing.assert_allclose(values, [ref[step][0]] * len(values), rtol=1e-6, err_msg=f"step {step}")


def test_sigterm_saves_and_exits_zero(tmp_path, cache_env):
    proc = subprocess.Popen(_train_cmd(tmp_path, "--gin.TrainerConfig.num_steps=100000",
                                       "--gin.TrainerConfig.checkpoint_every=5"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cache_env)
    _wait_for_checkpoint(tmp_path, 5, proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: saved step" in err
    saved = max(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    logged = max(_losses_by_step(tmp_path))
    assert saved == logged >= 5


def test_nonfinite_guard_skips_then_stops(tmp_path, capsys):
    # A logit scale that overflows float32 makes every loss and gradient non-finite.
    code = main(["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=20",
                 "--gin.LossConfig.logit_scale=1e39", "--gin.OptimizerConfig.max_consecutive_nonfinite=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the last 3 steps had NaN/Inf gradients" in err


def test_init_checkpoint_supplies_the_encoder(tmp_path, capsys):
    bare = ModelConfig(encoder=t5_config("tiny", vocab_size=128), head=None)
    params = init_params(bare, seed=7)
    native.save_params(tmp_path / "imported", bare, params)
    code = main(["train", f"--workdir={tmp_path / 'run'}", *TINY, "--gin.TrainerConfig.num_steps=1",
                 f"--gin.TrainerConfig.init_checkpoint='{tmp_path / 'imported'}'",
                 "--gin.OptimizerConfig.learning_rate=1e-30"])
    assert code == 0, capsys.readouterr().err
    config, trained = native.restore_params(tmp_path / "run")
    assert config.head is not None and "projection_layer" in trained
    np.testing.assert_array_equal(trained["token_embedder"]["embedding"], params["token_embedder"]["embedding"])
    np.testing.assert_array_equal(trained["encoder"]["layers_1"]["mlp"]["wo"]["kernel"],
                                  params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"])


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--gin.TrainerConfig.num_stepz=3"], "num_stepz"),
        (["--gin.TrainerConfg.num_steps=3"], "TrainerConfg"),
        (["--gin_file=no_such_file.gin"], "no_such_file.gin"),
        (["--gin.DataConfig.batch_size=12"], "batch size 12 is not divisible by the data axis (8)"),
        (["--gin.TrainerConfig.num_chunks=2", "--gin.DataConfig.batch_size=8"], "num_chunks"),
        (["--gin.LossConfig.name='listnet'"], "unknown loss"),
    ],
)
def test_config_errors_are_clear(tmp_path, capsys, args, fragment):
    code = main(["train", f"--workdir={tmp_path}", *TINY, *args])
    err = capsys.readouterr().err
    assert code == 2
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], err
    assert not (tmp_path / "checkpoints").exists()


def test_data_errors_reach_the_loop():
    from rankgen_jax.train.loop import prefetch_batches

    class Broken:
        batch_size = 8

        def batch(self, index, rows=None):
            if index == 2:
                raise ValueError("bad record at batch 2")
            return {"x": np.full((8, 1), index)}

    got = []
    with pytest.raises(ValueError, match="bad record at batch 2"):
        for batch in prefetch_batches(Broken(), 0, 5, lambda b: b):
            got.append(int(batch["x"][0, 0]))
    assert got == [0, 1]


# The README's training example, made cheap: its gin file's model, data source, loss and schedule with smaller
# batches and sequences.
README_EXAMPLE = ["--gin_file=rankgen_t5_tiny_books.gin", "--gin.DataConfig.batch_size=8",
                  "--gin.DataConfig.prefix_length=32", "--gin.BooksData.continuation_length=16",
                  "--gin.TrainerConfig.log_every=1", "--gin.TrainerConfig.eval_every=0"]


def test_readme_example_decays_over_the_steps_it_runs(tmp_path, capsys):
    """The README's example once trained steps 200-500 at learning rate 0 (its schedule ended at 200): the schedule
    now ends at TrainerConfig.num_steps, whatever the run's length; a shorter one set on purpose is refused."""
    steps = 210  # more than the 200 its gin file once decayed over
    code = main(["train", f"--workdir={tmp_path / 'run'}", *README_EXAMPLE, f"--gin.TrainerConfig.num_steps={steps}",
                 f"--gin.TrainerConfig.checkpoint_every={steps}"])
    assert code == 0, capsys.readouterr().err
    logged = {r["step"]: r["train/learning_rate"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
              if "train/learning_rate" in r}
    assert sorted(logged) == list(range(1, steps + 1))
    # Logged at step s: the rate step s-1's update used; warmup of 10 steps, then linear from 1e-3 to 0 at `steps`.
    expected = {s: 1e-3 * ((s - 1) / 10 if s - 1 < 10 else (steps - (s - 1)) / (steps - 10)) for s in logged}
    np.testing.assert_allclose([logged[s] for s in sorted(logged)], [expected[s] for s in sorted(logged)],
                               rtol=1e-5, atol=1e-12)
    assert logged[steps] > 0 and all(logged[s] > 0 for s in range(2, steps + 1))

    code = main(["train", f"--workdir={tmp_path / 'refused'}", *README_EXAMPLE, "--gin.TrainerConfig.num_steps=500",
                 "--gin.OptimizerConfig.total_steps=200"])
    err = capsys.readouterr().err
    assert code == 2
    assert "OptimizerConfig.total_steps=200" in err and "TrainerConfig.num_steps=500" in err, err
    assert not (tmp_path / "refused" / "checkpoints").exists()


# --- configuration errors at the boundary --------------------------------------------------------------------------


@pytest.fixture
def no_gin_file(tmp_path) -> str:
    """A --gin_file argument that binds nothing (without one, `train` runs the demo's config)."""
    (tmp_path / "empty.gin").write_text("# bindings come from the command line\n")
    return f"--gin_file={tmp_path / 'empty.gin'}"


@pytest.mark.parametrize("args,fragment", [
    # A head binding without ModelConfig.head = @HeadConfig() would train another head.
    (["--gin.ModelConfig.encoder=@t5_config()", "--gin.t5_config.size='tiny'", "--gin.t5_config.vocab_size=128",
      *RANDOM_IDS, "--gin.HeadConfig.pooling='mean'"],
     "gin binds HeadConfig.pooling, which nothing in this run reads (a head comes from ModelConfig.head = "
     "@HeadConfig())"),
    ([*TINY, "--gin.BertConfig.num_layers=3"], "gin binds BertConfig.num_layers, which nothing in this run reads"),
    ([*TINY, "--gin.JobConfig.export=False"], "JobConfig is read by `rankgen-jax train --job`"),
    ([*TINY, "--gin.BooksData.holdout_documents=3"],
     "gin binds BooksData.holdout_documents, which nothing in this run reads (a source's settings are read when "
     "DataConfig.source = @BooksData())"),
    # Gin files of earlier versions, whose one DataConfig held every source's fields: the replacement is named.
    ([*TINY, "--gin.DataConfig.holdout_documents=3"],
     "DataConfig.holdout_documents is a setting of the data source's own config now: bind "
     "ExamplesData.holdout_documents or BooksData.holdout_documents, with DataConfig.source = @ExamplesData() or "
     "@BooksData()"),
    ([*TINY_MODEL, "--gin.DataConfig.source='random'"],
     "DataConfig.source='random': a source is now its config object, DataConfig.source = @RandomData()"),
    ([*TINY, "--gin.OptimizerConfig.schedule='cosine'", "--gin.OptimizerConfig.total_steps=4",
      "--gin.TrainerConfig.num_steps=6"], "OptimizerConfig.total_steps=4 ends the cosine decay before "
                                          "TrainerConfig.num_steps=6"),
])
def test_bindings_that_would_change_nothing_are_errors(tmp_path, capsys, args, fragment, no_gin_file):
    code = main(["train", f"--workdir={tmp_path}", no_gin_file, "--gin.DataConfig.batch_size=8", *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err, err
    assert not (tmp_path / "checkpoints").exists()


def test_a_chosen_vocabulary_is_kept_with_an_init_checkpoint(tmp_path, capsys, spiece_model):
    """BooksData.vocab unset: the checkpoint's tokenizer; set (under gin too): the one chosen."""
    from rankgen_jax.resources import DEMO_VOCAB

    bare = ModelConfig(encoder=t5_config("tiny", vocab_size=1024), head=None)
    native.save_params(tmp_path / "imported", bare, init_params(bare, seed=3), vocab=spiece_model)
    books = [*TINY_MODEL, "--gin.t5_config.vocab_size=1024", "--gin.DataConfig.source=@BooksData()",
             "--gin.DataConfig.prefix_length=32", "--gin.BooksData.continuation_length=16",
             f"--gin.TrainerConfig.init_checkpoint='{tmp_path / 'imported'}'", "--gin.TrainerConfig.num_steps=1"]
    code = main(["train", f"--workdir={tmp_path / 'chosen'}", *books, f"--gin.BooksData.vocab='{DEMO_VOCAB}'"])
    err = capsys.readouterr().err
    assert code == 2 and "the data's vocabulary has 8000 ids but the model's embedding has 1024 rows" in err, err
    assert str(DEMO_VOCAB) in err
    assert main(["train", f"--workdir={tmp_path / 'own'}", *books]) == 0, capsys.readouterr().err
    vocab = Path(native.vocab_path(tmp_path / "own"))
    assert [p.read_bytes() for p in vocab.iterdir()] == [Path(spiece_model).read_bytes()]


def test_the_encoder_follows_the_init_checkpoint(tmp_path, capsys, no_gin_file):
    """A BERT checkpoint under gin's default (T5) encoder: the run takes the checkpoint's, pooler head included;
    gin encoder bindings must describe the checkpoint, except runtime settings, which apply."""
    import json

    from rankgen_jax.pretrained import resolve_model
    from rankgen_jax.models.configs import BertConfig

    bert = BertConfig(d_model=32, d_ff=64, num_layers=1, num_heads=4, max_position_embeddings=64)
    bare = ModelConfig(encoder=bert, head=None)
    native.save_params(tmp_path / "bert", bare, init_params(bare, seed=4), vocab=resolve_model("minilm"))
    lists = tmp_path / "lists.jsonl"
    lists.write_text("".join(json.dumps({"query": f"query {i}", "candidates": [f"right {i}", f"wrong {i}"],
                                         "labels": [1, 0]}) + "\n" for i in range(16)))
    ranker = [no_gin_file, "--gin.ModelConfig.kind='cross_encoder'", "--gin.ModelConfig.head=@HeadConfig()",
              "--gin.HeadConfig.pooling='pooler'", "--gin.HeadConfig.projection_dim=0",
              "--gin.DataConfig.source=@ListsData()", f"--gin.ListsData.train_file='{lists}'",
              "--gin.DataConfig.batch_size=8", "--gin.DataConfig.prefix_length=16",
              "--gin.ListsData.continuation_length=8", "--gin.LossConfig.name='listmle'",
              f"--gin.TrainerConfig.init_checkpoint='{tmp_path / 'bert'}'", "--gin.TrainerConfig.num_steps=1"]
    assert main(["train", f"--workdir={tmp_path / 'run'}", *ranker, "--gin.BertConfig.dropout_rate=0.2",
                 "--gin.ModelConfig.encoder=@BertConfig()"]) == 0, capsys.readouterr().err
    trained = native.load_model_config(tmp_path / "run")
    assert trained.encoder == dataclasses.replace(bert, dropout_rate=0.2) and trained.head.pooling == "pooler"
    code = main(["train", f"--workdir={tmp_path / 'other'}", *ranker, "--gin_file=models/t5_1_1_tiny.gin"])
    err = capsys.readouterr().err
    assert code == 2 and "holds a bert encoder (1 layers, d_model 32); the gin config binds ModelConfig.encoder, " \
                         "t5_config.size, t5_config.version, which build a T5 encoder" in err, err
    code = main(["train", f"--workdir={tmp_path / 'deeper'}", *ranker, "--gin.ModelConfig.encoder=@BertConfig()",
                 "--gin.BertConfig.num_layers=3"])
    err = capsys.readouterr().err
    assert code == 2 and "differ from it (d_model=384 where the checkpoint has 32" in err, err
    assert "num_layers=3 where the checkpoint has 1" in err


def test_a_time_budgeted_run_counts_steps(tmp_path, capsys):
    """The bar of a time-budgeted run shows steps, steps per minute and the budget's time left, not seconds."""
    code = main(["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=100000",
                 "--gin.TrainerConfig.max_minutes=0.01", "--gin.OptimizerConfig.schedule='linear'"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert re.search(r"train \(\d+\.\d steps/min, 0:00 of 0.01 min left\): \d+ steps \[", err), err
    assert "ends at step 100000; the time budget may stop the run before that" in err
    assert re.search(r"time budget of 0.01 minutes used: saved step \d+ \(learning rate [\d.e-]+: the linear schedule "
                     r"ends at step 100000\)", err), err
