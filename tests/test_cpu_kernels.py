"""The C++ kernels: build (cache, compiler failure); gated GELU, RMS norm and the weight gradient against float64 NumPy and XLA."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax_cpu import build


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


def test_vectors_are_as_wide_as_the_machine_registers():
    # 16-lane vectors on an AVX2 machine compiled and gave the right numbers, 13-20x slower
    # than XLA: the register blocks did not fit in the 16 registers (docs/performance/cpu-kernels.md,
    # 'Vector width that follows the instruction set').
    kernels_or_skip()
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), None) \
        if os.path.exists("/proc/cpuinfo") else None
    if not flags:
        pytest.skip("no x86 feature flags in /proc/cpuinfo")
    expected = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    assert build.vector_lanes() == expected


def test_kernels_are_used_by_default_only_at_measured_vector_widths(monkeypatch, capsys):
    """4-float builds (SSE-only x86, ARM) pass the tests but were never timed: XLA's code runs unless forced."""
    kernels_or_skip()
    real = build._load()

    class FourLaneLibrary:
        def RankgenVectorLanes(self):  # noqa: N802 (the exported C name)
            return 4

        def __getattr__(self, symbol):
            return getattr(real, symbol)

    monkeypatch.setattr(build, "_load", FourLaneLibrary)
    registered = []
    monkeypatch.setattr(build.jax.ffi, "register_ffi_target", lambda target, *args, **kwargs: registered.append(target))
    monkeypatch.delenv("RANKGEN_FUSED_KERNELS", raising=False)
    assert build.available.__wrapped__() is False and registered == []
    assert "built for 4-float vectors" in capsys.readouterr().err
    monkeypatch.setenv("RANKGEN_FUSED_KERNELS", "1")
    assert build.available.__wrapped__() is True and sorted(registered) == sorted(build.TARGETS)
    monkeypatch.setenv("RANKGEN_FUSED_KERNELS", "0")
    assert build.available.__wrapped__() is False

    monkeypatch.setattr(build, "_load", lambda: real)
    monkeypatch.delenv("RANKGEN_FUSED_KERNELS")
    registered.clear()
    assert build.available.__wrapped__() is (build.vector_lanes() in build.MEASURED_VECTOR_LANES)


@pytest.mark.parametrize("shape", [(7, 5), (33, 48), (3, 70_000)])  # scalar tails; several chunks
def test_gated_gelu_kernel_equals_jax(shape):
    kernels_or_skip()
    from rankgen_jax_cpu.gated_gelu import fused_gated_gelu

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


@pytest.mark.parametrize("shape", [(7, 5), (33, 48), (4, 300, 128), (3, 70_000)])  # tails; 3-D; several ranges
def test_rms_norm_kernel_equals_numpy_and_xla(shape):
    kernels_or_skip()
    from rankgen_jax_cpu.rms_norm import fused_rms_norm

    rng = np.random.default_rng(1)
    x = (rng.normal(size=shape) * 3).astype(np.float32)
    x[..., 0, :] = 0.0  # an all-zero row: eps alone keeps it finite
    scale = rng.normal(size=shape[-1:]).astype(np.float32)
    cotangent = rng.normal(size=shape).astype(np.float32)
    eps = 1e-6

    # Independent reference: float64 NumPy with the analytic gradients.
    x64, s64, g64 = x.astype(np.float64), scale.astype(np.float64), cotangent.astype(np.float64)
    r = 1 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + eps)
    expected = x64 * r * s64
    gs = g64 * s64
    expected_dx = r * gs - x64 * r**3 * np.sum(gs * x64, axis=-1, keepdims=True) / shape[-1]
    expected_dscale = np.sum((g64 * x64 * r).reshape(-1, shape[-1]), axis=0)

    out = fused_rms_norm(x, scale, eps)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6, rtol=2e-6)
    loss = lambda x, s: jnp.sum(fused_rms_norm(x, s, eps) * cotangent)  # noqa: E731
    d_x, d_scale = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, scale)
    np.testing.assert_allclose(np.asarray(d_x), expected_dx, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(d_scale), expected_dscale, atol=1e-4 * np.abs(expected_dscale).max(), rtol=1e-4)

    def xla_norm(x, s):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * s

    xla_grads = jax.jit(jax.grad(lambda x, s: jnp.sum(xla_norm(x, s) * cotangent), argnums=(0, 1)))(x, scale)
    for g, g_xla in zip((d_x, d_scale), xla_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_xla), atol=1e-4 * float(np.abs(g_xla).max()), rtol=1e-4)


