"""rankgen_jax's CPU plug-in: C++ kernels for XLA:CPU, and the process settings CPU training runs best with.

Nothing in `rankgen_jax` imports this package. It runs when enabled:
`RANKGEN_KERNEL_PLUGIN=rankgen_jax_cpu` makes `rankgen_jax.ops.dispatch` load
`kernel_set()` on first use, and `rankgen-jax-cpu` (`launch.py`) runs
`rankgen-jax` with that and the malloc and XLA settings. The Makefile's jobs
and `make bench` enable it; docs/performance/cpu-kernels.md has what each
kernel buys.
"""

from __future__ import annotations


def kernel_set():
    """The kernels as a `rankgen_jax.ops.dispatch.KernelSet`, or None where they cannot or should not run here."""
    # Imported here: the launcher (launch.py) imports this package and must not pay for jax. The module is not
    # called kernel_set: importing it would make the package's `kernel_set` attribute that module.
    from rankgen_jax_cpu.registration import kernel_set as build_kernel_set

    return build_kernel_set()
