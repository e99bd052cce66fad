"""SentencePiece vocabularies with T5's conventions (pad 0, eos 1, unk 2, no bos).

Real T5 checkpoints use Google's `spiece.model`; it cannot be downloaded here,
so tests and the smoke run train a small vocabulary of the same format on the
bundled corpus and go through the same code paths.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from rankgen_jax.errors import RankgenError
from rankgen_jax.resources import BUNDLED_CORPUS, REPO_ROOT  # noqa: F401 - also imported from here

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


def train_vocab(texts: Iterable[str], out_path: str | os.PathLike, vocab_size: int = 1000) -> str:
    """Train a unigram SentencePiece model with T5's special ids; returns the .model path."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(t for t in texts if t.strip()),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(model.getvalue())
    return str(out)


def corpus_lines(folder: str | os.PathLike = BUNDLED_CORPUS, max_lines: int | None = None) -> list[str]:
    """Non-empty lines of every .txt file under a folder (sorted, deterministic)."""
    lines: list[str] = []
    for path in sorted(Path(folder).rglob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                lines.append(line.strip())
                if max_lines is not None and len(lines) >= max_lines:
                    return lines
    return lines


class Vocabulary:
    """A SentencePiece model that appends EOS, as T5's seqio vocabulary does."""

    def __init__(self, path: str | os.PathLike):
        if not Path(path).is_file():
            raise RankgenError(f"{path}: no such SentencePiece model")
        self.path = str(path)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(self.path)
        except (OSError, RuntimeError) as e:
            raise RankgenError(f"{path}: not a SentencePiece model ({e})") from None

    @property
    def size(self) -> int:
        return self._sp.GetPieceSize()

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        ids = self._sp.EncodeAsIds(text)
        return ids + [EOS_ID] if add_eos else ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.DecodeIds([int(i) for i in ids if i not in (PAD_ID, EOS_ID)])

    def batch(self, texts: Sequence[str], max_length: int) -> np.ndarray:
        """[len(texts), max_length] int32 ids, right-padded with 0, truncated keeping EOS last."""
        out = np.zeros((len(texts), max_length), np.int32)
        for row, text in enumerate(texts):
            ids = self.encode(text)
            if len(ids) > max_length:
                ids = ids[: max_length - 1] + [EOS_ID]
            out[row, : len(ids)] = ids
        return out
