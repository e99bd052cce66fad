"""`rankgen-jax cache-tasks`: RankGen seqio tasks precomputed into seqio's cache with Apache Beam."""

from __future__ import annotations

from rankgen_jax.errors import RankgenError

# The commands here configured with gin (they take --gin.Name.param=value bindings).
GIN_COMMANDS = ("cache-tasks",)


def add_cache_tasks(subparsers) -> None:
    p = subparsers.add_parser(
        "cache-tasks",
        help="precompute RankGen seqio tasks into seqio's cache with Apache Beam (DirectRunner, Dataflow)",
        description="Run RankGen tasks through seqio's Beam cache pipeline: each source shard cuts and "
        "tokenises its blocks of documents, and every record written is one whole same-document group, so "
        "training from the cache (DataConfig.seqio_cache_dir) keeps InBook batches. Writes seqio's TFRecord, "
        "info and stats files and rankgen_stats.{split}.json (group size, skipped input) per task. Data paths "
        "come from gin (--gin_file, --gin.rankgen_data_paths.folder=...) or RANKGEN_* variables. Locally: "
        "--pipeline_options=--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing; "
        "Dataflow: see docs/data.md, 'On Google Cloud Dataflow'.",
    )
    p.add_argument("--tasks", required=True, help="comma-separated RankGen task names, e.g. rankgen_pg19_inbook")
    p.add_argument("--output_cache_dir", required=True, help="cache root (local or gs://); each task gets a folder")
    p.add_argument("--pipeline_options", default="--runner=DirectRunner",
                   help="comma-separated Beam pipeline options (default --runner=DirectRunner)")
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file binding the tasks' paths and options (repeatable; also looked up in gin_configs/)")
    p.add_argument("--source_shards", type=int, default=16,
                   help="source shards (units of Beam parallelism over blocks of documents; default 16)")
    p.add_argument("--output_shards", type=int, default=64,
                   help="TFRecord files per split (at least the number of training hosts; default 64)")
    p.add_argument("--seed", type=int, default=0, help="orders the groups, as DataConfig.seed does uncached (default 0)")
    p.add_argument("--overwrite", action="store_true", help="rebuild tasks already cached in --output_cache_dir")
    p.set_defaults(run=_run_cache_tasks)


def _run_cache_tasks(args) -> dict:
    # Beam, seqio and TensorFlow load here, only for this command.
    import gin

    from rankgen_jax.data.seqio.beam_cache import CachePlan, cache_tasks
    from rankgen_jax.experiments.gin_runs import SEQIO_TASKS_MODULE
    from rankgen_jax.train.gin_parsing import parse_gin

    tasks = tuple(name.strip() for name in args.tasks.split(",") if name.strip())
    options = [option for option in args.pipeline_options.split(",") if option]
    if any(option.startswith("--runner=") and "prism" in option.lower() for option in options):
        raise RankgenError("the Prism runner downloads its binary at start; use --runner=DirectRunner here, "
                           "or DataflowRunner (docs/data.md)")
    parse_gin(args.gin_file, args.gin_bindings, lambda text: [SEQIO_TASKS_MODULE])
    try:
        plan = CachePlan(tasks, args.output_cache_dir, source_shards=args.source_shards,
                         output_shards=args.output_shards, seed=args.seed, overwrite=args.overwrite)
        return cache_tasks(plan, options, modules=(SEQIO_TASKS_MODULE,), gin_text=gin.config_str())
    finally:
        gin.clear_config()
