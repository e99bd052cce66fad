"""The `rankgen-jax` console script: the malloc re-exec first, then the command line.

The re-exec (runtime/process.py) runs before the command line's modules are
imported, so the process it replaces has imported almost nothing: the re-exec
costs one interpreter start, not two imports of every subcommand's modules.
"""

from __future__ import annotations

import sys

from rankgen_jax.runtime.process import reexec_with_malloc_tunables


def console_main() -> int:
    """`rankgen-jax`: main() in a process with the malloc settings XLA:CPU runs best with."""
    reexec_with_malloc_tunables("rankgen_jax.cli.main", sys.argv[1:])
    from rankgen_jax.cli.main import main

    return main()
