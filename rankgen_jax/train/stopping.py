"""When a run stops early: SIGTERM, the wall-clock budget, and the vote that makes every host stop together.

Why the hosts vote: SIGTERM and the wall-clock budget are noticed by each host on its
own, at different steps. A host that saved and left the loop after step N while the
others ran step N+1 would leave every collective of step N+1 (and Orbax's save
barriers) waiting forever. So every host acts on the same flags: the max over all
processes of each host's (sigterm, out_of_time). jax's preemption sync point
(multihost_utils.reached_preemption_sync_point) would cover SIGTERM alone, through
its own signal handler; one vote covers both flags and our handler.
"""

from __future__ import annotations

import functools
import signal
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


class Preemption:
    """SIGTERM sets a flag; the loop saves and exits cleanly at the next step boundary."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


@functools.lru_cache(maxsize=None)
def _vote_functions(mesh) -> tuple[NamedSharding, Callable]:
    """The sharding of the vote (one row per device) and the jitted max over rows, replicated."""
    rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    return rows, jax.jit(functools.partial(jnp.max, axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))


def max_over_processes(flags: np.ndarray, mesh) -> jax.Array:
    """Elementwise max of every process's flags, dispatched without waiting; read it with np.asarray."""
    rows, reduce_max = _vote_functions(mesh)
    # Each device holds one row, its own host's flags, so the max over rows spans all hosts.
    votes = jax.make_array_from_callback((mesh.size,) + flags.shape, rows, lambda index: flags[None])
    return reduce_max(votes)


class StopVote:
    """The stop flags all hosts act on at a step boundary.

    One process: the local flags, at once and without any device sync. Several: each boundary dispatches a tiny
    max-reduction of this boundary's local flags over all devices and returns
    the previous boundary's result. Reading the previous vote waits only for
    the previous step, so dispatch stays a step ahead of the device; and as
    every host reads the same vote at the same boundary, all of them stop
    after the same step (one step after the first host raised a flag), save
    that same checkpoint, and leave the loop together.
    """

    def __init__(self, mesh, processes: int | None = None):
        self.voting = (jax.process_count() if processes is None else processes) > 1
        self._mesh = mesh
        self._pending: jax.Array | None = None

    def __call__(self, local: np.ndarray) -> np.ndarray:
        if not self.voting:
            return local
        previous, self._pending = self._pending, max_over_processes(local, self._mesh)
        return np.zeros_like(local) if previous is None else np.asarray(previous)