@pytest.mark.parametrize("tokens,m,n", [(7, 5, 3), (300, 37, 70), (5000, 130, 300), (2500, 200, 17)])
def test_weight_gradient_kernel_equals_numpy(tokens, m, n):
    """x^T d_y: odd widths (column tails), rows not a multiple of the 6-row kernel, several K blocks and splits."""
    kernels_or_skip()
    from rankgen_jax_cpu.dense import fused_dense, weight_gradient

    rng = np.random.default_rng(2)
    x = rng.normal(size=(tokens, m)).astype(np.float32)
    d_y = rng.normal(size=(tokens, n)).astype(np.float32)
    expected = x.astype(np.float64).T @ d_y.astype(np.float64)
    got = np.asarray(jax.jit(weight_gradient)(x, d_y))
    np.testing.assert_allclose(got, expected, atol=2e-6 * tokens**0.5 * 4, rtol=1e-5)
    assert np.array_equal(got, np.asarray(jax.jit(weight_gradient)(x, d_y)))  # same bits every call
    assert np.array_equal(np.asarray(weight_gradient(x[:0], d_y[:0])), np.zeros((m, n), np.float32))  # no tokens

    # Through the dense layer's VJP, with a leading batch axis: d_x and d_w by the kernels.
    w = rng.normal(size=(m, n)).astype(np.float32)
    x3, d_y3 = x.reshape(1, tokens, m), d_y.reshape(1, tokens, n)
    d_x, d_w = jax.jit(jax.grad(lambda x, w: jnp.sum(fused_dense(x, w) * d_y3), argnums=(0, 1)))(x3, w)
    np.testing.assert_allclose(np.asarray(d_w), expected, atol=2e-6 * tokens**0.5 * 4, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(d_x)[0], d_y.astype(np.float64) @ w.T.astype(np.float64), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "tokens,k,n",
    # row tails (not a multiple of the 96-row task or the 6-row kernel), column tails (not a
    # multiple of 64), K not a multiple of the 128-deep panels, several tasks, K = 0
    [(7, 5, 3), (300, 37, 70), (1000, 300, 130), (97, 130, 64), (5, 0, 4)],
)
def test_matmul_kernel_equals_numpy(tokens, k, n):
    """x w and d_y w^T (the dense layer's forward product and d_x) against float64 NumPy."""
    kernels_or_skip()
    from rankgen_jax_cpu.dense import matmul

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, tokens, k)).astype(np.float32)
    w = rng.normal(size=(k, n)).astype(np.float32)
    d_y = rng.normal(size=(1, tokens, n)).astype(np.float32)
    tol = 2e-6 * max(k, n) ** 0.5 * 4
    forward = jax.jit(matmul)
    got = np.asarray(forward(x, w))
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, atol=tol, rtol=1e-5)
    assert np.array_equal(got, np.asarray(forward(x, w)))  # same bits every call
    got_t = np.asarray(jax.jit(lambda a, b: matmul(a, b, transposed=True))(d_y, w))
    np.testing.assert_allclose(got_t, d_y.astype(np.float64) @ w.T.astype(np.float64), atol=tol, rtol=1e-5)


def test_dense_layer_with_a_large_weight_takes_its_gradient_from_xla():
    """Above 512 x 512 the weight gradient is XLA's, d_x still the kernel's: both equal float64 NumPy."""
    kernels_or_skip()
    from rankgen_jax_cpu.dense import fused_dense, kernel_gradient_applies

    rng = np.random.default_rng(4)
    tokens, m, n = 200, 600, 520
    assert not kernel_gradient_applies(m, n)
    x = rng.normal(size=(tokens, m)).astype(np.float32)
    w = rng.normal(size=(m, n)).astype(np.float32)
    d_y = rng.normal(size=(tokens, n)).astype(np.float32)
    y, vjp = jax.vjp(fused_dense, x, w)
    d_x, d_w = vjp(d_y)
    np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) @ w, atol=2e-4, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(d_x), d_y.astype(np.float64) @ w.T.astype(np.float64), atol=2e-4, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(d_w), x.T.astype(np.float64) @ d_y, atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "tokens,d,f",
    # row tails past the 96-row tasks and the 6-row kernel, F not a multiple of 64 (the edge
    # columns), K not a multiple of the 128-deep panels, several tasks; D = 0
    [(7, 5, 3), (200, 130, 70), (97, 64, 128), (4, 0, 6)],
)
def test_gated_gelu_mlp_kernel_equals_numpy_and_the_separate_kernels(tokens, d, f):
    """(gelu(x w0) * (x w1)) wo and its four gradients: float64 NumPy, and the same bits as the separate kernels."""
    kernels_or_skip()
    from rankgen_jax_cpu.dense import fused_dense
    from rankgen_jax_cpu.gated_gelu import fused_gated_gelu, fused_gated_gelu_mlp

    rng = np.random.default_rng(5)
    x = rng.normal(size=(tokens, d)).astype(np.float32)
    w0, w1 = (rng.normal(size=(d, f)).astype(np.float32) / max(d, 1) ** 0.5 for _ in range(2))
    wo = rng.normal(size=(f, 9)).astype(np.float32) / f**0.5
    d_y = rng.normal(size=(tokens, 9)).astype(np.float32)

    # float64 reference with the analytic GELU derivative
    x64, w0_64, w1_64, wo_64, d_y64 = (a.astype(np.float64) for a in (x, w0, w1, wo, d_y))
    gate, linear = x64 @ w0_64, x64 @ w1_64
    t = np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3))
    gelu = 0.5 * gate * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * gate * (1 - t**2) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * gate**2)
    h = gelu * linear
    d_h = d_y64 @ wo_64.T
    d_gate, d_linear = d_h * linear * slope, d_h * gelu
    expected = (h @ wo_64, d_gate @ w0_64.T + d_linear @ w1_64.T, x64.T @ d_gate, x64.T @ d_linear, h.T @ d_y64)

    y, vjp = jax.vjp(jax.jit(fused_gated_gelu_mlp), x, w0, w1, wo)
    got = (y, *vjp(d_y))
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(np.asarray(g), e, atol=1e-5, rtol=1e-4)

    def unfused(x, w0, w1, wo):
        return fused_dense(fused_gated_gelu(fused_dense(x, w0), fused_dense(x, w1)), wo)

    y_sep, vjp_sep = jax.vjp(jax.jit(unfused), x, w0, w1, wo)
    for g, s in zip(got, (y_sep, *vjp_sep(d_y))):
        assert np.array_equal(np.asarray(g), np.asarray(s))


