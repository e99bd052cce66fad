"""Model cards: the README.md of an export, with the model hub's metadata front matter.

Front matter is the YAML block between two `---` lines at the top of a
model card. Only flat keys with scalar or list values are read or written
here (what the hub's model metadata uses); strings are written JSON-quoted,
which YAML reads as the same strings.
"""

from __future__ import annotations

import json
import re


def read_front_matter(text: str) -> dict:
    """The flat keys of a card's front matter: {key: str} or {key: [str, ...]} ({} when there is none)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict = {}
    key = None
    for line in lines[1:]:
        if line.strip() == "---":
            return out
        match = re.match(r"^([A-Za-z_][\w-]*):\s*(.*)$", line)
        if match:
            key, value = match.group(1), match.group(2).strip()
            out[key] = _scalar(value) if value else []
        elif key is not None and isinstance(out.get(key), list) and re.match(r"^\s*-\s+", line):
            out[key].append(_scalar(re.sub(r"^\s*-\s+", "", line).strip()))
        else:
            key = None  # nested mappings and anything else are not read
    return {}  # no closing line: not front matter


def _scalar(value: str):
    if value[:1] in ('"', "'") and value[-1:] == value[:1] and len(value) >= 2:
        return json.loads(value) if value[0] == '"' else value[1:-1].replace("''", "'")
    return value
