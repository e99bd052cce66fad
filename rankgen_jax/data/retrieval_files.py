"""Retrieval data files as IR tools write them: passages, queries, qrels, runs, Tevatron training queries.

Every id is the exact string of the file: MS MARCO's pid "0" stays "0", "007"
stays "007", and a JSON integer id becomes its decimal string. No reader
makes ids up (from line numbers or otherwise): a record without an id is bad
input.

Passages and queries (`read_passages`, `read_queries`; `iter_texts` streams one file, `passages_file`
names the file read_passages reads):
- TSV (MS MARCO / TREC: collection.tsv, queries.dev.tsv): `id \\t text`, exactly
  two tab-separated fields a line, no header;
- JSON lines (`*.jsonl`, `*.json`): this project's `{"id", "text"}`, BEIR's
  `{"_id", "title", "text"}`, Tevatron's corpus `{"docid", "title", "text"}` and
  queries `{"query_id", "query"}` (a Tevatron training file read as queries
  gives its queries); one id field and one text field a record, `title` optional;
- a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv): its
  corpus.jsonl for passages; for queries its queries.jsonl, only the queries
  the split's qrels judge (BEIR's rule; split "test" unless named).
  Other files are told by their first line: a JSON object, or a line with a
  tab. Plain text, one passage per line, has no ids and is refused.

Titles: `join_title(title, text, title_join)` is the one rule. With
title_join a string (default " ", as BEIR's and Tevatron's encoders join
them) a passage reads `title + title_join + text`, or just its text when it
has no title; with title_join None titles are dropped. Readers keep titles
apart (`TextFile.titles`, `Passage.title`) so a writer can give them back.

Qrels (`read_qrels`): TREC `qid iter docid rel` (whitespace separated, the
iteration ignored), MS MARCO's two columns `qid docid` (each pair relevant,
label 1), and BEIR's `query-id \\t corpus-id \\t score` under that header.
Labels are integers, as trec_eval reads them; negative ones are kept.

Runs (`read_run`, `write_run`): TREC `qid Q0 docid rank score tag`, MS MARCO
`qid \\t pid \\t rank`, and `search`'s JSON lines `{"query_id", "ids", "scores"}`.
Written runs list each query's documents in trec_eval's order (score
descending, equal scores by docid descending) with ranks from 1, so the rank
column is the order trec_eval evaluates; an MS MARCO run has no scores, and
reads back with score -rank so that every measure ranks as the file does.

Tevatron training JSON lines (`iter_training_queries`, `read_training_queries`):
`{"query_id", "query", "positive_passages": [{"docid", "title", "text"}, ...],
"negative_passages": [...]}`; a query needs a positive, negatives may be absent.
Teacher scores ride on the passages as Tevatron's distillation data has them
(`"score"`: a finite number, on every passage of a record or on none), and a
retriever's rank of a passage as `"rank"` (an integer >= 1); both are optional.

Bad input:
- passages, queries, training queries: a line that is not UTF-8, not JSON,
  has the wrong number of fields, or lacks its id or text is skipped and
  counted with its line number (summarised on stderr); a file with no usable
  line is a RankgenError;
- a duplicate id (passage, query, training query, or qrels / run pair) is a
  RankgenError naming the file and both lines;
- qrels and runs: any bad line is a RankgenError naming the file and line (a
  skipped judgement would silently change the numbers);
- a file whose format cannot be told is a RankgenError;
- qrels ids missing from the corpus or the queries (`check_qrels`):
  RankgenError, or (on_missing="skip") dropped and counted by qrels line.
"""

from __future__ import annotations

import array
import dataclasses
import json
import math
import sys
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from rankgen_jax.data import jsonl
from rankgen_jax.errors import RankgenError

