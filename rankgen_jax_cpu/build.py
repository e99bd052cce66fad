"""The C++ kernels for XLA:CPU (`cpu_kernels.cc`): compiled on first use, cached, registered with the XLA FFI.

The library is compiled with the system C++ compiler (`$CXX`, else g++), for
this machine's instruction set, into a cache folder keyed by the source, the
flags, jaxlib's version and the CPU. Where no compiler works, or
`RANKGEN_FUSED_KERNELS=0`, `available()` is False and callers use XLA's
implementations: one warning says why, and nothing else changes.

They are used by default only where their speed has been measured against XLA's:
x86 CPUs with AVX2 or AVX-512 (8- or 16-float vectors). Elsewhere (SSE-only x86,
ARM) they build and pass the tests, but their speed is unknown, so XLA's
implementations run unless `RANKGEN_FUSED_KERNELS=1` asks for the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jaxlib

SOURCE = Path(__file__).with_name("cpu_kernels.cc")
CXX_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared")
# FFI target name -> exported handler symbol.
TARGETS = {
    "rankgen_attention_forward": "RankgenAttentionForward",
    "rankgen_attention_backward": "RankgenAttentionBackward",
    "rankgen_gated_gelu_forward": "RankgenGatedGeluForward",
    "rankgen_gated_gelu_backward": "RankgenGatedGeluBackward",
    "rankgen_rms_norm_forward": "RankgenRmsNormForward",
    "rankgen_rms_norm_backward": "RankgenRmsNormBackward",
    "rankgen_weight_gradient": "RankgenWeightGradient",
    "rankgen_matmul": "RankgenMatmul",
    "rankgen_matmul_transposed": "RankgenMatmulTransposed",
    "rankgen_gated_gelu_dense": "RankgenGatedGeluDense",
    "rankgen_gated_gelu_dense_backward": "RankgenGatedGeluDenseBackward",
}


def _cpu_signature() -> str:
    """Model name and feature flags: -march=native code must not run on another CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def cache_dir() -> Path:
    """Where compiled kernels are kept (`RANKGEN_KERNEL_CACHE`, else ~/.cache/rankgen_jax/kernels)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rankgen_jax" / "kernels"
    return Path(os.environ.get("RANKGEN_KERNEL_CACHE", default))


def _compile() -> Path:
    """The kernel library, compiled now unless the cache holds this exact build; raises on failure."""
    compiler = os.environ.get("CXX", "g++")
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), compiler, *CXX_FLAGS, jaxlib.__version__, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    library = cache_dir() / f"cpu_kernels-{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        built = Path(tmp) / library.name
        command = [compiler, *CXX_FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", str(built)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
        os.replace(built, library)  # atomic: concurrent processes see all of it or nothing
    return library


# Vector widths (floats) at which the kernels were timed against XLA:CPU and won: AVX2, AVX-512.
MEASURED_VECTOR_LANES = (8, 16)


def _load():
    """The compiled kernel library, loaded (compiled first unless cached); raises OSError / RuntimeError."""
    return ctypes.cdll.LoadLibrary(str(_compile()))


@functools.cache
def available() -> bool:
    """Whether the kernels are compiled, registered with XLA:CPU and to be used here (compiles them once)."""
    setting = os.environ.get("RANKGEN_FUSED_KERNELS", "auto")
    if setting == "0":
        return False
    try:
        library = _load()
        lanes = library.RankgenVectorLanes()
        if setting != "1" and lanes not in MEASURED_VECTOR_LANES:
            print(f"warning: fused CPU kernels not used: built for {lanes}-float vectors (no AVX2 / AVX-512), "
                  "where their speed against XLA's implementations has not been measured; "
                  "RANKGEN_FUSED_KERNELS=1 uses them anyway", file=sys.stderr)
            return False
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        print(f"warning: fused CPU kernels unavailable, using XLA's implementations: {err}", file=sys.stderr)
        return False
    return True


def vector_lanes() -> int:
    """Floats per vector the compiled kernels use: 16 with AVX-512, 8 with AVX2, 4 otherwise."""
    return _load().RankgenVectorLanes()


def require() -> None:
    """Raise unless the kernels are available (callers check `available()` first)."""
    if not available():
        raise RuntimeError("the fused CPU kernels are not available here (see the warning above)")
