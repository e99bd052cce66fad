"""The C++ kernels' build (cache, compiler failure) and the gated GELU kernel against jax.nn.gelu."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.kernels import build


def kernels_or_skip():
    """Skip where no C++ compiler exists; a compiler that fails to build the kernels is a failure."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler: the fused kernels cannot be built (XLA's implementations are used)")
    assert build.available(), "a compiler is present but the fused kernels did not build"


def test_build_is_cached_and_a_broken_compiler_falls_back(tmp_path, monkeypatch, capsys):
    kernels_or_skip()
    monkeypatch.setenv("RANKGEN_KERNEL_CACHE", str(tmp_path / "cache"))
    library = build._compile()
    built_at = library.stat().st_mtime_ns
    assert build._compile() == library and library.stat().st_mtime_ns == built_at

    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails: a new cache key, a failed build
    assert build.available.__wrapped__() is False
    assert "fused CPU kernels unavailable, using XLA's implementations" in capsys.readouterr().err


@pytest.mark.parametrize("shape", [(7, 5), (33, 48), (3, 70_000)])  # scalar tails; several chunks
def test_gated_gelu_kernel_equals_jax(shape):
    kernels_or_skip()
    from rankgen_jax.kernels.gated_gelu import fused_gated_gelu

    rng = np.random.default_rng(0)
    gate = (rng.normal(size=shape) * 3).astype(np.float32)
    gate.flat[:4] = [-30.0, 30.0, 0.0, -1e-6]  # saturated tanh, zero, tiny
    linear = rng.normal(size=shape).astype(np.float32)
    cotangent = rng.normal(size=shape).astype(np.float32)

    # Independent reference: float64 NumPy, tanh form, with its analytic derivative.
    x = gate.astype(np.float64)
    t = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))
    gelu = 0.5 * x * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x**2)
    expected_grads = (cotangent * linear * slope, cotangent * gelu)

    out = fused_gated_gelu(gate, linear)
    np.testing.assert_allclose(np.asarray(out), gelu * linear, atol=1e-6, rtol=1e-6)
    grads = jax.jit(jax.grad(lambda g, l: jnp.sum(fused_gated_gelu(g, l) * cotangent), argnums=(0, 1)))(gate, linear)
    for g, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(g), expected, atol=1e-6, rtol=1e-5)
    # XLA's tanh saturates to exactly -1 a little early (its gradients are 0 where the exact ones
    # are ~1e-5), so against XLA the agreement is looser than against float64.
    xla_grads = jax.jit(jax.grad(lambda g, l: jnp.sum(jax.nn.gelu(g, approximate=True) * l * cotangent), argnums=(0, 1)))(gate, linear)
    for g, g_xla in zip(grads, xla_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_xla), atol=5e-5, rtol=1e-4)