DEFAULT_TITLE_JOIN = " "
# The split a BEIR folder is read at by the commands that write training data (mining, teacher scores).
TRAINING_SPLIT = "train"
DEFAULT_SPLIT = "test"
BEIR_CORPUS = "corpus.jsonl"
BEIR_QUERIES = "queries.jsonl"
BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
TSV_SUFFIXES = (".tsv", ".tsv.gz")
TEXT_FORMATS = ("tsv", "jsonl")
QRELS_FORMATS = ("trec", "msmarco", "beir")
RUN_FORMATS = ("trec", "msmarco", "jsonl")
DEFAULT_RUN_TAG = "rankgen_jax"
# Record fields: BEIR's "_id", this project's "id", Tevatron's "docid" (corpus) and "query_id" (queries).
ID_FIELDS = ("_id", "id", "docid", "query_id")
TEXT_FIELDS = ("text", "query")
# Skip reasons (the JSON-lines reader adds its own: not UTF-8, malformed JSON, not a JSON object).
WRONG_FIELDS = "wrong number of tab-separated fields (expected 2: id, text)"
NO_ID = "no id field (" + ", ".join(ID_FIELDS) + ")"
SEVERAL_IDS = "more than one id field"
BAD_ID = "id that is not a non-empty string or integer"
NO_TEXT = "missing or empty text"
SEVERAL_TEXTS = "both a text and a query field"
BAD_TITLE = "title that is not a string"
NO_QUERY = "missing or empty query"
NO_POSITIVE = "no positive passage"
BAD_PASSAGE = ("a passage without a docid or text, or with a non-string title, a score that is not a finite number "
               "or a rank that is not an integer >= 1")
SOME_SCORES = "a teacher score on some passages but not all"


@dataclasses.dataclass(frozen=True)
class Passage:
    """One passage (or query) as its file gives it: id, text and title ("" when it has none).

    In a training file a passage may also carry a teacher's `score` (Tevatron's
    "score" field) and the `rank` a retriever gave it (1-based); None when absent.
    """

    id: str
    text: str
    title: str = ""
    score: float | None = None
    rank: int | None = None

    def joined(self, title_join: str | None = DEFAULT_TITLE_JOIN) -> str:
        """The text a model reads: see join_title."""
        return join_title(self.title, self.text, title_join)


@dataclasses.dataclass(frozen=True)
class TrainingQuery:
    """One query of a Tevatron training file with its positive and (hard) negative passages."""

    query_id: str
    query: str
    positives: tuple[Passage, ...]
    negatives: tuple[Passage, ...]


@dataclasses.dataclass
class TextFile:
    """The passages (or queries) of one file, in file order: ids, texts, titles, and each one's line."""

    path: str
    ids: list[str]
    texts: list[str]
    titles: list[str]
    lines: array.array
    rows: dict[str, int]
    skipped: jsonl.SkippedLines

    def __len__(self) -> int:
        return len(self.ids)

    def joined(self, title_join: str | None = DEFAULT_TITLE_JOIN) -> list[str]:
        """Every text with its title joined as join_title does."""
        return [join_title(title, text, title_join) for title, text in zip(self.titles, self.texts)]

    def passage(self, passage_id: str) -> Passage:
        """The passage with this id; KeyError when the file has none."""
        row = self.rows[passage_id]
        return Passage(passage_id, self.texts[row], self.titles[row])

    def subset(self, keep: Iterable[str]) -> "TextFile":
        """The entries whose id is in keep, in file order."""
        keep = set(keep)
        picked = [row for row, i in enumerate(self.ids) if i in keep]
        return TextFile(self.path, [self.ids[r] for r in picked], [self.texts[r] for r in picked],
                        [self.titles[r] for r in picked], array.array("q", (self.lines[r] for r in picked)),
                        {self.ids[r]: n for n, r in enumerate(picked)}, self.skipped)


@dataclasses.dataclass
class Qrels:
    """Relevance judgements: qid -> {docid: label}, and the file line of each (qid, docid)."""

    path: str
    labels: dict[str, dict[str, int]]
    lines: dict[tuple[str, str], int]

    def __len__(self) -> int:
        return len(self.lines)

    def relevant(self, query_id: str, level: int = 1) -> set[str]:
        """The docids judged at least `level` for a query (empty for an unjudged query)."""
        return {d for d, label in self.labels.get(query_id, {}).items() if label >= level}


@dataclasses.dataclass
class BeirData:
    """A BEIR folder read whole: the corpus, the split's queries and its qrels."""

    passages: TextFile
    queries: TextFile
    qrels: Qrels


def join_title(title: str, text: str, title_join: str | None = DEFAULT_TITLE_JOIN) -> str:
    """`title + title_join + text` when there is a title and title_join is a string, else text."""
    if title_join is None or not title:
        return text
    if not isinstance(title_join, str):
        raise RankgenError(f"title_join must be a string or None, got {title_join!r}")
    return title + title_join + text


