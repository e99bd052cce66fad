"""Gin parsing with clear errors: missing files, unknown bindings and bindings nothing reads fail before anything
compiles."""

from __future__ import annotations

import importlib
import io
import json
import logging
import re
import tokenize
from pathlib import Path
from typing import Callable, Iterable, Sequence

import gin

from rankgen_jax.errors import RankgenError
from rankgen_jax.resources import GIN_CONFIGS_DIR, resource_path

# The shipped configs: the repository's gin_configs/, or the installed package's copy.
GIN_SEARCH_PATH = GIN_CONFIGS_DIR


# The library's modules that define gin configurables. Gin knows a configurable only once its module is
# imported, and an unknown name must fail at parse time, not when a run is half set up.
CONFIGURABLE_MODULES = (
    "rankgen_jax.models.configs",
    "rankgen_jax.data.source_configs",
    "rankgen_jax.train.optimizers",
    "rankgen_jax.train.config",
)


def library_configurables(config_text: str) -> Sequence[str]:
    """The modules parse_gin imports by default, whatever the config says: the library's own."""
    return CONFIGURABLE_MODULES


def find_config_file(name: str) -> Path | None:
    """A config file (gin, a sweep grid) as given, else relative to the shipped gin_configs/ folder
    (GIN_SEARCH_PATH), else as a path in the repository (`gin_configs/...`, also in an installed package)."""
    for candidate in (Path(name), GIN_SEARCH_PATH / name, resource_path(name)):
        if candidate.is_file():
            return candidate
    return None


def read_grid_file(name: str) -> object:
    """The JSON of a grid file found by find_config_file; a RankgenError names the file when it is missing or bad."""
    found = find_config_file(name)
    if found is None:
        raise RankgenError(f"{name}: no such grid file (looked in the current folder and {GIN_SEARCH_PATH})")
    try:
        return json.loads(found.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RankgenError(f"{name}: not valid JSON ({e})") from None


def resolve_gin_file(name: str) -> str:
    """A gin file found by find_config_file; a RankgenError names where it looked."""
    found = find_config_file(name)
    if found is None:
        raise RankgenError(f"gin file {name!r} not found (looked in the current folder and {GIN_SEARCH_PATH})")
    return str(found)


def parse_gin(files: Sequence[str], bindings: Sequence[str],
              configurables: Callable[[str], Iterable[str]] = library_configurables) -> None:
    """Parse gin files and `Name.param=value` bindings; a typo is a one-line RankgenError naming where it is.

    configurables(text), given the text of the files and bindings, names the modules to import first so
    that gin knows every configurable the config may bind; the default names the library's.
    """
    paths = [resolve_gin_file(f) for f in files]
    texts = {}
    for path in paths:
        try:
            texts[path] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RankgenError(f"gin file {path}: cannot read it as UTF-8 text ({e})") from None
    # The files they include count too: a recipe may name the seqio tasks' options only in an included file.
    included: dict[str, str] = {}
    for path, file_text in texts.items():
        _add_includes(Path(path), file_text, included)
    text = "\n".join(list(texts.values()) + list(included.values()) + list(bindings))
    for module in configurables(text):
        importlib.import_module(module)
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


_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)


def _add_includes(path: Path, text: str, found: dict[str, str]) -> None:
    """The text of every file `text` includes, recursively, into found (path -> text); gin reports missing ones."""
    for name in _INCLUDE.findall(text):
        candidate = find_config_file(name)
        if candidate is None and (path.parent / name).is_file():
            candidate = path.parent / name
        if candidate is None or str(candidate) in found:
            continue
        try:
            found[str(candidate)] = candidate.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # gin's own parse reports it
        _add_includes(candidate, found[str(candidate)], found)


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
    moved = _moved_data_field(lines[0], "\n".join([*texts.values(), *bindings]))
    if moved:
        lines[0] = moved
    token = re.search(r"Failed to parse token '(.*)'", str(e))
    if isinstance(e, SyntaxError) and lines[0].startswith("malformed node or string") and token:
        # gin reads a value as a Python literal; a bare word (an unquoted string) is none.
        where = (f"{e.filename}, line {e.lineno}" if e.filename
                 else f"binding --gin.{(e.text or '').strip()}")
        return (f"{token[1]} is not a value gin can read ({where}): quote a string "
                f"(--gin.Name.param=\"'{token[1]}'\" in a shell, Name.param = '{token[1]}' in a file), or give a "
                "number, True / False, None, a list or an @reference")
    for i, line in enumerate(lines[1:], 1):
        located = re.match(r'In file "(.+)", line (\d+)', line)
        if located:
            return f"{lines[0]} ({located[1]}, line {located[2]})"
        if line.startswith("In bindings string") and i + 1 < len(lines):
            return f"{lines[0]} (binding --gin.{lines[i + 1]})"
    return lines[0]


