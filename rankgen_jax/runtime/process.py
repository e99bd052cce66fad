"""Process-level settings that must be made before JAX starts its backends."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path

from rankgen_jax.errors import RankgenError

# jax is imported inside the functions only: this module sets what must be in place before jax
# starts (XLA flags, glibc's malloc, the multi-host job), and is imported before jax is.

# YNNPACK fusions slow XLA:CPU training steps of these models (docs/design/environment.md, 'CPU performance');
# the flag is harmless on TPU and GPU.
CPU_XLA_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)


def configure_xla_flags(host_device_count: int | None = None) -> None:
    """Add our XLA flags (and optionally fake host devices) to XLA_FLAGS.

    Has an effect only before jax initialises a backend; a warning says so
    otherwise, rather than silently running with other settings.
    """
    if "jax" in sys.modules:
        import jax

        if jax._src.xla_bridge.backends_are_initialized():  # noqa: SLF001 - no public API for this
            if host_device_count is not None and jax.device_count() < host_device_count:
                print(
                    f"warning: jax already started with {jax.device_count()} devices; "
                    f"cannot add {host_device_count} host devices now",
                    file=sys.stderr,
                )
            return
    flags = os.environ.get("XLA_FLAGS", "").split()
    for flag in CPU_XLA_FLAGS:
        if not any(f.startswith(flag.split("=")[0]) for f in flags):
            flags.append(flag)
    if host_device_count is not None and not any(f.startswith("--xla_force_host_platform_device_count") for f in flags):
        flags.append(f"--xla_force_host_platform_device_count={host_device_count}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


# glibc malloc hands XLA:CPU's large per-step buffers out as fresh mmaps and unmaps them
# when freed, so every step faults its working set in again (tiny T5 step, batch 32:
# ~180k page faults and 0.3 s of kernel time per 0.6 s step). Transparent huge pages for
# malloc cut the faults ~10x; measured on `python -m benchmarks.bench` (docs/performance/cpu-step.md,
# 'malloc on huge pages'): the tiny step 0.63 -> 0.52 s, the small step 5.48 -> 4.68 s. That
# is what the re-exec buys, on CPU only (accelerator steps do not run on malloc'd buffers).
# glibc reads tunables only at process start, hence the re-exec.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"


def reexec_with_malloc_tunables(module: str, args: list[str], source_root: str | os.PathLike | None = None) -> None:
    """Re-run this process as `python -P -m module args` with MALLOC_TUNABLES, once; no-op when not applicable.

    -P (safe path): plain `-m` puts the working folder first on sys.path, so a
    `tqdm.py` or `numpy.py` in the folder a user runs from would be imported
    and run; with -P the child's sys.path is that of the console script.
    Skipped off glibc Linux, when GLIBC_TUNABLES already sets malloc.hugetlb,
    when RANKGEN_MALLOC_TUNING=0, or when the package is not installed (run
    from a source tree through the working folder, which -P would leave out).
    source_root: the folder that holds `module`'s top package when the
    installed distribution does not (the repository's benchmarks/): put on
    the child's PYTHONPATH, since -P leaves the working folder out.
    """
    current = os.environ.get("GLIBC_TUNABLES", "")
    if (sys.platform != "linux" or platform.libc_ver()[0] != "glibc" or "glibc.malloc.hugetlb" in current
            or os.environ.get("RANKGEN_MALLOC_TUNING", "1") == "0" or not _installed()):
        return
    os.environ["GLIBC_TUNABLES"] = f"{current}:{MALLOC_TUNABLES}" if current else MALLOC_TUNABLES
    if source_root is not None:
        paths = [str(Path(source_root).resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", module, *args])


def _installed() -> bool:
    """Whether the rankgen-jax distribution is installed (regular or editable), so that -P still finds it."""
    try:
        importlib.metadata.distribution("rankgen-jax")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# Environment variables that mark one process of a multi-host job: Cloud TPU VMs
# list every worker in TPU_WORKER_HOSTNAMES; other launchers set the coordinator;
# tpu_scripts/tpu.py launch sets RANKGEN_MULTI_HOST=1 on multi-host slices.
_MULTI_HOST_MARKERS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "RANKGEN_MULTI_HOST")


def is_multi_host_environment(environ=None) -> bool:
    """True on a multi-host TPU slice (several TPU worker hostnames) or under an explicit coordinator."""
    env = os.environ if environ is None else environ
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1 or any(env.get(k) for k in _MULTI_HOST_MARKERS)


def initialize_distributed(mode: str = "auto", environ=None) -> bool:
    """Join the multi-host job (jax.distributed.initialize) before any backend starts; True if joined.

    mode: "auto" joins when the environment says this is one host of many,
    "on" always joins, "off" never does. jax reads the coordinator, process
    count and process id from the Cloud TPU metadata (or JAX_COORDINATOR_ADDRESS
    and friends elsewhere); every host then sees all devices of the slice.
    """
    if mode not in ("auto", "on", "off"):
        raise RankgenError(f"TrainerConfig.distributed={mode!r}: expected 'auto', 'on' or 'off'")
    if mode == "off" or (mode == "auto" and not is_multi_host_environment(environ)):
        return False
    import jax

    if jax.distributed.is_initialized():
        return True
    if jax._src.xla_bridge.backends_are_initialized():  # noqa: SLF001 - no public API for this
        raise RankgenError("jax.distributed.initialize must run before jax starts its backends: "
                           "call rankgen_jax.runtime.process.initialize_distributed first")
    jax.distributed.initialize()
    print(f"joined the multi-host job as process {jax.process_index()} of {jax.process_count()}", file=sys.stderr)
    return True
