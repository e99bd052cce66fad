"""Tiny randomly initialised models (a GPT-2 causal LM, a T5 RankGen dual encoder, a BERT with MiniLM's vocabulary)
and small books for tests and benchmarks.

They are built on the fly from the bundled Botchan text, so tests and
`bench_generation` need no downloads. The scores they give are meaningless;
only shapes, plumbing and speed are exercised.
"""

from __future__ import annotations

import os
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from rankgen_jax.checkpoints import native
from rankgen_jax.data.vocab import BUNDLED_CORPUS, corpus_lines, train_vocab
from rankgen_jax.models.configs import RANKGEN_HEAD, BertConfig, HeadConfig, ModelConfig, T5Config
from rankgen_jax.models.factory import abstract_variables, init_params
from rankgen_jax.pretrained import resolve_model

BOTCHAN = BUNDLED_CORPUS / "botchan" / "botchan.txt"
GPT2_EOS = "<|endoftext|>"


_BOOK_WORDS = ("garden house river letter morning window journey evening sister friend carriage village "
               "dinner promise quiet bright gentle early little simple happy careful proper").split()


def word_book(tag: str, sentences: int, seed: int) -> str:
    """Plain ASCII sentences of 6-14 words ("The <tag> ... ended.") in paragraphs of five (decode exactly with the demo vocabulary)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(sentences):
        words = [str(w) for w in rng.choice(_BOOK_WORDS, size=int(rng.integers(4, 12)))]
        lines.append(f"The {tag} {' '.join(words)} ended.")
        if i % 5 == 4:
            lines.append("")
    return "\n".join(lines)


def botchan_prefixes(n: int, words: int = 20) -> list[str]:
    """n distinct Botchan passages of `words` to `words + 20` words."""
    tokens = BOTCHAN.read_text(encoding="utf-8").split()
    return [" ".join(tokens[1000 + 60 * i : 1000 + 60 * i + words + i % 3 * 10]) for i in range(n)]


def build_tiny_gpt2(out_dir: str | os.PathLike, seed: int = 0, vocab_size: int = 400, n_positions: int = 256,
                    n_layer: int = 2, n_head: int = 2, n_embd: int = 32) -> str:
    """Save a random GPT-2 (2 layers, width 32 unless told) with a byte-level BPE trained on Botchan as an HF
    folder; returns its path.

    The tokenizer has no pad token on purpose: the code under test must cope (GPT-2's own has none either).
    """
    # torch and transformers are heavy and only the LM tests need them.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    lines = [line for line in BOTCHAN.read_text(encoding="utf-8").splitlines() if line.strip()][:3000]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[GPT2_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(lines, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=GPT2_EOS)
    eos_id = tokenizer.convert_tokens_to_ids(GPT2_EOS)
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=len(tokenizer),
                        bos_token_id=eos_id, eos_token_id=eos_id)
    out = Path(out_dir)
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def tiny_rankgen_config():
    """A 1-layer, d_model 32 T5 RankGen dual encoder config (shared towers, RankGen head)."""
    encoder = T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16)
    return ModelConfig(encoder=encoder, head=RANKGEN_HEAD)


def random_params(config, seed: int):
    """Random parameters of the config's shapes (numpy; no jitted init to compile)."""
    rng = np.random.default_rng(seed)
    shapes = nn.unbox(abstract_variables(config))["params"]

    def draw(path, leaf):
        noise = rng.normal(0.0, 0.3, leaf.shape).astype(np.float32)
        # Layer-norm scales near 1, as after init, so activations stay in range.
        return noise + 1.0 if "scale" in jax.tree_util.keystr(path) else noise

    return jax.tree_util.tree_map_with_path(draw, shapes)


def build_tiny_rankgen(out_dir: str | os.PathLike, spiece_model: str, seed: int = 1) -> str:
    """Save a random tiny RankGen dual encoder checkpoint using `spiece_model`; returns its path."""
    config = tiny_rankgen_config()
    native.save_params(Path(out_dir), config, random_params(config, seed), vocab=spiece_model)
    return str(out_dir)


# A one-layer BERT that reads MiniLM's vocabulary, so that a run tokenises with MiniLM's tokenizer.json.
TINY_MINILM_BERT = BertConfig(vocab_size=30522, d_model=32, d_ff=64, num_layers=1, num_heads=4,
                              max_position_embeddings=128)


def build_tiny_minilm(out_dir: str | os.PathLike, seed: int = 3) -> Path:
    """Save a random TINY_MINILM_BERT encoder (mean pooling) with MiniLM's tokenizer; returns its path."""
    config = ModelConfig(encoder=TINY_MINILM_BERT, head=HeadConfig("mean", 0, True))
    native.save_params(Path(out_dir), config, init_params(config, seed), vocab=resolve_model("minilm") + "/tokenizer.json")
    return Path(out_dir)


def train_tiny_vocab(out_path: str | os.PathLike) -> str:
    """A 1000-piece SentencePiece model trained on the bundled corpus (what tests get from `spiece_model`)."""
    return train_vocab(corpus_lines(max_lines=20000), out_path, vocab_size=1000)
