"""Process-level settings that must be made before JAX starts its backends."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from rankgen_jax.errors import RankgenError

# jax is imported inside the functions only: this module sets what must be in place before jax
# starts (fake host devices, the multi-host job), and is imported before jax is.


def configure_xla_flags(host_device_count: int) -> None:
    """Add `host_device_count` fake host devices to XLA_FLAGS (sharding tests, AOT compiles on one host).

    Has an effect only before jax initialises a backend; a warning says so
    otherwise, rather than silently running with other settings.
    """
    if "jax" in sys.modules:
        import jax

        if jax._src.xla_bridge.backends_are_initialized():  # noqa: SLF001 - no public API for this
            if jax.device_count() < host_device_count:
                print(
                    f"warning: jax already started with {jax.device_count()} devices; "
                    f"cannot add {host_device_count} host devices now",
                    file=sys.stderr,
                )
            return
    flags = os.environ.get("XLA_FLAGS", "").split()
    if not any(f.startswith("--xla_force_host_platform_device_count") for f in flags):
        flags.append(f"--xla_force_host_platform_device_count={host_device_count}")
    os.environ["XLA_FLAGS"] = " ".join(flags)


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


@contextlib.contextmanager
def native_stderr_captured():
    """The process's stderr (file descriptor 2, where C++ libraries write) into a temporary file for the block: the
    start-up lines TensorFlow's C++ prints on import (CUDA probes, oneDNN notes) stay off the console. Shown after
    all when the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
