"""Smoke tests of the encoding and input-pipeline benchmarks at tiny settings (numbers are not checked, only sanity)."""

import math

from benchmarks import data_pipeline as bench_data
from benchmarks import encode as bench_encode

ENCODE_KEYS = {
    "size", "num_texts", "batch_size", "max_length", "side", "repeats", "torch_threads", "jax_devices", "tokens",
    "mean_tokens", "tokenize_seconds", "jax_seconds", "torch_seconds", "jax_sentences_per_second",
    "torch_sentences_per_second", "jax_tokens_per_second", "torch_tokens_per_second", "jax_over_torch",
    "max_abs_diff", "max_abs_vector", "jax_first_pass_seconds", "jax_compile_seconds", "jax_compiled_shapes",
    "jax_shapes_compiled_while_timed", "jax_padding_waste", "torch_padding_waste", "torch_first_pass_seconds",
    "peak_rss_mib", "malloc_tunables", "jax_bucket_step",
}
POW2_KEYS = {"jax_pow2_seconds", "jax_pow2_sentences_per_second", "jax_pow2_padding_waste", "bucket_step_speedup"}
DATA_KEYS = {
    "size", "batch_size", "prefix_length", "continuation_length", "with_negative", "task", "steps", "rounds",
    "warmup_steps", "source_batches", "jax_devices", "seqio_first_batch_seconds", "seqio_examples_per_second",
    "seqio_max_batch_seconds", "examples_build_seconds", "examples_examples_per_second",
    "random_examples_per_second", "step_compile_seconds", "synthetic_step_seconds", "real_step_seconds",
    "prefetch_random_step_seconds", "synthetic_step_seconds_best", "real_step_seconds_best",
    "prefetch_random_step_seconds_best", "synthetic_examples_per_second", "real_examples_per_second",
    "real_vs_synthetic", "real_vs_synthetic_best", "prefetch_random_vs_synthetic", "seqio_headroom",
    "examples_headroom", "loss", "peak_rss_mib", "malloc_tunables", "real_vs_synthetic_paired",
    "prefetch_random_vs_synthetic_paired", "step_seconds_spread",
}


def _flat(row: dict) -> bool:
    return all(isinstance(v, (int, float, str, bool)) for v in row.values())


def test_bench_encode_tiny(tmp_path):
    import torch

    threads = torch.get_num_threads()
    row = bench_encode.run(num_texts=40, size="tiny", batch_size=8, max_length=48, repeats=1, threads=1,
                           workdir=str(tmp_path), pow2_baseline=True)
    assert set(row) == ENCODE_KEYS | POW2_KEYS and _flat(row)
    assert torch.get_num_threads() == threads  # restored
    assert row["num_texts"] == 40 and 40 * 3 <= row["tokens"] <= 40 * 48
    # The exported PyTorch model gives the JAX index path's vectors.
    assert row["max_abs_diff"] < 1e-4 < row["max_abs_vector"]
    for key in ("jax_sentences_per_second", "torch_sentences_per_second", "jax_tokens_per_second",
                "torch_tokens_per_second", "jax_over_torch", "jax_compile_seconds"):
        assert 0 < row[key] < math.inf, key
    assert row["jax_first_pass_seconds"] >= row["jax_compile_seconds"]
    assert row["jax_compiled_shapes"] >= 1 and row["jax_shapes_compiled_while_timed"] == 0
    # Bucketed lengths and power-of-two rows never pad less than padding to each batch's longest row.
    assert 0 <= row["torch_padding_waste"] <= row["jax_padding_waste"] <= row["jax_pow2_padding_waste"] < 1
    assert row["jax_bucket_step"] == 16 and 0 < row["bucket_step_speedup"] < math.inf
    assert "sentences/s" in bench_encode.summary(row) and "power-of-two" in bench_encode.summary(row)


def test_bucket_step():
    from rankgen_jax.inference.encoder import bucket_length

    assert [bucket_length(n, 512, 16) for n in (1, 16, 17, 40, 100, 128)] == [16, 16, 32, 48, 112, 128]
    assert bucket_length(129, 512, 16) == 256 and bucket_length(40, 20, 16) == 20  # as without a step
    assert [bucket_length(n, 512) for n in (17, 40, 100)] == [32, 64, 128]  # powers of two by default


def test_corpus_passages_vary_and_repeat():
    texts = bench_encode.corpus_passages(200, seed=3)
    words = [len(t.split()) for t in texts]
    assert len(texts) == 200 and min(words) >= 3 and max(words) > 100 and min(words) < 10
    assert texts == bench_encode.corpus_passages(200, seed=3)


def test_bench_data_tiny():
    row = bench_data.run(batch_size=8, prefix_length=64, continuation_length=32, steps=2, rounds=2, warmup_steps=1,
                         source_batches=4, task_options=dict(prefix_words=48, max_continuation_words=24))
    assert set(row) == DATA_KEYS and _flat(row)
    for key in ("seqio_examples_per_second", "examples_examples_per_second", "random_examples_per_second",
                "synthetic_examples_per_second", "real_examples_per_second", "seqio_first_batch_seconds",
                "synthetic_step_seconds", "real_step_seconds", "prefetch_random_step_seconds", "seqio_headroom"):
        assert 0 < row[key] < math.inf, key
    assert row["real_step_seconds_best"] <= row["real_step_seconds"]
    assert math.isfinite(row["loss"]) and row["loss"] > 0
    assert math.isclose(row["real_vs_synthetic"], row["real_step_seconds"] / row["synthetic_step_seconds"] - 1)
    assert "examples/s" in bench_data.summary(row)
