"""Training metrics to TensorBoard event files and a JSONL file, without TensorFlow.

`tensorboard.summary.writer.event_file_writer.EventFileWriter` creates its
directory and file through `tensorboard.compat.tf`, which imports TensorFlow
whenever it is installed (seqio installs it here): seconds of start-up and a
process that may grab accelerators. So we write the same files with the
pieces that writer is made of and that do not touch TensorFlow: the event
protos (`tensorboard.compat.proto`) and the TFRecord framing
(`tensorboard.summary.writer.record_writer.RecordWriter`), into a file opened
with plain `open`.

Logdirs may be local or remote (gs://bucket/run). Object stores cannot
append, and GCS allows about one write per second to an object, so for a
remote logdir both files are written to a local staging folder exactly as for
a local logdir, and every flush at least `remote_sync_seconds` after the last
upload (and close, always) copies them whole over the remote objects. Remote
I/O goes through etils.epath, which imports TensorFlow (tf.io.gfile) only when
a remote path is first touched; local logdirs never do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from rankgen_jax.checkpoints.run_folder import METRICS_FILE, TENSORBOARD_DIR
from rankgen_jax.data.jsonl import SkippedLines, parse_lines
from rankgen_jax.errors import RankgenError

log = logging.getLogger(__name__)

# Distinguishes two writers opened by one process in the same second.
_writer_serial = 0


def _to_float(name: str, value: Any) -> float:
    """A Python float from a Python, NumPy or JAX scalar (or size-1 array)."""
    try:
        array = np.asarray(value)
        if array.size != 1:
            raise ValueError(f"shape {array.shape}")
        return float(array.reshape(()))
    except (TypeError, ValueError) as e:
        raise RankgenError(f"metric {name!r} is not a scalar: {e}") from e


class MetricWriter:
    """Scalars to TensorBoard event files and to a JSONL file; a no-op when enabled=False.

    JSONL: one object per call, `{"step": N, "<prefix><name>": value, ...}`.
    Pass enabled=False on non-zero hosts: nothing is created or written.
    Layout: `<logdir>/<jsonl_name>` and `<logdir>/<tb_subdir>/events.out.tfevents.*`.
    A restarted run pointed at the same logdir appends to the JSONL file and
    starts a new events file beside the old ones (TensorBoard reads them all).
    restart_step (a trainer that resumes, or starts afresh where a killed run
    left metrics): rows of that step and later from earlier processes are
    moved to `<jsonl stem>_superseded.jsonl`, since this process writes those
    steps again, and the new events file starts with a SessionLog START at
    restart_step, on which TensorBoard drops the older events of those steps.
    Each `write_scalars` call is one JSONL line, so train and eval scalars of
    the same step are two lines with the same "step". Lines are flushed as they
    are written, so a killed run loses at most a partly written last line,
    which `read_jsonl` skips. A remote logdir (see the module docstring) is
    updated at most every `remote_sync_seconds`, so a killed run also loses
    the lines written since the last upload.
    """

    def __init__(self, logdir: str | os.PathLike, enabled: bool = True, jsonl_name: str = METRICS_FILE,
                 tb_subdir: str = TENSORBOARD_DIR, remote_sync_seconds: float = 10.0, restart_step: int | None = None):
        self.enabled = enabled
        self.remote = "://" in os.fspath(logdir)
        # Final destinations (epath for a remote logdir); the files themselves are opened under _local_dir.
        self.logdir = epath.Path(logdir) if self.remote else Path(logdir)
        self.jsonl_path = self.logdir / jsonl_name
        self.tb_dir = self.logdir / tb_subdir
        self.remote_sync_seconds = remote_sync_seconds
        self._jsonl = None
        self._events = None
        self.events_path = None
        self._staging: Path | None = None
        self._last_upload = float("-inf")  # the first flush uploads
        if not enabled:
            return
        if self.remote:
            # Fails here, before any training, on a bad bucket or missing permission.
            self.tb_dir.mkdir(parents=True, exist_ok=True)
            self._staging = Path(tempfile.mkdtemp(prefix="rankgen_metrics_"))
            self._local_dir = self._staging
            if self.jsonl_path.exists():  # a restarted run: new lines follow the old ones
                (self._staging / jsonl_name).write_bytes(self.jsonl_path.read_bytes())
        else:
            self._local_dir = self.logdir
        self._local_jsonl = self._local_dir / jsonl_name
        self._local_tb_dir = self._local_dir / tb_subdir
        self._local_tb_dir.mkdir(parents=True, exist_ok=True)
        self.superseded_path = self.logdir / f"{Path(jsonl_name).stem}_superseded.jsonl"
        if restart_step is not None:
            self._set_aside_from(restart_step)
        self._jsonl = self._open_jsonl(self._local_jsonl)
        self._events = self._open_events()
        if restart_step is not None:
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._events.write(event_pb2.Event(wall_time=time.time(), step=int(restart_step),
                                               session_log=start).SerializeToString())
            self._events.flush()

    def _set_aside_from(self, restart_step: int) -> None:
        """Move the rows of steps >= restart_step from the JSONL file to the superseded file (appended)."""
        if not self._local_jsonl.exists():
            return
        kept, superseded = [], []
        for raw in self._local_jsonl.read_bytes().splitlines(keepends=True):
            _, record = next(parse_lines([raw]), (None, None))
            later = isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] >= restart_step
            (superseded if later else kept).append(raw if raw.endswith(b"\n") else raw + b"\n")
        if not superseded:
            return
        previous = self.superseded_path.read_bytes() if self.superseded_path.exists() else b""
        self.superseded_path.write_bytes(previous + b"".join(superseded))
        replacement = self._local_jsonl.with_name(self._local_jsonl.name + ".tmp")
        replacement.write_bytes(b"".join(kept))
        os.replace(replacement, self._local_jsonl)

    @staticmethod
    def _open_jsonl(path: Path):
        """Open for appending; end a previous run's truncated last line so it stays a separate (skipped) line."""
        if path.exists() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                ends_with_newline = f.read(1) == b"\n"
            if not ends_with_newline:
                with open(path, "a", encoding="utf-8") as f:
                    f.write("\n")
        return open(path, "a", encoding="utf-8")

    def _open_events(self) -> RecordWriter:
        """A new events file named as TensorBoard's own writer names them, starting with the version event."""
        global _writer_serial
        _writer_serial += 1
        # Zero-padded serial: TensorBoard reads a folder's files in name order, and "10" sorts before "9".
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{_writer_serial:06d}")
        self.events_path = self.tb_dir / name
        self._local_events = self._local_tb_dir / name
        writer = RecordWriter(open(self._local_events, "wb"))
        writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        writer.flush()
        return writer

    def _write_event(self, step: int, values: list[summary_pb2.Summary.Value]) -> None:
        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
        self._events.write(event.SerializeToString())

    def write_scalars(self, step: int, scalars: dict[str, Any], prefix: str = "") -> None:
        """Write scalars (Python/NumPy/JAX) under `prefix + name`, e.g. prefix "train/" or "eval/"."""
        if not self.enabled or not scalars:
            return
        values = {f"{prefix}{name}": _to_float(name, value) for name, value in scalars.items()}
        self._write_event(step, [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        # NaN/Inf are written as JSON's NaN/Infinity extensions, which json.loads reads back: a
        # diverging loss is exactly what one wants to see in the log.
        self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
        self.flush()

    def write_text(self, step: int, tag: str, text: str) -> None:
        """Write text (e.g. the operative gin config) to TensorBoard's Text tab."""
        if not self.enabled:
            return
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            string_val=[text.encode("utf-8")])
        meta = text_metadata.create_summary_metadata(display_name=tag, description="")
        self._write_event(step, [summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)])
        self._events.flush()

    def flush(self) -> None:
        """Push buffered lines and events to the OS (and, if due, to the remote logdir)."""
        if self.enabled and self._jsonl is not None:
            self._jsonl.flush()
            self._events.flush()
            if self.remote and time.monotonic() - self._last_upload >= self.remote_sync_seconds:
                self._upload()

    def _upload(self) -> bool:
        """Copy both staged files whole over their remote objects; True on success.

        A failed upload (a transient storage error) is logged rather than
        raised: the staged files still hold everything, and the next flush or
        close tries again, so a metrics hiccup does not end a training run.
        """
        self._last_upload = time.monotonic()
        try:
            self.jsonl_path.write_bytes(self._local_jsonl.read_bytes())
            self.events_path.write_bytes(self._local_events.read_bytes())
            return True
        except Exception as e:  # noqa: BLE001 - any storage error; retried at the next flush
            log.warning("uploading metrics to %s failed (%s: %s); will retry", self.logdir, type(e).__name__, e)
            return False

    def close(self) -> None:
        """Flush and close both files (a remote logdir gets its final upload); a second close is a no-op."""
        if self.enabled and self._jsonl is not None:
            self._jsonl.flush()
            self._events.flush()
            self._jsonl.close()
            self._events.close()
            self._jsonl = self._events = None
            if self.remote:
                if self._upload():
                    shutil.rmtree(self._staging, ignore_errors=True)
                else:  # keep the only copy
                    log.warning("metrics for %s kept in %s", self.logdir, self._staging)

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics_counted(path: str | os.PathLike) -> tuple[list[dict], int]:
    """(records, number of unreadable lines skipped) from a metrics JSONL file, local or on a bucket.

    A run killed mid-write leaves a partial line; after a restart it sits mid-file
    (the writer ends it with a newline before appending), so such lines are skipped
    under the project's JSON-lines policy (`data/jsonl.py`), and an empty file is no error.
    """
    skipped = SkippedLines()
    with epath.Path(path).open("rb") as lines:
        records = [record for _, record in parse_lines(lines, on_skip=skipped.add)]
    return records, skipped.count


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics JSONL file, skipping (with a warning) partial lines from killed runs."""
    records, skipped = read_metrics_counted(path)
    if skipped:
        log.warning("%s: skipped %d unreadable line(s) (a run killed mid-write?)", path, skipped)
    return records
