"""Multi-host detection and the distributed-init guard (the join itself needs a real slice)."""

import os
import sys

import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.runtime.process import initialize_distributed, is_multi_host_environment


def test_multi_host_detection():
    assert not is_multi_host_environment({})
    assert not is_multi_host_environment({"TPU_WORKER_HOSTNAMES": "10.0.0.2"})  # a single-host slice
    assert is_multi_host_environment({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"})
    assert is_multi_host_environment({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234"})
    assert is_multi_host_environment({"RANKGEN_MULTI_HOST": "1"})


def test_initialize_distributed_modes():
    assert initialize_distributed("off", {"TPU_WORKER_HOSTNAMES": "a,b"}) is False
    assert initialize_distributed("auto", {}) is False
    with pytest.raises(RankgenError, match="expected 'auto', 'on' or 'off'"):
        initialize_distributed("yes", {})
    import jax

    jax.devices()  # backends are up in the test process: joining now must fail clearly, not hang
    with pytest.raises(RankgenError, match="before jax starts its backends"):
        initialize_distributed("auto", {"TPU_WORKER_HOSTNAMES": "a,b"})


@pytest.mark.parametrize("module", ["benchmarks.bench", "benchmarks.data_pipeline", "benchmarks.encode"])
def test_benchmark_entry_points_start_from_the_repository_root(module):
    """`python -m benchmarks.…` from the repository root, as the docs run them (no re-exec drops the folder)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout
