"""Metric writer: TensorBoard events readable by TensorBoard, JSONL, restarts, disabled hosts, no TensorFlow."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.train.metric_writers import MetricWriter, read_metrics, read_metrics_counted


def _accumulator(tb_dir: Path):
    """TensorBoard's own reader over every events file in tb_dir."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={TENSORS: 0})
    acc.Reload()
    return acc


def test_scalars_roundtrip_through_tensorboard_and_jsonl(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        for step in (0, 10, 20):
            # Python, NumPy and JAX scalars, as the trainer hands them over.
            writer.write_scalars(step, {"loss": 1.0 / (step + 1), "lr": np.float32(2e-3), "acc": jnp.array(0.5)},
                                 prefix="train/")
        writer.write_scalars(20, {"recall@1": 0.25}, prefix="eval/")
        writer.write_text(0, "config/gin", "train.steps = 100\nOptimizerConfig.name = 'adafactor'")

    acc = _accumulator(tmp_path / "tensorboard")
    assert set(acc.Tags()["scalars"]) == {"train/loss", "train/lr", "train/acc", "eval/recall@1"}
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 10, 20]
    np.testing.assert_allclose([e.value for e in loss], [1.0, 1 / 11, 1 / 21], rtol=1e-6)
    assert acc.Scalars("train/lr")[0].value == pytest.approx(2e-3)
    assert [(e.step, e.value) for e in acc.Scalars("eval/recall@1")] == [(20, 0.25)]
    # Text is a string tensor tagged for TensorBoard's text plugin.
    (text,) = acc.Tensors("config/gin")
    assert text.tensor_proto.string_val == [b"train.steps = 100\nOptimizerConfig.name = 'adafactor'"]
    assert acc.SummaryMetadata("config/gin").plugin_data.plugin_name == "text"

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[0] == {"step": 0, "train/loss": 1.0, "train/lr": pytest.approx(2e-3), "train/acc": 0.5}
    assert [r["step"] for r in records] == [0, 10, 20, 20]
    assert records[-1] == {"step": 20, "eval/recall@1": 0.25}
    assert all(type(v) in (int, float) for r in records for v in r.values())


def test_restart_appends_jsonl_and_adds_events_file(tmp_path):
    with MetricWriter(str(tmp_path)) as first:
        first.write_scalars(1, {"loss": 3.0}, prefix="train/")
        first.write_scalars(2, {"loss": float("nan")}, prefix="train/")
    with MetricWriter(str(tmp_path)) as second:
        assert second.events_path != first.events_path
        second.write_scalars(3, {"loss": 1.0}, prefix="train/")

    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert np.isnan(records[1]["train/loss"])  # a diverging loss is logged, not dropped
    steps = [(e.step, e.value) for e in _accumulator(tmp_path / "tensorboard").Scalars("train/loss")]
    assert [s for s, _ in steps] == [1, 2, 3] and steps[0][1] == 3.0 and steps[2][1] == 1.0


def test_a_restart_step_sets_replayed_rows_aside_in_jsonl_and_tensorboard(tmp_path):
    """A resumed trainer (restart_step=3) trains steps 3-5 again: the earlier rows of those steps leave
    metrics.jsonl for metrics_superseded.jsonl, and TensorBoard's reader shows each step once, the later value."""
    with MetricWriter(str(tmp_path)) as first:
        for step in (1, 2, 3, 4, 5):
            first.write_scalars(step, {"loss": float(step)}, prefix="train/")
        first.write_scalars(4, {"loss": 0.5}, prefix="eval/")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train/lo')  # the killed process's partial last line stays (and stays skipped)
    with MetricWriter(str(tmp_path), restart_step=3) as second:
        for step in (3, 4, 5, 6):
            second.write_scalars(step, {"loss": 10.0 * step}, prefix="train/")

    records, skipped = read_metrics_counted(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["train/loss"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0),
                                                               (6, 60.0)]
    assert skipped == 1
    superseded = read_metrics(tmp_path / "metrics_superseded.jsonl")
    assert superseded == [{"step": 3, "train/loss": 3.0}, {"step": 4, "train/loss": 4.0},
                          {"step": 5, "train/loss": 5.0}, {"step": 4, "eval/loss": 0.5}]
    acc = _accumulator(tmp_path / "tensorboard")
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0),
                                                                      (5, 50.0), (6, 60.0)]
    assert acc.Scalars("eval/loss") == []  # step 4's eval belonged to the replaced run

    # A fresh start where a killed run left rows but no checkpoint (restart_step=0): all of them are set aside.
    with MetricWriter(str(tmp_path), restart_step=0) as third:
        third.write_scalars(1, {"loss": 7.0}, prefix="train/")
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [(1, 7.0)]
    assert [(e.step, e.value) for e in _accumulator(tmp_path / "tensorboard").Scalars("train/loss")] == [(1, 7.0)]


def test_truncated_last_line_is_skipped_and_restart_keeps_it_separate(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(1, {"loss": 2.0})
        writer.write_scalars(2, {"loss": 1.5})
    # A run killed halfway through writing step 3.
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')
    assert read_metrics_counted(path) == ([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}], 1)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]

    # The restarted run's first line must not be glued to the partial one.
    with MetricWriter(str(tmp_path)) as writer:
        writer.write_scalars(3, {"loss": 1.2})
    records, skipped = read_metrics_counted(path)
    assert [r["step"] for r in records] == [1, 2, 3] and skipped == 1
    assert path.read_text().splitlines()[2] == '{"step": 3, "lo'


def test_disabled_writer_writes_nothing(tmp_path):
    logdir = tmp_path / "run"
    writer = MetricWriter(str(logdir), enabled=False)
    writer.write_scalars(0, {"loss": 1.0}, prefix="train/")
    writer.write_text(0, "config", "x")
    writer.flush()
    writer.close()
    assert not logdir.exists()


def test_non_scalar_metric_is_a_clear_error(tmp_path):
    with MetricWriter(str(tmp_path)) as writer:
        with pytest.raises(RankgenError, match="'loss' is not a scalar"):
            writer.write_scalars(0, {"loss": np.ones(3)})


def test_local_logdir_is_written_in_place(tmp_path):
    # Remote (gs://) logdirs stage locally and upload: tests/test_multihost.py covers them.
    with MetricWriter(tmp_path) as writer:
        writer.write_scalars(0, {"loss": 1.0})
        assert not writer.remote and writer._staging is None
        assert writer.events_path.parent == tmp_path / "tensorboard" and writer.events_path.stat().st_size > 0
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "loss": 1.0}]


def test_writing_does_not_import_tensorflow(tmp_path):
    # In a fresh interpreter: other tests (and TensorBoard's reader) may import TF into this one.
    script = textwrap.dedent(
        f"""
        import sys
        from rankgen_jax.train.metric_writers import MetricWriter
        with MetricWriter({str(tmp_path)!r}) as w:
            w.write_scalars(0, {{"loss": 1.0}}, prefix="train/")
            w.write_text(0, "config", "x")
        print("tensorflow" in sys.modules, len(open({str(tmp_path / "metrics.jsonl")!r}).readlines()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "1"], out.stderr
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 0, "train/loss": 1.0}
