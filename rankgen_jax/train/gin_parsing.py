"""Gin parsing with clear errors: missing files and unknown bindings fail before anything compiles."""

from __future__ import annotations

import io
import logging
import re
import tokenize
from pathlib import Path
from typing import Sequence

import gin

from rankgen_jax.errors import RankgenError
from rankgen_jax.data.vocab import REPO_ROOT

GIN_SEARCH_PATH = REPO_ROOT / "gin_configs"


SEQIO_NAMES = ("rankgen_task_options", "rankgen_data_paths", "rankgen_mixture_rates", "'seqio'", '"seqio"')


def register_configurables(with_seqio_tasks: bool = False) -> None:
    """Import every module that defines gin configurables, so bindings can be checked at parse time.

    The seqio task options live in tasks/, whose import brings TensorFlow
    (seconds): only when the config mentions them.
    """
    import rankgen_jax.models.configs  # noqa: F401
    import rankgen_jax.data.sources  # noqa: F401
    import rankgen_jax.experiments.demo  # noqa: F401

    if with_seqio_tasks:
        import tasks.rankgen_tasks  # noqa: F401
    import rankgen_jax.train.optimizers  # noqa: F401
    import rankgen_jax.experiments.pipeline  # noqa: F401
    import rankgen_jax.train.loop  # noqa: F401


def resolve_gin_file(name: str) -> str:
    """A gin file as given, or relative to the repo's gin_configs/ folder."""
    for candidate in (Path(name), GIN_SEARCH_PATH / name):
        if candidate.is_file():
            return str(candidate)
    raise RankgenError(f"gin file {name!r} not found (looked in the current folder and {GIN_SEARCH_PATH})")


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parse gin files and `Name.param=value` bindings; a typo is a one-line RankgenError naming where it is."""
    paths = [resolve_gin_file(f) for f in files]
    texts = {}
    for path in paths:
        try:
            texts[path] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RankgenError(f"gin file {path}: cannot read it as UTF-8 text ({e})") from None
    text = "\n".join(list(texts.values()) + list(bindings))
    register_configurables(with_seqio_tasks=any(name in text for name in SEQIO_NAMES))
    gin.clear_config()
    gin.add_config_file_search_path(str(GIN_SEARCH_PATH))
    # gin logs an error for every search-path miss of an `include`, even when a later one hits.
    logging.disable(logging.ERROR)
    try:
        gin.parse_config_files_and_bindings(paths, list(bindings), finalize_config=False)
    except (ValueError, KeyError, TypeError, SyntaxError, IOError, tokenize.TokenError) as e:
        raise RankgenError(f"gin config: {_describe_gin_error(e, texts, bindings)}") from None
    finally:
        logging.disable(logging.NOTSET)


def _describe_gin_error(e: Exception, texts: dict[str, str], bindings: Sequence[str]) -> str:
    """gin's message on one line, with the file and line (or the binding) it names on later lines."""
    if isinstance(e, tokenize.TokenError):  # an unclosed bracket or string runs to the end of the text
        sources = [(f"gin file {path}", text) for path, text in texts.items()]
        sources += [(f"binding --gin.{b}", b) for b in bindings]
        where = next((name for name, text in sources if not _tokenizes(text)), "the gin config")
        return f"unclosed bracket or string in {where}"
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    for i, line in enumerate(lines[1:], 1):
        located = re.match(r'In file "(.+)", line (\d+)', line)
        if located:
            return f"{lines[0]} ({located[1]}, line {located[2]})"
        if line.startswith("In bindings string") and i + 1 < len(lines):
            return f"{lines[0]} (binding --gin.{lines[i + 1]})"
    return lines[0]


def _tokenizes(text: str) -> bool:
    try:
        list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    return True
