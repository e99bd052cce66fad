"""Smoke run of the model core (`rankgen-jax smoke`, `make smoke`; `make demo` runs the training job).

Trains a small SentencePiece vocabulary on the bundled books, builds a random
tiny T5 1.1 RankGen dual encoder, saves it as a rankgen_jax checkpoint, exports
it to the released RankGen HuggingFace format, reloads that folder with
transformers, and checks that PyTorch and JAX give the same vectors and scores
on real prefix / continuation pairs. The model is untrained: its suffix
identification accuracy is at chance, which the run reports as such.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
import torch
from transformers import AutoModel

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.vocab import BUNDLED_CORPUS, Vocabulary, corpus_lines, train_vocab
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
from rankgen_jax.models.factory import build_model, init_params


def prefix_continuation_pairs(lines: list[str], n: int, prefix_lines: int = 6, cont_lines: int = 2):
    """n (prefix, continuation) pairs of consecutive lines, spread over the text."""
    span = prefix_lines + cont_lines
    step = max(span, (len(lines) - span) // n)
    pairs = []
    for start in range(0, len(lines) - span, step)[:n]:
        pairs.append((" ".join(lines[start : start + prefix_lines]), " ".join(lines[start + prefix_lines : start + span])))
    return pairs


# The exported model must give the JAX vectors to within this (float32 on both sides).
MAX_ABS_DIFF = 1e-4


class SmokeFolder(JobFolder):
    """Where the smoke run keeps its outputs under `out`: the vocabulary, the checkpoint, its HF export, the
    summary."""

    @property
    def vocab(self) -> Path:
        return self.root / "spiece.model"

    @property
    def checkpoint(self) -> RunFolder:
        return self.model("checkpoint")

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    @property
    def summary(self) -> Path:
        return self.root / "smoke.json"


def run(out: Path, num_pairs: int = 16) -> dict:
    """The smoke run into `out`; its summary (also out/smoke.json), with "ok": PyTorch reproduced the vectors."""
    started = time.time()
    folder = SmokeFolder(out)
    folder.root.mkdir(parents=True, exist_ok=True)
    print(f"[1/4] training a 1000-piece SentencePiece vocabulary on {BUNDLED_CORPUS}", flush=True)
    vocab = Vocabulary(train_vocab(corpus_lines(max_lines=20000), folder.vocab, vocab_size=1000))

    print("[2/4] random-init tiny T5 1.1 RankGen dual encoder -> rankgen_jax checkpoint", flush=True)
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=1024), head=RANKGEN_HEAD)
    params = init_params(config, seed=0)
    native.save_params(folder.checkpoint, config, params, vocab=vocab.path, overwrite=True)

    print("[3/4] export to the RankGen HuggingFace format and reload with transformers", flush=True)
    export_hf(str(folder.checkpoint), str(folder.hf), fmt="rankgen", overwrite=True)
    hf_model = AutoModel.from_pretrained(str(folder.hf), trust_remote_code=True).eval()

    print(f"[4/4] encoding {num_pairs} prefix/continuation pairs from Persuasion with JAX and PyTorch", flush=True)
    book = (BUNDLED_CORPUS / "austen" / "persuasion.txt").read_text(encoding="utf-8")
    pairs = prefix_continuation_pairs([l for l in book.splitlines() if l.strip()], num_pairs)
    prefix_ids = vocab.batch(["pre " + p for p, _ in pairs], 128)
    suffix_ids = vocab.batch(["suffi " + c for _, c in pairs], 64)
    model = build_model(config)
    encode = jax.jit(lambda p, ids: model.apply({"params": p}, ids))
    jax_prefix, jax_suffix = np.asarray(encode(params, prefix_ids)), np.asarray(encode(params, suffix_ids))
    with torch.no_grad():
        torch_vectors = [
            hf_model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(ids != 0).long()).numpy()
            for ids in (prefix_ids, suffix_ids)
        ]
    scores = jax_prefix @ jax_suffix.T
    summary = {
        "pairs": len(pairs),
        "vector_dim": int(jax_prefix.shape[1]),
        "max_abs_diff_jax_vs_torch": float(
            max(np.abs(jax_prefix - torch_vectors[0]).max(), np.abs(jax_suffix - torch_vectors[1]).max())
        ),
        "max_abs_diff_scores": float(np.abs(scores - torch_vectors[0] @ torch_vectors[1].T).max()),
        "in_batch_top1_untrained": float(np.mean(scores.argmax(axis=1) == np.arange(len(pairs)))),
        "chance": 1.0 / len(pairs),
        "seconds": round(time.time() - started, 1),
    }
    summary["ok"] = summary["max_abs_diff_jax_vs_torch"] < MAX_ABS_DIFF
    folder.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return summary
