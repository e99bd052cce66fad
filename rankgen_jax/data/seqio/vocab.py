"""seqio vocabularies for the project's tokenizers: SentencePiece (T5), HF `tokenizers` (BERT family), and one
that resolves its path only when first used (so gin can bind it after the tasks are registered)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import seqio
import tensorflow as tf

from rankgen_jax.data.text import HFTokenizerEncoder, load_text_encoder
from rankgen_jax.errors import RankgenError

def _vocab_file(path: str | Path) -> Path:
    """The spiece.model or tokenizer.json named by `path` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        for name in ("spiece.model", "tokenizer.json"):
            if (p / name).is_file():
                return p / name
        raise RankgenError(f"{path}: no spiece.model or tokenizer.json in this folder")
    if not p.is_file():
        raise RankgenError(f"{path}: no such vocabulary file")
    return p


def make_vocabulary(path: str | Path) -> seqio.Vocabulary:
    """seqio vocabulary for a model: SentencePiece (T5) for a .model file, TokenizersVocabulary for tokenizer.json."""
    file = _vocab_file(path)
    if file.suffix == ".json":
        return TokenizersVocabulary(file)
    load_text_encoder(file)  # fail now, with a clear message, if it is not a SentencePiece model
    return seqio.SentencePieceVocabulary(str(file))


class TokenizersVocabulary(seqio.Vocabulary):
    """A HF `tokenizers` tokenizer.json (BERT family) behind seqio's Vocabulary interface.

    `encode` gives ids without special tokens (seqio's convention: no EOS);
    `eos_id` is the token the tokenizer ends a text with ([SEP] or </s>), so
    `decode` stops there, and `pad_id` is the tokenizer's own padding id
    (0 for BERT, 1 for RoBERTa) rather than seqio's fixed 0.
    """

    def __init__(self, path: str | Path):
        file = _vocab_file(path)
        if file.suffix != ".json":
            raise RankgenError(f"{path}: TokenizersVocabulary needs a tokenizer.json")
        self._path = str(file.resolve())
        self._encoder: HFTokenizerEncoder | None = None
        super().__init__(extra_ids=0)
        self.encoder  # noqa: B018 - load now so a bad file fails at construction

    @property
    def encoder(self) -> HFTokenizerEncoder:
        if self._encoder is None:
            self._encoder = HFTokenizerEncoder(self._path)
        return self._encoder

    def __getstate__(self):
        # gin deep-copies configurable arguments; reload the tokenizer lazily instead of pickling it.
        state = self.__dict__.copy()
        state["_encoder"] = None
        return state

    @property
    def path(self) -> str:
        return self._path

    @property
    def bos_id(self) -> int | None:
        return self.encoder._head[0] if self.encoder._head else None

    @property
    def eos_id(self) -> int | None:
        return self.encoder._tail[-1] if self.encoder._tail else None

    @property
    def unk_id(self) -> int | None:
        token = getattr(self.encoder.tokenizer.model, "unk_token", None)
        return self.encoder.tokenizer.token_to_id(token) if token else None

    @property
    def pad_id(self) -> int:
        return self.encoder.pad_id

    @property
    def _base_vocab_size(self) -> int:
        return self.encoder.size

    def _encode(self, s: str) -> Sequence[int]:
        return self.encoder.tokenize(s)

    def _decode(self, ids) -> str:
        return self.encoder.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Scalar string -> int32 [n]; a vector of strings -> a RaggedTensor [m, None]."""

        def encode_one(text):
            return np.asarray(self._encode(text.numpy().decode("utf-8")), np.int32)

        def encode_scalar(text):
            ids = tf.py_function(encode_one, [text], tf.int32)
            ids.set_shape([None])
            return ids

        s = tf.convert_to_tensor(s)
        if s.shape.rank == 0:
            return encode_scalar(s)
        return tf.map_fn(encode_scalar, s, fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int ids [..., n] -> strings [...]."""
        ids = tf.convert_to_tensor(ids)

        def decode_all(array):
            array = array.numpy()
            flat = array.reshape(-1, array.shape[-1]) if array.ndim else array.reshape(1, 1)
            texts = [self._decode([i for i in row if i != self.pad_id]) for row in flat]
            return np.asarray(texts, object).reshape(array.shape[:-1])

        out = tf.py_function(decode_all, [ids], tf.string)
        out.set_shape(ids.shape[:-1])
        return out

    def __eq__(self, other):
        return isinstance(other, TokenizersVocabulary) and other.path == self.path

    def __hash__(self):
        return hash((TokenizersVocabulary, self._path))

    def __str__(self) -> str:
        return f"TokenizersVocabulary({self._path})"


class DeferredVocabulary(seqio.Vocabulary):
    """A vocabulary whose path is looked up each time it is used, so a task can register before gin binds it."""

    def __init__(self, path_fn: Callable[[], str | Path | None]):
        self._path_fn = path_fn
        self._loaded: dict[str, seqio.Vocabulary] = {}
        super().__init__(extra_ids=0)

    @property
    def vocabulary(self) -> seqio.Vocabulary:
        path = self._path_fn()
        if not path:
            raise RankgenError("no vocabulary path is set for this task")
        key = str(path)
        if key not in self._loaded:
            self._loaded[key] = make_vocabulary(key)
        return self._loaded[key]

    # Everything seqio asks of a vocabulary goes to the resolved one.
    bos_id = property(lambda self: self.vocabulary.bos_id)
    eos_id = property(lambda self: self.vocabulary.eos_id)
    unk_id = property(lambda self: self.vocabulary.unk_id)
    pad_id = property(lambda self: self.vocabulary.pad_id)
    extra_ids = property(lambda self: self.vocabulary.extra_ids)
    vocab_size = property(lambda self: self.vocabulary.vocab_size)
    _base_vocab_size = property(lambda self: self.vocabulary._base_vocab_size)

    def _encode(self, s):
        return self.vocabulary._encode(s)

    def _decode(self, ids):
        return self.vocabulary._decode(ids)

    def _encode_tf(self, s):
        return self.vocabulary._encode_tf(s)

    def _decode_tf(self, ids):
        return self.vocabulary._decode_tf(ids)

    def encode(self, s):
        return self.vocabulary.encode(s)

    def decode(self, ids):
        return self.vocabulary.decode(ids)

    def encode_tf(self, s):
        return self.vocabulary.encode_tf(s)

    def decode_tf(self, ids):
        return self.vocabulary.decode_tf(ids)

    def __eq__(self, other):
        if isinstance(other, DeferredVocabulary) and other._path_fn is self._path_fn:
            return True
        if not isinstance(other, seqio.Vocabulary):
            return False
        other = other.vocabulary if isinstance(other, DeferredVocabulary) else other
        return self.vocabulary == other

    def __hash__(self):
        return hash((DeferredVocabulary, self._path_fn))

    def __str__(self) -> str:
        return f"DeferredVocabulary({self._path_fn})"
