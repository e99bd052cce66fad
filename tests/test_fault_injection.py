"""Fault injection: SIGKILL at any moment, damaged checkpoints, NaN/Inf steps.

- a kill in the middle of an async checkpoint write resumes from the last complete step;
- a damaged latest checkpoint (array file truncated or removed, bytes flipped, data item removed)
  is named, set aside as `<step>.damaged`, and the previous step is used;
- no restorable step (a config that does not fit the checkpoints) is one clear error, nothing renamed;
- ten SIGKILL/resume cycles at seeded random moments end at the uninterrupted run's exact parameters;
- one NaN step is skipped and counted; N in a row stop the run with exit code 2 and a checkpoint
  holding the parameters from before the streak, which resumes.

The subprocess tests share a persistent JAX compilation cache (a session tmp folder), so each
process start costs imports and a cache read, not a compile.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.losses import registry as losses
from rankgen_jax.losses.spec import LossSpec
from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.cli.main import main
from rankgen_jax.data.source_configs import DataConfig, RandomData
from rankgen_jax.data.sources import make_sources
from rankgen_jax.models.batch_layout import TRIPLES
from rankgen_jax.train.metric_writers import read_metrics

from test_trainer import TINY, _losses_by_step

TMP = ".orbax-checkpoint-tmp"
# The run the kill tests interrupt: a save every 3 steps keeps Orbax writing much of the time.
RUN = [*TINY, "--gin.TrainerConfig.num_steps=45", "--gin.TrainerConfig.checkpoint_every=3"]


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """Environment for trainer subprocesses: one CPU device, a compilation cache shared by this module's runs."""
    cache = tmp_path_factory.mktemp("jax_cache")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _cmd(workdir, *args):
    return [sys.executable, "-m", "rankgen_jax.cli.main", "train", f"--workdir={workdir}", *args]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_env) -> Path:
    """The uninterrupted run (it also fills the compilation cache for the runs that get killed)."""
    workdir = tmp_path_factory.mktemp("reference")
    subprocess.run(_cmd(workdir, *RUN), check=True, capture_output=True, timeout=300, env=cache_env)
    return workdir


def _steps(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _tmp_folders(workdir: Path) -> list[str]:
    folder = workdir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if TMP in p.name) if folder.is_dir() else []


def _files_under(path: Path) -> int:
    try:
        return sum(len(files) for _, _, files in os.walk(path))
    except OSError:
        return 0


def _train_lines(workdir: Path) -> int:
    path = workdir / "metrics.jsonl"
    return path.read_text().count('"train/loss"') if path.exists() else 0


def _kill_during_write(proc, workdir: Path, min_files: int, timeout: float = 120) -> str | None:
    """SIGKILL once a save has >= min_files files in its temporary folder; the folder's name, or None.

    Call it once the process has logged a step: by then it has deleted any
    temporary folder an earlier killed run left (Orbax does on start-up), so
    a temporary folder is one of its own saves.
    """
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        for name in _tmp_folders(workdir):
            if _files_under(workdir / "checkpoints" / name) >= min_files:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
                return name
        time.sleep(0.002)
    return None


def _wait_for_progress(proc, workdir: Path, lines_before: int, timeout: float = 120) -> None:
    """Until this process has logged a training step of its own (or exited)."""
    deadline = time.time() + timeout
    while proc.poll() is None and _train_lines(workdir) <= lines_before and time.time() < deadline:
        time.sleep(0.01)