# ---------------------------------------------------------------------------
# Lines of a file


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based number, raw line without its end) of every line; RankgenError when the file cannot be read."""
    try:
        with jsonl.open_binary(path) as f:
            for number, raw in enumerate(f, start=1):
                yield number, raw.rstrip(b"\r\n")
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise RankgenError(f"{path}: cannot read the file ({e})") from None


def _decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(number, text) of every non-blank line, for qrels and runs: a non-UTF-8 line is a RankgenError."""
    for number, raw in numbered_lines(path):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            raise RankgenError(f"{path}:{number}: not UTF-8") from None
        if line.strip():
            yield number, line


def _first_line(path: Path) -> str | None:
    """The first non-blank line (decoded leniently, only to tell the format), or None for an empty file."""
    for _, raw in numbered_lines(path):
        if raw.strip():
            return raw.decode("utf-8-sig", errors="replace")
    return None


def existing_file(path: str | Path, what: str) -> Path:
    file = Path(path)
    if not file.is_file():
        raise RankgenError(f"{path}: no such {what} file" + (" (a folder)" if file.is_dir() else ""))
    return file


# ---------------------------------------------------------------------------
# Passages and queries


def text_format(path: str | Path) -> str:
    """"tsv" or "jsonl", from the file's name or else its first line; RankgenError when neither fits."""
    file = existing_file(path, "text")
    name = file.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TSV_SUFFIXES):
        return "tsv"
    first = _first_line(file)
    if first is None:
        raise RankgenError(f"{path}: the file is empty")
    if first.lstrip().startswith("{"):
        return "jsonl"
    if "\t" in first:
        return "tsv"
    raise RankgenError(f"{path}: cannot tell the format: its first line is neither a JSON object nor "
                       "`id<TAB>text`; plain text (one passage per line) has no ids, so write TSV "
                       "(`id<TAB>text` lines) or JSON lines ({\"id\": ..., \"text\": ...})")


