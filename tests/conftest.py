"""Test settings: 8 fake CPU devices for sharding tests, offline HF, a vocabulary trained once."""

import os

# Must happen before jax is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests compare float32 numerics with tight tolerances. On CPU this changes nothing;
# on a GPU (TF32) or TPU (bf16 passes) the default f32 matmul precision is lower: on an
# H200, 13 of the model, attention and HF-parity tests failed at the default, none at highest.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# The CPU plug-in (rankgen_jax_cpu) enabled with its XLA flags, as `rankgen-jax-cpu` enables it, so the model
# paths run through its kernels; they run wherever they build, also on CPUs where they are not used by default.
# Its malloc setting is left out: it acts only at a process's start, and the PyTorch processes tests start
# run as PyTorch users run them.
os.environ.setdefault("RANKGEN_FUSED_KERNELS", "1")
from rankgen_jax_cpu.launch import environment  # noqa: E402

os.environ.update({k: v for k, v in environment(os.environ).items() if k != "GLIBC_TUNABLES"})
from rankgen_jax.runtime.process import configure_xla_flags  # noqa: E402

TEST_DEVICES = 8
configure_xla_flags(host_device_count=TEST_DEVICES)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# A real T5X checkpoint, kept in the repository with its provenance (tests/fixtures/README.md).
T5X_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "t5x_de_t5_tiny.checkpoint_1000"


@pytest.fixture(scope="session")
def spiece_model(tmp_path_factory) -> str:
    """A 1000-piece SentencePiece model trained on the bundled corpus (T5 special ids)."""
    from rankgen_jax.data.vocab import corpus_lines, train_vocab

    out = tmp_path_factory.mktemp("vocab") / "spiece.model"
    return train_vocab(corpus_lines(max_lines=20000), out, vocab_size=1000)


@pytest.fixture(autouse=True)
def _no_gin_bindings_leak():
    """Every test starts and ends with an empty gin config (bindings are process-global)."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run tiny torch models on one thread: on a busy box, intra-op threads make each op much slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a backend with fewer than TEST_DEVICES devices (one GPU), a sharding test's mesh error is a skip.

    On CPU the 8 devices above always exist, so this never fires there.
    """
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.outcome != "failed":
        return
    from rankgen_jax.errors import RankgenError

    if call.excinfo.errisinstance(RankgenError) and "available devices" in str(call.excinfo.value):
        import jax

        if jax.device_count() < TEST_DEVICES:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0,
                               f"Skipped: needs {TEST_DEVICES} devices, the {jax.default_backend()} backend has "
                               f"{jax.device_count()} ({call.excinfo.value})")