def _assert_same_params(workdir: Path, reference: Path, step: int) -> None:
    _, got = native.restore_params(workdir, step)
    _, want = native.restore_params(reference, step)
    paths = jax.tree_util.tree_leaves_with_path(want)
    assert len(paths) == len(jax.tree_util.tree_leaves(got))
    for (path, expected), actual in zip(paths, jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(actual, expected, err_msg=jax.tree_util.keystr(path))


def _saved_digest(workdir: Path, step: int) -> dict:
    return json.loads((workdir / "checkpoints" / str(step) / "data" / "metadata").read_text())["digest"]


# --- kills ------------------------------------------------------------------------------------


def test_kill_during_an_async_checkpoint_write_resumes_from_the_last_complete_step(tmp_path, reference, cache_env):
    workdir = tmp_path / "run"
    proc = subprocess.Popen(_cmd(workdir, *RUN), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cache_env)
    _wait_for_progress(proc, workdir, 0)
    killed_in = _kill_during_write(proc, workdir, min_files=4)
    assert killed_in is not None and proc.returncode == -signal.SIGKILL
    # The save was cut short: its temporary folder is still there, and Orbax does not list it as a step.
    assert killed_in in _tmp_folders(workdir)
    cut = int(killed_in.split(".")[0])
    assert cut not in _steps(workdir)
    last_complete = max([s for s in _steps(workdir) if s < cut], default=None)

    resumed = subprocess.run(_cmd(workdir, *RUN), capture_output=True, text=True, timeout=300, env=cache_env)
    assert resumed.returncode == 0, resumed.stderr
    if last_complete is None:
        assert "resuming from" not in resumed.stderr
    else:
        assert f"resuming from {workdir}/checkpoints/{last_complete}\n" in resumed.stderr
    assert "cannot restore" not in resumed.stderr and "damaged" not in resumed.stderr
    assert _tmp_folders(workdir) == []  # the unfinished save was cleaned up
    _assert_same_params(workdir, reference, 45)


def test_ten_sigkills_end_at_the_uninterrupted_params(tmp_path, reference, cache_env):
    """SIGKILL at seeded random moments: during start-up, mid-training, or mid-checkpoint-write."""
    rng = random.Random(20240609)
    workdir = tmp_path / "run"
    kills, cut_saves = 0, 0
    for cycle in range(10):
        mode = ["startup", "training", "write"][cycle % 3] if cycle < 3 else rng.choice(["startup", "training", "write"])
        lines_before = _train_lines(workdir)
        proc = subprocess.Popen(_cmd(workdir, *RUN), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=cache_env)
        if mode == "startup":  # imports, compile-cache reads, restore
            time.sleep(rng.uniform(0.5, 3.0))
        elif mode == "training":
            _wait_for_progress(proc, workdir, lines_before)
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            _wait_for_progress(proc, workdir, lines_before)
            if _kill_during_write(proc, workdir, min_files=rng.randint(0, 12)):
                cut_saves += 1
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=60)
        kills += code == -signal.SIGKILL
        assert code in (0, -signal.SIGKILL), f"cycle {cycle} ({mode}): exit code {code}"
    assert kills >= 8 and cut_saves >= 2, (kills, cut_saves)

    final = subprocess.run(_cmd(workdir, *RUN), capture_output=True, text=True, timeout=300, env=cache_env)
    assert final.returncode == 0, final.stderr
    assert not [p for p in (workdir / "checkpoints").iterdir() if "damaged" in p.name]
    assert _tmp_folders(workdir) == []
    _assert_same_params(workdir, reference, 45)
    # The whole state (optimizer moments, step, rng) matches too: the digests saved with it are equal.
    assert _saved_digest(workdir, 45) == _saved_digest(reference, 45)
    # Every logged loss, whichever process logged it, is the uninterrupted run's.
    ref = _losses_by_step(reference)
    for step, values in _losses_by_step(workdir).items():
        np.testing.assert_allclose(values, [ref[step][0]] * len(values), rtol=1e-6, err_msg=f"step {step}")


# --- damaged checkpoints ------------------------------------------------------------------------

SHORT = [*TINY, "--gin.TrainerConfig.checkpoint_every=2"]


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> Path:
    """A run that saved steps 2, 4 and 6."""
    workdir = tmp_path_factory.mktemp("three_steps")
    assert main(["train", f"--workdir={workdir}", *SHORT, "--gin.TrainerConfig.num_steps=6"]) == 0
    assert _steps(workdir) == [2, 4, 6]
    return workdir


