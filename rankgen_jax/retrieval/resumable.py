"""JSON-lines outputs written a batch of queries at a time and resumed where they stopped (mine-negatives,
score-candidates).

The output grows a batch at a time, each batch flushed to disk before
`OUTPUT.progress.json` (replaced atomically) records the output's size, the
number of queries handled, the last one's id and the command's counts. A rerun
with the same settings cuts the output back to the recorded size (a batch or
partial line written after the last record goes) and continues from the next
query, so an interrupted run ends with the file an uninterrupted one writes.
Other settings or changed inputs are refused (overwrite starts over), and a
file without a progress record is never appended to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rankgen_jax.data.retrieval_files import BEIR_CORPUS, BEIR_QUERIES
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.dense_index import CONFIG_FILE, IDS_FILE, INDEX_FILE

PROGRESS_SUFFIX = ".progress.json"
PROGRESS_VERSION = 1


def progress_path(out: Path) -> Path:
    return out.with_name(out.name + PROGRESS_SUFFIX)


def input_stamp(path: str | None) -> dict | None:
    """The resolved path and size of an input (a folder: of the files read there), so a resume sees a changed input."""
    if path is None:
        return None
    p = Path(path)
    files = [p]
    if p.is_dir():
        # A BEIR folder's corpus, queries and qrels; an index folder's files. Not all its files: the output may be
        # written in the folder.
        files = [p / name for name in (BEIR_CORPUS, BEIR_QUERIES, CONFIG_FILE, IDS_FILE, INDEX_FILE)]
        files = [f for f in files if f.is_file()] + sorted((p / "qrels").glob("*.tsv"))
    return {"path": str(p.resolve()), "bytes": sum(f.stat().st_size for f in files)}


def write_progress(path: Path, record: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    partial.replace(path)


def append_lines(out: Path, lines: list[bytes]) -> int:
    """Append lines to out, flushed to disk; returns the file's new size."""
    with out.open("ab") as f:
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def start_or_resume(out: Path, settings: dict, counts: dict, overwrite: bool, command: str) -> dict:
    """The progress record to continue from (a fresh one, holding `counts`, when starting); the output cut to its
    recorded size. command: the command's name, for messages."""
    path = progress_path(out)
    fresh = {"version": PROGRESS_VERSION, "settings": settings, "bytes": 0, "handled": 0, "last_query_id": None,
             **counts}
    if overwrite:
        out.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    if not path.is_file():
        if out.exists():
            raise RankgenError(f"{out}: exists and has no {path.name} (not a run of {command} to resume); choose "
                               "another output or pass `overwrite`", names=("overwrite",))
        return fresh
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RankgenError(f"{path}: cannot read the progress record ({e}); pass overwrite to start over")
    if not isinstance(record, dict) or record.get("version") != PROGRESS_VERSION or set(record) != set(fresh):
        raise RankgenError(f"{path}: not a progress record of this version; pass overwrite to start over")
    if record["settings"] != settings:
        changed = sorted(k for k in settings.keys() | record["settings"].keys()
                         if settings.get(k) != record["settings"].get(k))
        raise RankgenError(f"{out}: was started with other settings or inputs ({', '.join(changed)} differ); "
                           "rerun with those, or pass `overwrite` to start over", names=("overwrite",))
    size = out.stat().st_size if out.is_file() else 0
    if size < record["bytes"]:
        raise RankgenError(f"{out}: holds {size} bytes but {path.name} records {record['bytes']} written; "
                           "the output was changed, pass overwrite to start over")
    if size > record["bytes"]:
        # A batch (or part of a line) written after the last progress record: it is done again.
        with out.open("r+b") as f:
            f.truncate(record["bytes"])
    return record


def check_resume_point(out: Path, record: dict, query_ids: list[str]) -> int:
    """The index of the first query still to handle; RankgenError when the inputs no longer give the recorded ones."""
    start = record["handled"]
    if start > len(query_ids) or (start and query_ids[start - 1] != record["last_query_id"]):
        raise RankgenError(f"{progress_path(out)}: records {start} queries handled, last {record['last_query_id']!r}, "
                           "which the inputs no longer give; pass overwrite to start over")
    return start


def save_batch(out: Path, record: dict, lines: list[bytes], handled: int, last_query_id: str) -> None:
    """Append a batch's lines, then record it (and the counts already updated in `record`) as done."""
    record["bytes"] = append_lines(out, lines) if lines else record["bytes"]
    record["handled"] = handled
    record["last_query_id"] = last_query_id
    write_progress(progress_path(out), record)
