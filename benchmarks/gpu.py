"""GPU benchmark (`make bench-gpu`): our RankGen step and encoder against a tuned PyTorch / HF peer; numbers, not pass/fail.

One process per framework, each running all of its cases side by side at the
same shapes (`benchmarks.step_timing.BenchCase`):

- train: the RankGen step (prefix 512 / continuation 128 tokens plus one
  generative negative each, in-batch softmax, AdamW) of T5 1.1 base and large
  encoders: at the largest batch that fits without GradCache (JAX: read off the
  compiler's memory figures for a probe batch, then stepped down on an
  out-of-memory; PyTorch: the same batch, halved until it fits), and JAX at batch
  1536 with GradCache in chunks of at most that batch. PyTorch runs as
  `benchmarks.torch_peer` tunes it for GPUs (bf16 autocast, SDPA, torch.compile,
  fused AdamW); GradCache is ours only (the peer has none).
  Per case: step time, tokens/s, peak device memory, and MFU: the model's matmul
  FLOPs (3x the forward's, attention included, `step_timing.step_flops`; the
  GradCache re-forward is not counted) per second over the chip's nominal dense
  bf16 peak (`NOMINAL_BF16_TFLOPS`) and over a bf16 matmul peak measured
  in the same process beside the timed steps.
- encode: passages/s of the document tower on random ids (RankGen's suffix
  shape, 128 tokens, no tokenising: that is `benchmarks.encode`'s job), JAX
  against the same HF encoder under bf16 autocast and SDPA in inference mode.
- rerank: the share of RankGen beam search time spent re-ranking
  (`benchmarks.generation`), with a random-init GPT-2 medium-size LM on the
  GPU and our encoder.

A time budget (--budget_s, default 450 s) bounds the run: a case that would
start after its framework's share of it is recorded as skipped. JSON goes to
--out and the tables into the GPU section of docs/benchmarks.md. On CPU, at a
tiny size (tests/test_bench_gpu.py), the same code runs so that it never rots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import replace_section, write_json
from benchmarks.step_timing import BenchCase, step_flops, step_tokens

LEARNING_RATE = 1e-4
# Nominal dense bf16 TFLOP/s of one GPU (vendor figures, no sparsity), by a substring of its device name.
# TPU generations have theirs in rankgen_jax.tpu.aot.GENERATIONS.
NOMINAL_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L4": 121.0}


def peak_tflops(device_kind: str) -> float | None:
    """The table's figure for a device name ('NVIDIA H200'), or None where it has none (a CPU)."""
    return next((v for name, v in NOMINAL_BF16_TFLOPS.items() if name.lower() in device_kind.lower()), None)