def _largest_array_file(step_dir: Path) -> Path:
    return max((step_dir / "params").rglob("d/*"), key=lambda p: p.stat().st_size)


def _truncate(step_dir: Path) -> None:
    f = _largest_array_file(step_dir)
    os.truncate(f, f.stat().st_size // 2)


def _remove_array_file(step_dir: Path) -> None:
    _largest_array_file(step_dir).unlink()


ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


def _flip_bytes(step_dir: Path) -> None:
    """Bytes changed in place: Orbax restores these without complaint, the saved digest does not match.

    The file holds one zstd frame per stored chunk, in an order that varies from save to save: the flip goes
    into the middle of the largest frame, where random floats sit in raw blocks that decode whatever they hold,
    never onto a frame's header (which zstd itself would reject).
    """
    f = _largest_array_file(step_dir)
    data = bytearray(f.read_bytes())
    starts, at = [], data.find(ZSTD_FRAME_MAGIC)
    while at >= 0:
        starts.append(at)
        at = data.find(ZSTD_FRAME_MAGIC, at + 1)
    starts = starts or [0]
    start, end = max(zip(starts, [*starts[1:], len(data)]), key=lambda span: span[1] - span[0])
    middle = (start + end) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    f.write_bytes(bytes(data))


def _remove_data_item(step_dir: Path) -> None:
    shutil.rmtree(step_dir / "data")


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys, three_steps):
    workdir = tmp_path / "run"
    shutil.copytree(three_steps, workdir)
    _truncate(workdir / "checkpoints" / "6")
    code = main(["train", f"--workdir={workdir}", *SHORT, "--gin.TrainerConfig.num_steps=8"])
    err = capsys.readouterr().err
    assert code == 0, err
    warning = next(l for l in err.splitlines() if l.startswith(f"warning: cannot restore {workdir}/checkpoints/6 ("))
    assert "checkpoints/6/params/" in warning and "trying the previous checkpoint" in warning
    assert f"warning: {workdir}/checkpoints/6 is damaged; moved it to 6.damaged" in err
    assert f"resuming from {workdir}/checkpoints/4\n" in err
    assert (workdir / "checkpoints" / "6.damaged").is_dir()  # kept for inspection, not deleted
    assert _steps(workdir) == [4, 6, 8]
    # Resumed from step 4, the run saved step 6 again: exactly the step the damage destroyed.
    _assert_same_params(workdir, three_steps, 6)


@pytest.fixture(scope="module")
def resume_from(three_steps):
    """checkpointing.resume for copies of `three_steps`, with its state's shapes and shardings (nothing compiled)."""
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.train import checkpointing
    from rankgen_jax.train.compiled import build_step_functions
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train.step import StepOptions

    mesh = partitioning.make_mesh(-1, 1)
    rules = partitioning.rules_by_name("standard")
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.001))
    setup = build_step_functions(native.load_model_config(three_steps), StepOptions(), tx, schedule, {}, mesh, rules,
                                 seed=0)

    def resume(workdir: Path):
        manager = native.step_manager(workdir, max_to_keep=3, writer=True)
        try:
            with jax.set_mesh(mesh):
                return checkpointing.resume(manager, RunFolder.at(workdir), setup.abstract_state, setup.shardings)
        finally:
            manager.close()

    return resume


@pytest.mark.parametrize("damage,fragment", [
    (_remove_array_file, "checkpoints/6/params/"),
    (_flip_bytes, "differ from the digest saved with them"),
    (_remove_data_item, "data"),
])
def test_other_damage_falls_back_too(tmp_path, capsys, three_steps, resume_from, damage, fragment):
    workdir = tmp_path / "run"
    shutil.copytree(three_steps, workdir)
    damage(workdir / "checkpoints" / "6")
    step, state, next_batch = resume_from(workdir)
    assert (step, int(state.step), next_batch) == (4, 4, 4)
    err = capsys.readouterr().err
    assert f"warning: cannot restore {workdir}/checkpoints/6 (" in err and fragment in err
    assert (workdir / "checkpoints" / "6.damaged").is_dir() and _steps(workdir) == [2, 4]
    _, params4 = native.restore_params(three_steps, 4)
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(state.params), params4)


