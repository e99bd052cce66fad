"""MPTS files: text pairs labelled similar or not from each of several perspectives (IMDB genres).

A file is tab-separated (`*.gz` gunzipped), its first row the header `id`,
`texta`, `textb`, then one column per perspective. A perspective's cell is 1
when both texts have the genre, 0 when neither has it and -1 when exactly one
has it; as in the released code, a pair is similar from a perspective only for
1. Fields are split on tabs alone, as the released reader splits them.

The perspectives read are the ones asked for, in that order, or every column
after `textb`; none is built in (MPTS_RELEASED_PERSPECTIVES is the released
code's choice, for configs to name). Bad rows -- a wrong number of fields, an
empty text, a label outside {1, 0, -1}, a repeated id, a line that is not
UTF-8 -- are skipped, counted by reason with their line numbers and reported;
a missing file, a header without the columns asked for, or a file without one
usable row is a RankgenError.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from rankgen_jax.data import jsonl
from rankgen_jax.data.retrieval_files import existing_file, numbered_lines
from rankgen_jax.errors import RankgenError

# The 12 of the 27 genre columns the released code (main.py, MPTSDataset) trains and scores, in its order.
MPTS_RELEASED_PERSPECTIVES = ("Action", "Adventure", "Animation", "Comedy", "Crime", "Drama", "Family", "Fantasy",
                              "Mystery", "Romance", "Sci-Fi", "Thriller")
TEXT_COLUMNS = ("id", "texta", "textb")
CELL_VALUES = {"1": 1, "0": 0, "-1": 0}  # similar only when both texts have the genre


@dataclasses.dataclass
class MptsPairs:
    """The usable pairs of one file: records {"id", "a", "b", "labels"} (one 0/1 label per perspective)."""

    path: str
    perspectives: tuple[str, ...]
    records: list[dict]
    skipped: jsonl.SkippedLines

    def positive_counts(self) -> dict[str, int]:
        """Each perspective's support: the number of pairs similar from it."""
        return {p: sum(r["labels"][n] for r in self.records) for n, p in enumerate(self.perspectives)}


def _header(path: Path) -> tuple[int, list[str]]:
    for number, raw in numbered_lines(path):
        if raw.strip():
            try:
                return number, raw.decode("utf-8-sig").strip().split("\t")
            except UnicodeDecodeError:
                raise RankgenError(f"{path}:{number}: the header row is not UTF-8") from None
    raise RankgenError(f"{path}: the file is empty")


def read_mpts(path: str | Path, perspectives: Sequence[str] = (), quiet: bool = False) -> MptsPairs:
    """The pairs of an MPTS file with the labels of `perspectives` (every column after textb when empty)."""
    file = existing_file(path, "MPTS")
    header_line, columns = _header(file)
    column_of = {name: i for i, name in enumerate(columns)}
    missing = [c for c in TEXT_COLUMNS if c not in column_of]
    if missing:
        raise RankgenError(f"{path}:{header_line}: the header has no {missing} column(s); an MPTS file starts "
                           f"with {'/'.join(TEXT_COLUMNS)} then one column per perspective, got {columns[:6]}")
    chosen = tuple(perspectives) or tuple(columns[column_of["textb"] + 1:])
    if not chosen:
        raise RankgenError(f"{path}:{header_line}: no perspective columns after textb")
    if len(set(chosen)) != len(chosen):
        raise RankgenError(f"{path}: perspectives named twice in {list(chosen)}")
    unknown = [p for p in chosen if p not in column_of]
    if unknown:
        raise RankgenError(f"{path}: no column for perspective(s) {unknown}; the file has "
                           f"{columns[column_of['textb'] + 1:]}")
    id_col, a_col, b_col = (column_of[c] for c in TEXT_COLUMNS)
    label_cols = [column_of[p] for p in chosen]
    records, skipped, seen = [], jsonl.SkippedLines(), set()
    for number, raw in numbered_lines(file):
        if number <= header_line or not raw.strip():
            continue
        try:
            fields = raw.decode("utf-8").split("\t")
        except UnicodeDecodeError:
            skipped.add(jsonl.NOT_UTF8, number)
            continue
        if len(fields) != len(columns):
            skipped.add(f"{len(fields)} fields, not {len(columns)}", number)
            continue
        pair_id, a, b = fields[id_col].strip(), fields[a_col].strip(), fields[b_col].strip()
        cells = [fields[c].strip() for c in label_cols]
        if not pair_id or not a or not b:
            skipped.add("empty id or text", number)
        elif any(c not in CELL_VALUES for c in cells):
            skipped.add("a perspective cell not 1, 0 or -1", number)
        elif pair_id in seen:
            skipped.add("repeated id", number)
        else:
            seen.add(pair_id)
            records.append({"id": pair_id, "a": a, "b": b, "labels": [CELL_VALUES[c] for c in cells]})
    if not records:
        raise RankgenError(f"{path}: no usable pairs" + (f" ({skipped.describe()})" if skipped.count else ""))
    if skipped.count and not quiet:
        print(f"{path}: skipped {skipped.count} rows: {skipped.describe()}", file=sys.stderr)
    return MptsPairs(str(path), chosen, records, skipped)
