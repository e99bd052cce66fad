"""Multi-host readiness: bucket (gs://) workdirs through epath, and hosts agreeing on when to stop."""

import functools
import os
import sys
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from etils.epath import backend as epath_backend
from etils.epath import gpath

from rankgen_jax.runtime import partitioning
from rankgen_jax.train import checkpointing, stopping
from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.models.configs import ModelConfig, t5_config
from rankgen_jax.errors import RankgenError
from rankgen_jax.train.metric_writers import MetricWriter, read_metrics
from rankgen_jax.models.factory import init_params

from test_trainer import TINY


class FakeBucket(epath_backend._OsPathBackend):  # noqa: SLF001 - epath's own local backend, re-rooted
    """gs://NAME/... kept under a local root: a stand-in for GCS that, like GCS, cannot append."""

    def __init__(self, root: Path):
        self.root = root

    def local(self, path) -> str:
        path = os.fspath(path)
        assert path.startswith("gs://"), f"the fake bucket got a non-gs path {path!r}"
        return str(self.root / path[len("gs://"):])

    def url(self, local) -> str:
        return "gs://" + str(Path(local).relative_to(self.root))

    def open(self, path, mode):
        if "a" in mode:
            raise OSError(f"{path}: objects cannot be appended to")
        return super().open(self.local(path), mode)

    def exists(self, path):
        return super().exists(self.local(path))

    def isdir(self, path):
        return super().isdir(self.local(path))

    def listdir(self, path):
        return super().listdir(self.local(path))

    def glob(self, path):
        return [self.url(p) for p in super().glob(self.local(path))]

    def walk(self, top, **kwargs):
        for root, dirs, files in super().walk(self.local(top), **kwargs):
            yield self.url(root), dirs, files

    def makedirs(self, path, **kwargs):
        return super().makedirs(self.local(path), **kwargs)

    def mkdir(self, path, **kwargs):
        return super().mkdir(self.local(path), **kwargs)

    def rmtree(self, path):
        return super().rmtree(self.local(path))

    def remove(self, path):
        return super().remove(self.local(path))

    def rename(self, path, dst):
        return super().rename(self.local(path), self.local(dst))

    def replace(self, path, dst):
        return super().replace(self.local(path), self.local(dst))

    def copy(self, path, dst, overwrite):
        return super().copy(self.local(path), self.local(dst), overwrite=overwrite)

    def stat(self, path):
        return super().stat(self.local(path))


@pytest.fixture
def bucket(tmp_path, monkeypatch) -> FakeBucket:
    """gs:// routed to a local folder; the test runs in an empty cwd, where a mangled "gs:" folder would show."""
    fake = FakeBucket(tmp_path / "bucket_root")
    fake.root.mkdir()
    monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, "gs", fake)  # noqa: SLF001
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)  # else epath picks tf.io.gfile for gs://
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield fake
    assert not list(cwd.iterdir()), "a gs:// path became a local folder"


# --- paths -----------------------------------------------------------------------------------


def test_bucket_urls_stay_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert str(native.as_path("gs://bucket/run") / native.STEPS_DIR) == "gs://bucket/run/checkpoints"
    assert str(native.resolve("gs://bucket/run")) == "gs://bucket/run"  # epath's absolute() gives "<cwd>/gs:/..."
    assert str(native.resolve("run")) == str(tmp_path.resolve() / "run")
    assert native.is_remote("gs://bucket/run") and not native.is_remote(tmp_path / "run")
    assert native.as_path(native.as_path("gs://b/x")) == native.as_path("gs://b/x")


