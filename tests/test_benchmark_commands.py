"""Every documented benchmark command, started as a user starts it: a subprocess at the root of a fresh copy of the
repository (the files a clone has), in its quickest setting; each must write its report.

The benchmarks' functions are tested in-process elsewhere (test_bench.py, test_bench_gpu.py, ...); this is about
starting them: a command that cannot find its modules from a clone's root fails here, not in a user's hands.
`make bench` (which starts `benchmarks.encode` and `benchmarks.data_pipeline` as its children) and
`benchmarks.index_memory` run in `make test`; the three that take a minute or more each run in `make test-all`.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# The commands the docs give (README.md and docs/), each with the quickest setting it has. `make bench-gpu`
# needs a GPU (tests/test_bench_gpu.py runs its code at toy sizes on CPU).
QUICKEST = {
    "make bench": ["make", "-o", f"{sys.prefix}/.installed", f"VENV={sys.prefix}", "bench",
                   "BENCH_ARGS=--smoke --report runs/bench/bench.md"],
    "python -m benchmarks.index_memory": [PYTHON, "-m", "benchmarks.index_memory", "--small", "24", "--scale", "2",
                                          "--batch_size", "8"],
    "python -m benchmarks.cl_drd_cost": [PYTHON, "-m", "benchmarks.cl_drd_cost", "--repeats", "1",
                                         "--out", "runs/bench/cl_drd_cost.json"],
    "python -m benchmarks.generation": [PYTHON, "-m", "benchmarks.generation", "--prefixes", "1"],
    "python -m benchmarks.data_pipeline --cache": [PYTHON, "-m", "benchmarks.data_pipeline", "--cache",
                                                   "--steps", "1", "--rounds", "1", "--warmup_steps", "1",
                                                   "--source_batches", "2", "--batch_size", "8",
                                                   "--prefix_length", "32", "--continuation_length", "16"],
}
# Run by `make bench` as its children (each `python -m` from the same root), so its test covers them too.
RUN_BY_MAKE_BENCH = ("python -m benchmarks.bench", "python -m benchmarks.encode", "python -m benchmarks.data_pipeline")
GPU_ONLY = ("make bench-gpu", "make bench-gpu-wheels")


def _documented_commands() -> set[str]:
    """Every `make bench…` and `python -m benchmarks.…` (with --cache where given) that the docs mention."""
    pattern = re.compile(r"(make bench[\w-]*|python -m benchmarks\.\w+(?: --cache)?)")
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return {m.group(1) for page in pages for m in pattern.finditer(page.read_text(encoding="utf-8"))}


def test_every_documented_benchmark_command_is_started_here():
    documented = _documented_commands()
    assert {"make bench", "python -m benchmarks.index_memory"} <= documented  # the reader finds them
    covered = set(QUICKEST) | set(RUN_BY_MAKE_BENCH) | set(GPU_ONLY)
    assert documented - covered == set()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The files git tracks (or would: untracked, not ignored) copied into an empty folder, as a clone has them."""
    root = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    with tarfile.open(root / "files.tar", "w") as tar:
        for name in filter(None, listed):
            if (REPO / name).is_file():
                tar.add(REPO / name, arcname=name)
    with tarfile.open(root / "files.tar") as tar:
        tar.extractall(root / "repo", filter="data")
    return root / "repo"


def _run(clone: Path, command: str, timeout: int) -> subprocess.CompletedProcess:
    # Nothing of this checkout on the path: the clone's root (the working folder) is what the command has. Nor
    # the test process's settings: its 8 fake devices and the CPU plug-in (make bench sets its own per case).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS", "RANKGEN_KERNEL_PLUGIN")}
    done = subprocess.run(QUICKEST[command], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_make_bench(clone):
    _run(clone, "make bench", timeout=900)
    report = json.loads((clone / "runs/bench/bench.json").read_text())
    assert report["setting"] == "smoke"
    [peer] = report["train"]["peers"]
    assert {"jax", "torch"} <= set(peer) and peer["cpu_plugin_speedup"] > 0  # with and without the CPU plug-in
    assert report["train"]["gradcache"] and report["encode"]["jax_sentences_per_second"] > 0
    assert report["data"]["synthetic_step_seconds"] > 0
    page = (clone / "runs/bench/bench.md").read_text()
    assert "smoke run" in page and "## The CPU plug-in" in page and "| T5 1.1 tiny |" in page


def test_index_memory(clone):
    _run(clone, "python -m benchmarks.index_memory", timeout=600)
    row = json.loads((clone / "runs/bench/index_memory.json").read_text())
    assert row["large_passages"] == 2 * row["small_passages"] and row["rss_ratio"] > 0


@pytest.mark.slow  # about a minute: BERT-base-sized models compiled in float32
def test_cl_drd_cost(clone):
    _run(clone, "python -m benchmarks.cl_drd_cost", timeout=600)
    assert json.loads((clone / "runs/bench/cl_drd_cost.json").read_text())


@pytest.mark.slow  # about a minute: one process per decoding strategy
def test_generation(clone):
    _run(clone, "python -m benchmarks.generation", timeout=600)
    assert json.loads((clone / "runs/bench/generation.json").read_text())


@pytest.mark.slow  # the Beam pipeline over the whole bundled corpus: minutes even in its quickest setting
def test_data_pipeline_cache(clone):
    _run(clone, "python -m benchmarks.data_pipeline --cache", timeout=1200)
    row = json.loads((clone / "runs/bench/data.json").read_text())
    assert row["cached_examples_per_second"] > 0