def test_damage_in_the_optimizer_state_is_caught(tmp_path, capsys, three_steps, resume_from):
    workdir = tmp_path / "run"
    shutil.copytree(three_steps, workdir)
    step_dir = workdir / "checkpoints" / "6"
    f = max((step_dir / "train_state").rglob("d/*"), key=lambda p: p.stat().st_size)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert resume_from(workdir)[0] == 4
    assert "cannot restore" in capsys.readouterr().err
    # A second damaged step with the same number is set aside beside the first.
    shutil.copytree(three_steps / "checkpoints" / "6", step_dir)
    _flip_bytes(step_dir)
    assert resume_from(workdir)[0] == 4
    assert (workdir / "checkpoints" / "6.damaged.1").is_dir()


def test_bit_flips_are_caught_when_reading_params_too(tmp_path, three_steps):
    workdir = tmp_path / "run"
    shutil.copytree(three_steps, workdir)
    _flip_bytes(workdir / "checkpoints" / "6")
    from rankgen_jax.errors import RankgenError

    with pytest.raises(RankgenError, match=r"cannot read step 6 \(RankgenError: 1 of \d+ arrays differ"):
        native.restore_params(workdir)
    native.restore_params(workdir, 4)


def test_no_restorable_checkpoint_is_one_clear_error_and_renames_nothing(tmp_path, capsys, three_steps):
    workdir = tmp_path / "run"
    shutil.copytree(three_steps, workdir)
    # Another optimizer than the one that saved the steps: the run's record refuses it before anything restores.
    another_optimizer = ["train", f"--workdir={workdir}", *SHORT, "--gin.TrainerConfig.num_steps=8",
                         "--gin.OptimizerConfig.name='adafactor'"]
    assert main(another_optimizer) == 2
    assert "(OptimizerConfig.name 'adamw' -> 'adafactor'; recorded -> now)" in capsys.readouterr().err
    # A workdir from before run_config.json: its state does not fit the other optimizer at any step.
    (workdir / "run_config.json").unlink()
    code = main(another_optimizer)
    err = capsys.readouterr().err
    assert code == 2
    error = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and f"no checkpoint in {workdir}/checkpoints restores (step 6: " in error[0], err
    assert "step 4: " in error[0] and "step 2: " in error[0] and "config may differ" in error[0]
    assert "Traceback" not in err
    assert _steps(workdir) == [2, 4, 6] and not list((workdir / "checkpoints").glob("*.damaged"))


def test_digest_of_sharded_arrays_equals_the_host_digest():
    from jax.sharding import NamedSharding, PartitionSpec

    from rankgen_jax.runtime import partitioning

    mesh = partitioning.make_mesh(-1, 1)
    host = {"w": np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32), "step": np.array(7, np.int32),
            "bf": np.arange(10, dtype=np.float32).astype(jnp.bfloat16)}
    device = {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec("data") if k == "w" else PartitionSpec()))
              for k, v in host.items()}
    assert native.tree_digest(device) == native.tree_digest(host)
    moved = dict(host, w=host["w"][::-1].copy())  # same values, other places
    assert native.tree_digest(moved)["['w']"] != native.tree_digest(host)["['w']"]


# --- non-finite steps ---------------------------------------------------------------------------

NAN_LOSS = "test_nan_on_batches"