# --- the plug-in: how the dispatcher finds it, and the launcher's process settings ---------------------------


def test_the_dispatcher_loads_the_plugin_named_in_the_environment(monkeypatch):
    from rankgen_jax.errors import RankgenError
    from rankgen_jax.ops import dispatch

    kernels_or_skip()
    monkeypatch.setattr(dispatch, "_active", [dispatch._UNSET])
    monkeypatch.setenv(dispatch.PLUGIN_VARIABLE, "rankgen_jax_cpu")
    kernels = dispatch.active_kernels()
    assert kernels.name == "cpu_kernel" and dispatch.active_kernels() is kernels  # loaded once
    monkeypatch.setattr(dispatch, "_active", [dispatch._UNSET])  # again, its modules imported: still a plug-in
    assert dispatch.active_kernels().name == "cpu_kernel"
    x = jnp.ones((4, 8), jnp.float32)
    assert jax.jit(lambda x: jnp.zeros(()) + kernels.applies(x, jnp.float32))(x) == 1
    assert not kernels.applies(x.astype(jnp.bfloat16), jnp.float32) and not kernels.applies(x, jnp.bfloat16)

    for unset in ("", "  "):  # not named: XLA only
        monkeypatch.setattr(dispatch, "_active", [dispatch._UNSET])
        monkeypatch.setenv(dispatch.PLUGIN_VARIABLE, unset)
        assert dispatch.active_kernels() is None
    monkeypatch.setattr(dispatch, "_active", [dispatch._UNSET])
    monkeypatch.setenv(dispatch.PLUGIN_VARIABLE, "no_such_plugin_module")
    with pytest.raises(RankgenError, match="RANKGEN_KERNEL_PLUGIN='no_such_plugin_module'.*cannot be imported"):
        dispatch.active_kernels()
    monkeypatch.setenv(dispatch.PLUGIN_VARIABLE, "json")
    with pytest.raises(RankgenError, match="no kernel_set\\(\\) function"):
        dispatch.active_kernels()


def test_use_kernels_overrides_the_environment(monkeypatch):
    from rankgen_jax.ops import dispatch

    monkeypatch.setattr(dispatch, "_active", [dispatch._UNSET])
    monkeypatch.setenv(dispatch.PLUGIN_VARIABLE, "no_such_plugin_module")
    dispatch.use_kernels(None)
    assert dispatch.active_kernels() is None
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    np.testing.assert_allclose(dispatch.dense(x, jnp.eye(4), jnp.float32), x)  # XLA's dot


def test_launcher_environment_adds_each_setting_once(monkeypatch):
    from rankgen_jax_cpu import launch

    monkeypatch.setattr(launch.sys, "platform", "linux")
    monkeypatch.setattr(launch.platform, "libc_ver", lambda: ("glibc", "2.36"))
    env = launch.environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                              "GLIBC_TUNABLES": "glibc.pthread.rseq=0", "HOME": "/h"})
    assert env == {"HOME": "/h", "RANKGEN_KERNEL_PLUGIN": "rankgen_jax_cpu",
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_cpu_experimental_ynn_fusion_type=",
                   "GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.hugetlb=1"}
    assert launch.environment(env) == env  # applied twice: nothing added twice
    # A user's own choices are kept: another plug-in, another YNN setting, no malloc tuning off glibc.
    mine = {"RANKGEN_KERNEL_PLUGIN": "mine", "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
    monkeypatch.setattr(launch.platform, "libc_ver", lambda: ("", ""))
    assert launch.environment(mine) == mine


def test_launcher_runs_the_command_line_under_that_environment(monkeypatch):
    from rankgen_jax_cpu import launch

    calls = []
    monkeypatch.setattr(launch.os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    monkeypatch.setattr(launch.sys, "argv", ["rankgen-jax-cpu", "train", "--workdir=x"])
    launch.main()
    [(exe, argv, env)] = calls
    assert argv == [launch.sys.executable, "-P", "-m", "rankgen_jax.cli.main", "train", "--workdir=x"]
    assert env == launch.environment(launch.os.environ)


def test_the_launcher_starts_without_jax():
    """It re-executes at once: importing jax or the command line first would cost a second start-up."""
    import subprocess
    import sys

    code = "import sys, rankgen_jax_cpu.launch; print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'rankgen_jax')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
