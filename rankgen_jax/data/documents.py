"""Read documents (books) from text and JSON-lines files, skipping and counting bad input.

Sources: a folder (searched recursively, hidden entries ignored), a file, or a
list of them. Files are read in sorted order so every run sees the same
documents in the same order.

- `*.txt`, `*.txt.gz`: one document per file; id = the path relative to the
  folder it was found in (its file name when the file was named directly).
- `*.jsonl`, `*.jsonl.gz`, `*.json`, `*.json.gz`: one `{"id": ..., "text": ...}`
  record per line (a `.json` file may also hold one JSON array of records);
  `id` is optional and defaults to "<file id>:<line>".
- A file named directly with another extension is read as plain text; inside
  a folder such files (README.md, ...) are ignored.

Text is decoded as UTF-8 (a byte-order mark is dropped) and line ends become
"\\n". Nothing in the input crashes the reader: empty files, binary or
non-UTF-8 files, unreadable or corrupt gzip files, malformed JSON lines and
records without a text string are skipped and counted in a `ReadStats`. Only a
path that does not exist is an error (RankgenError naming it).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib
from pathlib import Path
from typing import Iterator, Sequence

from rankgen_jax.data import jsonl
from rankgen_jax.data.sentences import word_count
from rankgen_jax.errors import RankgenError

TEXT_SUFFIXES = (".txt", ".txt.gz")
JSON_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")

# Skip reasons: key -> (singular, plural) noun phrase used in summaries.
EMPTY_FILE = "empty file"
BINARY_FILE = "binary or non-UTF-8 file"
UNREADABLE_FILE = "unreadable file"
MALFORMED_JSON = "malformed JSON line"
MISSING_TEXT = "record with missing or empty text"
TOO_SHORT = "document below the word minimum"
_PLURALS = {
    EMPTY_FILE: "empty files",
    BINARY_FILE: "binary or non-UTF-8 files",
    UNREADABLE_FILE: "unreadable files",
    MALFORMED_JSON: "malformed JSON lines",
    MISSING_TEXT: "records with missing or empty text",
    TOO_SHORT: "documents below the word minimum",
}


@dataclasses.dataclass(frozen=True)
class Document:
    """One book or article: a stable id (used to seed its examples) and its full text."""

    id: str
    text: str


@dataclasses.dataclass
class ReadStats:
    """What a read saw: files opened, documents yielded, and skipped input by reason."""

    files: int = 0
    documents: int = 0
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    first_skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    def skip(self, reason: str, location: str) -> None:
        """Count one skipped record; the first location per reason is kept for the summary."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skipped.setdefault(reason, location)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        """One line: 'read N documents from M files; skipped: 3 malformed JSON lines (first: f:2), ...'."""
        documents = _plural(self.documents, "document", "documents")
        line = f"read {documents} from {_plural(self.files, 'file', 'files')}"
        if not self.skipped:
            return line
        parts = []
        for reason, count in self.skipped.items():
            noun = reason if count == 1 else _PLURALS.get(reason, reason + "s")
            where = self.first_skipped[reason]
            parts.append(f"{count} {noun} ({where if count == 1 else 'first: ' + where})")
        return f"{line}; skipped: {', '.join(parts)}"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def read_documents(source: str | Path | Sequence[str | Path], stats: ReadStats | None = None) -> Iterator[Document]:
    """Documents of a folder, a file, or a list of them, in a deterministic order; bad input is counted in `stats`."""
    stats = stats if stats is not None else ReadStats()
    for path, doc_id in _list_files(source):
        stats.files += 1
        for document in _read_file(path, doc_id, stats):
            stats.documents += 1
            yield document


def require_documents(source: str | Path | Sequence[str | Path], min_words: int = 0) -> tuple[list[Document], ReadStats]:
    """All documents with at least `min_words` words, and the stats; RankgenError when none is usable."""
    stats = ReadStats()
    documents = []
    for document in read_documents(source, stats):
        if word_count(document.text) < min_words:
            stats.skip(TOO_SHORT, document.id)
            continue
        documents.append(document)
    if not documents:
        raise RankgenError(f"no usable document in {_describe(source)} ({stats.summary()})")
    return documents, stats


def _describe(source: str | Path | Sequence[str | Path]) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return ", ".join(str(s) for s in source) or "an empty list of paths"


def _list_files(source: str | Path | Sequence[str | Path]) -> list[tuple[Path, str]]:
    """(path, document id) for every file to read; a missing path is a RankgenError."""
    sources = [source] if isinstance(source, (str, Path)) else list(source)
    files: list[tuple[Path, str]] = []
    for item in sources:
        path = Path(item)
        if path.is_dir():
            files.extend(_folder_files(path))
        elif path.is_file():
            files.append((path, path.name))
        else:
            raise RankgenError(f"no such file or folder: {path}")
    return files


def _folder_files(folder: Path) -> list[tuple[Path, str]]:
    """Supported files under a folder, sorted by relative path; hidden files and folders are left out."""
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_file() and path.name.endswith(TEXT_SUFFIXES + JSON_SUFFIXES):
            found.append((path, relative.as_posix()))
    return sorted(found, key=lambda item: item[1])


def _read_file(path: Path, doc_id: str, stats: ReadStats) -> Iterator[Document]:
    """Documents of one file (one for text, one per record for JSON)."""
    raw = read_document_bytes(path, stats)
    if raw is None:
        return
    if not raw.strip():
        stats.skip(EMPTY_FILE, str(path))
        return
    if path.name.endswith(JSON_SUFFIXES):
        yield from json_documents(raw, path, doc_id, stats)
        return
    text = _decode(raw)
    if text is None:
        stats.skip(BINARY_FILE, str(path))
    elif not text.strip():  # e.g. only a byte-order mark
        stats.skip(EMPTY_FILE, str(path))
    else:
        yield Document(doc_id, text)


def read_document_bytes(path: Path, stats: ReadStats) -> bytes | None:
    """File contents, gunzipped for *.gz; None (counted) when the file or the gzip stream is unreadable."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error):  # gzip.BadGzipFile is an OSError
        stats.skip(UNREADABLE_FILE, str(path))
        return None


