"""`rankgen-jax train`, `pipeline`, `cl-drd`, `distillation-demo`, `perspectives`, `mpts`, `negatives-claim`, `compile`
(configured with gin),
`recipe-example`, `demo-curve`, `sweep` and `report`."""

from __future__ import annotations

import contextlib

from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.gin_runs import DEMO_GIN, gin_config, train_from_gin
from rankgen_jax.experiments.sweep import report, run_sweep
from rankgen_jax.runtime.process import native_stderr_captured
from rankgen_jax.tpu.aot import AOT_VENV_HINT, DEFAULT_UTILIZATIONS, run_compile, run_plan

# The commands whose run is configured with gin: they take --gin.Name.param=value bindings (args.gin_bindings).
GIN_COMMANDS = ("train", "pipeline", "cl-drd", "distillation-demo", "perspectives", "mpts", "negatives-claim",
                "generation-claim", "compile")
DISTILLATION_DEMO_GIN = "distillation/books_cpu.gin"
DEMO_WORKDIR = "runs/demo"
PERSPECTIVES_WORKDIR = "runs/perspectives"
MPTS_WORKDIR = "runs/mpts"
MPTS_GIN = "mpts_minilm.gin"
NEGATIVES_CLAIM_GIN = "rankgen_claims/negatives_minilm.gin"
GENERATION_CLAIM_GIN = "rankgen_claims/generation_minilm.gin"


def add_train(subparsers) -> None:
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


def _run_train(args) -> dict:
    workdir = args.workdir or (None if args.gin_file else DEMO_WORKDIR)
    if workdir is None:
        raise RankgenError("--workdir is required with --gin_file")
    return train_from_gin(args.gin_file, args.gin_bindings, workdir, job=args.job)


def add_pipeline(subparsers) -> None:
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


def _run_pipeline(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.pipeline import run_pipeline

    with gin_config(args.gin_file, args.gin_bindings):
        return run_pipeline(args.workdir)


def add_cl_drd(subparsers) -> None:
    p = subparsers.add_parser(
        "cl-drd",
        help="distil a teacher's ranking into a dense retriever with CL-DRD's curriculum (Algorithm 1)",
        description="Each iteration the student retrieves the top N of every training query from its own index of "
        "the corpus, the teacher (cross encoder or score file) re-ranks them, the teacher's ranking is cut into "
        "CL-DRD's three groups (top K by rank, N_h drawn from the next K', N_s from the rest; K grows per "
        "iteration), the student trains fixed epochs with the LambdaRank loss of eq. 2, and is evaluated on "
        "held-out queries (TREC run, nDCG@10 / RR@10 / R@100 with standard errors). Configure with gin "
        "(ClDrdConfig; gin_configs/cl_drd/msmarco_paper.gin has the paper's settings); resumes stage by stage. "
        "--shard_index runs one shard's encoding, retrieval and teacher scoring as a worker for a coordinator "
        "run with ClDrdConfig.shard_workers=True.")
    p.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable; also looked up in gin_configs/)")
    p.add_argument("--workdir", required=True, help="folder for every iteration's artefacts and results.json")
    p.add_argument("--shard_index", type=int, help="run as the worker of this shard (0 .. num_shards-1)")
    p.set_defaults(run=_run_cl_drd)


def _run_cl_drd(args):
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.cl_drd import run_cl_drd, run_shard_worker

    with gin_config(args.gin_file, args.gin_bindings):
        if args.shard_index is not None:
            return run_shard_worker(args.workdir, args.shard_index)
        return run_cl_drd(args.workdir)


def add_distillation_demo(subparsers) -> None:
    p = subparsers.add_parser(
        "distillation-demo",
        help="do CL-DRD and DKMR^2 improve a real retriever? MiniLM, its baselines, on the bundled books (~1 hour)",
        description="Build a BEIR folder from the bundled books (train, dev and test books apart), evaluate BM25, "
        "train the teacher's MiniLM member on the training books, evaluate the teacher (with all-mpnet-base-v2, "
        "fetched once), run cl-drd from zero-shot MiniLM choosing the iteration on dev, train standard KL "
        "distillation for as many steps, run DKMR^2's pipeline on its own task, and write the table (test nDCG@10 "
        "/ RR@10 / R@100 with standard errors and paired differences from the zero-shot student) to "
        f"WORKDIR/distillation_table.md. Configured with gin (default: {DISTILLATION_DEMO_GIN}); resumes.")
    p.add_argument("--gin_file", action="append", default=[],
                   help=f"gin file (repeatable; also looked up in gin_configs/; default {DISTILLATION_DEMO_GIN})")
    p.add_argument("--workdir", required=True, help="folder for the collection, models, runs and results.json")
    p.set_defaults(run=_run_distillation_demo)


