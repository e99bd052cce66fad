"""The perspectives demo's data: literary works cut into passages, and labelled passage pairs.

The corpus (data/perspectives/works.json) names each work's file, author,
title and form (play, poem, novel, prose). Every work is cut into passages of
min_words..max_words words at line ends (preferring paragraph, then sentence
ends); the last eval_fraction of each work's passages is held out, so no
passage text is in both splits. Pairs are drawn per label pattern: a share
from one work, a share from two works of one author, the rest from two
authors, the cross-work shares split into same form and different form.
Labels are [same_author, same_work, same_form]; same work implies the other two.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.resources import PERSPECTIVES_DIR, resource_path

PERSPECTIVES = ("same_author", "same_work", "same_form")
WORK_FIELDS = ("author", "work", "form")


@dataclasses.dataclass(frozen=True)
class Work:
    """One text file and what the corpus says about it."""

    path: Path
    author: str
    work: str
    form: str



def load_works(works_file: str | Path) -> list[Work]:
    """The works a works.json lists, their files resolved against its folder and checked to exist."""
    path = Path(works_file)
    # A relative path in a gin file (e.g. 'data/perspectives/works.json') should work from any folder, as the
    # default does: it also names the shipped file, in a checkout or an installed package.
    if not path.is_file() and not path.is_absolute() and resource_path(str(path)).is_file():
        path = resource_path(str(path))
    if not path.is_file():
        raise RankgenError(f"{works_file}: no such works file")
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RankgenError(f"{works_file}: not valid JSON ({e})") from None
    if not isinstance(table, dict) or not table:
        raise RankgenError(f"{works_file}: expected a JSON object mapping text files to their author, work and form")
    works = []
    for name, info in table.items():
        if not isinstance(info, dict) or not all(isinstance(info.get(k), str) and info[k].strip() for k in WORK_FIELDS):
            raise RankgenError(f"{works_file}: entry {name!r} needs non-empty strings {', '.join(WORK_FIELDS)}")
        text_path = (path.parent / name).resolve()
        if not text_path.is_file():
            raise RankgenError(f"{works_file}: {name!r} is not a file (looked for {text_path})")
        works.append(Work(text_path, *(info[k].strip() for k in WORK_FIELDS)))
    titles = [w.work for w in works]
    if len(set(titles)) != len(titles):
        raise RankgenError(f"{works_file}: every entry must name a different work")
    return works


_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
# Verse editions print every tenth line's number at the far right; it would give the edition away.
_LINE_NUMBER = re.compile(r"\s{2,}\d{1,5}\s*$")
# A line ends a sentence when its last word does (closing quotes, brackets, _italics_ allowed).
_SENTENCE_END = re.compile(r"[.!?][\"'\u2019\u201d)\]_]*$")
# Shorter lines ending in a period are speaker tags ("Ber.") or headings ("ACT I."), not sentence ends.
_MIN_SENTENCE_LINE_WORDS = 4


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's *** START / *** END lines (all of it when they are absent)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def _line_words(text: str, chunk_words: int) -> list[list[str]]:
    """Words of each line ([] for a blank one), line numbers dropped, lines over chunk_words split."""
    lines = []
    for line in strip_gutenberg(text).splitlines():
        words = _LINE_NUMBER.sub("", line).split()
        if not words:
            lines.append([])
        for start in range(0, len(words), chunk_words):
            lines.append(words[start : start + chunk_words])
    return lines


def _ends_sentence(words: list[str]) -> bool:
    return len(words) >= _MIN_SENTENCE_LINE_WORDS and bool(_SENTENCE_END.search(words[-1]))


def passages_of_text(text: str, min_words: int = 60, max_words: int = 100) -> list[str]:
    """Passages of min_words..max_words words cut at line ends, preferring paragraph, then sentence ends."""
    # Lines are joined with single spaces (plays and poems have short lines); a passage may run
    # across a paragraph break until it has min_words, and a shorter tail is dropped.
    if not 0 < min_words < max_words:
        raise RankgenError(f"passage words need 0 < min_words < max_words, got {min_words} and {max_words}")
    # Lines of at most max - min words: a buffer below min_words then never overflows max_words.
    lines = _line_words(text, max_words - min_words)
    passages: list[str] = []
    buffer: list[list[str]] = []
    size = 0

    def emit(count: int) -> None:
        nonlocal buffer, size
        passages.append(" ".join(w for line in buffer[:count] for w in line))
        buffer = buffer[count:]
        size = sum(map(len, buffer))

    for words in lines:
        if not words:
            if size >= min_words:
                emit(len(buffer))
            continue
        if size + len(words) > max_words:
            # The last sentence end that still leaves min_words, else everything so far.
            cut, running = len(buffer), 0
            for i, line in enumerate(buffer):
                running += len(line)
                if running >= min_words and _ends_sentence(line):
                    cut = i + 1
            emit(cut)
        buffer.append(words)
        size += len(words)
    if size >= min_words:
        emit(len(buffer))
    return passages


@dataclasses.dataclass(frozen=True)
class Passages:
    """Each work's passages of one split, in reading order (index i is works[i])."""

    works: list[Work]
    texts: list[list[str]]

    def count(self) -> int:
        return sum(map(len, self.texts))


