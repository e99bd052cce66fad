"""Train-step throughput and peak memory of the RankGen step (`make bench`); numbers, not pass/fail.

Each configuration runs in its own subprocess so that its peak RSS is its own.
Achieved FLOP/s uses the analytical training cost (3x the forward matmul
FLOPs; GradCache really does a 4th forward, which is not counted) against an
fp32 matmul peak measured in the same run. The plain cases also run the
PyTorch / HuggingFace peer step (`benchmarks.torch_peer`) with the same
config, shapes, optimizer (AdamW) and thread count, and report the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from benchmarks.report import marked_sections, render_markdown, write_json
from benchmarks.step_timing import (
    MINILM_HEAD,
    MINILM_LOGIT_SCALE,
    BenchCase,
    encoder_config,
    matmul_peak_gflops,
    step_flops,
    step_tokens,
    time_steps,
)
from benchmarks.torch_peer import run_torch_case
from rankgen_jax_cpu.launch import environment as cpu_plugin_environment

LEARNING_RATE = 1e-4
THREADS = 2  # XLA:CPU uses every core it may run on; torch is told the same number


def run_case(case: BenchCase) -> dict:
    """One case's timings and analytical FLOP/s, in this (fresh) process."""
    if case.framework == "torch":
        timing = run_torch_case(case, THREADS, LEARNING_RATE, weight_decay=0.0)
    else:
        timing = run_jax_case(case)
    seconds = timing["step_seconds"]
    return {
        **dataclasses.asdict(case),
        **timing,
        "examples_per_second": case.batch / seconds,
        "tokens_per_second": step_tokens(case) / seconds,
        "train_gflops_per_second": step_flops(case) / seconds / 1e9,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_jax_case(case: BenchCase, peak_fn=None) -> dict:
    """Timings of our train step for one BenchCase (peak_fn: see step_timing.time_steps)."""
    # Imported here: a PyTorch case runs in a process of its own whose peak RSS is measured,
    # and JAX's training stack must not count in it.
    import flax.linen as nn
    import jax

    from rankgen_jax.data.sources import RandomTriples

    fns, data, rules, mesh = build_jax_step(case)
    source = RandomTriples(data)
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        state = fns.init()
        # A fresh batch every step: repeating a few lets the loss collapse to ~0 within steps.
        batches = [jax.device_put(source.batch(i), fns.batch_sharding) for i in range(case.steps + 1)]
        holder = {"state": state}

        def step(i: int) -> float:
            holder["state"], metrics = fns.train_step(holder["state"], batches[i])
            return float(metrics["loss"])  # waits for the step

        timing = time_steps(step, case.steps, peak_fn)
        del holder, batches, state
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        timing["peak_device_memory_gib"] = stats["peak_bytes_in_use"] / 2**30
    return timing


def build_jax_step(case: BenchCase):
    """(step functions, data config, axis rules, mesh) of a case: RankGen's step with AdamW on all devices."""
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig
    from rankgen_jax.data.source_configs import DataConfig, RandomData
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train.step import StepOptions
    from rankgen_jax.train.compiled import build_step_functions

    minilm = case.encoder == "minilm"
    config = ModelConfig(encoder=encoder_config(case), head=MINILM_HEAD if minilm else RANKGEN_HEAD)
    data = DataConfig(RandomData(continuation_length=case.continuation_length, with_negative=case.with_negative, vocab_size=config.encoder.vocab_size), batch_size=case.batch, prefix_length=case.prefix_length)
    mesh = partitioning.make_mesh(-1, 1)
    rules = partitioning.STANDARD_RULES
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=LEARNING_RATE))
    loss_options = (("logit_scale", MINILM_LOGIT_SCALE),) if minilm else ()
    options = StepOptions("in_batch_softmax", loss_options, num_chunks=case.num_chunks)
    return build_step_functions(config, options, tx, schedule, {}, mesh, rules, seed=0), data, rules, mesh


# JAX against the PyTorch peer at the two reference points the speed targets are set at
# (benchmarks.report.TARGETS), and at the demo's own step (MiniLM-L6, batch 32, 128 + 128 tokens);
# each runs as (JAX with the CPU plug-in, JAX without it, PyTorch) in interleaved rounds; the
# reported ratios are the medians of the rounds' ratios.
DEMO_CASE = BenchCase("L6", 32, prefix_length=128, continuation_length=128, with_negative=False, steps=3,
                      encoder="minilm")