def test_checkpoint_metadata_on_a_bucket(bucket, tmp_path, monkeypatch):
    vocab = tmp_path / "my_tokenizer.model"
    vocab.write_bytes(b"\x00sentencepiece bytes\xff")
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=128))
    native.save_model_config("gs://bucket/ckpt", config, vocab=str(vocab))
    assert native.is_checkpoint_dir("gs://bucket/ckpt") and not native.is_checkpoint_dir("gs://bucket/other")
    assert native.load_model_config("gs://bucket/ckpt") == config
    assert native.vocab_path("gs://bucket/ckpt") == "gs://bucket/ckpt/vocab"
    assert native.require_vocab_path("gs://bucket/ckpt") == "gs://bucket/ckpt/vocab"
    with pytest.raises(RankgenError, match="gs://bucket/other: checkpoint has no tokenizer"):
        native.require_vocab_path("gs://bucket/other")
    assert native.spiece_path("gs://bucket/ckpt") == "gs://bucket/ckpt/vocab/spiece.model"
    assert (bucket.root / "bucket/ckpt/vocab/spiece.model").read_bytes() == vocab.read_bytes()
    # The trainer copies a bucket tokenizer to a local folder, since tokenizers read local files
    # only, and removes the copy at exit.
    at_exit = []
    monkeypatch.setattr(checkpointing.atexit, "register", lambda fn, *a, **k: at_exit.append((fn, a, k)))
    local = checkpointing.local_vocab(native.vocab_path("gs://bucket/ckpt"))
    assert not native.is_remote(local) and (Path(local) / "spiece.model").read_bytes() == vocab.read_bytes()
    assert len(at_exit) == 1
    fn, args, kwargs = at_exit[0]
    fn(*args, **kwargs)
    assert not Path(local).exists()
    assert checkpointing.local_vocab(str(tmp_path)) == str(tmp_path) and checkpointing.local_vocab(None) is None


def test_step_manager_keeps_the_bucket_url(bucket, monkeypatch):
    with pytest.raises(RankgenError, match="need the google-cloud-storage package"):
        native.step_manager("gs://bucket/run")
    # Orbax asks the bucket whether it has a hierarchical namespace: a stand-in client says no.
    storage = types.ModuleType("google.cloud.storage")
    storage.Client = lambda: types.SimpleNamespace(get_bucket=lambda name: types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "google.cloud.storage", storage)
    manager = native.step_manager("gs://bucket/run")
    try:
        assert str(manager.directory) == "gs://bucket/run/checkpoints"
        assert manager.latest_step() is None
    finally:
        manager.close()


# --- metrics ---------------------------------------------------------------------------------


