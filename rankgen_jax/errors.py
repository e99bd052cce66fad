"""User-facing errors: one clear line saying what was wrong and where."""

import collections.abc
import dataclasses
import numbers
import os
import re
import types
import typing

import numpy as np


class RankgenError(Exception):
    """A problem with the user's input (paths, configs, checkpoints).

    The CLI prints these as a single `error: ...` line and exits non-zero;
    anything else is a bug and keeps its traceback.

    names: the library arguments and gin settings the message quotes in backticks
    (`workdir`, `TrainerConfig.init_checkpoint`); the CLI shows each as its own flag.
    """

    def __init__(self, message: str = "", *, names: tuple[str, ...] = ()):
        super().__init__(message)
        self.names = names


def check_field_types(config) -> None:
    """Raise RankgenError naming the first field of a dataclass config whose value has the wrong type.

    gin hands values over as parsed (`num_steps='abc'`, `batch_size=8.5`,
    `remat='no'`) without looking at annotations, and the mistake would
    otherwise surface as a TypeError deep inside training. Lenient where
    Python is: an int passes for a float, a list for a tuple, numpy scalars
    for their kinds; annotations it cannot read are not checked.
    """
    try:
        hints = typing.get_type_hints(type(config))
    except Exception:  # noqa: BLE001 - an unresolvable annotation: check nothing rather than fail
        return
    for field in dataclasses.fields(config):
        if field.name not in hints:
            continue
        value = getattr(config, field.name)
        if not _type_ok(value, hints[field.name]):
            annotation = hints[field.name]
            expected = annotation.__name__ if isinstance(annotation, type) else re.sub(r"\b(?:\w+\.)+", "", str(annotation))
            raise RankgenError(f"{type(config).__name__}.{field.name} = {value!r}: expected {expected}, "
                               f"got {type(value).__name__}")


def _type_ok(value, annotation) -> bool:
    if annotation is typing.Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    cls = origin or annotation
    if not isinstance(cls, type):
        return True  # Callable, Literal, TypeVar...: not checked
    if cls is bool:
        return isinstance(value, (bool, np.bool_))
    if cls is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if cls is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if cls in (tuple, list):
        return isinstance(value, (tuple, list))
    if cls is dict:
        return isinstance(value, collections.abc.Mapping)
    return isinstance(value, cls)


def _quoted(what: str) -> tuple[str, ...]:
    """The argument name `what` quotes in backticks (`input_path`), for RankgenError.names."""
    return (what[1:-1],) if len(what) > 2 and what[0] == what[-1] == "`" else ()


def require_input_file(path, what: str = "input") -> None:
    """A RankgenError unless path is an existing file; a folder is named as one. `what` names the path (an argument
    in backticks: `input_path`)."""
    if os.path.isdir(path):
        raise RankgenError(f"{what} {path}: is a folder; expected a file", names=_quoted(what))
    if not os.path.isfile(path):
        raise RankgenError(f"{what} {path}: no such file", names=_quoted(what))


def require_output_file(path, what: str = "output", create_folder: bool = False) -> None:
    """A RankgenError unless path can be written as a file: not a folder, in a folder that exists (or, with
    create_folder, is created)."""
    names = _quoted(what)
    if os.path.isdir(path):
        raise RankgenError(f"{what} {path}: is a folder; expected a file name", names=names)
    folder = os.path.dirname(os.path.abspath(path))
    if create_folder:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise RankgenError(f"{what} {path}: cannot create folder {folder} ({e.strerror})", names=names) from None
    elif not os.path.isdir(folder):
        raise RankgenError(f"{what} {path}: folder {folder} does not exist", names=names)