PEER_CASES = [BenchCase("tiny", 32, steps=10), BenchCase("small", 16, steps=4), DEMO_CASE]
PEER_ROUNDS = {"tiny": 3, "small": 5, "L6": 3}  # small: its steps vary most (4.8-6.9 s within one process)
# A round's processes: the JAX step with and without the CPU plug-in, then the PyTorch peer.
ROUND_VARIANTS = {"jax": {"framework": "jax"}, "jax_xla": {"framework": "jax", "cpu_plugin": False},
                  "torch": {"framework": "torch"}}
# GradCache memory: peak RSS at batch 1536 against batch 64, both in chunks of 32 (tiny model).
GRADCACHE_CASES = [
    BenchCase("tiny", 64, steps=3),
    BenchCase("tiny", 64, num_chunks=2, steps=3),
    BenchCase("tiny", 256, num_chunks=8, steps=2),
    BenchCase("tiny", 1536, num_chunks=48, steps=1),
]


def case_environment(case: BenchCase, base: dict[str, str]) -> dict[str, str]:
    """The environment a case's process runs in: JAX with or without the CPU plug-in, PyTorch as its users run it."""
    # Without the plug-in, as a user of the core gets it: its kernels, malloc and XLA settings all off.
    plain = {k: v for k, v in base.items() if k not in ("RANKGEN_KERNEL_PLUGIN", "GLIBC_TUNABLES")}
    plain["XLA_FLAGS"] = " ".join(f for f in base.get("XLA_FLAGS", "").split() if "ynn_fusion" not in f)
    # PyTorch with glibc's default malloc: huge pages did not speed it up, and once (T5 small)
    # stalled it 10x in page compaction.
    return cpu_plugin_environment(plain) if case.framework == "jax" and case.cpu_plugin else plain


