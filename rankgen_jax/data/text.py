"""Text to token ids for any encoder, behind one interface.

T5 models use a SentencePiece vocabulary (`spiece.model`: ids + EOS); the BERT
family uses the HF `tokenizers` library (`tokenizer.json`: [CLS] ids [SEP], or
<s> ids </s> for RoBERTa). Data pipelines and inference code ask a
TextEncoder for `tokenize` (no special tokens), `add_special`, `encode_pair`
and `batch`, and never need to know which one they hold. RankGen's text
markers ("pre ", "suffi ") are plain text and work with both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from rankgen_jax.errors import RankgenError
from rankgen_jax.data.vocab import Vocabulary


class TextEncoder(Protocol):
    pad_id: int
    size: int
    num_special: int

    def tokenize(self, text: str) -> list[int]: ...

    def add_special(self, ids: Sequence[int]) -> list[int]: ...

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]: ...


# RankGen's markers before a prefix and a continuation (the released models read them).
PREFIX_MARKER, SUFFIX_MARKER = "pre ", "suffi "


@dataclass(frozen=True)
class TokenWindows:
    """How a training source turns texts into token ids with `text`: a query is its marker and at most
    `query_length` ids, keeping the text's `query_keep` end; a candidate its marker and at most `candidate_length`
    ids. markers: (query's, candidate's), read by separate towers only (a joint pair has none)."""

    text: TextEncoder
    query_length: int
    candidate_length: int
    query_keep: str = "end"
    markers: tuple[str, str] = (PREFIX_MARKER, SUFFIX_MARKER)


def encode(encoder: TextEncoder, text: str) -> list[int]:
    """Ids of one text with the model's special tokens."""
    return encoder.add_special(encoder.tokenize(text))


def pad_batch(sequences: Sequence[Sequence[int]], max_length: int, pad_id: int = 0) -> np.ndarray:
    """[N, max_length] int32, right-padded; a too-long row keeps its last id (EOS / [SEP]) at the end."""
    out = np.full((len(sequences), max_length), pad_id, np.int32)
    for row, ids in enumerate(sequences):
        ids = list(ids)
        if len(ids) > max_length:
            ids = ids[: max_length - 1] + ids[-1:]
        out[row, : len(ids)] = ids
    return out


def encode_truncated(encoder: TextEncoder, marker: str, text: str, max_length: int, keep: str = "start") -> list[int]:
    """marker + text with the special tokens, at most max_length ids.

    keep="start" drops the text's end (the released RankGen behaviour, up to
    its lost EOS); keep="end" drops its beginning, which suits prefixes: the
    part nearest the continuation survives. The marker and specials always stay.
    """
    marker_ids = encoder.tokenize(marker) if marker else []
    body = encoder.tokenize(text)
    room = max_length - encoder.num_special - len(marker_ids)
    if room < 1:
        raise RankgenError(f"max_length={max_length} leaves no room for text after the marker and special tokens")
    if len(body) > room:
        body = body[:room] if keep == "start" else body[len(body) - room :]
    return encoder.add_special(marker_ids + body)


def batch(encoder: TextEncoder, texts: Sequence[str], max_length: int) -> np.ndarray:
    return pad_batch([encode(encoder, t) for t in texts], max_length, encoder.pad_id)


def join_pair(encoder: TextEncoder, first_body: Sequence[int], second_body: Sequence[int]) -> tuple[list[int], list[int]]:
    """Two token-id bodies as one pair input, with the specials and token types the encoder's encode_pair uses.

    The template (e.g. `[CLS] a [SEP] b [SEP]`, `<s> a </s></s> b </s>`,
    `a </s> b </s>`) is read once from encode_pair on two one-token probes.
    """
    (head, head_types), (middle, middle_types), (tail, tail_types), (first_type, second_type) = _pair_template(encoder)
    ids = head + list(first_body) + middle + list(second_body) + tail
    type_ids = (head_types + [first_type] * len(first_body) + middle_types + [second_type] * len(second_body)
                + tail_types)
    return ids, type_ids


_PAIR_TEMPLATES: dict[int, tuple] = {}


