"""Runs configured with gin: parse a config that may bind any experiment's configurables, and train from one.

The library parses gin (train/gin_parsing.py) knowing only its own
configurables; this module adds the experiments' and, when a config names
them, the seqio task options of tasks/ (which the library must not import).

Importing it starts no jax (parsing a config and training do), so the
`rankgen-jax` command can import it before it sets XLA's flags.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import gin

from rankgen_jax.train.gin_parsing import CONFIGURABLE_MODULES, parse_gin

# What `rankgen-jax train` (and a sweep grid) runs without gin files: the main job on MiniLM.
DEMO_GIN = "demo_minilm.gin"

EXPERIMENT_CONFIGURABLE_MODULES = (
    "rankgen_jax.experiments.demo",
    "rankgen_jax.experiments.pipeline",
    "rankgen_jax.experiments.cl_drd",
    "rankgen_jax.experiments.distillation_demo",
    "rankgen_jax.experiments.perspectives",
    "rankgen_jax.experiments.mpts",
    "rankgen_jax.experiments.negatives_claim",
    "rankgen_jax.experiments.generation_claim",
)
# The seqio task options; importing them brings TensorFlow (seconds), so only for a config that names them.
SEQIO_TASKS_MODULE = "tasks.rankgen_tasks"
SEQIO_NAMES = ("rankgen_task_options", "rankgen_data_paths", "rankgen_mixture_rates", "SeqioData")


def experiment_configurables(config_text: str) -> list[str]:
    """The modules that define the configurables a config of this text may bind (parse_gin's `configurables`)."""
    modules = [*CONFIGURABLE_MODULES, *EXPERIMENT_CONFIGURABLE_MODULES]
    if any(name in config_text for name in SEQIO_NAMES):
        modules.append(SEQIO_TASKS_MODULE)
    return modules


@contextlib.contextmanager
def gin_config(files: Sequence[str], bindings: Sequence[str]) -> Iterator[None]:
    """The gin files and bindings parsed for the block, and cleared after it.

    Bindings are process-global: a caller that runs one command after another
    in one process (tests, a sweep) must not carry one run's into the next.
    """
    parse_gin(files, bindings, experiment_configurables)
    try:
        yield
    finally:
        gin.clear_config()


def train_from_gin(gin_files: Sequence[str], bindings: Sequence[str], workdir: str, job: bool = False) -> dict:
    """Train (or resume) in workdir as the gin files and bindings configure; returns the results.

    job: the main job (experiments.demo.run_job: held-out suffix
    identification before and after training, plot, export), returning its
    results; otherwise train.loop.train, returning (and printing) its last
    train metrics. No gin files: the demo, DEMO_GIN, which always runs as the
    main job.
    """
    # Imported here, not at the top: they import jax, which must start after the CLI sets XLA's flags.
    from rankgen_jax.experiments.demo import run_job
    from rankgen_jax.train.loop import train

    if not gin_files:
        gin_files, job = [DEMO_GIN], True
    with gin_config(gin_files, bindings):
        if job:
            return run_job(workdir)
        metrics = train(workdir)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
    print(f"done: {shown}; outputs in {workdir}")
    return metrics
