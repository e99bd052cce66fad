"""Flags that were renamed: the old spelling keeps working, with a one-line note on stderr."""

from __future__ import annotations

import argparse
import sys


class RenamedFlag(argparse.Action):
    """The old spelling of a flag: stores into the new flag's dest and says the new name on stderr."""

    def __init__(self, option_strings, dest, renamed_to: str, **kwargs):
        self.renamed_to = renamed_to
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is deprecated and will be removed; use {self.renamed_to}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flag(parser, new: str, old: str, *, required: bool = False, **kwargs) -> argparse.Action:
    """Add flag `new` (what --help shows) and its old spelling `old` (hidden): one of them, not both."""
    group = parser.add_mutually_exclusive_group(required=required)
    action = group.add_argument(new, **kwargs)
    group.add_argument(old, dest=action.dest, action=RenamedFlag, renamed_to=new, help=argparse.SUPPRESS,
                       choices=action.choices, type=action.type, metavar=action.metavar)
    return action
