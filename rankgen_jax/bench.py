"""Train-step throughput and peak memory of the RankGen step (`make bench`); numbers, not pass/fail.

Each configuration runs in its own subprocess so that its peak RSS is its own.
Achieved FLOP/s uses the analytical training cost (3x the forward matmul
FLOPs; GradCache really does a 4th forward, which is not counted) against an
fp32 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from rankgen_jax.runtime import configure_xla_flags

configure_xla_flags()


@dataclasses.dataclass(frozen=True)
class BenchCase:
    size: str = "tiny"
    batch: int = 32
    prefix_length: int = 256
    continuation_length: int = 128
    with_negative: bool = True
    num_chunks: int = 1
    steps: int = 5


def forward_flops(cfg, length: int, head_dim_out: int) -> float:
    """Matmul FLOPs of one encoder forward over one sequence of `length` tokens (plus the head)."""
    d, inner, ff = cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff
    mlp_in = 2 if cfg.mlp_activation == "gated-gelu" else 1
    per_token_dense = 2 * (3 * d * inner + inner * d + mlp_in * d * ff + ff * d)
    per_token_attention = 2 * 2 * length * inner
    return cfg.num_layers * length * (per_token_dense + per_token_attention) + 2 * d * head_dim_out


def run_case(case: BenchCase) -> dict:
    import flax.linen as nn
    import jax

    from rankgen_jax import partitioning
    from rankgen_jax.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.data.triples import DataConfig, RandomTriples
    from rankgen_jax.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train_step import StepOptions
    from rankgen_jax.trainer import build_step_functions

    config = ModelConfig(encoder=t5_config(case.size), head=RANKGEN_HEAD)
    data = DataConfig(source="random", batch_size=case.batch, prefix_length=case.prefix_length,
                      continuation_length=case.continuation_length, with_negative=case.with_negative,
                      vocab_size=config.encoder.vocab_size)
    mesh = partitioning.make_mesh(-1, 1)
    rules = partitioning.STANDARD_RULES
    tx, schedule = make_optimizer(OptimizerConfig(name="adafactor", learning_rate=2e-3))
    options = StepOptions("in_batch_softmax", (), num_chunks=case.num_chunks)
    fns = build_step_functions(config, options, tx, schedule, {}, mesh, rules, seed=0)
    source = RandomTriples(data)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = fns.init()
        batches = [jax.device_put(source.batch(i), fns.batch_sharding) for i in range(2)]
        compile_start = time.perf_counter()
        state, metrics = fns.train_step(state, batches[0])
        jax.block_until_ready(metrics)
        compile_seconds = time.perf_counter() - compile_start
        start = time.perf_counter()
        for i in range(case.steps):
            state, metrics = fns.train_step(state, batches[i % 2])
        jax.block_until_ready(metrics)
        seconds = (time.perf_counter() - start) / case.steps
    towers = 3 if case.with_negative else 2
    tokens = case.batch * (case.prefix_length + (towers - 1) * case.continuation_length)
    cfg = config.encoder
    flops = 3 * case.batch * (
        forward_flops(cfg, case.prefix_length, cfg.d_model)
        + (towers - 1) * forward_flops(cfg, case.continuation_length, cfg.d_model)
    )
    return {
        **dataclasses.asdict(case),
        "step_seconds": seconds,
        "first_step_seconds": compile_seconds,
        "examples_per_second": case.batch / seconds,
        "tokens_per_second": tokens / seconds,
        "train_gflops_per_second": flops / seconds / 1e9,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loss": float(metrics["loss"]),
    }


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of an n^3 numpy matmul on this machine."""
    import numpy as np

    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


DEFAULT_CASES = [
    BenchCase("tiny", 32),
    BenchCase("small", 16, steps=3),
    BenchCase("tiny", 64),
    BenchCase("tiny", 256, steps=3),
    BenchCase("tiny", 64, num_chunks=2, steps=3),
    BenchCase("tiny", 256, num_chunks=8, steps=2),
    BenchCase("tiny", 1536, num_chunks=48, steps=1),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child mode: one BenchCase as JSON
    parser.add_argument("--out", default="runs/bench/bench.json")
    parser.add_argument("--quick", action="store_true", help="only tiny batch 32 and GradCache batch 64")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(BenchCase(**json.loads(args.case)))))
        return 0
    cases = DEFAULT_CASES[:1] + DEFAULT_CASES[4:5] if args.quick else DEFAULT_CASES
    peak = matmul_peak_gflops()
    print(f"fp32 matmul peak (numpy 2048^3): {peak:.1f} GFLOP/s", flush=True)
    results = []
    for case in cases:
        proc = subprocess.run([sys.executable, "-m", "rankgen_jax.bench", "--case", json.dumps(dataclasses.asdict(case))],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{case}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["fraction_of_peak"] = row["train_gflops_per_second"] / peak
        results.append(row)
        mode = f"GradCache x{case.num_chunks} (chunk {case.batch // case.num_chunks})" if case.num_chunks > 1 else "plain"
        print(f"{case.size:>5} batch {case.batch:>5} {mode:<26} {row['examples_per_second']:8.1f} ex/s "
              f"{row['tokens_per_second']:9.0f} tok/s {row['train_gflops_per_second']:6.1f} GFLOP/s "
              f"({row['fraction_of_peak']:.0%} of peak)  peak RSS {row['peak_rss_mib']:7.0f} MiB", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"matmul_peak_gflops": peak, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
