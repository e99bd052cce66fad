"""JSON-lines files: the one reader, with the project's policy for bad lines, and the one writer.

A JSON-lines file holds one JSON object per line; `*.gz` files are gunzipped.
Lines are split on "\\n" alone, so a line number is the one editors and
`wc -l` show.

Bad input:
- a blank line is no record and passes silently (so does the file's final newline);
- a line that is not UTF-8, not JSON, not a JSON object, or that the caller's
  `check` rejects is skipped and counted under its reason, with its line
  number; nothing in a line stops the read;
- a missing file, an unreadable file or a corrupt gzip stream is a
  RankgenError naming the file, and so (`read_jsonl`) is a file without one
  usable record.

`read_jsonl` reads a whole file and reports what it skipped on stderr;
`collect_jsonl` returns the skips instead, `iter_jsonl` streams a file (for
files too large to hold, or callers that count skips their own way), and
`parse_lines` applies the same policy to lines already in memory.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import zlib
from pathlib import Path
from typing import Callable, Iterable, Iterator

from rankgen_jax.errors import RankgenError

# Skip reasons of the reader itself; a caller's check adds its own.
NOT_UTF8 = "not UTF-8"
MALFORMED_JSON = "malformed JSON"
NOT_AN_OBJECT = "not a JSON object"
# Line numbers quoted per reason in a summary.
SHOWN_LINES = 5

# check(record) -> None for a usable record, else a short reason why not.
Check = Callable[[dict], "str | None"]
# on_skip(reason, line number), called for every skipped line as the read reaches it.
OnSkip = Callable[[str, int], None]


@dataclasses.dataclass
class SkippedLines:
    """The lines a read skipped: reason -> their 1-based line numbers, reasons in order of first appearance.

    `unit` names what the numbers count where a file is not read line by line (e.g. "example").
    """

    by_reason: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    unit: str = "line"

    def add(self, reason: str, number: int) -> None:
        """Count one skipped line (an `OnSkip`)."""
        self.by_reason.setdefault(reason, []).append(number)

    @property
    def count(self) -> int:
        return sum(map(len, self.by_reason.values()))

    def numbers(self) -> list[int]:
        """Every skipped line number, in file order."""
        return sorted(n for numbers in self.by_reason.values() for n in numbers)

    def describe(self) -> str:
        """'2 malformed JSON (line 3, 9); 1 not a JSON object (line 7)': each reason with its first line numbers."""
        parts = []
        for reason, numbers in self.by_reason.items():
            shown = ", ".join(map(str, numbers[:SHOWN_LINES])) + (", ..." if len(numbers) > SHOWN_LINES else "")
            parts.append(f"{len(numbers)} {reason} ({self.unit} {shown})")
        return "; ".join(parts)


def parse_lines(lines: Iterable[bytes], check: Check | None = None,
                on_skip: OnSkip | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each usable line of `lines` (raw bytes, numbered from 1); see the module docstring."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record = None
        try:
            # utf-8-sig on every line: only the first can start with a byte-order mark, and it is dropped there.
            record = json.loads(raw.decode("utf-8-sig"))
        except UnicodeDecodeError:
            reason = NOT_UTF8
        except (ValueError, RecursionError):  # RecursionError: nesting too deep for the parser
            reason = MALFORMED_JSON
        else:
            if not isinstance(record, dict):
                reason = NOT_AN_OBJECT
            else:
                reason = check(record) if check is not None else None
        if reason is None:
            yield number, record
        elif on_skip is not None:
            on_skip(reason, number)


def open_binary(path: Path):
    """The file opened for reading bytes, gunzipped when its name ends in .gz."""
    return gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")


def iter_jsonl(path: str | Path, check: Check | None = None,
               on_skip: OnSkip | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of each usable line of a file, streamed; skipped lines go to on_skip.

    RankgenError at once when the file is missing, and while reading when it
    (or its gzip stream) cannot be read.
    """
    file = Path(path)
    if not file.is_file():
        raise RankgenError(f"{path}: no such file")

    def records() -> Iterator[tuple[int, dict]]:
        try:
            with open_binary(file) as lines:
                yield from parse_lines(lines, check, on_skip)
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise RankgenError(f"{path}: cannot read the file ({e})") from None

    return records()


def collect_jsonl(path: str | Path, check: Check | None = None) -> tuple[list[dict], SkippedLines]:
    """(usable records, skipped lines) of a file, for callers that report skips and judge an empty file themselves."""
    skipped = SkippedLines()
    return [record for _, record in iter_jsonl(path, check, skipped.add)], skipped


def read_jsonl(path: str | Path, check: Check | None = None) -> list[dict]:
    """The usable records of a JSON-lines file, in order; skipped lines are summarised on stderr.

    RankgenError when the file is missing or unreadable, or holds no usable record.
    """
    records, skipped = collect_jsonl(path, check)
    if skipped.count:
        print(f"{path}: skipped {skipped.count} lines: {skipped.describe()}", file=sys.stderr)
    if not records:
        raise RankgenError(f"{path}: no usable records" + (f" ({skipped.describe()})" if skipped.count else
                                                            " (the file is empty)"))
    return records


def write_jsonl(path: str | Path, records: Iterable[dict]) -> Path:
    """Write records one JSON object a line (the parent folder made if needed); returns the path.

    Written to a side file and renamed into place: a resumable job counts a
    stage as done when its file exists, so there is never half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    partial.replace(path)
    return path