def _decode(raw: bytes) -> str | None:
    """UTF-8 text with "\\n" line ends, or None for binary (NUL bytes) or non-UTF-8 data."""
    if b"\x00" in raw:
        return None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _default_id(file_id: str, number: int) -> str:
    return f"{file_id}:{number}" if file_id else str(number)


def json_documents(raw: bytes, path: Path, file_id: str, stats: ReadStats) -> Iterator[Document]:
    """Documents of a JSON-lines file (or a .json file holding one array of records).

    A record without an id gets "<file_id>:<line>", or just "<line>" when file_id is "".
    """
    if b"\x00" in raw:
        stats.skip(BINARY_FILE, str(path))
        return
    array = _json_array(raw)
    if array is not None:
        for index, record in enumerate(array, start=1):
            yield from _record_document(record, _default_id(file_id, index), f"{path}:{index}", stats)
        return

    def skip(reason: str, number: int) -> None:
        # A JSON value that is no object has no text either.
        stats.skip(MISSING_TEXT if reason == jsonl.NOT_AN_OBJECT else MALFORMED_JSON, f"{path}:{number}")

    for number, record in jsonl.parse_lines(raw.split(b"\n"), on_skip=skip):
        yield from _record_document(record, _default_id(file_id, number), f"{path}:{number}", stats)


def _json_array(raw: bytes) -> list | None:
    """The records of a file that is one JSON array, else None (the file is read as JSON lines)."""
    if not raw.lstrip().lstrip(b"\xef\xbb\xbf").startswith(b"["):
        return None
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        return None  # e.g. a JSON-lines file whose first record is a list: read it line by line
    return value if isinstance(value, list) else None


def _record_document(record: object, default_id: str, location: str, stats: ReadStats) -> Iterator[Document]:
    """The document of one JSON record, or nothing (counted) when it has no non-empty text string."""
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str) or not text.strip():
        stats.skip(MISSING_TEXT, location)
        return
    doc_id = record.get("id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        doc_id = default_id
    yield Document(str(doc_id), text.replace("\r\n", "\n"))


def document_genre(doc_id: str) -> str:
    """A document's genre: the first folder of its id ("plays/othello.txt" -> "plays"); "all" without one."""
    return doc_id.split("/", 1)[0] if "/" in doc_id else "all"
