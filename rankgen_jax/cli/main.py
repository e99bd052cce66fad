"""`rankgen-jax` command line: one subcommand per job; the logic lives in importable modules."""

from __future__ import annotations

import argparse
import sys

from rankgen_jax.runtime.process import configure_xla_flags, reexec_with_malloc_tunables

configure_xla_flags()

from rankgen_jax.tpu.aot import add_subparser as add_compile_subparser  # noqa: E402
from rankgen_jax.models.configs import POOLINGS, HeadConfig  # noqa: E402
from rankgen_jax.lm.generative_negatives import add_subparser as add_generate_negatives_subparser  # noqa: E402
from rankgen_jax.inference.api import add_subparser as add_encode_subparser  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402
from rankgen_jax.eval.ranking import add_subparser as add_score_subparser  # noqa: E402
from rankgen_jax.lm.generation import add_subparser as add_generate_subparser  # noqa: E402
from rankgen_jax.eval.generation_metrics import add_subparser as add_generation_metrics_subparser  # noqa: E402
from rankgen_jax.experiments.perspectives import add_subparser as add_perspectives_subparser  # noqa: E402
from rankgen_jax.experiments.sweep import add_subparsers as add_sweep_subparsers  # noqa: E402

DEMO_GIN = "demo_minilm.gin"
GIN_COMMANDS = ("train", "pipeline", "perspectives", "compile")
DEMO_WORKDIR = "runs/demo"