def _poison(monkeypatch, bad_batches: list[int], num_steps: int) -> None:
    """Register a loss that is in_batch_softmax, times NaN on the given batches (found by their token sum)."""
    train, _ = make_sources(DataConfig(RandomData(vocab_size=128, continuation_length=8), batch_size=8, prefix_length=16))
    sums = [int(train.batch(i)["query_ids"].sum()) for i in range(num_steps)]
    assert len(set(sums)) == num_steps  # the sum identifies the batch
    bad = jnp.array([sums[i] for i in bad_batches], jnp.int32)

    def nan_on_batches(outputs, batch, loss_params):
        loss, metrics = losses.in_batch_softmax_loss(outputs, batch, loss_params)
        poisoned = jnp.any(jnp.sum(batch["query_ids"]) == bad)
        return loss * jnp.where(poisoned, jnp.nan, 1.0), metrics

    monkeypatch.setitem(losses.LOSS_SPECS, NAN_LOSS, LossSpec(nan_on_batches, TRIPLES, ("dual_encoder",),
                                                              needs_full_batch=True, formula="in_batch_softmax's"))


def _train_records(workdir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(workdir / "metrics.jsonl") if "train/loss" in r}


def _params(workdir: Path, step: int) -> list[np.ndarray]:
    return jax.tree_util.tree_leaves(native.restore_params(workdir, step)[1])


def test_one_nonfinite_step_is_skipped_counted_and_training_goes_on(tmp_path, capsys, monkeypatch):
    _poison(monkeypatch, bad_batches=[2], num_steps=6)  # batch 2 is step 3
    code = main(["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=6",
                 "--gin.TrainerConfig.checkpoint_every=1", "--gin.TrainerConfig.keep_checkpoints=10",
                 f"--gin.LossConfig.name='{NAN_LOSS}'", "--gin.OptimizerConfig.max_consecutive_nonfinite=2"])
    assert code == 0, capsys.readouterr().err
    records = _train_records(tmp_path)
    assert [records[s]["train/nonfinite_skipped"] for s in range(1, 7)] == [0, 0, 1, 1, 1, 1]
    assert np.isnan(records[3]["train/loss"])
    assert all(np.isfinite(records[s]["train/loss"]) for s in (1, 2, 4, 5, 6))
    # Step 3 changed nothing; step 4 trained as usual.
    for before, after in zip(_params(tmp_path, 2), _params(tmp_path, 3)):
        np.testing.assert_array_equal(after, before)
    assert any(not np.array_equal(a, b) for a, b in zip(_params(tmp_path, 3), _params(tmp_path, 4)))
    assert all(np.all(np.isfinite(p)) for p in _params(tmp_path, 6))


def test_a_nonfinite_streak_stops_with_a_checkpoint_from_before_it(tmp_path, capsys, monkeypatch):
    _poison(monkeypatch, bad_batches=[3, 4, 5], num_steps=10)  # steps 4, 5 and 6
    args = ["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=10",
            "--gin.TrainerConfig.checkpoint_every=3", "--gin.OptimizerConfig.max_consecutive_nonfinite=3"]
    code = main([*args, f"--gin.LossConfig.name='{NAN_LOSS}'"])
    err = capsys.readouterr().err
    assert code == 2
    error = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(error) == 1, err
    assert "the last 3 steps had NaN/Inf gradients (steps 4-6; 3 skipped in all)" in error[0]
    assert f"{tmp_path}/checkpoints/6 holds the parameters from before them (those of step 3)" in error[0]
    assert _steps(tmp_path) == [3, 6]
    assert _train_records(tmp_path)[6]["train/nonfinite_skipped"] == 3
    for before, saved in zip(_params(tmp_path, 3), _params(tmp_path, 6)):
        np.testing.assert_array_equal(saved, before)

    # The advice works: the run resumes from that checkpoint and finishes. The poisoned loss
    # stays on, so a resume that replayed the streak's batches (3-5) would skip them again:
    # the checkpoint carries the index of the batch after the streak.
    code = main([*args, f"--gin.LossConfig.name='{NAN_LOSS}'", "--gin.OptimizerConfig.learning_rate=0.0005"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"resuming from {tmp_path}/checkpoints/6\n" in err
    records = _train_records(tmp_path)
    assert [records[s]["train/nonfinite_skipped"] for s in range(7, 11)] == [3, 3, 3, 3]
    assert all(np.isfinite(records[s]["train/loss"]) for s in range(7, 11))
