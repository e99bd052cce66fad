"""The documentation: the generated reference pages are current, every relative link and anchor resolves,
docs/index.md reaches every page, the code's references to the docs name real pages and sections, and the
README stays a landing page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _markdown_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    files += [REPO / "tpu_scripts" / "README.md", REPO / "tasks" / "README.md"]
    return files + sorted((REPO / "data").glob("*/README.md"))


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' removed, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    return [m.group(1).strip() for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)]


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(path):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def _links(path: Path) -> list[tuple[str, str]]:
    """(target path, anchor) of every relative link of a markdown file."""
    out = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", _prose(path.read_text(encoding="utf-8"))):
        target = match.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        out.append((file, anchor))
    return out


def test_generated_reference_pages_are_current():
    stale = [str(path) for path, text in _gen_docs().generated_pages().items()
             if not (REPO / path).is_file() or (REPO / path).read_text(encoding="utf-8") != text]
    assert stale == [], f"out of date, run `make docs`: {stale}"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in _markdown_files():
        for file, anchor in _links(page):
            target = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(REPO)}: {file}{'#' + anchor if anchor else ''}"
            if not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_the_index_reaches_every_page():
    index = REPO / "docs" / "index.md"
    linked = {(index.parent / file).resolve() for file, _ in _links(index) if file}
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")} - {index.resolve()}
    assert sorted(str(p.relative_to(REPO)) for p in pages - linked) == []
    assert (REPO / "docs" / "index.md").resolve() in {(REPO / f).resolve() for f, _ in _links(REPO / "README.md")}


# A page named in code, optionally with a section in quotes after a comma: "docs/design/models.md, 'Precision'".
# Comment markers inside a quoted section that wraps to the next line are dropped.
_REFERENCE = re.compile(r"((?:docs|tpu_scripts|tasks)/[\w/.-]*\w\.md)(?:,\s*(?:#\s*)?(['\"])((?:(?!\2).){1,120}?)\2)?",
                        re.S)
_CODE_FOLDERS = ("rankgen_jax", "tests", "gin_configs", "tpu_scripts", "benchmarks", "tools", "tasks")
_CODE_FILES = ("Makefile", "pyproject.toml", "requirements.txt", "requirements-nodeps.txt", "requirements-tpu.txt")


def _code_files() -> list[Path]:
    files = [REPO / name for name in _CODE_FILES]
    for folder in _CODE_FOLDERS:
        files += [p for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".gin", ".sh", ".json", ".cc")]
    return [p for p in files if p.is_file() and p != Path(__file__).resolve()]


def test_code_references_to_the_docs_name_real_pages_and_sections():
    found, broken = 0, []
    for path in _code_files():
        for match in _REFERENCE.finditer(path.read_text(encoding="utf-8")):
            page, section = REPO / match.group(1), match.group(3)
            where = f"{path.relative_to(REPO)}: {match.group(0)!r}"
            found += 1
            if not page.is_file():
                broken.append(f"{where} (no such page)")
            elif section is not None:
                wanted = " ".join(re.sub(r"\n\s*#", " ", section).split())
                if wanted not in {" ".join(h.replace("`", "").split()) for h in headings(page)}:
                    broken.append(f"{where} (no such section)")
    assert found > 20 and broken == []


def test_the_readme_is_a_landing_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


@pytest.mark.parametrize("heading, expected", [
    ("Attention VJP for XLA:CPU", "attention-vjp-for-xlacpu"),
    ("Ahead-of-time compilation: `rankgen-jax compile`", "ahead-of-time-compilation-rankgen-jax-compile"),
    ("t5_config", "t5_config"),
])
def test_anchors_follow_githubs_rule(heading, expected):
    assert slug(heading) == expected