def _run_distillation_demo(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.distillation_demo import run_distillation_demo

    with gin_config(args.gin_file or [DISTILLATION_DEMO_GIN], args.gin_bindings):
        return run_distillation_demo(args.workdir)


def add_retrieval_example(subparsers) -> None:
    p = subparsers.add_parser(
        "retrieval-example", help="the end-to-end retrieval example on the bundled books (MiniLM, a few minutes)",
        description="Build a BEIR folder from the bundled books, train MiniLM with in-batch negatives, mine BM25 "
        "negatives, train with hard negatives, then index each model in 2 shards, search (TREC run) and evaluate "
        "nDCG@10 / RR@10 / R@100 on the test books; resumes stage by stage.")
    p.add_argument("--workdir", required=True, help="folder for the collection, models, indexes, runs and results.json")
    p.set_defaults(run=_run_retrieval_example)


def _run_retrieval_example(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.retrieval_example import run_retrieval_example

    return run_retrieval_example(args.workdir)


def add_recipe_example(subparsers) -> None:
    p = subparsers.add_parser(
        "recipe-example", help="the RankGen recipe end to end at CPU size (tiny random models, a few minutes)",
        description="Copy a few bundled addresses, split them with split-data (the paper's examples, the tiny recipe "
        "gin) into the LM's half and the negatives' prefix file, sample generative negatives with a random-init "
        "tiny GPT-2, train the tiny recipe on InBook and (p, c, g) examples, mine hard negatives on the held-out "
        "address with the trained model and score them with the model and the baselines; WORKDIR/recipe_table.md. "
        "Resumes stage by stage.")
    p.add_argument("--workdir", required=True, help="folder for the documents, splits, LM, negatives, model, tables")
    p.set_defaults(run=_run_recipe_example)


def _run_recipe_example(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.recipe_example import run_recipe_example

    return run_recipe_example(args.workdir)


def add_demo_curve(subparsers) -> None:
    p = subparsers.add_parser(
        "demo-curve", help="held-out suffix identification of a demo job's saved steps against minutes of training",
        description="Score a finished demo job's held-out items with each saved training step and compare each "
        "per genre with the best zero-shot reading of the starting model (the job's own report, at every step). "
        "Writes WORKDIR/curve/curve.{md,json,png}; keep the steps with --gin.TrainerConfig.keep_checkpoints "
        "when training.")
    p.add_argument("--workdir", default=DEMO_WORKDIR, help=f"the job's folder (default {DEMO_WORKDIR})")
    p.add_argument("--steps", default="", help="comma-separated saved steps (default: all of them)")
    p.set_defaults(run=_run_demo_curve)


def _run_demo_curve(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.demo_curve import run_curve

    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()] or None
    except ValueError:
        raise RankgenError(f"--steps={args.steps!r}: expected comma-separated step numbers, e.g. 50,100") from None
    return run_curve(args.workdir, steps)


def add_sweep(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="expand a grid of gin overrides into training runs",
                              description="Run every combination of a JSON grid of gin overrides (see "
                              "rankgen_jax/experiments/sweep.py), locally one after another, or print TPU launch commands.")
    p.add_argument("--grid", required=True, help="grid JSON file (e.g. gin_configs/ablations/grid_demo_cpu.json)")
    p.add_argument("--workdir", required=True, help="root folder; each run gets WORKDIR/<run name>")
    p.add_argument("--tpu_name", default="", help="print `tpu_scripts/tpu.py launch --dry_run` commands for this slice")
    p.add_argument("--tpu_arg", action="append", default=[], help="extra launch argument (repeatable), e.g. --zone=...")
    p.add_argument("--report_dir", default="", help="afterwards write ablations.md / .png / .json here: every run "
                   "against the baseline run, item by item, with standard errors")
    p.set_defaults(run=_run_sweep)


def _run_sweep(args) -> list[dict]:
    return run_sweep(args.grid, args.workdir, args.tpu_name, args.tpu_arg, args.report_dir)


def add_report(subparsers) -> None:
    r = subparsers.add_parser("report", help="one markdown table (and plot) of several runs' final metrics",
                              description="Gather held-out results (results.json of --job runs) or the last eval "
                              "metrics (metrics.jsonl) of training workdirs into one markdown table.")
    r.add_argument("workdirs", nargs="+", help="training workdirs")
    r.add_argument("--out", default="", help="also write the table to this file")
    r.add_argument("--plot", default="", help="PNG bar plot of the accuracy columns")
    r.set_defaults(run=_run_report)


def _run_report(args) -> None:
    print(report(args.workdirs, args.out, args.plot))


def add_perspectives(subparsers) -> None:
    p = subparsers.add_parser(
        "perspectives",
        help="multi-perspective demo: do two passages share an author, a work, a form? (bi- and cross encoder)",
        description="Cut the works of data/perspectives/works.json (Shakespeare, Milton, Austen, Soseki) into "
        "passages, pair them with labels [same_author, same_work, same_form], fine-tune MiniLM as a "
        "multi-perspective bi-encoder and as a cross encoder, and evaluate both on held-out passages against "
        "the majority class, zero-shot MiniLM and their untrained selves. Configure with gin "
        "(PerspectivesConfig); resumes stage by stage.",
    )
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file (repeatable; also looked up in gin_configs/), e.g. perspectives_minilm.gin")
    p.add_argument("--workdir", default=PERSPECTIVES_WORKDIR,
                   help=f"folder for the pairs, checkpoints and results.json (default {PERSPECTIVES_WORKDIR})")
    p.set_defaults(run=_run_perspectives)


def _run_perspectives(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.perspectives import run_perspectives

    with gin_config(args.gin_file, args.gin_bindings):
        return run_perspectives(args.workdir)


def add_mpts(subparsers) -> None:
    p = subparsers.add_parser(
        "mpts",
        help="MPTS: multi-perspective bi- and cross encoders on the released data, recipe and metric",
        description="Train MiniLM as a multi-perspective bi-encoder and cross encoder on the bundled MPTS dev "
        "split (part held out to choose the epoch) with the released recipe, and score them on MPTS test with "
        "the released W.Avg metrics against the majority class and thresholded zero-shot cosine, with bootstrap "
        f"standard errors. Configure with gin (MptsConfig; default {MPTS_GIN}); resumes stage by stage.",
    )
    p.add_argument("--gin_file", action="append", default=[],
                   help=f"gin file (repeatable; also looked up in gin_configs/); none: {MPTS_GIN}")
    p.add_argument("--workdir", default=MPTS_WORKDIR,
                   help=f"folder for the pairs, checkpoints, predictions and results.json (default {MPTS_WORKDIR})")
    p.set_defaults(run=_run_mpts)


def _run_mpts(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.mpts import run_mpts

    with gin_config(args.gin_file or [MPTS_GIN], args.gin_bindings):
        return run_mpts(args.workdir)


def add_negatives_claim(subparsers) -> None:
    p = subparsers.add_parser(
        "negatives-claim",
        help="RankGen's claim about negatives: InBook, generative and both rankers against InBook negatives and "
        "against a real LM's continuations (Gemma 3 270M, MiniLM rankers)",
        description="Sample a generative negative (cut to its gold's length) for groups of training prefixes and "
        "a continuation of held-out prefixes with a real LM, train the same MiniLM the same steps on InBook, "
        "generative and both, and score every ranker, the zero-shot model, unigram overlap and a length-only "
        "scorer on gold vs 10 and vs 1 InBook negatives and gold vs the LM's continuation, with paired standard "
        f"errors (WORKDIR/negatives_table.md). Configured with gin (NegativesClaimConfig; default "
        f"{NEGATIVES_CLAIM_GIN}); resumes stage by stage.",
    )
    p.add_argument("--gin_file", action="append", default=[],
                   help=f"gin file (repeatable; also looked up in gin_configs/); none: {NEGATIVES_CLAIM_GIN}")
    p.add_argument("--workdir", required=True, help="folder for the prefixes, negatives, rankers and results.json")
    p.set_defaults(run=_run_negatives_claim)


def _run_negatives_claim(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.negatives_claim import run_negatives_claim

    with gin_config(args.gin_file or [NEGATIVES_CLAIM_GIN], args.gin_bindings):
        return run_negatives_claim(args.workdir)


def add_generation_claim(subparsers) -> None:
    p = subparsers.add_parser(
        "generation-claim",
        help="RankGen's claim about generation: nucleus vs over-generate-and-re-rank vs beam search, re-ranked by "
        "the trained ranker, the zero-shot model and LM likelihood, MAUVE over seeds (after negatives-claim)",
        description="On the held-out prefixes of a negatives-claim workdir, run one generation sweep (the grid of "
        "GenerationClaimConfig.grid: nucleus p = 0.9, over-generate 20 and re-rank, beam B = 2, N = 10, L = 20, "
        "three seeds) per re-ranker: the 'both' ranker negatives-claim trained, the zero-shot starting model, and "
        "the LM's likelihood. Writes WORKDIR/<re-ranker>/ (the sweeps, resumed seed by seed) and "
        "WORKDIR/generation_table.md: MAUVE against the human continuations (mean ± std over the seeds) and its "
        f"difference from nucleus, words generated and gold, seconds and re-ranking share. Configured with gin "
        f"(GenerationClaimConfig; default {GENERATION_CLAIM_GIN}).",
    )
    p.add_argument("--gin_file", action="append", default=[],
                   help=f"gin file (repeatable; also looked up in gin_configs/); none: {GENERATION_CLAIM_GIN}")
    p.add_argument("--workdir", required=True, help="folder for the sweeps, the table and results.json")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_generation_claim)


def _run_generation_claim(args) -> dict:
    # Imports jax, which must start after main() sets XLA's flags.
    from rankgen_jax.experiments.generation_claim import run_generation_claim

    with gin_config(args.gin_file or [GENERATION_CLAIM_GIN], args.gin_bindings):
        return run_generation_claim(args.workdir, progress=not args.no_progress)


def add_compile(subparsers) -> None:
    p = subparsers.add_parser(
        "compile",
        help="compile the train step for a TPU topology on this machine; report memory and FLOPs per device",
        description="Lower and compile the gin-configured train step (the trainer's mesh, shardings and step) "
        "for a TPU topology with libtpu's compile-only devices, on a CPU machine. Reports per-device memory "
        "(argument + output - alias + temp) against the chip's HBM, FLOPs per step per device and the step "
        "time they imply; exits 2 with the compiler's RESOURCE_EXHAUSTED line when the config does not fit. "
        f"Needs libtpu: {AOT_VENV_HINT}.",
    )
    p.add_argument("--topology", required=True,
                   help="accelerator type (v3-128, v4-64, v5litepod-16) or chip grid (v3:8x8, v4:4x4x4, v5e:16x16)")
    p.add_argument("--gin_file", action="append", default=[], required=True,
                   help="gin file (repeatable; also looked up in gin_configs/); --gin.Name.param=value bindings apply")
    p.add_argument("--json", help="also write the report to this JSON file (also when the step does not fit)")
    p.add_argument("--plan", action="store_true",
                   help="search the settings that keep the model and the global batch (GradCache chunks, remat, FSDP "
                   "or standard axis rules), compiling each group up to its first that fits, and pick the one with "
                   "the fewest FLOPs per device by XLA's cost analysis; prints its gin bindings")
    p.add_argument("--utilization", type=float, nargs="+", default=list(DEFAULT_UTILIZATIONS),
                   help="fractions of peak FLOP/s to convert FLOPs into step times (default: 0.4 0.6)")
    p.add_argument("--hlo_out", help="write the compiled (optimized, per-device) HLO text here")
    p.add_argument("--step_seconds", type=float,
                   help="a step time (measured, or a paper's: 100k steps in 2 days is 1.728) to report the MFU it "
                   "implies")
    p.set_defaults(run=_run_compile)


def _run_compile(args) -> dict:
    with contextlib.ExitStack() as stack:
        # Parsing gin loads the seqio tasks' TensorFlow, whose C++ start-up lines (CUDA probes, oneDNN notes) would
        # come before the answer; they are shown only if parsing fails.
        with native_stderr_captured():
            stack.enter_context(gin_config(args.gin_file, args.gin_bindings))
        if args.plan:
            return run_plan(args.topology, json_out=args.json, utilizations=args.utilization)
        return run_compile(args.topology, args.utilization, hlo_out=args.hlo_out, json_out=args.json,
                           step_seconds=args.step_seconds)