def _record_id(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    value = str(value)
    return value if value else None


def _check_text_record(record: dict) -> str | None:
    present = [f for f in ID_FIELDS if f in record]
    if not present:
        return NO_ID
    if len(present) > 1:
        return SEVERAL_IDS
    if _record_id(record[present[0]]) is None:
        return BAD_ID
    texts = [f for f in TEXT_FIELDS if f in record]
    if len(texts) > 1:
        return SEVERAL_TEXTS
    text = record.get(texts[0]) if texts else None
    if not isinstance(text, str) or not text.strip():
        return NO_TEXT
    if not isinstance(record.get("title", ""), str):
        return BAD_TITLE
    return None


def _jsonl_texts(path: Path, skipped: jsonl.SkippedLines) -> Iterator[tuple[int, Passage]]:
    for number, record in jsonl.iter_jsonl(path, _check_text_record, skipped.add):
        id_field = next(f for f in ID_FIELDS if f in record)
        text_field = next(f for f in TEXT_FIELDS if f in record)
        yield number, Passage(_record_id(record[id_field]), record[text_field], record.get("title") or "")


def _tsv_texts(path: Path, skipped: jsonl.SkippedLines) -> Iterator[tuple[int, Passage]]:
    for number, raw in numbered_lines(path):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            skipped.add(jsonl.NOT_UTF8, number)
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            skipped.add(WRONG_FIELDS, number)
        elif not fields[0]:
            skipped.add(BAD_ID, number)
        elif not fields[1].strip():
            skipped.add(NO_TEXT, number)
        else:
            yield number, Passage(fields[0], fields[1])


def iter_texts(path: str | Path, format: str = "auto",
               skipped: jsonl.SkippedLines | None = None) -> Iterator[tuple[int, Passage]]:
    """(line number, passage) of each usable line of a TSV or JSON-lines file, streamed.

    Skipped lines are counted in `skipped`; duplicate ids are not checked here
    (read_texts does, and so must a streaming caller).
    """
    file = existing_file(path, "text")
    format = text_format(file) if format == "auto" else format
    if format not in TEXT_FORMATS:
        raise RankgenError(f"unknown text file format {format!r}: expected one of {TEXT_FORMATS} or 'auto'")
    skipped = skipped if skipped is not None else jsonl.SkippedLines()
    return _jsonl_texts(file, skipped) if format == "jsonl" else _tsv_texts(file, skipped)


def read_texts(path: str | Path, format: str = "auto", what: str = "passage", quiet: bool = False) -> TextFile:
    """Every usable passage (or query) of a TSV or JSON-lines file; see the module docstring for bad input."""
    skipped = jsonl.SkippedLines()
    ids, texts, titles, lines, rows = [], [], [], array.array("q"), {}
    for number, passage in iter_texts(path, format, skipped):
        row = rows.setdefault(passage.id, len(ids))
        if row != len(ids):
            raise RankgenError(f"{path}: {what} id {passage.id!r} occurs twice (lines {lines[row]} and {number}); "
                               "ids must be unique")
        ids.append(passage.id)
        texts.append(passage.text)
        titles.append(passage.title)
        lines.append(number)
    report_read(path, what, len(ids), skipped, quiet)
    return TextFile(str(path), ids, texts, titles, lines, rows, skipped)


def report_read(path: str | Path, what: str, usable: int, skipped: jsonl.SkippedLines, quiet: bool) -> None:
    """RankgenError when a file gave nothing usable; else its skipped lines summarised on stderr (unless quiet)."""
    if not usable:
        reason = f" ({skipped.describe()})" if skipped.count else " (the file is empty)"
        raise RankgenError(f"{path}: no usable {what}{reason}")
    if skipped.count and not quiet:
        print(f"{path}: skipped {skipped.count} lines: {skipped.describe()}", file=sys.stderr)


def is_beir_folder(path: str | Path) -> bool:
    """A folder holding BEIR's corpus.jsonl or queries.jsonl."""
    folder = Path(path)
    return folder.is_dir() and ((folder / BEIR_CORPUS).is_file() or (folder / BEIR_QUERIES).is_file())


def _beir_file(folder: Path, name: str) -> Path:
    if not is_beir_folder(folder):
        raise RankgenError(f"{folder}: a folder, but not a BEIR one (no {BEIR_CORPUS} or {BEIR_QUERIES})")
    if not (folder / name).is_file():
        raise RankgenError(f"{folder / name}: missing from the BEIR folder")
    return folder / name


def read_passages(path: str | Path, quiet: bool = False) -> TextFile:
    """The passages of a TSV or JSON-lines file, or of a BEIR folder's corpus.jsonl."""
    file = _beir_file(Path(path), BEIR_CORPUS) if Path(path).is_dir() else path
    return read_texts(file, what="passage", quiet=quiet)


def passages_file(path: str | Path) -> Path:
    """The file read_passages reads: path itself, or a BEIR folder's corpus.jsonl."""
    return _beir_file(Path(path), BEIR_CORPUS) if Path(path).is_dir() else existing_file(path, "passage")


def beir_splits(folder: str | Path) -> list[str]:
    """The qrels splits of a BEIR folder (qrels/<split>.tsv), sorted."""
    qrels = Path(folder) / "qrels"
    return sorted(p.stem for p in qrels.glob("*.tsv")) if qrels.is_dir() else []


def require_split(queries_path: str | Path, split: str | None) -> None:
    """A BEIR folder's queries are read only at a split named on purpose: a default one (test) could as well be the
    split a user trains on, or mines for, by mistake."""
    if split is None and Path(queries_path).is_dir():
        raise RankgenError(f"{queries_path} is a BEIR folder: name the split whose queries to read with `split` "
                           f"(its splits: {', '.join(beir_splits(queries_path)) or 'none'})", names=("split",))


def read_queries(path: str | Path, split: str | None = None, quiet: bool = False) -> TextFile:
    """The queries of a TSV or JSON-lines file, or those of a BEIR folder its split's qrels judge (default "test").

    A split judging a query that queries.jsonl lacks is a RankgenError naming the qrels line.
    """
    if not Path(path).is_dir():
        if split is not None:
            raise RankgenError(f"{path}: a split ({split!r}) names a BEIR folder's qrels; this is a file")
        return read_texts(path, what="query", quiet=quiet)
    folder = Path(path)
    queries = read_texts(_beir_file(folder, BEIR_QUERIES), what="query", quiet=quiet)
    qrels = read_qrels(folder, split=split)
    check_qrels(qrels, query_ids=queries.rows)
    return queries.subset(qrels.labels)


# ---------------------------------------------------------------------------
# Qrels


def _beir_qrels_file(folder: Path, split: str | None) -> Path:
    split = DEFAULT_SPLIT if split is None else split
    path = folder / "qrels" / f"{split}.tsv"
    if not path.is_file():
        found = beir_splits(folder)
        raise RankgenError(f"{path}: no qrels for split {split!r} in {folder}"
                           + (f" (splits there: {', '.join(found)})" if found else ""))
    return path


def qrels_format(path: str | Path) -> str:
    """"trec", "msmarco" or "beir", told from the file's first line; RankgenError when none fits."""
    file = existing_file(path, "qrels")
    first = _first_line(file)
    if first is None:
        raise RankgenError(f"{path}: the qrels file is empty")
    fields = first.split()
    if tuple(fields) == BEIR_QRELS_HEADER:
        return "beir"
    if len(fields) == 4:
        return "trec"
    if len(fields) == 2:
        return "msmarco"
    raise RankgenError(f"{path}: cannot tell the qrels format from line 1 ({len(fields)} fields): expected TREC's "
                       "`qid iter docid rel`, MS MARCO's `qid docid`, or BEIR's `query-id<TAB>corpus-id<TAB>score` "
                       "header")


def _label(value: str, path: Path, number: int) -> int:
    try:
        return int(value)
    except ValueError:
        raise RankgenError(f"{path}:{number}: relevance {value!r} is not an integer "
                           "(trec_eval reads integer labels)") from None


def read_qrels(path: str | Path, split: str | None = None, format: str = "auto") -> Qrels:
    """Judgements of a TREC, MS MARCO or BEIR qrels file, or of a BEIR folder's qrels/<split>.tsv.

    Every bad line is a RankgenError naming the file and line: the wrong
    number of fields, a non-integer label, a (qid, docid) judged twice.
    """
    if Path(path).is_dir():
        file = _beir_qrels_file(Path(path), split)
    else:
        if split is not None:
            raise RankgenError(f"{path}: a split ({split!r}) names a BEIR folder's qrels; this is a file")
        file = existing_file(path, "qrels")
    format = qrels_format(file) if format == "auto" else format
    if format not in QRELS_FORMATS:
        raise RankgenError(f"unknown qrels format {format!r}: expected one of {QRELS_FORMATS} or 'auto'")
    expected = {"trec": 4, "msmarco": 2, "beir": 3}[format]
    labels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    header_seen = False
    for number, line in _decoded_lines(file):
        if format == "beir":
            fields = line.split("\t")
            if not header_seen:
                if tuple(f.strip() for f in fields) != BEIR_QRELS_HEADER:
                    raise RankgenError(f"{file}:{number}: expected BEIR's header "
                                       f"{chr(9).join(BEIR_QRELS_HEADER)!r}, got {line!r}")
                header_seen = True
                continue
        else:
            fields = line.split()
        if len(fields) != expected or not all(fields):
            raise RankgenError(f"{file}:{number}: {len(fields)} fields, expected {expected} "
                               f"({format} qrels: {_QRELS_LAYOUT[format]})")
        if format == "trec":
            qid, _, docid, value = fields
            label = _label(value, file, number)
        elif format == "beir":
            qid, docid, value = fields
            label = _label(value, file, number)
        else:
            (qid, docid), label = fields, 1
        previous = lines.setdefault((qid, docid), number)
        if previous != number:
            raise RankgenError(f"{file}: query {qid!r} judges document {docid!r} twice (lines {previous} "
                               f"and {number})")
        labels.setdefault(qid, {})[docid] = label
    if not lines:
        raise RankgenError(f"{file}: no judgements")
    return Qrels(str(file), labels, lines)


_QRELS_LAYOUT = {"trec": "qid iter docid rel", "msmarco": "qid docid", "beir": "query-id<TAB>corpus-id<TAB>score"}


def check_qrels(qrels: Qrels, passage_ids: Mapping | set | None = None, query_ids: Mapping | set | None = None,
                on_missing: str = "error") -> Qrels:
    """qrels whose passages and queries all exist (in passage_ids / query_ids, when given).

    on_missing "error": RankgenError naming the qrels file, the count and the
    first lines. "skip": those judgements are dropped, counted on stderr by line.
    """
    if on_missing not in ("error", "skip"):
        raise RankgenError(f"on_missing must be 'error' or 'skip', got {on_missing!r}")
    missing = jsonl.SkippedLines()
    for (qid, docid), number in qrels.lines.items():
        if query_ids is not None and qid not in query_ids:
            missing.add("query not among the queries", number)
        elif passage_ids is not None and docid not in passage_ids:
            missing.add("document not in the corpus", number)
    if not missing.count:
        return qrels
    if on_missing == "error":
        raise RankgenError(f"{qrels.path}: {missing.count} judgements name ids that are missing: {missing.describe()}")
    print(f"{qrels.path}: skipped {missing.count} judgements: {missing.describe()}", file=sys.stderr)
    dropped = set(missing.numbers())
    labels: dict[str, dict[str, int]] = {}
    lines = {}
    for (qid, docid), number in qrels.lines.items():
        if number not in dropped:
            labels.setdefault(qid, {})[docid] = qrels.labels[qid][docid]
            lines[(qid, docid)] = number
    return Qrels(qrels.path, labels, lines)


def _write_whole(path: Path, lines: Iterable[str]) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(lines)
    partial.replace(path)


def write_beir(folder: str | Path, corpus: Iterable[Mapping], queries: Iterable[Mapping],
               qrels: Mapping[str, Iterable[tuple[str, str, int]]]) -> Path:
    """A BEIR folder: corpus.jsonl ({"_id", "title", "text"}), queries.jsonl ({"_id", "text"}) and, per split,
    qrels/<split>.tsv of (query id, passage id, label); each file written whole (renamed into place)."""
    out = Path(folder)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    _write_whole(out / BEIR_CORPUS, (json.dumps(dict(r), ensure_ascii=False) + "\n" for r in corpus))
    _write_whole(out / BEIR_QUERIES, (json.dumps(dict(r), ensure_ascii=False) + "\n" for r in queries))
    for split, judged in qrels.items():
        rows = ["\t".join(BEIR_QRELS_HEADER) + "\n"] + [f"{q}\t{d}\t{int(label)}\n" for q, d, label in judged]
        _write_whole(out / "qrels" / f"{split}.tsv", rows)
    return out


def read_beir(folder: str | Path, split: str | None = None, on_missing: str = "skip") -> BeirData:
    """A BEIR folder's corpus, the queries its split judges, and that split's qrels (checked against both).

    Judgements naming a passage missing from corpus.jsonl are dropped and
    counted (on_missing="skip"), or a RankgenError (on_missing="error"); a
    judged query missing from queries.jsonl is always a RankgenError.
    """
    return read_judged(folder, folder, folder, split, on_missing)


def read_judged(passages: str | Path, queries: str | Path, qrels: str | Path, split: str | None = None,
                on_missing: str = "skip") -> BeirData:
    """Passages, the queries the qrels judge, and the qrels, each a file or a BEIR folder (whose queries and qrels
    are read at `split`), checked against each other as read_beir checks a folder."""
    passage_file = read_passages(passages)
    query_file = read_texts(_beir_file(Path(queries), BEIR_QUERIES) if Path(queries).is_dir() else queries,
                            what="query")
    judged = read_qrels(qrels, split=split if Path(qrels).is_dir() else None)
    check_qrels(judged, query_ids=query_file.rows)
    judged = check_qrels(judged, passage_ids=passage_file.rows, on_missing=on_missing)
    return BeirData(passage_file, query_file.subset(judged.labels), judged)


# ---------------------------------------------------------------------------
# Runs


def trec_eval_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """(docid, score) by score descending, equal scores by docid descending: the order trec_eval ranks a run in."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)


def run_format(path: str | Path) -> str:
    """"trec", "msmarco" or "jsonl", told from the file's first line; RankgenError when none fits."""
    file = existing_file(path, "run")
    first = _first_line(file)
    if first is None:
        raise RankgenError(f"{path}: the run file is empty")
    if first.lstrip().startswith("{"):
        return "jsonl"
    fields = first.split()
    if len(fields) == 6:
        return "trec"
    if len(fields) == 3:
        return "msmarco"
    raise RankgenError(f"{path}: cannot tell the run format from line 1 ({len(fields)} fields): expected TREC's "
                       "`qid Q0 docid rank score tag`, MS MARCO's `qid<TAB>pid<TAB>rank`, or search's JSON lines")


def _number(value: str, expected, what: str, path: Path, number: int):
    try:
        parsed = expected(value)
    except ValueError:
        raise RankgenError(f"{path}:{number}: {what} {value!r} is not a number") from None
    if expected is float and not math.isfinite(parsed):
        raise RankgenError(f"{path}:{number}: {what} {value!r} is not finite")
    return parsed


def read_run(path: str | Path, format: str = "auto") -> dict[str, dict[str, float]]:
    """A run as qid -> {docid: score} (pytrec_eval's form); every bad line is a RankgenError naming file and line.

    TREC runs keep their scores (trec_eval ignores the rank column); MS MARCO
    runs get score -rank; JSON lines keep "scores", or rank in list order
    without them. A (qid, docid) listed twice is an error, as in trec_eval.
    """
    file = existing_file(path, "run")
    format = run_format(file) if format == "auto" else format
    if format not in RUN_FORMATS:
        raise RankgenError(f"unknown run format {format!r}: expected one of {RUN_FORMATS} or 'auto'")
    run: dict[str, dict[str, float]] = {}
    lines: dict[tuple[str, str], int] = {}
    ranks: dict[tuple[str, int], int] = {}

    def add(qid: str, docid: str, score: float, number: int) -> None:
        previous = lines.setdefault((qid, docid), number)
        if previous != number:
            raise RankgenError(f"{file}: query {qid!r} lists document {docid!r} twice (line {previous} and {number})")
        run.setdefault(qid, {})[docid] = score

    if format == "jsonl":
        query_lines: dict[str, int] = {}
        for number, (qid, ids, scores) in _run_records(file):
            previous = query_lines.setdefault(qid, number)
            if previous != number:
                raise RankgenError(f"{file}: query {qid!r} is on two lines ({previous} and {number})")
            if len(set(ids)) != len(ids):
                raise RankgenError(f"{file}:{number}: query {qid!r} lists a document twice")
            run[qid] = {docid: float(scores[position]) if scores is not None else -float(position + 1)
                        for position, docid in enumerate(ids)}
    else:
        expected = 6 if format == "trec" else 3
        for number, line in _decoded_lines(file):
            fields = line.split() if format == "trec" else line.split("\t")
            if len(fields) != expected or not all(f.strip() for f in fields):
                layout = "qid Q0 docid rank score tag" if format == "trec" else "qid<TAB>pid<TAB>rank"
                raise RankgenError(f"{file}:{number}: {len(fields)} fields, expected {expected} ({format} run: {layout})")
            if format == "trec":
                qid, _, docid, rank, score, _ = fields
                _number(rank, int, "rank", file, number)
                add(qid, docid, _number(score, float, "score", file, number), number)
            else:
                qid, docid, rank = (f.strip() for f in fields)
                rank = _number(rank, int, "rank", file, number)
                if rank < 1:
                    raise RankgenError(f"{file}:{number}: rank {rank} (MS MARCO ranks start at 1)")
                previous = ranks.setdefault((qid, rank), number)
                if previous != number:
                    raise RankgenError(f"{file}: query {qid!r} has two documents at rank {rank} "
                                       f"(lines {previous} and {number})")
                add(qid, docid, -float(rank), number)
    if not run:
        raise RankgenError(f"{file}: the run lists no query")
    return run


def _run_records(path: Path) -> Iterator[tuple[int, tuple[str, list[str], list[float] | None]]]:
    """(line, (qid, ids, scores or None)) of search's JSON lines; a bad line is a RankgenError."""

    def check(record: dict) -> str | None:
        if _record_id(record.get("query_id")) is None:
            return "no query_id string"
        ids = record.get("ids")
        if not isinstance(ids, list) or not all(_record_id(i) is not None for i in ids):
            return "ids is not a list of id strings"
        scores = record.get("scores")
        if scores is not None:
            if not isinstance(scores, list) or len(scores) != len(ids):
                return "scores is not a list as long as ids"
            if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scores):
                return "scores holds a value that is not a finite number"
        return None

    def fail(reason: str, number: int) -> None:
        raise RankgenError(f"{path}:{number}: {reason}")

    for number, record in jsonl.iter_jsonl(path, check, fail):
        yield number, (_record_id(record["query_id"]), [_record_id(i) for i in record["ids"]], record.get("scores"))