def build_passages(works: list[Work], min_words: int, max_words: int,
                   eval_fraction: float) -> tuple[Passages, Passages]:
    """(train, eval) passages: the last eval_fraction of each work is held out; no text is in both."""
    if not 0 < eval_fraction < 1:
        raise RankgenError(f"the held-out share eval_fraction must be in (0, 1), got {eval_fraction}")
    seen: set[str] = set()
    train, held = [], []
    for work in works:
        try:
            text = work.path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as e:
            raise RankgenError(f"{work.path}: cannot read as UTF-8 text ({e})") from None
        # A passage that repeats an earlier one (a refrain, a repeated notice) is dropped, so
        # the splits share no text even across works.
        texts = [t for t in passages_of_text(text, min_words, max_words) if not (t in seen or seen.add(t))]
        # Both splits get at least one passage of every work that has two.
        num_eval = min(max(1, round(eval_fraction * len(texts))), len(texts) - 1) if len(texts) > 1 else 0
        train.append(texts[: len(texts) - num_eval])
        held.append(texts[len(texts) - num_eval :])
    return Passages(works, train), Passages(works, held)


# --- pairs --------------------------------------------------------------------------------


def pair_labels(a: Work, b: Work) -> tuple[float, float, float]:
    """[same_author, same_work, same_form] of two works."""
    return float(a.author == b.author), float(a.work == b.work), float(a.form == b.form)


def pattern_weights(same_work_share: float, same_author_share: float) -> dict[tuple, float]:
    """Share of pairs per label pattern: cross-work shares split evenly into same and different form."""
    rest = 1.0 - same_work_share - same_author_share
    if same_work_share < 0 or same_author_share < 0 or rest < -1e-9:
        raise RankgenError(f"pair shares must be >= 0 and sum to at most 1, got same_work_share={same_work_share} "
                           f"and same_author_share={same_author_share}")
    rest = max(rest, 0.0)
    return {(1.0, 1.0, 1.0): same_work_share,
            (1.0, 0.0, 1.0): same_author_share / 2, (1.0, 0.0, 0.0): same_author_share / 2,
            (0.0, 0.0, 1.0): rest / 2, (0.0, 0.0, 0.0): rest / 2}


def _work_pairs(passages: Passages) -> dict[tuple, list[tuple[int, int]]]:
    """Ordered (work, work) index pairs per label pattern; one work pairs with itself if it has two passages."""
    works, texts = passages.works, passages.texts
    by_pattern: dict[tuple, list[tuple[int, int]]] = {}
    for i, a in enumerate(works):
        for j, b in enumerate(works):
            usable = len(texts[i]) >= 2 if i == j else bool(texts[i]) and bool(texts[j])
            if usable:
                by_pattern.setdefault(pair_labels(a, b), []).append((i, j))
    return by_pattern


def _allocate(weights: list[float], count: int) -> list[int]:
    """Split count in proportion to weights (largest remainders), so pattern shares are exact."""
    total = sum(weights)
    exact = np.asarray(weights, np.float64) * count / total
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: count - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def sample_pairs(passages: Passages, count: int, rng: np.random.Generator, same_work_share: float = 1 / 3,
                 same_author_share: float = 1 / 3) -> list[dict]:
    """count labelled pairs {"a", "b", "labels", "works"}: a label pattern in its share, two works, two passages."""
    weights = pattern_weights(same_work_share, same_author_share)
    by_pattern = _work_pairs(passages)
    # A pattern without any work pair in this corpus gives its share to the others.
    patterns = [p for p, w in weights.items() if w > 0 and p in by_pattern]
    if not patterns:
        raise RankgenError("the corpus gives no passage pairs for the configured shares: it needs works with "
                           "at least two passages, or two works")
    plan = [p for p, n in zip(patterns, _allocate([weights[p] for p in patterns], count)) for _ in range(n)]
    rng.shuffle(plan)
    records, used = [], set()
    for pattern in plan:
        candidates = by_pattern[pattern]
        # A repeated pair teaches and measures nothing new: redraw a few times, then accept it.
        for _ in range(20):
            i, j = candidates[int(rng.integers(len(candidates)))]
            if i == j:
                a, b = (int(x) for x in rng.choice(len(passages.texts[i]), size=2, replace=False))
            else:
                a, b = int(rng.integers(len(passages.texts[i]))), int(rng.integers(len(passages.texts[j])))
            if (i, a, j, b) not in used:
                break
        used.add((i, a, j, b))
        records.append({"a": passages.texts[i][a], "b": passages.texts[j][b], "labels": list(pattern),
                        "works": [passages.works[i].work, passages.works[j].work]})
    return records


def label_rates(records: list[dict]) -> dict[str, float]:
    """Share of positive labels per perspective."""
    labels_PxN = np.asarray([r["labels"] for r in records], np.float64)
    return {name: float(labels_PxN[:, n].mean()) for n, name in enumerate(PERSPECTIVES)}