def _add_import(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="convert an HF folder or a T5X checkpoint into a rankgen_jax checkpoint",
        description="Convert a HuggingFace T5 folder (plain T5 or the RankGen T5EncoderWithProjection format) "
        "or a T5X checkpoint (local, or gs:// through tensorstore) into a rankgen_jax checkpoint folder.",
    )
    p.add_argument("--from", dest="source", required=True, choices=["hf", "t5x"], help="source format")
    p.add_argument("--path", required=True, help="HF folder or T5X checkpoint folder (checkpoint_N/)")
    p.add_argument("--out", required=True, help="new checkpoint folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    p.add_argument("--vocab", help="SentencePiece model to store with the checkpoint (default: the source's spiece.model)")
    t5x = p.add_argument_group("T5X only (its checkpoints store no model config)")
    t5x.add_argument("--pooling", choices=POOLINGS, default="first", help="dual-encoder pooling (default: first, as RankGen)")
    t5x.add_argument("--l2_normalize", action="store_true", help="L2-normalise vectors (Sentence-T5 / t5x_retrieval)")
    t5x.add_argument("--no_head", action="store_true", help="import the encoder only, without a dual-encoder head")
    t5x.add_argument("--relpos_max_distance", type=int, default=128, help="relative position max distance (default 128)")
    p.set_defaults(run=_run_import)


def _run_import(args) -> None:
    from rankgen_jax.checkpoints.convert import describe_model, import_checkpoint

    head = None if args.no_head else HeadConfig(pooling=args.pooling, l2_normalize=args.l2_normalize)
    if args.source == "hf" and (args.no_head or args.pooling != "first" or args.l2_normalize):
        raise RankgenError("--pooling / --l2_normalize / --no_head apply to --from t5x only (HF folders carry their config)")
    config = import_checkpoint(
        args.source, args.path, args.out, overwrite=args.overwrite, vocab=args.vocab,
        head=head, relpos_max_distance=args.relpos_max_distance,
    )
    print(f"imported a {describe_model(config)} to {args.out}")


def _add_export(subparsers) -> None:
    p = subparsers.add_parser(
        "export-hf",
        help="write a checkpoint as a HuggingFace folder (safetensors)",
        description="Export a rankgen_jax checkpoint as a HuggingFace folder: the released RankGen format "
        "(T5EncoderWithProjection, load with AutoModel.from_pretrained(dir, trust_remote_code=True)) "
        "or a plain T5EncoderModel.",
    )
    p.add_argument("--checkpoint", required=True, help="rankgen_jax checkpoint folder (import output or train workdir)")
    p.add_argument("--out", required=True, help="HF folder to write")
    p.add_argument("--format", choices=["rankgen", "t5-encoder"], default="rankgen", help="default: rankgen")
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    p.set_defaults(run=_run_export)


def _run_export(args) -> None:
    from rankgen_jax.checkpoints.convert import describe_model, export_hf, export_layout

    config = export_hf(args.checkpoint, args.out, fmt=args.format, overwrite=args.overwrite, step=args.step)
    print(f"exported the {describe_model(config)} in {args.checkpoint} to {args.out} ({export_layout(config, args.format)})")


def _add_train(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train (or resume) a dual encoder, ranker or distilled retriever configured with gin",
        description="Train a model with the sharded train step. Configure with gin files and bindings, e.g. "
        "--gin_file=rankgen_t5_tiny_books.gin --gin.TrainerConfig.num_steps=200. Resumes from the workdir's "
        "latest checkpoint; SIGTERM saves and exits 0.",
    )
    p.add_argument("--gin_file", action="append", default=[],
                   help=f"gin file (repeatable; also looked up in gin_configs/); none: the demo, {DEMO_GIN}")
    p.add_argument("--workdir", help="checkpoints, metrics.jsonl, TensorBoard events, operative config "
                   f"(default with the demo: {DEMO_WORKDIR})")
    p.add_argument("--job", action="store_true",
                   help="also evaluate held-out suffix identification before and after, plot and export "
                   "(on by default for the demo)")
    p.set_defaults(run=_run_train)


def _run_train(args) -> None:
    from rankgen_jax.train.gin_parsing import parse_gin
    from rankgen_jax.train.loop import train

    import gin

    demo = not args.gin_file
    gin_files = args.gin_file or [DEMO_GIN]
    workdir = args.workdir or (DEMO_WORKDIR if demo else None)
    if workdir is None:
        raise RankgenError("--workdir is required with --gin_file")
    parse_gin(gin_files, args.gin_bindings)
    try:
        if demo or args.job:
            from rankgen_jax.experiments.demo import run_job

            run_job(workdir)
            return
        metrics = train(workdir)
    finally:
        # Bindings are process-global: a caller using main() in-process must not inherit them.
        gin.clear_config()
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
    print(f"done: {shown}; outputs in {workdir}")


def _add_pipeline(subparsers) -> None:
    p = subparsers.add_parser(
        "pipeline",
        help="run the metric -> ranker -> retriever distillation pipeline (DKMR^2, CL-DRD)",
        description="Warm up Retriever0, build metric-scored candidate pools with FAISS, train rankers "
        "(ListMLE, BCE), distill Retriever1 (KL, CL-DRD, direct from the metric) and evaluate every stage. "
        "Configure with gin (PipelineConfig); resumes stage by stage.",
    )
    p.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable; also looked up in gin_configs/)")
    p.add_argument("--workdir", required=True, help="folder for every stage's data, checkpoints and results.json")
    p.set_defaults(run=_run_pipeline)


def _run_pipeline(args) -> None:
    import gin

    from rankgen_jax.train.gin_parsing import parse_gin
    from rankgen_jax.experiments.pipeline import run_pipeline

    parse_gin(args.gin_file, args.gin_bindings)
    try:
        run_pipeline(args.workdir)
    finally:
        gin.clear_config()


def _add_index(subparsers) -> None:
    p = subparsers.add_parser("index", help="encode a corpus into a FAISS index",
                              description="Encode passages (JSONL {id, text} or one passage per line) with a dual "
                              "encoder's document tower into a FAISS inner-product index.")
    p.add_argument("--model", required=True, help="dual-encoder checkpoint, training workdir or HF folder")
    p.add_argument("--corpus", required=True, help="passages: JSONL {\"id\", \"text\"} or plain text, one per line")
    p.add_argument("--out", required=True, help="index folder to write")
    p.add_argument("--kind", choices=["flat", "ivf", "hnsw"], default="flat",
                   help="flat: exact inner product (default); ivf / hnsw: approximate, for millions of vectors")
    p.add_argument("--encode_kind", choices=["suffix", "prefix", "raw"], default="suffix",
                   help="text marker and tower of the passages (default: suffix)")
    p.add_argument("--max_length", type=int, help="tokens per passage (default: the encode kind's)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    p.set_defaults(run=_run_index)


def _run_index(args) -> None:
    from rankgen_jax.retrieval.dense_index import index_corpus

    index_corpus(args.model, args.corpus, args.out, kind=args.kind, batch_size=args.batch_size,
                 encode_kind=args.encode_kind, max_length=args.max_length, overwrite=args.overwrite)
    print(f"wrote the {args.kind} index of {args.corpus} to {args.out}")


def _add_search(subparsers) -> None:
    p = subparsers.add_parser("search", help="top-K passages of each query from a FAISS index",
                              description="Encode queries with the model's query tower and search an index "
                              "made by `rankgen-jax index`; writes JSONL {query_id, query, ids, scores}.")
    p.add_argument("--model", required=True, help="the model the index was built with")
    p.add_argument("--index", required=True, help="index folder")
    p.add_argument("--queries", required=True, help="queries: JSONL {id, text} or plain text, one per line")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--output", help="JSONL file to write (default: stdout)")
    p.add_argument("--encode_kind", choices=["prefix", "suffix", "raw"], default="prefix")
    p.set_defaults(run=_run_search)


def _run_search(args) -> None:
    import json

    from rankgen_jax.retrieval.dense_index import search_queries

    results = search_queries(args.model, args.index, args.queries, args.k, out_path=args.output,
                             encode_kind=args.encode_kind)
    if not args.output:
        for r in results:
            print(json.dumps(r))


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
    _add_import(subparsers)
    _add_export(subparsers)
    _add_train(subparsers)
    add_score_subparser(subparsers)
    add_generate_negatives_subparser(subparsers)
    _add_pipeline(subparsers)
    _add_index(subparsers)
    _add_search(subparsers)
    add_encode_subparser(subparsers)
    add_generate_subparser(subparsers)
    add_generation_metrics_subparser(subparsers)
    add_sweep_subparsers(subparsers)
    add_perspectives_subparser(subparsers)
    add_compile_subparser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        argv, bindings = _split_gin_bindings(list(sys.argv[1:] if argv is None else argv))
        args = build_parser().parse_args(argv)
        args.gin_bindings = bindings
        if bindings and args.command not in GIN_COMMANDS:
            raise RankgenError(f"--gin.* bindings apply to {', '.join(GIN_COMMANDS)} only")
        args.run(args)
    except RankgenError as e:
        # gin appends "In call to configurable ..." lines to errors raised inside configurables.
        print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


def console_main() -> int:
    """The `rankgen-jax` command: main() in a process with the malloc settings XLA:CPU runs best with."""
    reexec_with_malloc_tunables("rankgen_jax.cli.main", sys.argv[1:])
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
