"""`rankgen-jax-cpu`: `rankgen-jax` with the CPU plug-in enabled and the process settings XLA:CPU runs best with.

Three settings, each measured on `make bench` (docs/performance/cpu-step.md):
- RANKGEN_KERNEL_PLUGIN=rankgen_jax_cpu: the C++ kernels;
- GLIBC_TUNABLES=glibc.malloc.hugetlb=1: glibc malloc hands XLA:CPU's large
  per-step buffers out as fresh mmaps and unmaps them when freed, so every step
  faults its working set in again (tiny T5 step, batch 32: ~180k page faults,
  0.3 s of kernel time per 0.6 s step); transparent huge pages cut the faults
  ~10x (the tiny step 0.63 -> 0.52 s, the small step 5.48 -> 4.68 s);
- XLA_FLAGS += --xla_cpu_experimental_ynn_fusion_type=: YNNPACK fusions slow
  XLA:CPU training steps of these models.
glibc reads its tunables only at process start, so this re-executes: one
interpreter start (this module imports neither jax nor the CLI).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

PLUGIN_SETTING = ("RANKGEN_KERNEL_PLUGIN", "rankgen_jax_cpu")
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"
XLA_CPU_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with the plug-in enabled and its malloc and XLA settings added (settings already in `base` kept)."""
    env = dict(base)
    env.setdefault(*PLUGIN_SETTING)
    flags = env.get("XLA_FLAGS", "").split()
    flags += [flag for flag in XLA_CPU_FLAGS if not any(f.split("=")[0] == flag.split("=")[0] for f in flags)]
    env["XLA_FLAGS"] = " ".join(flags)
    tunables = env.get("GLIBC_TUNABLES", "")
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc" and "glibc.malloc.hugetlb" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_TUNABLES}" if tunables else MALLOC_TUNABLES
    return env


def main() -> None:
    """Replace this process with `python -P -m rankgen_jax.cli.main ARGS` under `environment`.

    -P (safe path) keeps the working folder off sys.path, as the console script
    does: a `numpy.py` in the folder a user runs from is never imported.
    """
    os.execve(sys.executable, [sys.executable, "-P", "-m", "rankgen_jax.cli.main", *sys.argv[1:]],
              environment(os.environ))
