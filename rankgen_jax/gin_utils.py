"""Gin parsing with clear errors: missing files and unknown bindings fail before anything compiles."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import gin

from rankgen_jax.errors import RankgenError
from rankgen_jax.vocab import REPO_ROOT

GIN_SEARCH_PATH = REPO_ROOT / "gin_configs"


SEQIO_NAMES = ("rankgen_task_options", "rankgen_data_paths", "rankgen_mixture_rates", "'seqio'", '"seqio"')


def register_configurables(with_seqio_tasks: bool = False) -> None:
    """Import every module that defines gin configurables, so bindings can be checked at parse time.

    The seqio task options live in tasks/, whose import brings TensorFlow
    (seconds): only when the config mentions them.
    """
    import rankgen_jax.configs  # noqa: F401
    import rankgen_jax.data.triples  # noqa: F401
    import rankgen_jax.job  # noqa: F401

    if with_seqio_tasks:
        import tasks.rankgen_tasks  # noqa: F401
    import rankgen_jax.optimizers  # noqa: F401
    import rankgen_jax.pipeline  # noqa: F401
    import rankgen_jax.trainer  # noqa: F401


def resolve_gin_file(name: str) -> str:
    """A gin file as given, or relative to the repo's gin_configs/ folder."""
    for candidate in (Path(name), GIN_SEARCH_PATH / name):
        if candidate.is_file():
            return str(candidate)
    raise RankgenError(f"gin file {name!r} not found (looked in the current folder and {GIN_SEARCH_PATH})")


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parse gin files and `Name.param=value` bindings; a typo is a one-line RankgenError."""
    paths = [resolve_gin_file(f) for f in files]
    text = "\n".join([Path(p).read_text(encoding="utf-8") for p in paths] + list(bindings))
    register_configurables(with_seqio_tasks=any(name in text for name in SEQIO_NAMES))
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_SEARCH_PATH))
    # gin logs an error for every search-path miss of an `include`, even when a later one hits.
    logging.disable(logging.ERROR)
    try:
        gin.parse_config_files_and_bindings(paths, list(bindings), finalize_config=False)
    except (ValueError, KeyError, TypeError, SyntaxError, IOError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"gin config: {first_line}") from None
    finally:
        logging.disable(logging.NOTSET)