def _pair_template(encoder: TextEncoder) -> tuple:
    """((head ids, types), (middle ids, types), (tail ids, types), (first body type, second body type))."""
    key = id(encoder)
    if key not in _PAIR_TEMPLATES:
        a, b = encoder.tokenize("a"), encoder.tokenize("b")
        ids, types = encoder.encode_pair("a", "b")
        types = list(types) if types else [0] * len(ids)
        at = next(i for i in range(len(ids)) if ids[i : i + len(a)] == a)
        bt = next(i for i in range(at + len(a), len(ids)) if ids[i : i + len(b)] == b)
        part = lambda lo, hi: (ids[lo:hi], types[lo:hi])  # noqa: E731
        _PAIR_TEMPLATES[key] = (part(0, at), part(at + len(a), bt), part(bt + len(b), len(ids)), (types[at], types[bt]))
    return _PAIR_TEMPLATES[key]


def encode_pair_truncated(encoder: TextEncoder, first: str, second: str, first_length: int, second_length: int,
                          first_keep: str = "end") -> tuple[list[int], list[int]]:
    """(ids, token types) of a pair of at most first_length + second_length ids.

    The first text (a query) keeps its end by default, the second (a candidate)
    its start; the pair's specials count against the first part's budget
    (head and middle) and the second's (tail).
    """
    (head, _), (middle, _), (tail, _), _ = _pair_template(encoder)
    first_room, second_room = first_length - len(head) - len(middle), second_length - len(tail)
    if first_room < 1 or second_room < 1:
        raise RankgenError(f"pair lengths {first_length}/{second_length} leave no room for text after the special tokens")
    first_body, second_body = encoder.tokenize(first), encoder.tokenize(second)[:second_room]
    if len(first_body) > first_room:
        first_body = first_body[len(first_body) - first_room :] if first_keep == "end" else first_body[:first_room]
    return join_pair(encoder, first_body, second_body)


class SentencePieceEncoder:
    """T5: SentencePiece ids, EOS appended; a pair is `first </s> second </s>` with no token types."""

    num_special = 1

    def __init__(self, path: str | Path):
        self.vocab = Vocabulary(path)
        self.pad_id = 0
        self.size = self.vocab.size
        self.path = str(path)

    def tokenize(self, text: str) -> list[int]:
        return self.vocab.encode(text, add_eos=False)

    def add_special(self, ids: Sequence[int]) -> list[int]:
        return list(ids) + [1]

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        ids = self.add_special(self.tokenize(first)) + self.add_special(self.tokenize(second))
        return ids, [0] * len(ids)


class HFTokenizerEncoder:
    """BERT family: a `tokenizer.json` (WordPiece or BPE) with its own special tokens and token types."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer  # only BERT-family tokenizers need the HF tokenizers library

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise RankgenError(f"{path}: not a tokenizers tokenizer.json ({e})") from None
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.path = str(path)
        self.size = self.tokenizer.get_vocab_size()
        specials = self.tokenizer.encode("").ids
        # What the post-processor wraps a single text with, e.g. [CLS] ... [SEP].
        self._head, self._tail = specials[:1], specials[1:]
        self.num_special = len(specials)
        self.pad_id = self._find_pad_id(Path(path).parent)

    def _find_pad_id(self, folder: Path) -> int:
        config = folder / "tokenizer_config.json"
        candidates = []
        if config.is_file():
            token = json.loads(config.read_text(encoding="utf-8")).get("pad_token")
            candidates.append(token["content"] if isinstance(token, dict) else token)
        for token in candidates + ["[PAD]", "<pad>"]:
            if token is not None and self.tokenizer.token_to_id(token) is not None:
                return int(self.tokenizer.token_to_id(token))
        raise RankgenError(f"{self.path}: cannot find the padding token")

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def add_special(self, ids: Sequence[int]) -> list[int]:
        return self._head + list(ids) + self._tail

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        encoding = self.tokenizer.encode(first, second)
        return encoding.ids, encoding.type_ids


def load_text_encoder(path: str | Path) -> TextEncoder:
    """A TextEncoder from a spiece.model, a tokenizer.json, or a folder holding one of them."""
    p = Path(path)
    if p.is_dir():
        for name in ("spiece.model", "tokenizer.json"):
            if (p / name).is_file():
                return load_text_encoder(p / name)
        raise RankgenError(f"{path}: no spiece.model or tokenizer.json in this folder")
    if not p.is_file():
        raise RankgenError(f"{path}: no such vocabulary file")
    if p.suffix == ".json":
        return HFTokenizerEncoder(p)
    return SentencePieceEncoder(p)
