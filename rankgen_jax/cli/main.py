"""`rankgen-jax` command line: one subcommand per job; the logic lives in importable modules.

Each area's subcommands (flags and the handler that calls the library with
them) are in their own module: checkpoints.py, training.py, ranking.py,
generation.py. Nothing imported here starts jax: a handler imports what
starts jax when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping, Sequence

from rankgen_jax.cli import checkpoints, data, generation, ranking, training
from rankgen_jax.errors import RankgenError

# The commands configured with gin: they take --gin.Name.param=value bindings (args.gin_bindings).
GIN_COMMANDS = training.GIN_COMMANDS + data.GIN_COMMANDS
# What every gin command's --help ends with: argparse cannot declare these flags.
GIN_BINDINGS_HELP = ("gin bindings: --gin.Name.param=value (repeatable) binds one setting on top of the gin files, "
                     "e.g. --gin.ClDrdConfig.depth=100 or --gin.ClDrdConfig.corpus=\"'beir/scifact'\" (strings "
                     "in gin's quotes); docs/reference/config.md lists every setting")
# In the order `rankgen-jax --help` lists them.
SUBCOMMANDS = (
    checkpoints.add_import,
    checkpoints.add_export,
    training.add_train,
    ranking.add_score,
    data.add_split_data,
    generation.add_generate_negatives,
    generation.add_merge_negatives,
    data.add_cache_tasks,
    data.add_books_beir,
    training.add_pipeline,
    training.add_cl_drd,
    training.add_distillation_demo,
    training.add_retrieval_example,
    training.add_recipe_example,
    training.add_demo_curve,
    ranking.add_index,
    ranking.add_search,
    ranking.add_bm25,
    ranking.add_evaluate,
    ranking.add_mine_negatives,
    ranking.add_suffix_negatives,
    data.add_suffix_benchmark,
    ranking.add_score_candidates,
    ranking.add_encode,
    generation.add_generate,
    generation.add_generation_metrics,
    generation.add_generation_sweep,
    training.add_sweep,
    training.add_report,
    training.add_perspectives,
    training.add_mpts,
    training.add_negatives_claim,
    training.add_generation_claim,
    training.add_compile,
    checkpoints.add_smoke,
)

# Packages that only an extra of the pip package installs (pyproject.toml), by the module a command imports.
EXTRA_OF_MODULE = {
    "torch": "torch",
    "transformers": "torch",
    "faiss": "retrieval",
    "bm25s": "retrieval",
    "seqio": "data",
    "apache_beam": "beam",
    "tensorflow": "data",
    "mauve": "metrics",
    "sentence_transformers": "st",
}


def _split_gin_bindings(argv: list[str]) -> tuple[list[str], list[str]]:
    """Pull `--gin.Name.param=value` arguments out of argv (argparse cannot declare them)."""
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin."):
            if "=" not in arg:
                raise RankgenError(f"gin binding {arg!r} needs a value: --gin.Name.param=value")
            bindings.append(arg[len("--gin.") :])
        else:
            rest.append(arg)
    return rest, bindings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankgen-jax",
        description="Train and use RankGen-style ranking models on T5 encoders (JAX/Flax).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    for name in GIN_COMMANDS:
        subparsers.choices[name].epilog = GIN_BINDINGS_HELP
    parser.commands = subparsers.choices  # each subcommand's parser, for its flags
    return parser


def run_command(argv: list[str]) -> Any:
    """Parse argv (`--gin.*` bindings included) and run its subcommand; returns what the library returned.

    A RankgenError propagates (main() turns it into one line and exit status 2), in the command line's words
    (`in_flags`).
    """
    argv, bindings = _split_gin_bindings(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if bindings and args.command not in GIN_COMMANDS:
        raise RankgenError(f"--gin.* bindings apply to {', '.join(GIN_COMMANDS)} only")
    args.gin_bindings = bindings
    try:
        return args.run(args)
    except RankgenError as e:
        if not e.names:
            raise
        flags = [s for action in parser.commands[args.command]._actions for s in action.option_strings
                 if s.startswith("--")]
        # A library's path argument is its flag without the suffix: input_path is --input, model_path --model.
        flag_of = {f"{s[2:]}_path": s for s in flags} | {s[2:]: s for s in flags} | getattr(args, "flag_of", {})
        raise RankgenError(in_flags(str(e), e.names, flag_of, gin=args.command in GIN_COMMANDS)) from e


def in_flags(message: str, names: Sequence[str], flag_of: Mapping[str, str], gin: bool) -> str:
    """A library error as the command line says it: each of `names` the message quotes in backticks (RankgenError's
    names) becomes its flag in `flag_of` (the subcommand's --name, --x for x_path, or the flag a subcommand's
    `flag_of` default gives an argument its flags name otherwise), --gin.Config.field where the subcommand takes gin
    bindings, else the plain name. Other backticked words are left as they are."""
    for name in names:
        if "." in name and gin:
            shown = f"--gin.{name}"
        else:
            shown = flag_of.get(name, name)
        message = message.replace(f"`{name}`", shown)
    return message


def main(argv: list[str] | None = None) -> int:
    try:
        run_command(list(sys.argv[1:] if argv is None else argv))
    except RankgenError as e:
        # gin appends "In call to configurable ..." lines to errors raised inside configurables.
        print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        extra = EXTRA_OF_MODULE.get((e.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"error: this command needs {e.name}, which the '{extra}' extra installs: "
              f"pip install 'rankgen-jax[{extra}]'", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # `python -m rankgen_jax.cli.main`, as `rankgen-jax-cpu` runs it
    sys.exit(main())