def test_metric_writer_uploads_whole_files_to_a_bucket(bucket):
    remote = bucket.root / "bucket/run"
    with MetricWriter("gs://bucket/run", remote_sync_seconds=0) as writer:
        writer.write_scalars(1, {"loss": 2.0}, prefix="train/")
        # Each flush (write_scalars flushes) re-uploads the staged files whole: GCS objects cannot be appended.
        assert read_metrics("gs://bucket/run/metrics.jsonl") == [{"step": 1, "train/loss": 2.0}]
        writer.write_scalars(2, {"loss": 1.0}, prefix="train/")
        assert [r["step"] for r in read_metrics(remote / "metrics.jsonl")] == [1, 2]
        staging = writer._staging
        assert str(writer.events_path).startswith("gs://bucket/run/tensorboard/events.out.tfevents.")
    assert not staging.exists()
    # A restarted run continues the remote JSONL and adds an events file.
    with MetricWriter("gs://bucket/run", remote_sync_seconds=3600) as writer:
        writer.write_scalars(3, {"loss": 0.5}, prefix="train/")  # first flush: uploads at once
        writer.write_scalars(4, {"loss": 0.25}, prefix="train/")  # within the interval: staged only
        assert [r["step"] for r in read_metrics(remote / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in read_metrics(remote / "metrics.jsonl")] == [1, 2, 3, 4]  # close uploads

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert len(list((remote / "tensorboard").glob("events.out.tfevents.*"))) == 2
    acc = EventAccumulator(str(remote / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]


def test_failed_upload_is_retried_not_raised(bucket, monkeypatch):
    writer = MetricWriter("gs://bucket/run", remote_sync_seconds=0)
    real_open = FakeBucket.open

    def broken(self, path, mode):
        if "w" in mode:
            raise OSError("503 from the bucket")
        return real_open(self, path, mode)

    monkeypatch.setattr(FakeBucket, "open", broken)
    writer.write_scalars(1, {"loss": 2.0})  # logged, not raised
    monkeypatch.setattr(FakeBucket, "open", real_open)
    writer.close()
    assert read_metrics("gs://bucket/run/metrics.jsonl") == [{"step": 1, "loss": 2.0}]


def test_disabled_writer_touches_no_bucket(bucket):
    MetricWriter("gs://bucket/run", enabled=False).close()
    assert not (bucket.root / "bucket").exists()


# --- the trainer on a bucket workdir ------------------------------------------------------------


def test_train_in_a_bucket_workdir(bucket, tmp_path, monkeypatch, capsys):
    bare = ModelConfig(encoder=t5_config("tiny", vocab_size=128), head=None)
    (tmp_path / "spiece.model").write_bytes(b"not read: the data are random ids")
    native.save_params(bucket.local("gs://bucket/imported"), bare, init_params(bare, seed=7),
                       vocab=str(tmp_path / "spiece.model"))
    # Orbax writes arrays through TensorStore's own GCS driver, which no fake reaches: its
    # manager gets the bucket's local folder; everything else sees only gs:// URLs.
    real_manager = native.step_manager
    monkeypatch.setattr(native, "step_manager", lambda path, **kw: real_manager(bucket.local(path), **kw))
    code = main(["train", "--workdir=gs://bucket/run", *TINY, "--gin.TrainerConfig.num_steps=2",
                 "--gin.TrainerConfig.init_checkpoint='gs://bucket/imported'"])
    assert code == 0, capsys.readouterr().err
    run = bucket.root / "bucket/run"
    for name in ("model_config.json", "config.gin", "operative_config.gin", "metrics.jsonl", "vocab/spiece.model"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "train/loss" in r] == [1, 2]
    assert native.is_checkpoint_dir("gs://bucket/run") and (run / "checkpoints" / "2").is_dir()
    # A second call resumes from the bucket (nothing left to do: 2 of 2 steps done).
    code = main(["train", "--workdir=gs://bucket/run", *TINY, "--gin.TrainerConfig.num_steps=2"])
    assert code == 0 and "resuming from gs://bucket/run/checkpoints/2" in capsys.readouterr().err


# --- agreeing on when to stop --------------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(-1, 1)


def test_one_process_acts_on_its_own_flags_at_once(mesh):
    vote = stopping.StopVote(mesh)
    assert not vote.voting
    local = np.array([1, 0], np.int32)
    assert vote(local) is local  # no device round trip at all


def test_max_over_processes_on_one_process_is_the_local_flags(mesh):
    for flags in ([0, 0], [1, 0], [0, 1]):
        got = stopping.max_over_processes(np.array(flags, np.int32), mesh)
        np.testing.assert_array_equal(np.asarray(got), flags)


def test_voting_reads_the_previous_boundary(mesh):
    vote = stopping.StopVote(mesh, processes=2)  # the real reduction, forced on one process
    assert vote.voting
    np.testing.assert_array_equal(vote(np.array([0, 1], np.int32)), [0, 0])  # nothing agreed yet
    np.testing.assert_array_equal(vote(np.array([0, 0], np.int32)), [0, 1])
    np.testing.assert_array_equal(vote(np.array([1, 0], np.int32)), [0, 0])
    np.testing.assert_array_equal(vote(np.array([0, 0], np.int32)), [1, 0])


def _other_host(wants: list[int], from_call: int):
    """A stand-in for the reduction over hosts: another host raises `wants` at its boundary from_call (1-based)."""
    calls = []

    def gather(flags, mesh):
        calls.append(flags.copy())
        other = np.array(wants if len(calls) >= from_call else [0, 0], np.int32)
        return jnp.asarray(np.maximum(flags, other))

    return gather, calls


def test_a_flag_raised_on_any_host_stops_every_host(mesh, monkeypatch):
    gather, _ = _other_host([1, 0], from_call=2)
    monkeypatch.setattr(stopping, "max_over_processes", gather)
    vote = stopping.StopVote(mesh, processes=2)
    agreed = [vote(np.zeros(2, np.int32)).tolist() for _ in range(4)]
    assert agreed == [[0, 0], [0, 0], [1, 0], [1, 0]]


@pytest.mark.parametrize("wants,message", [([1, 0], "SIGTERM on another host: saved step 4; exiting"),
                                           ([0, 1], "used (by another host's clock): saved step 4")])
def test_the_loop_stops_saves_and_exits_with_the_other_host(tmp_path, monkeypatch, capsys, wants, message):
    gather, calls = _other_host(wants, from_call=3)
    monkeypatch.setattr(stopping, "max_over_processes", gather)
    monkeypatch.setattr(stopping, "StopVote", functools.partial(stopping.StopVote, processes=2))
    extra = ["--gin.TrainerConfig.max_minutes=1000"] if wants[1] else []
    code = main(["train", f"--workdir={tmp_path}", *TINY, "--gin.TrainerConfig.num_steps=50",
                 "--gin.TrainerConfig.checkpoint_every=100", "--gin.TrainerConfig.log_every=10", *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    # Raised at boundary 3, agreed at boundary 4: every host saves step 4 and leaves the loop.
    assert message in err
    assert len(calls) == 4 and not any(c.any() for c in calls)  # this host never wanted to stop
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [4]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "train/loss" in r] == [1, 2, 3, 4]
