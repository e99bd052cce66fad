"""Process-level settings that must be made before JAX starts its backends."""

from __future__ import annotations

import os
import sys

# YNNPACK fusions slow XLA:CPU training steps of these models (DESIGN.md s7);
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
