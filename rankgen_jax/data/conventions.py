"""How a model reads text: markers, lengths, which end of an over-long text stays, EOS handling.

A model is only as good as the way its inputs are cut. The released RankGen
models read `"pre " + prefix` (the first 512 tokens) and `"suffi " +
continuation` (the first 128), sliced after padding so that a cut input loses
its EOS; the demo trains MiniLM on prefixes cut to their LAST 128 tokens with
the [SEP] kept. Both are InputConventions. Training records the conventions
its data used (`training_conventions` in data/sources.py) beside the model
(`input_conventions.json` in a checkpoint or an export), and every reader
(`score`, `encode`, RankGenEncoder, `index` / `search`, the job's evaluation,
the sentence-transformers export) starts from the recorded ones.

Sides: "prefix" (the query tower: a RankGen prefix, a retrieval query, a
cross encoder's first text) and "suffix" (the document tower: a continuation,
a passage, a cross encoder's candidate). A side's `keep` says which end of an
over-long text stays: "start" cuts its end, "end" cuts its beginning; the
marker and the special tokens always stay. `truncation` is "released" (pad,
then slice to the limit: a cut input loses its final special token, as the
released RankGen code does) or "clean" (cut the text, keep the final special
token). Texts carry no title anywhere in this project, so there is no title
convention to record.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any, Mapping

from rankgen_jax.errors import RankgenError

CONVENTIONS_FILE = "input_conventions.json"
SIDES = ("prefix", "suffix")
# The sides a text is encoded on: a conventions side, or "raw" (the prefix side without its marker).
ENCODE_SIDES = ("prefix", "suffix", "raw")
# The conventions side each encoding side reads with.
CONVENTIONS_SIDE = {"prefix": "prefix", "suffix": "suffix", "raw": "prefix"}
KEEPS = ("start", "end")
TRUNCATIONS = ("clean", "released")
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class InputConventions:
    """How each side's text becomes token ids (see the module docstring); the defaults are the released RankGen's."""

    prefix_marker: str = "pre "
    suffix_marker: str = "suffi "
    prefix_length: int = 512
    suffix_length: int = 128
    prefix_keep: str = "start"
    suffix_keep: str = "start"
    truncation: str = "released"

    def __post_init__(self):
        problems = []
        for side in SIDES:
            marker, length, keep = self.side(side)
            if not isinstance(marker, str):
                problems.append(f"{side}_marker must be a string, got {marker!r}")
            if isinstance(length, bool) or not isinstance(length, int) or length < 2:
                problems.append(f"{side}_length must be an integer >= 2, got {length!r}")
            if keep not in KEEPS:
                problems.append(f"{side}_keep must be one of {KEEPS}, got {keep!r}")
            elif keep == "end" and self.truncation == "released":
                problems.append(f"{side}_keep='end' needs truncation='clean' (the released encoder always cuts the end)")
        if self.truncation not in TRUNCATIONS:
            problems.append(f"truncation must be one of {TRUNCATIONS}, got {self.truncation!r}")
        if problems:
            raise RankgenError("bad input conventions: " + "; ".join(problems))

    def side(self, side: str) -> tuple[str, int, str]:
        """(marker, max length in tokens, kept end) of "prefix" or "suffix"."""
        if side not in SIDES:
            raise RankgenError(f"unknown side {side!r}: expected one of {SIDES}")
        return getattr(self, f"{side}_marker"), getattr(self, f"{side}_length"), getattr(self, f"{side}_keep")

    def replace(self, **overrides: Any) -> InputConventions:
        """These conventions with the fields given (None values are ignored: "not given")."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise RankgenError(f"unknown input convention(s) {unknown}: expected some of "
                               f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **given) if given else self

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> InputConventions:
        """The conventions of a parsed input_conventions.json; RankgenError naming `where` when malformed."""
        if not isinstance(data, Mapping):
            raise RankgenError(f"{where}: expected a JSON object of input conventions")
        version = data.get("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise RankgenError(f"{where}: input conventions format_version {version!r} is not supported "
                               f"(this version reads {FORMAT_VERSION})")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields - {"format_version"})
        if unknown:
            raise RankgenError(f"{where}: unknown input convention(s) {unknown}")
        try:
            return cls(**{k: v for k, v in data.items() if k in fields})
        except RankgenError as e:
            raise RankgenError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, text: str, where: str) -> InputConventions:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RankgenError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(data, where)

    def describe(self) -> str:
        """One line: markers, each side's length and kept end, EOS handling."""
        markers = (f"markers {self.prefix_marker!r} / {self.suffix_marker!r}"
                   if self.prefix_marker or self.suffix_marker else "no markers")
        eos = "released truncation (a cut text loses its EOS)" if self.truncation == "released" else \
            "clean truncation (EOS kept)"
        return (f"{markers}; prefix {self.prefix_length} tokens keeping the {self.prefix_keep}, "
                f"suffix {self.suffix_length} keeping the {self.suffix_keep}; {eos}")


# The released RankGen encoders' conventions: what a folder without a record is read with.
RELEASED = InputConventions()
# A cross encoder without a record: query + candidate read together, no markers, the query's end kept
# (the layout the list trainer uses, data/lists.py).
PAIR_DEFAULTS = InputConventions(prefix_marker="", suffix_marker="", prefix_length=128, suffix_length=128,
                                 prefix_keep="end", truncation="clean")


def default_conventions(model_kind: str) -> InputConventions:
    """What a model of this kind ("dual_encoder", "cross_encoder", ...) is read with when nothing is recorded."""
    return PAIR_DEFAULTS if model_kind == "cross_encoder" else RELEASED


def check_encode_side(side: str) -> None:
    if side not in ENCODE_SIDES:
        raise RankgenError(f"unknown encoding side {side!r}: expected one of {list(ENCODE_SIDES)}")


def renamed_side(side: str | None, kind: str | None, where: str) -> str | None:
    """`side`, or the value given under its old keyword `kind` (with a DeprecationWarning)."""
    if kind is None:
        return side
    if side is not None:
        raise RankgenError(f"{where}: give side (kind is its old name), not both")
    warnings.warn(f"{where}: the keyword kind= is now side=", DeprecationWarning, stacklevel=3)
    return kind
