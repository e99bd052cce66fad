"""The public suffix-identification benchmarks RankGen reports (App. C.4-C.5), read from their released files into
`rankgen-jax score` items: {"id", "prefix", "candidates", "label"} (label: the gold candidate's index).

- **ChapterBreak** (Sun et al. 2022): the released JSON, {split: {work id: [{"ctx", "pos", "negs"}]}} with the
  splits "pg19" and "ao3"; prefix = ctx, candidates = [pos, *negs], label 0. The paper reads 256 tokens of
  prefix: the `chapterbreak_ctx_256.json` file.
- **HellaSwag** (Zellers et al. 2019): the released JSON lines ({"ind", "ctx_a", "ctx_b", "endings", "label"});
  the paper's complete-sentence setting puts ctx_b before each ending: prefix = ctx_a, candidate k =
  ctx_b + " " + endings[k]. The validation file (the test file's labels are hidden).
- **StoryCloze** (Mostafazadeh et al. 2016; Sharma et al. 2018): the released CSV (InputStoryid,
  InputSentence1-4, RandomFifthSentenceQuiz1-2, AnswerRightEnding 1 or 2); prefix = the four sentences joined
  by spaces, candidates = the two endings in file order, label = AnswerRightEnding - 1.

The data are not bundled: each comes under its authors' terms (StoryCloze only on request), so a user
downloads them. A record that cannot make an item is skipped and counted with its reason and place; a file
without one usable record, or of the wrong layout, is a RankgenError.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rankgen_jax.data.jsonl import SkippedLines, collect_jsonl
from rankgen_jax.errors import RankgenError

BENCHMARKS = ("chapterbreak", "hellaswag", "storycloze")
CHAPTERBREAK_SPLITS = ("pg19", "ao3")
HELLASWAG_ENDINGS = 4
CHAPTERBREAK_NEGATIVES = 5
STORYCLOZE_COLUMNS = ("InputStoryid", "InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4",
                      "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding")


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _join(*parts: str) -> str:
    return " ".join(part.strip() for part in parts if part.strip())


def _hellaswag_problem(record: dict) -> str | None:
    endings, label = record.get("endings"), record.get("label")
    if "ind" not in record:
        return "no ind"
    if not _text(record.get("ctx_a")) or not isinstance(record.get("ctx_b", ""), str):
        return "no ctx_a text"
    if not (isinstance(endings, list) and len(endings) == HELLASWAG_ENDINGS and all(map(_text, endings))):
        return f"endings are not {HELLASWAG_ENDINGS} texts"
    if label in (None, ""):
        return "no label (a test-split record)"
    if isinstance(label, bool) or not isinstance(label, (int, str)) or str(label) not in map(str, range(len(endings))):
        return "label is not an ending's index"
    return None


def hellaswag_items(path: str | Path) -> tuple[list[dict], SkippedLines]:
    """HellaSwag's JSON lines as items (module docstring); the skipped lines with their reasons."""
    records, skipped = collect_jsonl(path, _hellaswag_problem)
    items = [{"id": f"hellaswag-{r['ind']}", "prefix": r["ctx_a"].strip(),
              "candidates": [_join(r.get("ctx_b", ""), ending) for ending in r["endings"]],
              "label": int(r["label"])} for r in records]
    return items, skipped


def storycloze_items(path: str | Path) -> tuple[list[dict], SkippedLines]:
    """StoryCloze's CSV as items (module docstring); skipped rows are numbered by the line they end on."""
    file = Path(path)
    if not file.is_file():
        raise RankgenError(f"{path}: no such file")
    skipped, items = SkippedLines(), []
    with file.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in STORYCLOZE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RankgenError(f"{path}: not a StoryCloze CSV: its header lacks {', '.join(missing)} "
                               f"(found {', '.join(reader.fieldnames or []) or 'no header'})")
        for row in reader:
            texts = [row.get(c) for c in STORYCLOZE_COLUMNS[1:7]]
            answer = (row.get("AnswerRightEnding") or "").strip()
            if not all(map(_text, texts)) or not _text(row.get("InputStoryid")):
                skipped.add("a story id, sentence or ending is empty", reader.line_num)
            elif answer not in ("1", "2"):
                skipped.add("AnswerRightEnding is not 1 or 2", reader.line_num)
            else:
                items.append({"id": row["InputStoryid"].strip(), "prefix": _join(*texts[:4]),
                              "candidates": [texts[4].strip(), texts[5].strip()], "label": int(answer) - 1})
    return items, skipped


def _chapterbreak_problem(example) -> str | None:
    if not isinstance(example, dict):
        return "not a JSON object"
    negatives = example.get("negs")
    if not _text(example.get("ctx")) or not _text(example.get("pos")):
        return "no ctx or pos text"
    if not (isinstance(negatives, list) and negatives and all(map(_text, negatives))):
        return "negs is not a list of texts"
    return None


def chapterbreak_items(path: str | Path, split: str) -> tuple[list[dict], SkippedLines]:
    """One split of ChapterBreak's JSON as items (module docstring); skipped examples are numbered in file order
    within the split. Ids are "<split>/<work id>/<index in the work's list>"."""
    file = Path(path)
    if not file.is_file():
        raise RankgenError(f"{path}: no such file")
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RankgenError(f"{path}: not a ChapterBreak JSON file ({e})") from None
    if not isinstance(data, dict) or split not in data:
        found = ", ".join(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise RankgenError(f"{path}: no ChapterBreak split {split!r} (found: {found})")
    works = data[split]
    if not isinstance(works, dict):
        raise RankgenError(f"{path}: split {split!r} is not an object of work id -> examples")
    skipped, items, number = SkippedLines(unit="example"), [], 0
    for work_id, examples in works.items():
        if not isinstance(examples, list):
            number += 1
            skipped.add(f"work {work_id}'s examples are not a list", number)
            continue
        for k, example in enumerate(examples):
            number += 1
            problem = _chapterbreak_problem(example)
            if problem is not None:
                skipped.add(problem, number)
                continue
            items.append({"id": f"{split}/{work_id}/{k}", "prefix": example["ctx"].strip(),
                          "candidates": [example["pos"].strip(), *(n.strip() for n in example["negs"])],
                          "label": 0})
    return items, skipped


def benchmark_items(benchmark: str, path: str | Path, split: str = "pg19") -> tuple[list[dict], SkippedLines]:
    """The items of one benchmark file (`split` only for ChapterBreak); RankGenError when none is usable."""
    if benchmark == "chapterbreak":
        if split not in CHAPTERBREAK_SPLITS:
            raise RankgenError(f"ChapterBreak's splits are {', '.join(CHAPTERBREAK_SPLITS)}, not {split!r}")
        items, skipped = chapterbreak_items(path, split)
    elif benchmark == "hellaswag":
        items, skipped = hellaswag_items(path)
    elif benchmark == "storycloze":
        items, skipped = storycloze_items(path)
    else:
        raise RankgenError(f"unknown benchmark {benchmark!r}: one of {', '.join(BENCHMARKS)}")
    if not items:
        raise RankgenError(f"{path}: no usable {benchmark} record"
                           + (f" ({skipped.describe()})" if skipped.count else " (the file holds none)"))
    return items, skipped