def _run_child(case: BenchCase) -> dict | None:
    """One case in a fresh process (its own peak RSS, its own thread pools); None if it failed."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--case", json.dumps(dataclasses.asdict(case))],
                          capture_output=True, text=True, env=case_environment(case, dict(os.environ)))
    if proc.returncode != 0:
        print(f"{case}: failed\n{proc.stderr[-2000:]}", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The train cases of each setting: (peer cases, rounds per case or None for PEER_ROUNDS, GradCache cases).
# smoke: the plumbing alone (every process starts, runs one step and reports), its numbers meaningless.
SMOKE_CASE = BenchCase("tiny", 8, prefix_length=32, continuation_length=16, steps=1)
SETTINGS = {
    "full": (PEER_CASES, None, GRADCACHE_CASES),
    "quick": (PEER_CASES[:1], 1, GRADCACHE_CASES[:2]),
    "smoke": ([SMOKE_CASE], 1, [dataclasses.replace(SMOKE_CASE, batch=16, num_chunks=2)]),
}
_SMOKE_DATA = ["--steps", "1", "--rounds", "1", "--warmup_steps", "1", "--source_batches", "2", "--batch_size", "8",
               "--prefix_length", "32", "--continuation_length", "16"]
# The other benchmarks of `make bench`, each its own module and process: (report key, module, args, the extra
# args of each setting but the full one; None: not run in that setting).
MODULE_BENCHMARKS = [
    ("encode", "benchmarks.encode", [], {"quick": ["--texts", "400", "--size", "tiny"],
                                         "smoke": ["--texts", "16", "--size", "tiny", "--repeats", "1",
                                                   "--batch_size", "8"]}),
    ("data", "benchmarks.data_pipeline", [], {"quick": ["--steps", "5", "--rounds", "2", "--source_batches", "30"],
                                              "smoke": _SMOKE_DATA}),
    # The Beam cache pipeline and training from its cache (the beam extra): minutes over the whole corpus even in
    # its quickest setting, so not in the smoke run (tests/test_benchmark_commands.py runs it on its own).
    ("data_cache", "benchmarks.data_pipeline", ["--cache"],
     {"quick": ["--cache_copies", "1", "--steps", "5", "--rounds", "2", "--source_batches", "30"], "smoke": None}),
]


def _run_module(module: str, out: Path, extra: list[str]) -> dict | None:
    """`python -m module --out out` with its output shown as it comes; its JSON result, or None if it failed."""
    print(f"--- {module}", flush=True)
    # With the CPU plug-in, as the demo runs (the encode benchmark's JAX side goes through its kernels).
    proc = subprocess.run([sys.executable, "-m", module, "--out", str(out), *extra],
                          env=cpu_plugin_environment(os.environ))
    if proc.returncode != 0:
        print(f"{module}: failed with exit code {proc.returncode}", flush=True)
        return None
    return json.loads(out.read_text())


def _describe(row: dict) -> str:
    mode = f"GradCache x{row['num_chunks']} (chunk {row['batch'] // row['num_chunks']})" if row["num_chunks"] > 1 else "plain"
    plugin = "" if row["framework"] == "torch" else " +cpu" if row.get("cpu_plugin", True) else " xla"
    return (f"{row['framework'] + plugin:>9} {row.get('encoder', 't5'):>6} {row['size']:>5} batch {row['batch']:>5} {mode:<24} {row['step_seconds']:7.3f} s/step "
            f"{row['tokens_per_second']:8.0f} tok/s {row['train_gflops_per_second']:6.1f} GFLOP/s "
            f"({row['train_gflops_per_second'] / max(row['peak_readings']):.0%} of the peak beside it: "
            f"{' / '.join(f'{p:.0f}' for p in row['peak_readings'])})  peak RSS {row['peak_rss_mib']:6.0f} MiB")


def summarize_rounds(size: str, batch: int, rounds: list[dict]) -> dict:
    """The report's entry for interleaved {"jax", "torch", "ratio"} rounds of one case.

    The ratio comes from the median round by ratio (of an even count, the one less
    favourable to JAX). The % of peak is added by `judge_peak` once the run's readings are in.
    Rounds with a "jax_xla" row (JAX without the CPU plug-in) also give the plug-in's
    speed-up: the median over rounds of that row's step time over the plug-in's.
    """
    median_round = sorted(rounds, key=lambda r: r["ratio"])[(len(rounds) - 1) // 2]
    summary = {"size": size, "batch": batch, "jax": median_round["jax"], "torch": median_round["torch"],
               "jax_over_torch": median_round["ratio"], "round_ratios": [r["ratio"] for r in rounds], "rounds": rounds}
    speedups = [r["jax_xla"]["step_seconds"] / r["jax"]["step_seconds"] for r in rounds if "jax_xla" in r]
    if speedups:
        summary["cpu_plugin_speedups"] = speedups
        summary["cpu_plugin_speedup"] = sorted(speedups)[(len(speedups) - 1) // 2]
        summary["jax_xla_step_seconds"] = statistics.median(r["jax_xla"]["step_seconds"] for r in rounds if "jax_xla" in r)
        summary["jax_step_seconds"] = statistics.median(r["jax"]["step_seconds"] for r in rounds)
    return summary


def judge_peak(train: dict, floor: float) -> None:
    """Each row's % of peak, and the JAX round each peer case's % of peak comes from.

    A row is measured against the higher of the two peak readings taken beside its own
    timed steps, so that a step and its peak come from the same state of the machine, but
    never against less than `floor`, the median of all the run's readings: a slow spell
    that lowers both readings and not the step would otherwise flatter the figure. The
    % of peak of a case is JAX's alone: its median round by that figure (of an even count,
    the lower), not the round the ratio picks, whose choice depends on PyTorch's noise.

    Where the machine's speed moves within seconds, no reading pairs well with a step, so
    each case also gets a figure that pairs nothing: JAX's median rate over its rounds
    against `floor`, the median reading (`jax_median_of_median_peak`).
    """
    for row in _train_rows(train):
        row["peak_gflops"] = max(*row["peak_readings"], floor)
        row["of_peak"] = row["train_gflops_per_second"] / row["peak_gflops"]
    for peer in train["peers"]:
        jax_rows = sorted((r["jax"] for r in peer["rounds"]), key=lambda row: row["of_peak"])
        peer["jax_for_peak"] = jax_rows[(len(jax_rows) - 1) // 2]
        rates = [row["train_gflops_per_second"] for row in jax_rows]
        peer["jax_median_of_median_peak"] = statistics.median(rates) / floor if floor else None


def _train_rows(train: dict) -> list[dict]:
    return [*train["gradcache"], *(r[name] for peer in train["peers"] for r in peer["rounds"]
                                   for name in ROUND_VARIANTS if name in r)]


def all_peak_readings(train: dict) -> list[float]:
    """Every matmul peak reading taken beside a train case's steps."""
    return [p for row in _train_rows(train) for p in row["peak_readings"]]


