"""Split book text into sentences: the unit RankGen prefixes and continuations are built from.

Rules, in order:

1. Paragraphs. Lines are joined within a paragraph (books are hard-wrapped at
   ~70 columns) and a blank line always ends a sentence: nothing continues
   across a paragraph break, so a heading or a title that stands alone
   ("CHAPTER I", "By Jane Austen") becomes its own sentence.
2. Heading lines. Inside a paragraph, a short line with no lowercase letters
   ("FIRST WITCH.", "ACT II. SCENE 1.", "BOTCHAN (MASTER DARLING)") or a bare
   "Chapter 12" line is one sentence on its own, unsplit. This matters for
   files without blank lines (the bundled Botchan) and for play speaker tags.
3. Sentence ends. A word ending in . ! ? or an ellipsis (closing quotes,
   brackets and _italic_ marks stay with it) ends a sentence when the next word
   starts with a capital letter (after any opening quotes or brackets). So
   '"Is it?" she asked.' stays whole and '"Go!" He left.' splits.
4. Not an end: titles and other abbreviations that precede a name or a
   number (Mr. Mrs. Dr. St. Mt. Col. Capt. Gen. Rev. vs. e.g. i.e. Wm. ...),
   initials ("J. R. R. Tolkien", "J.R.R."), and any period followed by a
   digit or a lowercase word ("No. 5", "3.5", "etc. and", "a.m. on").
   Abbreviations that can also end a sentence (etc. a.m. p.m. Esq.) end one
   when a capitalised word follows.

Known limits (no parser can decide these without grammar): '"Cut!" I said.'
splits after "Cut!" because "I" is capitalised; a proper noun after "etc." or
"p.m." starts a new sentence.

Whitespace inside a sentence is collapsed to single spaces, and splitting only
ever happens between whitespace-separated words, so joining all sentences'
words gives back exactly the text's words.
"""

from __future__ import annotations

import re

# Characters that may follow the terminal punctuation and still belong to the
# sentence it ends: closing quotes, brackets, and Gutenberg's _italic_ marks.
_CLOSERS = "\"'\u201d\u2019)]}_*\u00bb"
# Characters that may precede the first letter of a sentence.
_OPENERS = "\"'\u201c\u2018([{_*\u00ab"
_TERMINALS = ".!?\u2026"

# Abbreviations that precede a name, a number or an example, so a capitalised
# word after them never starts a new sentence (lowercase, without the dot).
_NEVER_END = frozenset(
    """
    mr mrs ms messrs mme mlle dr st mt col capt gen lt sgt maj adm cmdr
    gov sen hon prof rev fr pres supt insp vs cf viz e.g i.e vol vols pp
    wm geo chas jas jno thos benj robt edw richd saml
    """.split()
)

# "Chapter 12", "BOOK IV.", "Act 2" alone on a line: a heading even in mixed case.
_CHAPTER_LINE = re.compile(
    r"(?:chapter|book|part|volume|vol\.|act|scene|canto|letter|section|stave)"
    r"\s+(?:[ivxlcdm]+|\d+)\.?",
    re.IGNORECASE,
)
_MAX_HEADING_CHARS = 60


def word_count(text: str) -> int:
    """Number of whitespace-separated words, the unit every length in this package is measured in."""
    return len(text.split())


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` in order, each with single spaces between its words; never an empty one."""
    sentences: list[str] = []
    for paragraph in _paragraphs(text):
        for words, is_heading in _segments(paragraph):
            if is_heading:
                sentences.append(" ".join(words))
            else:
                sentences.extend(_split_words(words))
    return sentences


def _paragraphs(text: str) -> list[list[str]]:
    """Non-blank lines grouped into paragraphs; a whitespace-only line separates them."""
    paragraphs: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    return paragraphs


def _segments(lines: list[str]) -> list[tuple[list[str], bool]]:
    """Runs of words within one paragraph, with heading lines cut out as their own (words, True) runs."""
    segments: list[tuple[list[str], bool]] = []
    running: list[str] = []
    previous: str | None = None
    for line in lines:
        if _is_heading_line(line, previous):
            if running:
                segments.append((running, False))
                running = []
            segments.append((line.split(), True))
        else:
            running.extend(line.split())
        previous = line
    if running:
        segments.append((running, False))
    return segments


def _is_heading_line(line: str, previous: str | None) -> bool:
    """Whether a line is a heading or a speaker tag rather than part of running text."""
    stripped = line.strip()
    if len(stripped) > _MAX_HEADING_CHARS:
        return False
    if _CHAPTER_LINE.fullmatch(stripped):
        return True
    if not _is_all_caps(stripped):
        return False
    # The short last line of an all-caps paragraph (licence boilerplate in
    # capitals) continues the long line above it: not a heading.
    return previous is None or len(previous.strip()) <= _MAX_HEADING_CHARS or not _is_all_caps(previous)


def _is_all_caps(text: str) -> bool:
    """At least two capital letters and no lowercase ones ("I" alone or "1919" is not a heading)."""
    if any(c.islower() for c in text):
        return False
    return sum(c.isupper() for c in text) >= 2


def _split_words(words: list[str]) -> list[str]:
    """Sentences of one run of words, cut after every word that ends a sentence."""
    sentences: list[str] = []
    start = 0
    for i in range(len(words) - 1):
        if _ends_sentence(words[i], words[i + 1]):
            sentences.append(" ".join(words[start : i + 1]))
            start = i + 1
    if start < len(words):
        sentences.append(" ".join(words[start:]))
    return sentences


def _ends_sentence(word: str, next_word: str) -> bool:
    """Whether a sentence ends after `word`, given the word that follows it."""
    core = word.rstrip(_CLOSERS)
    if not core or core[-1] not in _TERMINALS:
        return False
    if not _starts_sentence(next_word):
        return False
    return not (core[-1] == "." and _is_abbreviation(core))


def _starts_sentence(word: str) -> bool:
    """Whether a word can open a sentence: a capital letter after any opening quotes or brackets."""
    core = word.lstrip(_OPENERS)
    return bool(core) and core[0].isupper()


def _is_abbreviation(core: str) -> bool:
    """Whether a word ending in "." is an abbreviation or an initial that a name follows."""
    stem = core.lstrip(_OPENERS)[:-1]
    if stem.endswith("."):  # an ellipsis ("so...") is a real end
        return False
    if stem.lower() in _NEVER_END:
        return True
    # Initials: "J." or "J.R.R." (but "I." is the pronoun ending a sentence).
    parts = stem.split(".")
    return all(len(p) == 1 and p.isupper() for p in parts) and stem != "I"


# The characters the RankGen paper's released code cuts generations and human text after.
_CUT_MARKS = ".?!;"


def cut_at_last_sentence_end(text: str) -> str:
    """Whitespace collapsed, then cut after the last ". ? ! ;" (the RankGen paper's cut of generations and human
    text for MAUVE, as its released `truncate`); unchanged when there is none, or only at the first character."""
    text = " ".join(text.split())
    last = max(text.rfind(mark) for mark in _CUT_MARKS)
    return text[: last + 1] if last > 0 else text
