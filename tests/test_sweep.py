"""Ablation grids: expansion into runs, TPU launch lines, the report table, and every ablation gin file parses."""

import ast
import json
import os
import signal
import threading
import time

import gin
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.train.gin_parsing import GIN_SEARCH_PATH, parse_gin
from rankgen_jax.experiments.gin_runs import experiment_configurables
from rankgen_jax.train.metric_writers import read_metrics
from rankgen_jax.experiments.sweep import expand_grid, read_grid, report, run_sweep, train_command

ABLATIONS = GIN_SEARCH_PATH / "ablations"


PRODUCT_GRID = {"gin_files": ["demo_minilm.gin"], "bindings": ["TrainerConfig.max_minutes = 1.5"],
                "axes": {"DataConfig.batch_size": [8, 32, 128], "ExamplesData.same_document": [True, False]},
                "per_run": {"DataConfig.batch_size=128": ["TrainerConfig.num_chunks = 4"]}, "job": True}


def test_grid_expands_to_every_combination():
    runs = expand_grid(PRODUCT_GRID)
    assert len(runs) == 6 and len({r["name"] for r in runs}) == 6
    big = next(r for r in runs if r["name"] == "batch_size-128__same_document-false")
    assert "DataConfig.batch_size = 128" in big["bindings"] and "ExamplesData.same_document = False" in big["bindings"]
    assert "TrainerConfig.num_chunks = 4" in big["bindings"]
    assert big["changed"] == {"DataConfig.batch_size": 128, "ExamplesData.same_document": False}
    small = next(r for r in runs if r["name"] == "batch_size-8__same_document-true")
    assert "TrainerConfig.num_chunks = 4" not in small["bindings"]
    argv = train_command(PRODUCT_GRID, big, "runs/grid/")
    assert argv[:4] == ["rankgen-jax", "train", "--workdir", "runs/grid/batch_size-128__same_document-false"]
    assert "--gin.DataConfig.batch_size=128" in argv and argv[-1] == "--job"


def test_shipped_cpu_grid_is_one_factor_at_a_time():
    grid = read_grid(str(ABLATIONS / "grid_demo_cpu.json"))
    runs = expand_grid(grid)
    # The baseline, then each other value of each axis alone: 1 + sum(len(values) - 1) runs, not the product.
    assert len(runs) == 1 + sum(len(v) - 1 for v in grid["axes"].values())
    assert runs[0]["name"] == "baseline" and runs[0]["changed"] == {}
    for run in runs[1:]:
        (axis, value), = run["changed"].items()
        assert value != grid["baseline"][axis]
        assert run["name"] == f"{axis.split('.')[-1]}-{str(value).lower()}"
        others = [f"{a} = {v}" for a, v in grid["baseline"].items() if a != axis]
        assert all(any(b.lower() == o.lower() for b in run["bindings"]) for o in others), run["name"]
    by_name = {r["name"]: r["bindings"] for r in runs}
    # Bindings apply in order and the last wins: per-run overrides come after the shared ones.
    assert by_name["batch_size-128"][-3:] == ["TrainerConfig.num_chunks = 4", "TrainerConfig.num_steps = 3",
                                              "OptimizerConfig.warmup_steps = 1"]
    assert "JobConfig.zero_shot = True" in by_name["baseline"]
    assert all("JobConfig.zero_shot = True" not in b for n, b in by_name.items() if n != "baseline")
    for run in runs:  # every run's bindings are valid gin for the demo's configurables
        parse_gin(grid["gin_files"], run["bindings"], experiment_configurables)
        gin.clear_config()


def test_bad_baselines(tmp_path):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"axes": {"a.b": [1, 2], "a.c": [True]}, "baseline": {"a.b": 1}}))
    with pytest.raises(RankgenError, match="one value for each axis"):
        read_grid(str(path))
    path.write_text(json.dumps({"axes": {"a.b": [1, 2]}, "baseline": {"a.b": 3}}))
    with pytest.raises(RankgenError, match=r"baseline a.b=3 is not one of the axis values \[1, 2\]"):
        read_grid(str(path))


def test_report_dir_needs_local_runs():
    with pytest.raises(RankgenError, match="`report_dir` needs the runs' results here"):
        run_sweep(str(ABLATIONS / "grid_demo_cpu.json"), "gs://bucket/sweep", tpu_name="v3", report_dir="out")