def run_train_benchmarks(setting: str) -> dict:
    """JAX (with and without the CPU plug-in) vs PyTorch at the peer cases, then GradCache memory (SETTINGS)."""
    peer_cases, rounds_per_case, gradcache_cases = SETTINGS[setting]
    peers, gradcache = [], []
    for case in peer_cases:
        rounds = []
        for _ in range(rounds_per_case or PEER_ROUNDS[case.size]):
            pair = {}
            for name, variant in ROUND_VARIANTS.items():
                row = _run_child(dataclasses.replace(case, **variant))
                if row:
                    print(_describe(row), flush=True)
                    pair[name] = row
            if "jax" in pair and "torch" in pair:
                pair["ratio"] = pair["jax"]["tokens_per_second"] / pair["torch"]["tokens_per_second"]
                rounds.append(pair)
        if rounds:
            peer = {"encoder": case.encoder, **summarize_rounds(case.size, case.batch, rounds)}
            print(f"      {case.encoder} {case.size} batch {case.batch}: JAX / PyTorch tokens/s = "
                  f"{peer['jax_over_torch']:.2f}x (median of {len(rounds)} round(s): "
                  f"{', '.join(f'{r:.2f}' for r in peer['round_ratios'])}); the CPU plug-in's speed-up: "
                  f"{peer.get('cpu_plugin_speedup', float('nan')):.2f}x", flush=True)
            peers.append(peer)
    for case in gradcache_cases:
        row = _run_child(case)
        if row:
            print(_describe(row), flush=True)
            gradcache.append(row)
    by_batch = {r["batch"]: r for r in gradcache if r["num_chunks"] > 1}
    rss_ratio = by_batch[1536]["peak_rss_mib"] / by_batch[64]["peak_rss_mib"] if {64, 1536} <= set(by_batch) else None
    if rss_ratio:
        print(f"      GradCache peak RSS, batch 1536 / batch 64 (chunks of 32): {rss_ratio:.2f}x", flush=True)
    return {"peers": peers, "gradcache": gradcache, "gradcache_rss_1536_over_64": rss_ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child mode: one BenchCase as JSON
    parser.add_argument("--out", default="runs/bench/bench.json")
    parser.add_argument("--report", default="docs/benchmarks.md", help="markdown results table to (re)write")
    parser.add_argument("--quick", action="store_true", help="tiny cases only (a few minutes)")
    parser.add_argument("--smoke", action="store_true",
                        help="every process at the smallest shapes for one step: checks the plumbing, measures nothing")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(BenchCase(**json.loads(args.case)))))
        return 0
    started = time.time()
    peak = matmul_peak_gflops()
    print(f"fp32 matmul peak (numpy {2048}^3, {THREADS} threads): {peak:.1f} GFLOP/s", flush=True)
    setting = "smoke" if args.smoke else "quick" if args.quick else "full"
    report = {"machine": machine_description(), "quick": setting != "full", "setting": setting,
              "train": run_train_benchmarks(setting)}
    peak_after = matmul_peak_gflops()
    report["matmul_peak_measurements"] = [peak, peak_after]
    readings = [peak, peak_after, *all_peak_readings(report["train"])]
    # The run-wide figure is the highest of every reading (before and after all train steps, and
    # beside each case's steps), so that a low reading cannot flatter the "% of peak" it yields.
    report["matmul_peak_gflops"] = run_peak = max(readings)
    report["matmul_peak_median"] = statistics.median(readings)
    report["matmul_peak_lowest"] = min(readings)
    judge_peak(report["train"], report["matmul_peak_median"])
    print(f"fp32 matmul peak after the train steps: {peak_after:.1f} GFLOP/s; the highest reading of the run: "
          f"{run_peak:.1f}, the median: {report['matmul_peak_median']:.1f}", flush=True)
    out_dir = Path(args.out).parent
    for name, module, module_args, setting_args in MODULE_BENCHMARKS:
        extra = [] if setting == "full" else setting_args[setting]
        if extra is not None:
            report[name] = _run_module(module, out_dir / f"{name}.json", module_args + extra)
    report["seconds"] = time.time() - started
    write_json(args.out, report)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        # Sections other benchmarks keep in the same file (benchmarks.gpu's) stay as they are.
        previous = Path(args.report).read_text() if Path(args.report).exists() else ""
        text = render_markdown(report)
        for section in marked_sections(previous):
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        Path(args.report).write_text(text)
        print(f"wrote {args.report}")
    return 0


def machine_description() -> dict:
    """CPU model, cores, memory and library versions, for the report header."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    meminfo = Path("/proc/meminfo")
    mem_gib = (int(meminfo.read_text().split()[1]) / 2**20) if meminfo.exists() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"),
            **{name: version(name) for name in ("jax", "jaxlib", "flax", "torch", "transformers", "numpy")},
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}


if __name__ == "__main__":
    sys.exit(main())