def _moved_data_field(message: str, config_text: str) -> str:
    """gin's refusal of a DataConfig field that moved to a source's config, said with the binding that replaces it
    (that of the source an earlier version's `DataConfig.source = 'name'` in config_text names); "" for any other
    message."""
    from rankgen_jax.data.source_configs import MOVED_DATA_FIELDS, SOURCE_CONFIGS

    match = re.match(r"Configurable '(?:[\w/]+/)?DataConfig' doesn't have a parameter named '(\w+)'", message)
    if not match or match[1] not in MOVED_DATA_FIELDS:
        return ""
    field, kinds = match[1], MOVED_DATA_FIELDS[match[1]]
    named = re.findall(r"DataConfig\.source\s*=\s*['\"](\w+)['\"]", config_text)
    if named and named[-1] in kinds:
        kinds = (named[-1],)
    classes = [SOURCE_CONFIGS[kind].__name__ for kind in kinds]
    return (f"DataConfig.{field} is a setting of the data source's own config now: bind "
            + " or ".join(f"{name}.{field}" for name in classes) + ", with DataConfig.source = "
            + " or ".join(f"@{name}()" for name in classes))


def _tokenizes(text: str) -> bool:
    try:
        list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    return True


# How a configurable comes into a run, for the message about a binding nothing read.
_HOW_USED = {
    "HeadConfig": "a head comes from ModelConfig.head = @HeadConfig()",
    "BertConfig": "the encoder is ModelConfig.encoder (@BertConfig() for a BERT-family one)",
    "T5Config": "the encoder is ModelConfig.encoder (@T5Config() or @t5_config() for a T5)",
    "t5_config": "the encoder is ModelConfig.encoder (@t5_config() for a named T5 size)",
    "JobConfig": "JobConfig is read by `rankgen-jax train --job` (and the demo)",
    **{name: f"a source's settings are read when DataConfig.source = @{name}()"
       for name in ("ExamplesData", "SeqioData", "BooksData", "RandomData", "ListsData", "PairsData",
                    "RetrievalData")},
}


def _bindings() -> dict[tuple[str, str], dict]:
    # gin has no public API listing the bound parameters or those a run read; its module state holds both.
    return gin.config._CONFIG  # noqa: SLF001


def bound_parameters(names: Iterable[str]) -> list[str]:
    """The bound parameters (`Name.param`) of the library's configurables called `names` (unscoped or scoped)."""
    names = set(names)
    return sorted(f"{selector.rsplit('.', 1)[-1]}.{param}" for (_, selector), params in _bindings().items()
                  if selector.startswith("rankgen_jax.") and selector.rsplit(".", 1)[-1] in names for param in params)


def unused_bindings() -> list[str]:
    """The library's gin bindings (`[scope/]Name.param`) that no configurable call has read since parsing.

    A configurable reads its bindings when it is called: a binding of one that the run never calls, or one
    that its caller overrides, is unused (gin's operative config records what each call read).
    """
    operative = gin.config._OPERATIVE_CONFIG  # noqa: SLF001
    unused = []
    for (scope, selector), params in _bindings().items():
        if not selector.startswith("rankgen_jax."):
            continue  # the seqio tasks' options (tasks/) are read later, when a task is read
        read = set()
        for (call_scope, called), values in operative.items():
            if called == selector and (not scope or scope in call_scope.split("/")):
                read |= set(values)
        name = (f"{scope}/" if scope else "") + selector.rsplit(".", 1)[-1]
        unused += [f"{name}.{param}" for param in params if param not in read]
    return sorted(unused)


def check_bindings_used() -> None:
    """A RankgenError naming every library binding the run has not read (call it once the run's configs are
    built, before anything compiles): a binding that changes nothing is a mistake, not a setting."""
    unused = unused_bindings()
    if not unused:
        return
    hints = sorted({_HOW_USED[name] for name in (u.split("/")[-1].split(".")[0] for u in unused) if name in _HOW_USED})
    raise RankgenError(f"gin binds {', '.join(unused)}, which nothing in this run reads"
                       + (f" ({'; '.join(hints)})" if hints else "") + ": remove the binding or bind what reads it")


def encoder_bindings() -> list[str]:
    """The gin config's bindings of a model's encoder: ModelConfig.encoder and the encoder configs' parameters."""
    return ([b for b in bound_parameters(("ModelConfig",)) if b == "ModelConfig.encoder"]
            + bound_parameters(("T5Config", "t5_config", "BertConfig")))