def test_tpu_launch_lines(capsys):
    runs = run_sweep(str(ABLATIONS / "grid_paper_tpu.json"), "gs://bucket/sweep", tpu_name="rankgen-v3",
                     tpu_args=["--zone=europe-west4-a"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(runs) == 6
    assert all(l.startswith("python3 tpu_scripts/tpu.py launch --dry_run --name rankgen-v3 --zone=europe-west4-a -- train")
               for l in lines)
    assert any("SeqioData.task=" in l and "rankgen_pg19_generative" in l for l in lines)
    assert all(" --workdir gs://bucket/sweep/task-rankgen_pg19_" in l for l in lines)


def test_bad_grids(tmp_path):
    path = tmp_path / "grid.json"
    path.write_text('{"axes": {}}')
    with pytest.raises(RankgenError, match="non-empty list"):
        read_grid(str(path))
    path.write_text('{"axis": {"a": [1]}}')
    with pytest.raises(RankgenError, match="expected an object with keys"):
        read_grid(str(path))
    with pytest.raises(RankgenError, match="no such grid file"):
        read_grid(str(tmp_path / "none.json"))


def test_report_table_and_plot(tmp_path):
    job = tmp_path / "a"
    job.mkdir()
    (job / "results.json").write_text(json.dumps({
        "fine_tuned": {"n": 150, "accuracy_2way": 0.8, "accuracy_11way": 0.5},
        "zero_shot": {"n": 150, "accuracy_2way": 0.7}, "train": {"steps": 12.0, "loss": 1.5}}))
    plain = tmp_path / "b"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text(
        json.dumps({"step": 5, "train/loss": 2.0}) + "\n" + json.dumps({"step": 5, "eval/accuracy": 0.25}) + "\n")
    table = report([str(job), str(plain)], out=str(tmp_path / "t.md"), plot=str(tmp_path / "p.png"))
    lines = table.splitlines()
    assert lines[0].startswith("| run | accuracy_11way | accuracy_2way")
    assert "| a | 0.500 | 0.800 |" in lines[2] and lines[3].startswith("| b |")
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "t.md").read_text().strip() == table
    with pytest.raises(RankgenError, match="not a training workdir"):
        report([str(tmp_path)])


@pytest.mark.parametrize("name", sorted(p.name for p in ABLATIONS.glob("*.gin")))
def test_ablation_gin_files_parse(name):
    base = "pipelines/demo_minilm.gin" if name.startswith(("distill", "curriculum")) else "rankgen_t5_tiny_books.gin"
    parse_gin([base, f"ablations/{name}"], [], experiment_configurables)
    # Every binding the ablation file makes is what gin now holds (the file wins over the base).
    bindings = [line.split("=", 1) for line in (ABLATIONS / name).read_text().splitlines()
                if "=" in line and not line.startswith(("#", "include"))]
    if name.startswith("model_"):  # these only include a model file: its size is what gin holds
        bindings = [("t5_config.size", repr(name.removeprefix("model_").removesuffix(".gin")))]
    for key, value in bindings:
        held = gin.query_parameter(key.strip())
        if value.strip().startswith("@"):  # a configurable reference, e.g. DataConfig.source = @SeqioData()
            assert repr(held) == value.strip(), key
        else:
            assert held == ast.literal_eval(value.strip()), key


def test_local_sweep_trains_in_process_and_names_the_failed_run(tmp_path, capsys):
    grid = {"gin_files": ["models/t5_1_1_tiny.gin"],
            "bindings": ["t5_config.vocab_size = 128", "DataConfig.source = @RandomData()", "RandomData.vocab_size = 128",
                         "DataConfig.batch_size = 8", "DataConfig.prefix_length = 16",
                         "RandomData.continuation_length = 8", "TrainerConfig.num_steps = 2"],
            "axes": {"LossConfig.name": ["in_batch_softmax", "no_such_loss"]}}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    for attempt in range(2):
        with pytest.raises(RankgenError) as error:
            run_sweep(str(path), str(tmp_path / "runs"))
        message = str(error.value)
        assert message.startswith("run name-no_such_loss failed: ") and "no_such_loss" in message[30:]
        assert message.endswith("; rerun the sweep to resume it") and "\n" not in message
        err = capsys.readouterr().err
        # The first run trains once; the rerun finds it done and goes on to the failed one.
        assert ("name-in_batch_softmax: done earlier" in err) == (attempt == 1)
    done = tmp_path / "runs" / "name-in_batch_softmax" / "sweep_done"
    assert done.read_text().startswith("rankgen-jax train --workdir ")
    assert max(r["step"] for r in read_metrics(done.parent / "metrics.jsonl")) == 2
    assert not (tmp_path / "runs" / "name-no_such_loss" / "sweep_done").exists()
    assert gin.config_str() == ""  # no run's bindings outlive it


def test_sigterm_stops_the_sweep_without_marking_the_run_done(tmp_path, capsys):
    """SIGTERM mid-run: the run saves and the sweep stops there, neither evaluating the partly trained model nor
    marking it done, so that a rerun resumes it."""
    grid = {"gin_files": ["models/t5_1_1_tiny.gin"],
            "bindings": ["t5_config.vocab_size = 8064", "DataConfig.source = @ExamplesData()", "DataConfig.batch_size = 8",
                         "DataConfig.prefix_length = 24", "ExamplesData.continuation_length = 16",
                         "ExamplesData.prefix_words = 48", "ExamplesData.max_continuation_words = 16",
                         "ExamplesData.holdout_documents = 2", "TrainerConfig.num_steps = 100000",
                         "TrainerConfig.checkpoint_every = 2", "JobConfig.suffix_eval_examples = 4",
                         "JobConfig.plot = False", "JobConfig.export = False"],
            "axes": {"LossConfig.logit_scale": [20.0, 10.0]}, "job": True}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    first = tmp_path / "runs" / "logit_scale-20.0"

    def send_sigterm_after_a_checkpoint():
        deadline = time.time() + 600
        while time.time() < deadline and not any(p.name.isdigit() for p in (first / "train" / "checkpoints").glob("*")):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_sigterm_after_a_checkpoint, daemon=True)
    sender.start()
    run_sweep(str(path), str(tmp_path / "runs"), report_dir=str(tmp_path / "report"))
    sender.join()
    err = capsys.readouterr()
    assert "[sweep] logit_scale-20.0: stopped by SIGTERM; rerun the sweep to resume it" in err.err
    assert "[job] stopped by SIGTERM at step" in err.out
    assert not (first / "sweep_done").exists() and not (tmp_path / "runs" / "logit_scale-10.0").exists()
    results = json.loads((first / "results.json").read_text())
    assert results["train"]["preempted"] == 1.0 and "fine_tuned" not in results
    assert not (tmp_path / "report").exists()
