"""Retrieval-encoding benchmark (`python -m benchmarks.encode`): JAX index path vs the exported PyTorch model.

Builds a random-init T5 1.1 RankGen dual encoder (default `small`: d_model 512,
8 layers) with the project's demo SentencePiece vocabulary, saves it as a
rankgen_jax checkpoint and exports it with the project's exporter to the
released RankGen HF format. Then encodes the same few thousand passages of the
bundled books (sentence-bounded, 3 to ~150 words, so lengths vary) with:

- JAX: `retrieval.dense_index.encode_all` on `inference.load_model(checkpoint)`,
  the very function `rankgen-jax index` encodes a corpus with (chunks of
  batch_size x ENCODE_CHUNK_BATCHES texts; in each, `LoadedModel.encode` sorts
  by length and pads every batch to its bucket length, a multiple of
  ENCODE_BUCKET_STEP = 16 tokens up to 128, and its rows to a power of two:
  one compiled shape per (rows, length)). Before that step (power-of-two
  lengths) padding was twice as high; --pow2_baseline times that too.
- PyTorch: the exported folder through `AutoModel.from_pretrained(...,
  trust_remote_code=True)` (modeling_rankgen.T5EncoderWithProjection), on
  the same token ids (the same tokenizer call, timed on both sides), the same
  chunks, sorted by length, batch_size rows per batch padded to the batch's own
  longest row with an attention mask; torch.inference_mode, torch threads = 2.

Both sides time the whole pass: tokenising, batching, the model, the copy back.
Before timing, a full untimed pass of each warms up (JAX: every (rows, length)
shape the timed pass uses is compiled there; jax's compile events give the
compile seconds); then `repeats` timed passes alternate JAX and PyTorch and the
fastest of each counts. Numbers, not pass/fail; on a shared machine they are noisy.
Defaults (2000 passages, small, 2 repeats) take about 3-4 minutes on 2 quiet cores.

The flat dict `run()` returns (also written as JSON by `main`):

  size, num_texts, batch_size, max_length, side, repeats, torch_threads, jax_devices  the settings
  tokens, mean_tokens            real (non-pad) input tokens of the pass, after truncation
  tokenize_seconds               tokenising all texts once (inside both timed passes)
  jax_seconds, torch_seconds     fastest timed pass
  jax_sentences_per_second, torch_sentences_per_second
  jax_tokens_per_second, torch_tokens_per_second   real tokens / s
  jax_over_torch                 jax_sentences_per_second / torch_sentences_per_second (target >= 1)
  max_abs_diff                   max |JAX vector - PyTorch vector| over all texts
  max_abs_vector                 max |vector| entry (scale for max_abs_diff)
  jax_first_pass_seconds         the untimed JAX warm-up pass (compiling included)
  jax_compile_seconds            tracing + lowering + XLA compile seconds (jax.monitoring events)
  jax_compiled_shapes            distinct (rows, length) shapes compiled
  jax_shapes_compiled_while_timed  should be 0
  jax_padding_waste              pad slots / all slots in the JAX batches (bucketed lengths, filler rows)
  torch_padding_waste            the same for PyTorch (each batch padded to its longest row)
  torch_first_pass_seconds       the untimed PyTorch warm-up pass
  peak_rss_mib                   peak resident memory of the process
  malloc_tunables                GLIBC_TUNABLES of the run (`make bench` starts it with the CPU plug-in's)
  jax_bucket_step                dense_index.ENCODE_BUCKET_STEP (0: power-of-two buckets)
  With pow2_baseline (--pow2_baseline), the index path again with power-of-two buckets:
  jax_pow2_seconds, jax_pow2_sentences_per_second, jax_pow2_padding_waste
  bucket_step_speedup            jax_pow2_seconds / jax_seconds
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_json
from rankgen_jax.cli.renamed import add_renamed_flag
from rankgen_jax.data.conventions import ENCODE_SIDES


import numpy as np

# jax.monitoring events whose durations add up to "compile time" of a jitted call.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def corpus_passages(num_texts: int, seed: int = 0, min_words: int = 3, max_words: int = 150) -> list[str]:
    """num_texts passages of the bundled books: runs of whole sentences, about log-uniform in [min, max] words.

    Deterministic for a seed. Each passage starts at a random sentence and takes
    sentences until it reaches its drawn word count (so a long first sentence
    may overshoot it; the encoder's max_length truncates).
    """
    from rankgen_jax.data.sentences import split_sentences
    from rankgen_jax.data.vocab import BUNDLED_CORPUS

    sentences: list[str] = []
    for path in sorted(BUNDLED_CORPUS.rglob("*.txt")):
        # The first 120k characters of every book: enough sentences, and every book's style.
        sentences.extend(split_sentences(path.read_text(encoding="utf-8")[:120_000]))
    rng = np.random.default_rng(seed)
    targets = np.exp(rng.uniform(np.log(min_words), np.log(max_words), num_texts))
    starts = rng.integers(0, len(sentences), num_texts)
    passages = []
    for start, target in zip(starts, targets):
        words: list[str] = []
        i = int(start)
        while len(words) < target:
            words.extend(sentences[i % len(sentences)].split())
            i += 1
        passages.append(" ".join(words))
    return passages


def build_model(out: Path, size: str = "small", seed: int = 0) -> tuple[str, str]:
    """(checkpoint folder, exported RankGen HF folder) of a random-init T5 1.1 RankGen dual encoder."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.checkpoints.convert import export_hf
    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.resources import DEMO_VOCAB

    from rankgen_jax.models.factory import init_params

    # The demo vocabulary has 8000 pieces; 8064 rounds that up to a multiple of 128.
    config = ModelConfig(encoder=t5_config(size, vocab_size=8064), head=RANKGEN_HEAD)
    params = init_params(config, seed=seed)
    checkpoint, hf = out / "checkpoint", out / "hf"
    native.save_params(checkpoint, config, params, vocab=str(DEMO_VOCAB), overwrite=True)
    export_hf(str(checkpoint), str(hf), fmt="rankgen", overwrite=True)
    return str(checkpoint), str(hf)


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def torch_encode(hf_model, model, texts: list[str], side: str, max_length: int, batch_size: int,
                 chunk: int) -> tuple[np.ndarray, int]:
    """PyTorch vectors [N, D] of texts and the pad slots used: the JAX model's token ids, chunked and
    length-sorted like the index path, each batch padded to its own longest row."""
    import torch

    vectors_NxD = np.zeros((len(texts), model.dim), np.float32)
    pad_slots = 0
    with torch.inference_mode():
        for begin, end in _chunks(len(texts), chunk):
            # The same tokenizer call LoadedModel.encode makes (marker, EOS, clean truncation).
            sequences = model.input_ids(texts[begin:end], side, max_length)
            lengths_N = np.array([len(s) for s in sequences])
            order = np.argsort(-lengths_N, kind="stable")
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                length = int(lengths_N[rows[0]])
                ids_BxL = np.full((len(rows), length), model.text.pad_id, np.int64)
                for r, i in enumerate(rows):
                    ids_BxL[r, : lengths_N[i]] = sequences[i]
                mask_BxL = (np.arange(length)[None, :] < lengths_N[rows][:, None]).astype(np.int64)
                pad_slots += int(mask_BxL.size - mask_BxL.sum())
                out = hf_model(input_ids=torch.from_numpy(ids_BxL), attention_mask=torch.from_numpy(mask_BxL))
                vectors_NxD[begin + rows] = out.numpy()
    return vectors_NxD, pad_slots


class _SlotCounter:
    """Counts the (all, real) token slots of every batch LoadedModel.encode feeds its jitted tower function.

    While installed, inference._tower_fn hands out a wrapper that reads each
    batch's mask on the host before the call (used in the untimed warm-up pass).
    """

    def __init__(self):
        self.slots = self.real = 0

    def __enter__(self):
        from rankgen_jax.inference import encoder as inference

        self._original = inference._tower_fn

        def counting_tower_fn(*args, **kwargs):
            fn = self._original(*args, **kwargs)

            def counted(params, ids_BxL, mask_BxL):
                self.slots += int(np.size(mask_BxL))
                self.real += int(np.sum(mask_BxL))
                return fn(params, ids_BxL, mask_BxL)

            return counted

        inference._tower_fn = counting_tower_fn
        return self

    def __exit__(self, *exc):
        from rankgen_jax.inference import encoder as inference

        inference._tower_fn = self._original

    @property
    def waste(self) -> float:
        return (self.slots - self.real) / self.slots if self.slots else 0.0


class _CompileTimer:
    """Sums jax's compile-event durations while installed."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            self.seconds += duration

    def __enter__(self):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self)


def run(num_texts: int = 2000, size: str = "small", batch_size: int = 64, max_length: int = 128,
        side: str = "suffix", repeats: int = 2, threads: int = 2, seed: int = 0,
        workdir: str | None = None, texts: list[str] | None = None, pow2_baseline: bool = False) -> dict:
    """Build the model (under workdir, default a temporary folder), encode with JAX and PyTorch; see the module doc.

    texts: encode these instead of corpus_passages(num_texts, seed). torch's thread count is restored afterwards.
    pow2_baseline: also time the index path with power-of-two length buckets (its bucketing before
    dense_index.ENCODE_BUCKET_STEP) and add the jax_pow2_* keys.
    """
    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(num_texts, size, batch_size, max_length, side, repeats, threads, seed, workdir, texts,
                    pow2_baseline)
    finally:
        torch.set_num_threads(threads_before)


def _run(num_texts, size, batch_size, max_length, side, repeats, threads, seed, workdir, texts, pow2_baseline) -> dict:
    import jax
    from transformers import AutoModel

    from rankgen_jax.inference.encoder import load_model
    from rankgen_jax.retrieval import dense_index
    from rankgen_jax.retrieval.dense_index import ENCODE_CHUNK_BATCHES, encode_all

    texts = corpus_passages(num_texts, seed) if texts is None else list(texts)
    with tempfile.TemporaryDirectory(prefix="bench_encode_") as tmp:
        root = Path(workdir) if workdir else Path(tmp)
        with _CompileTimer():  # model init compiles too; not counted
            checkpoint, hf_dir = build_model(root, size, seed)
        model = load_model(checkpoint)
        hf_model = AutoModel.from_pretrained(hf_dir, trust_remote_code=True).eval()

    chunk = batch_size * ENCODE_CHUNK_BATCHES

    def jax_pass() -> np.ndarray:
        return encode_all(model, texts, side, max_length, batch_size, progress=False, desc="encode")

    def torch_pass() -> np.ndarray:
        return torch_encode(hf_model, model, texts, side, max_length, batch_size, chunk)[0]

    def pow2_pass() -> np.ndarray:
        step = dense_index.ENCODE_BUCKET_STEP
        dense_index.ENCODE_BUCKET_STEP = None
        try:
            return jax_pass()
        finally:
            dense_index.ENCODE_BUCKET_STEP = step

    began = time.perf_counter()
    tokens = sum(len(s) for s in model.input_ids(texts, side, max_length))
    tokenize_seconds = time.perf_counter() - began

    with _CompileTimer() as compile_timer, _SlotCounter() as jax_slots:
        began = time.perf_counter()
        jax_vectors = jax_pass()
        jax_first = time.perf_counter() - began
    shapes = len(model.compiled_shapes)
    began = time.perf_counter()
    torch_vectors, torch_pad = torch_encode(hf_model, model, texts, side, max_length, batch_size, chunk)
    torch_first = time.perf_counter() - began
    passes = {"jax": jax_pass, "torch": torch_pass}
    if pow2_baseline:
        with _SlotCounter() as pow2_slots:
            pow2_pass()
        passes["pow2"] = pow2_pass
    warm_shapes = len(model.compiled_shapes)

    times = {name: [] for name in passes}
    for _ in range(repeats):
        for name, fn in passes.items():
            began = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - began)
    jax_seconds, torch_seconds = min(times["jax"]), min(times["torch"])
    row = {
        "size": size,
        "num_texts": len(texts),
        "batch_size": batch_size,
        "max_length": max_length,
        "side": side,
        "repeats": repeats,
        "torch_threads": threads,
        "jax_devices": jax.device_count(),
        "tokens": int(tokens),
        "mean_tokens": tokens / len(texts),
        "tokenize_seconds": tokenize_seconds,
        "jax_seconds": jax_seconds,
        "torch_seconds": torch_seconds,
        "jax_sentences_per_second": len(texts) / jax_seconds,
        "torch_sentences_per_second": len(texts) / torch_seconds,
        "jax_tokens_per_second": tokens / jax_seconds,
        "torch_tokens_per_second": tokens / torch_seconds,
        "jax_over_torch": torch_seconds / jax_seconds,
        "max_abs_diff": float(np.abs(jax_vectors - torch_vectors).max()),
        "max_abs_vector": float(np.abs(torch_vectors).max()),
        "jax_first_pass_seconds": jax_first,
        "jax_compile_seconds": compile_timer.seconds,
        "jax_compiled_shapes": shapes,
        "jax_shapes_compiled_while_timed": len(model.compiled_shapes) - warm_shapes,
        "jax_padding_waste": jax_slots.waste,
        "torch_padding_waste": torch_pad / (torch_pad + tokens),
        "torch_first_pass_seconds": torch_first,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "malloc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "jax_bucket_step": dense_index.ENCODE_BUCKET_STEP or 0,
    }
    if pow2_baseline:
        pow2_seconds = min(times["pow2"])
        row.update(jax_pow2_seconds=pow2_seconds, jax_pow2_sentences_per_second=len(texts) / pow2_seconds,
                   jax_pow2_padding_waste=pow2_slots.waste, bucket_step_speedup=pow2_seconds / jax_seconds)
    return row


def summary(row: dict) -> str:
    """A few readable lines of a run() result."""
    return "\n".join([
        f"T5 1.1 {row['size']} RankGen encoder, {row['num_texts']} passages ({row['tokens']} tokens, "
        f"mean {row['mean_tokens']:.1f}), side {row['side']}, max_length {row['max_length']}, "
        f"batch {row['batch_size']}, best of {row['repeats']}",
        f"  JAX (index path)  {row['jax_sentences_per_second']:8.1f} sentences/s {row['jax_tokens_per_second']:9.0f} "
        f"tokens/s  padding waste {row['jax_padding_waste']:.1%}",
        f"  PyTorch HF ({row['torch_threads']} thr) {row['torch_sentences_per_second']:8.1f} sentences/s "
        f"{row['torch_tokens_per_second']:9.0f} tokens/s  padding waste {row['torch_padding_waste']:.1%}",
        f"  JAX / PyTorch: {row['jax_over_torch']:.2f}x   max |JAX - PyTorch| {row['max_abs_diff']:.2e} "
        f"(max |v| {row['max_abs_vector']:.2f})",
        f"  JAX compile {row['jax_compile_seconds']:.1f} s for {row['jax_compiled_shapes']} shapes "
        f"(first pass {row['jax_first_pass_seconds']:.1f} s, timed pass {row['jax_seconds']:.1f} s; "
        f"{row['jax_shapes_compiled_while_timed']} shapes compiled while timed); "
        f"tokenising {row['tokenize_seconds']:.2f} s per pass",
    ] + ([
        f"  JAX with power-of-two buckets (the index path before bucket step {row['jax_bucket_step']}): "
        f"{row['jax_pow2_sentences_per_second']:.1f} sentences/s, padding waste {row['jax_pow2_padding_waste']:.1%}; "
        f"bucket step speed-up {row['bucket_step_speedup']:.2f}x",
    ] if "jax_pow2_seconds" in row else []))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local folders; never ask a hub
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=2000, help="passages to encode (default 2000)")
    parser.add_argument("--size", default="small", help="T5 1.1 size (default small)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=128)
    add_renamed_flag(parser, "--side", "--kind", default="suffix", choices=ENCODE_SIDES, help="encoding side")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per framework (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--pow2_baseline", action="store_true",
                        help="also time the index path with power-of-two length buckets")
    parser.add_argument("--out", default="runs/bench/encode.json")
    args = parser.parse_args(argv)
    row = run(args.texts, args.size, args.batch_size, args.max_length, args.side, args.repeats, args.threads,
              pow2_baseline=args.pow2_baseline)
    print(summary(row))
    write_json(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