# Share of the device memory a plain step's batch is sized to (the rest: XLA's and cuDNN's
# workspaces, fragmentation, and the error of the linear fit).
MEMORY_FILL = 0.85
GRADCACHE_BATCH = 1536
SECTION = "gpu"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one run measures; the defaults are the H200 run, tests shrink them."""

    sizes: tuple[str, ...] = ("base", "large")
    prefix_length: int = 512
    continuation_length: int = 128
    batch: int = 0  # plain-step batch; 0: the largest that fits (needs device memory figures)
    probe_batch: int = 16
    gradcache_batch: int = GRADCACHE_BATCH
    steps: int = 3
    device: str = "cuda"
    precision: str = "auto"
    torch_compile: bool = True
    matmul_size: int = 8192
    encode_passages: int = 4096
    encode_batch: int = 512
    rerank_prefixes: int = 4
    lm_size: str = "medium"
    budget_s: float = 450.0


def _case(settings: Settings, size: str, batch: int, framework: str, num_chunks: int = 1) -> BenchCase:
    return BenchCase(size, batch, settings.prefix_length, settings.continuation_length, with_negative=True,
                     num_chunks=num_chunks, steps=settings.steps, framework=framework, device=settings.device,
                     precision=settings.precision, sdpa=True, torch_compile=settings.torch_compile)


def gradcache_chunks(total: int, fits: int) -> int:
    """The fewest chunks that split `total` evenly into chunks of at most `fits` rows."""
    return next(n for n in range(1, total + 1) if total % n == 0 and total // n <= fits)


def _is_oom(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error}".lower()
    return "resource_exhausted" in text or "out of memory" in text or "outofmemory" in text


# --- JAX process -------------------------------------------------------------------------------

def jax_matmul_peak_tflops(n: int) -> float:
    """Best bf16 TFLOP/s of an n^3 matmul in JAX on the default device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def jax_plain_batch(case: BenchCase, settings: Settings) -> tuple[int, dict]:
    """The largest plain-step batch that fits, from the compiled step's memory at a probe batch.

    Memory ~ state + batch x per-example activations: the state is the step's argument bytes
    (its outputs alias them: the state is donated), the activations its temporaries.
    """
    import jax

    from benchmarks.bench import build_jax_step

    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    if settings.batch or not limit:
        return settings.batch or settings.probe_batch, {"batch_from": "given" if settings.batch else "probe"}
    probe = dataclasses.replace(case, batch=settings.probe_batch)
    fns, data, rules, mesh = build_jax_step(probe)
    batch_shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=fns.batch_sharding)
                    for k, v in _abstract_batch(data).items()}
    import flax.linen as nn

    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        memory = fns.train_step.lower(fns.abstract_state, batch_shapes).compile().memory_analysis()
    per_example = memory.temp_size_in_bytes / settings.probe_batch
    fits = int((MEMORY_FILL * limit - memory.argument_size_in_bytes) / per_example)
    batch = max(8, fits // 8 * 8)
    return batch, {"batch_from": "compiler memory at the probe batch", "probe_batch": settings.probe_batch,
                   "probe_temp_gib": memory.temp_size_in_bytes / 2**30,
                   "state_gib": memory.argument_size_in_bytes / 2**30, "device_memory_gib": limit / 2**30}


def _abstract_batch(data) -> dict:
    from rankgen_jax.data.sources import RandomTriples

    return RandomTriples(data).batch(0)


def _run_jax_train(case: BenchCase, peak_fn) -> dict:
    import jax

    from benchmarks.bench import run_jax_case

    try:
        return run_jax_case(case, peak_fn)
    finally:
        jax.clear_caches()


def jax_encode(size: str, settings: Settings) -> dict:
    """Passages/s of the document tower on random [passages, continuation_length] ids."""
    import jax
    import numpy as np

    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.models.factory import build_model, init_params

    config = ModelConfig(encoder=t5_config(size, dtype=settings.precision), head=RANKGEN_HEAD)
    params = jax.device_put(init_params(config))
    model = build_model(config)
    tower = jax.jit(lambda p, ids: model.apply({"params": p}, ids, tower="document"))
    batches = _encode_batches(settings, config.encoder.vocab_size)
    tower(params, batches[0]).block_until_ready()
    start = time.perf_counter()
    outputs = [tower(params, ids) for ids in batches]
    jax.block_until_ready(outputs)
    seconds = time.perf_counter() - start
    return {"framework": "jax", "size": size, "passages": sum(len(b) for b in batches), "seconds": seconds,
            "passages_per_second": sum(len(b) for b in batches) / seconds,
            "vector_dtype": str(np.asarray(outputs[0]).dtype)}


def _encode_batches(settings: Settings, vocab_size: int) -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    count = max(1, settings.encode_passages // settings.encode_batch)
    return [rng.integers(2, vocab_size, (settings.encode_batch, settings.continuation_length)).astype(np.int32)
            for _ in range(count)]


def run_jax(settings: Settings, deadline: float) -> dict:
    """Every JAX case of the run, in this process."""
    import jax

    peak_fn = lambda: jax_matmul_peak_tflops(settings.matmul_size)  # noqa: E731
    device = jax.devices()[0]
    out = {"device_kind": device.device_kind, "platform": device.platform, "jax": jax.__version__,
           "matmul_peak_tflops": peak_fn(), "train": [], "encode": []}
    for size in settings.sizes:
        for row in _jax_size(size, settings, deadline, peak_fn):
            out["train"].append(row)
        if time.time() < deadline:
            out["encode"].append(jax_encode(size, settings))
    return out


def _jax_size(size: str, settings: Settings, deadline: float, peak_fn) -> list[dict]:
    rows = []
    if time.time() >= deadline:
        return [{"framework": "jax", "size": size, "skipped": "time budget"}]
    batch, how = jax_plain_batch(_case(settings, size, settings.probe_batch, "jax"), settings)
    fitted = None
    while batch >= 1 and time.time() < deadline:
        case = _case(settings, size, batch, "jax")
        try:
            rows.append({**dataclasses.asdict(case), **how, **_run_jax_train(case, peak_fn)})
            fitted = batch
            break
        except Exception as error:  # noqa: BLE001 - an out-of-memory steps the batch down, anything else is raised
            if not _is_oom(error):
                raise
            print(f"jax {size} batch {batch}: out of memory, trying {batch * 3 // 4 // 8 * 8}", flush=True)
            batch = batch * 3 // 4 // 8 * 8
    if fitted and time.time() < deadline:
        chunks = gradcache_chunks(settings.gradcache_batch, fitted)
        case = _case(settings, size, settings.gradcache_batch, "jax", num_chunks=chunks)
        rows.append({**dataclasses.asdict(case), **_run_jax_train(case, peak_fn)})
    elif fitted:
        rows.append({"framework": "jax", "size": size, "num_chunks": -1, "skipped": "time budget"})
    return rows


# --- PyTorch process ---------------------------------------------------------------------------

def torch_matmul_peak_tflops(n: int, device: str) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = float("inf")
    for i in range(6):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_encode(size: str, settings: Settings) -> dict:
    import torch

    from benchmarks.torch_peer import build_peer

    case = _case(settings, size, settings.encode_batch, "torch")
    encoder, projection, embed, autocast = build_peer(case)
    encoder.eval()
    from rankgen_jax.models.configs import t5_config

    batches = [torch.from_numpy(b).long().to(settings.device)
               for b in _encode_batches(settings, t5_config(size).vocab_size)]
    with torch.inference_mode(), autocast():
        embed(batches[0])
        _sync(settings.device)
        start = time.perf_counter()
        outputs = [embed(ids) for ids in batches]
        _sync(settings.device)
    seconds = time.perf_counter() - start
    return {"framework": "torch", "size": size, "passages": sum(len(b) for b in batches), "seconds": seconds,
            "passages_per_second": sum(len(b) for b in batches) / seconds, "vector_dtype": str(outputs[0].dtype)}


def run_torch(settings: Settings, deadline: float, batches: dict[str, int]) -> dict:
    """Every PyTorch case of the run, in this process; `batches`: JAX's plain batch per size."""
    import torch

    from benchmarks.torch_peer import run_torch_case

    peak_fn = lambda: torch_matmul_peak_tflops(settings.matmul_size, settings.device)  # noqa: E731
    cuda = settings.device.startswith("cuda")
    out = {"device_kind": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "matmul_peak_tflops": peak_fn(), "train": [], "encode": []}
    for size in settings.sizes:
        batch = batches.get(size) or settings.batch or settings.probe_batch
        while batch >= 1:
            if time.time() >= deadline:
                out["train"].append({"framework": "torch", "size": size, "skipped": "time budget"})
                break
            case = _case(settings, size, batch, "torch")
            try:
                out["train"].append({**dataclasses.asdict(case), **run_torch_case(case, torch.get_num_threads(),
                                                                               LEARNING_RATE, 0.0, peak_fn)})
                break
            except torch.OutOfMemoryError:
                print(f"torch {size} batch {batch}: out of memory, trying {batch // 2}", flush=True)
                torch.cuda.empty_cache()
                batch //= 2
        if time.time() < deadline:
            out["encode"].append(torch_encode(size, settings))
    return out


# --- the run -----------------------------------------------------------------------------------

def derive(report: dict) -> None:
    """Tokens/s, MFU (nominal and measured peak) per train row, and JAX / PyTorch ratios."""
    for framework in ("jax", "torch"):
        side = report.get(framework) or {}
        nominal = peak_tflops(side.get("device_kind", ""))
        for row in side.get("train", []):
            if "step_seconds" not in row:
                continue
            case = BenchCase(**{f.name: row[f.name] for f in dataclasses.fields(BenchCase)})
            row["tokens_per_second"] = step_tokens(case) / row["step_seconds"]
            row["model_tflops_per_step"] = step_flops(case) / 1e12
            achieved = row["model_tflops_per_step"] / row["step_seconds"]
            row["achieved_tflops"] = achieved
            row["mfu_nominal"] = achieved / nominal if nominal else None
            row["peak_measured_tflops"] = max(row["peak_readings"])
            row["mfu_measured_peak"] = achieved / row["peak_measured_tflops"]
            row["nominal_peak_tflops"] = nominal
    ratios = {}
    jax_rows = {(r["size"], r.get("num_chunks")): r for r in (report.get("jax") or {}).get("train", [])}
    for row in (report.get("torch") or {}).get("train", []):
        mine = jax_rows.get((row["size"], 1))
        if mine and "tokens_per_second" in row and "tokens_per_second" in mine:
            ratios[f"train_{row['size']}"] = mine["tokens_per_second"] / row["tokens_per_second"]
    for size in {r["size"] for r in (report.get("jax") or {}).get("train", [])}:
        plain, cached = jax_rows.get((size, 1)), [r for k, r in jax_rows.items() if k[0] == size and (k[1] or 0) > 1]
        if plain and cached and "tokens_per_second" in plain and "tokens_per_second" in cached[0]:
            ratios[f"gradcache_over_plain_{size}"] = cached[0]["tokens_per_second"] / plain["tokens_per_second"]
    encodes = {(r["framework"], r["size"]): r for side in ("jax", "torch") for r in (report.get(side) or {}).get("encode", [])}
    for (framework, size), row in encodes.items():
        if framework == "jax" and ("torch", size) in encodes:
            ratios[f"encode_{size}"] = row["passages_per_second"] / encodes[("torch", size)]["passages_per_second"]
    report["ratios"] = ratios


def _child(args: list[str], timeout: float) -> dict | None:
    """`python -m benchmarks.gpu <args>` in a fresh process; its JSON (last stdout line) or None."""
    # JAX takes 75% of a GPU's memory up front by default; PyTorch may grow into all of it.
    env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")}
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", *args], capture_output=True, text=True,
                              timeout=max(timeout, 30), env=env)
    except subprocess.TimeoutExpired as error:
        print(f"{args[:2]}: timed out after {error.timeout:.0f} s", flush=True)
        return None
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        print(f"{args[:2]}: failed (exit {proc.returncode})", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rerank(settings: Settings, timeout: float, out: Path) -> dict | None:
    """benchmarks.generation's beam case on settings.device with a GPT-2 of settings.lm_size."""
    command = [sys.executable, "-m", "benchmarks.generation", "--device", settings.device, "--lm_size",
               settings.lm_size, "--rankgen_size", settings.sizes[0], "--prefixes", str(settings.rerank_prefixes),
               "--only", "beam", "--out", str(out)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout, 30))
    except subprocess.TimeoutExpired:
        print("rerank: timed out", flush=True)
        return None
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        print("rerank: failed", flush=True)
        return None
    return json.loads(out.read_text())


def run(settings: Settings, workdir: Path) -> dict:
    """The whole benchmark: the JAX process, the PyTorch process, the re-ranking one; the derived figures."""
    started = time.time()
    shares = {"jax": 0.5, "torch": 0.85, "rerank": 1.0}  # of the budget, cumulative
    encoded = json.dumps(dataclasses.asdict(settings))
    report = {"settings": dataclasses.asdict(settings), "date": time.strftime("%Y-%m-%d")}
    report["jax"] = _child(["--child", "jax", "--settings", encoded,
                            "--deadline", str(started + shares["jax"] * settings.budget_s)],
                           started + settings.budget_s - time.time())
    batches = {r["size"]: r["batch"] for r in (report["jax"] or {}).get("train", []) if r.get("num_chunks") == 1}
    report["torch"] = _child(["--child", "torch", "--settings", encoded, "--batches", json.dumps(batches),
                              "--deadline", str(started + shares["torch"] * settings.budget_s)],
                             started + settings.budget_s - time.time())
    report["rerank"] = _rerank(settings, started + settings.budget_s - time.time(), workdir / "rerank.json")
    derive(report)
    report["seconds"] = time.time() - started
    return report


def render(report: dict) -> str:
    """The GPU section of docs/benchmarks.md."""
    jax_side, torch_side = report.get("jax") or {}, report.get("torch") or {}
    s = report["settings"]
    lines = [f"## GPU ({jax_side.get('device_kind', torch_side.get('device_kind', '?'))}, {report['date']})", "",
             f"`make bench-gpu`: prefix {s['prefix_length']} / continuation {s['continuation_length']} tokens plus one "
             f"negative, AdamW, {s['steps']} timed steps after a warm-up step, median. JAX {jax_side.get('jax', '?')} "
             f"(activations {s['precision']}), PyTorch {torch_side.get('torch', '?')} (bf16 autocast, SDPA, "
             f"torch.compile={s['torch_compile']}, fused AdamW). Measured bf16 matmul peak "
             f"({s['matmul_size']}^3): JAX {jax_side.get('matmul_peak_tflops', 0):.0f}, PyTorch "
             f"{torch_side.get('matmul_peak_tflops', 0):.0f} TFLOP/s. The run took {report['seconds']:.0f} s.", "",
             "| framework | size | batch | mode | s / step | tokens / s | peak memory GiB | MFU (nominal) | "
             "MFU (measured peak) |", "|---|---|---|---|---|---|---|---|---|"]
    for side in (jax_side, torch_side):
        for row in side.get("train", []):
            if "skipped" in row:
                lines.append(f"| {row['framework']} | {row['size']} | | | skipped: {row['skipped']} | | | | |")
                continue
            mode = f"GradCache x{row['num_chunks']}" if row["num_chunks"] > 1 else "plain"
            nominal = f"{row['mfu_nominal']:.1%}" if row.get("mfu_nominal") is not None else "n/a"
            memory = f"{row['peak_device_memory_gib']:.1f}" if "peak_device_memory_gib" in row else "n/a"
            lines.append(f"| {row['framework']} | {row['size']} | {row['batch']} | {mode} | {row['step_seconds']:.3f} | "
                         f"{row['tokens_per_second']:,.0f} | {memory} | {nominal} | {row['mfu_measured_peak']:.1%} |")
    lines += ["", "| framework | size | passages / s |", "|---|---|---|"]
    for side in (jax_side, torch_side):
        for row in side.get("encode", []):
            lines.append(f"| {row['framework']} | {row['size']} | {row['passages_per_second']:,.0f} |")
    ratios = report.get("ratios", {})
    if ratios:
        lines += ["", "Ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in sorted(ratios.items())) + "."]
    rerank = report.get("rerank")
    if rerank:
        for row in rerank.get("results", []):
            lines.append(f"\nRe-ranking share of RankGen beam search ({row['name']}, GPT-2 {s['lm_size']} on "
                         f"{s['device']}, RankGen {s['sizes'][0]}): **{row['rerank_share']:.1%}** "
                         f"({row['seconds_per_generation']:.2f} s per generation).")
    else:
        lines.append("\nRe-ranking share: not run, or failed.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=("jax", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--batches", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench_gpu/gpu.json")
    parser.add_argument("--report", default="docs/benchmarks.md", help="markdown file whose GPU section to (re)write")
    for field in dataclasses.fields(Settings):
        field_type = type(field.default)
        if field_type is tuple:
            parser.add_argument(f"--{field.name}", nargs="+", default=list(field.default))
        elif field_type is bool:
            parser.add_argument(f"--{field.name}", type=lambda v: v.lower() in ("1", "true", "yes"), default=field.default)
        else:
            parser.add_argument(f"--{field.name}", type=field_type, default=field.default)
    args = parser.parse_args(argv)
    if args.child:
        fields = json.loads(args.settings)
        settings = Settings(**{**fields, "sizes": tuple(fields["sizes"])})
        result = run_jax(settings, args.deadline) if args.child == "jax" else run_torch(
            settings, args.deadline, json.loads(args.batches))
        print(json.dumps(result))
        return 0
    settings = Settings(**{f.name: (tuple(getattr(args, f.name)) if f.name == "sizes" else getattr(args, f.name))
                           for f in dataclasses.fields(Settings)})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = run(settings, Path(args.out).parent)
    write_json(args.out, report)
    text = render(report)
    print(text)
    if args.report:
        path = Path(args.report)
        path.write_text(replace_section(path.read_text() if path.exists() else "", SECTION, text))
        print(f"wrote the GPU section of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
