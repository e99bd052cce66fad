"""One train-step benchmark case, how its steps are timed, and its analytical cost.

What the JAX step (`benchmarks.bench`) and its PyTorch peer (`benchmarks.torch_peer`)
share, so that both sides time the same work the same way: the case, the timing
loop with the matmul peak read beside the timed steps, and the tokens and FLOPs
a step processes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from rankgen_jax.models.configs import MINILM_L6, HeadConfig, t5_config
from rankgen_jax.models.flops import train_step_model_flops

# The demo's model: all-MiniLM-L6-v2's shape with its sentence-transformers head (mean pooling, L2) and the
# demo's fixed logit scale (gin_configs/demo_minilm_training.gin).
MINILM_HEAD = HeadConfig(pooling="mean", projection_dim=-1, l2_normalize=True)
MINILM_LOGIT_SCALE = 20.0


@dataclasses.dataclass(frozen=True)
class BenchCase:
    size: str = "tiny"  # T5 1.1's size; "L6" with encoder "minilm"
    batch: int = 32
    prefix_length: int = 256
    continuation_length: int = 128
    with_negative: bool = True
    num_chunks: int = 1
    steps: int = 5
    framework: str = "jax"  # or "torch": the HF peer step
    # Where and how it runs (the CPU bench keeps the defaults; benchmarks.gpu sets them):
    # device "cpu" or "cuda"; precision: the JAX encoder's dtype (models.precision: `auto` is
    # bfloat16 on accelerators), and for torch bfloat16 autocast where it resolves to bfloat16;
    # sdpa / torch_compile: HF's scaled-dot-product attention and torch.compile for the peer.
    device: str = "cpu"
    precision: str = "auto"
    sdpa: bool = False
    torch_compile: bool = False
    # "t5" (RankGen's head: first token, d -> d projection) or "minilm" (the demo's step: MINILM_HEAD).
    encoder: str = "t5"
    # JAX on CPU: with the CPU plug-in (rankgen_jax_cpu: its kernels, malloc and XLA settings) or plain XLA.
    cpu_plugin: bool = True


def encoder_config(case: BenchCase):
    """The case's encoder config (T5 1.1 at case.size, or MiniLM-L6) in the case's precision."""
    if case.encoder == "minilm":
        return dataclasses.replace(MINILM_L6, dtype=case.precision)
    return t5_config(case.size, dtype=case.precision)


def _towers(case: BenchCase) -> int:
    """Encoder calls per example: the prefix, the continuation and (with_negative) the negative."""
    return 3 if case.with_negative else 2


def step_tokens(case: BenchCase) -> int:
    """Tokens one train step encodes."""
    return case.batch * (case.prefix_length + (_towers(case) - 1) * case.continuation_length)


def step_flops(case: BenchCase) -> float:
    """Model FLOPs of one train step (models.flops: 6 N T plus attention; GradCache's re-forward not counted)."""
    cfg = encoder_config(case)
    shapes = {"query": (case.batch, case.prefix_length),
              "documents": (case.batch * (_towers(case) - 1), case.continuation_length)}
    return train_step_model_flops(cfg, shapes, cfg.d_model if case.encoder == "t5" else 0)


def time_steps(step, steps: int, peak_fn=None) -> dict:
    """Run step(0) (compile / warm-up) then `steps` timed steps; median and best seconds per step.

    The matmul peak is read right before and right after the timed steps, in the same
    process: the machine's speed drifts within a run (numpy's peak read 391 and then 332
    GFLOP/s in one `make bench`), so a step's % of peak is taken against readings from
    the same minute, not from the run's start or end. peak_fn: the reading (default the
    CPU's fp32 numpy matmul; on a GPU its bfloat16 matmul in the same framework).
    """
    peak_fn = peak_fn or _peak_between_steps
    start = time.perf_counter()
    step(0)
    first = time.perf_counter() - start
    peak_before = peak_fn()
    seconds = []
    for i in range(1, steps + 1):
        start = time.perf_counter()
        loss = step(i)
        seconds.append(time.perf_counter() - start)
    peak_after = peak_fn()
    return {"step_seconds": statistics.median(seconds), "best_step_seconds": min(seconds),
            "first_step_seconds": first, "loss": loss, "peak_readings": [peak_before, peak_after]}


# Idle thread pools (torch's OpenMP, numpy's OpenBLAS) spin for up to ~0.2 s after their
# last call; the pauses keep either side's spinning out of the other's measurement.
THREAD_SPIN_SECONDS = 0.5


def _peak_between_steps() -> float:
    time.sleep(THREAD_SPIN_SECONDS)
    peak = matmul_peak_gflops()
    time.sleep(THREAD_SPIN_SECONDS)
    return peak


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of an n^3 numpy matmul on this machine."""
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