def _checked_run_id(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise RankgenError(f"{what} {value!r} is empty or holds whitespace: a TREC or MS MARCO run cannot hold it "
                           "(write the `out_format` jsonl)", names=("out_format",))
    return value


def run_lines(results: Iterable[Mapping], format: str, tag: str = DEFAULT_RUN_TAG) -> Iterator[str]:
    """Lines (without "\\n") of a run from search results [{"query_id", "ids", "scores", ...}].

    trec: `qid Q0 docid rank score tag`, msmarco: `qid\\tpid\\trank`, jsonl: one
    result a line as given. trec and msmarco list each query's documents in
    trec_eval's order with ranks from 1; a document twice for one query is a
    RankgenError.
    """
    if format not in RUN_FORMATS:
        raise RankgenError(f"unknown run format {format!r}: expected one of {RUN_FORMATS}")
    if format != "jsonl":
        _checked_run_id(tag, "run tag")
    for result in results:
        if format == "jsonl":
            yield json.dumps(dict(result), ensure_ascii=False)
            continue
        qid = _checked_run_id(str(result["query_id"]), "query id")
        scores = {}
        for docid, score in zip(result["ids"], result["scores"]):
            docid = _checked_run_id(str(docid), "document id")
            if docid in scores:
                raise RankgenError(f"query {qid!r}: document {docid!r} is listed twice; a run holds each once")
            scores[docid] = float(score)
        for rank, (docid, score) in enumerate(trec_eval_order(scores), start=1):
            yield f"{qid} Q0 {docid} {rank} {score!r} {tag}" if format == "trec" else f"{qid}\t{docid}\t{rank}"


def write_run(path: str | Path, results: Iterable[Mapping], format: str, tag: str = DEFAULT_RUN_TAG) -> Path:
    """Write run_lines to path (parent folder made), through a side file renamed into place; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("w", encoding="utf-8") as f:
            for line in run_lines(results, format, tag):
                f.write(line + "\n")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return path


# ---------------------------------------------------------------------------
# Tevatron training queries


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tevatron_passage(value) -> Passage | None:
    if not isinstance(value, dict):
        return None
    docid, text, title = _record_id(value.get("docid")), value.get("text"), value.get("title", "")
    if docid is None or not isinstance(text, str) or not text.strip() or not isinstance(title, str):
        return None
    score, rank = value.get("score"), value.get("rank")
    if (score is not None and not _finite_number(score)) or (
            rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1)):
        return None
    return Passage(docid, text, title, None if score is None else float(score), rank)


def _check_training_record(record: dict) -> str | None:
    if _record_id(record.get("query_id")) is None:
        return "no query_id (a non-empty string or integer)"
    if not isinstance(record.get("query"), str) or not record["query"].strip():
        return NO_QUERY
    positives = record.get("positive_passages")
    negatives = record.get("negative_passages", [])
    if not isinstance(positives, list) or not positives:
        return NO_POSITIVE
    if not isinstance(negatives, list):
        return BAD_PASSAGE
    passages = [_tevatron_passage(p) for p in positives + negatives]
    if any(p is None for p in passages):
        return BAD_PASSAGE
    if len({p.score is None for p in passages}) > 1:
        return SOME_SCORES
    return None


def iter_training_queries(path: str | Path,
                          skipped: jsonl.SkippedLines | None = None) -> Iterator[tuple[int, TrainingQuery]]:
    """(line number, query) of each usable record of a Tevatron training file, streamed; skips go to `skipped`."""
    skipped = skipped if skipped is not None else jsonl.SkippedLines()
    for number, record in jsonl.iter_jsonl(path, _check_training_record, skipped.add):
        yield number, TrainingQuery(
            _record_id(record["query_id"]), record["query"],
            tuple(_tevatron_passage(p) for p in record["positive_passages"]),
            tuple(_tevatron_passage(p) for p in record.get("negative_passages", [])))


def read_training_queries(path: str | Path, quiet: bool = False) -> list[TrainingQuery]:
    """Every usable query of a Tevatron training file; skips summarised on stderr, a query id twice an error."""
    return [query for _, query in read_numbered_training_queries(path, quiet)]


def read_numbered_training_queries(path: str | Path, quiet: bool = False) -> list[tuple[int, TrainingQuery]]:
    """(line number, query) of every usable query of a Tevatron training file, as read_training_queries reads them."""
    skipped = jsonl.SkippedLines()
    queries, first_line = [], {}
    for number, query in iter_training_queries(path, skipped):
        previous = first_line.setdefault(query.query_id, number)
        if previous != number:
            raise RankgenError(f"{path}: query id {query.query_id!r} occurs twice (lines {previous} and {number})")
        queries.append((number, query))
    report_read(path, "training query", len(queries), skipped, quiet)
    return queries


def training_query_record(query: TrainingQuery) -> dict:
    """The Tevatron JSON object of a query (titles kept apart; scores and ranks where passages have them), e.g. for
    jsonl.write_jsonl."""

    def passage(p: Passage) -> dict:
        record = {"docid": p.id, "title": p.title, "text": p.text}
        if p.score is not None:
            record["score"] = p.score
        if p.rank is not None:
            record["rank"] = p.rank
        return record

    return {"query_id": query.query_id, "query": query.query,
            "positive_passages": [passage(p) for p in query.positives],
            "negative_passages": [passage(p) for p in query.negatives]}

