"""`rankgen-jax split-data` and `cache-tasks`: RankGen seqio tasks' documents split for the generator LM and the
generative negatives, and the tasks precomputed into seqio's cache with Apache Beam; `books-beir`: a BEIR folder
cut from books;
`suffix-benchmark`: ChapterBreak, HellaSwag or StoryCloze as `score` items."""

from __future__ import annotations

from rankgen_jax.errors import RankgenError

# The commands here configured with gin (they take --gin.Name.param=value bindings).
GIN_COMMANDS = ("split-data", "cache-tasks")


def add_split_data(subparsers) -> None:
    p = subparsers.add_parser(
        "split-data",
        help="cut a task's documents as training does into the generator LM's half and the generative negatives' "
        "prefix file (the RankGen recipe)",
        description="Read the documents of a RankGen seqio task's InBook stream (the same documents, holdout and "
        "example settings as training: use the domain's _inbook task, e.g. rankgen_pg19_inbook, with the recipe "
        "gin) and split them, whole documents, into two halves of about 50%% of the examples each: OUT/lm_train.txt, "
        "the LM's causal-LM text (prefix + continuation, one example per line), and OUT/prefixes.jsonl, the input "
        "of `rankgen-jax generate-negatives` ({id, doc_id, prefix, continuation}); OUT/split.json says which "
        "document went where. --split validation writes every document to the prefix file (the LM must not learn "
        "validation text).",
    )
    p.add_argument("--task", required=True, help="a RankGen task that reads documents, e.g. rankgen_pg19_inbook")
    p.add_argument("--out_dir", required=True, help="folder for lm_train.txt, prefixes.jsonl and split.json")
    p.add_argument("--split", choices=("train", "validation"), default="train", help="default train")
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file binding the task's paths and options, e.g. the recipe gin (repeatable)")
    p.set_defaults(run=_run_split_data)


def _run_split_data(args) -> dict:
    from rankgen_jax.data.seqio.split_data import split_task_data
    from rankgen_jax.experiments.gin_runs import SEQIO_TASKS_MODULE, experiment_configurables
    from rankgen_jax.train.gin_parsing import parse_gin

    # A training gin (the recipe's) binds the trainer's configurables too: all of them are known.
    parse_gin(args.gin_file, args.gin_bindings, lambda text: [*experiment_configurables(text), SEQIO_TASKS_MODULE])
    try:
        return split_task_data(args.task, args.out_dir, args.split, lm_half=args.split == "train")
    finally:
        import gin

        gin.clear_config()


def add_cache_tasks(subparsers) -> None:
    p = subparsers.add_parser(
        "cache-tasks",
        help="precompute RankGen seqio tasks into seqio's cache with Apache Beam (DirectRunner, Dataflow)",
        description="Run RankGen tasks through seqio's Beam cache pipeline: each source shard cuts and "
        "tokenises its blocks of documents, and every record written is one whole same-document group, so "
        "training from the cache (SeqioData.seqio_cache_dir) keeps InBook batches. Writes seqio's TFRecord, "
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


def add_books_beir(subparsers) -> None:
    from rankgen_jax.data.beir_books import BooksCollectionConfig

    defaults = BooksCollectionConfig()
    p = subparsers.add_parser(
        "books-beir", help="write a BEIR folder from books: prefixes as queries, gold continuations as passages",
        description="Cut each book into RankGen examples (sentence-bounded prefixes of about --prefix_words words, "
        "continuations of --min/--max_continuation_words) and write OUT/corpus.jsonl (the continuations, ids "
        "<book>-<n>), OUT/queries.jsonl (the prefixes, ids q-<passage id>) and OUT/qrels/{train,dev,test}.tsv (each "
        "query's gold continuation judged 1). The last --test_books books (by id) are the test split, the "
        "--dev_books before them dev, the rest train: no book is in two splits. Default: the bundled novels, as "
        "the retrieval example and the distillation demo use them; the distillation demo's own collection is "
        "--passages_per_book 250 --dev_books 1 --prefix_words 64 --max_continuation_words 40. Deterministic for given "
        "settings.")
    p.add_argument("--out", required=True, help="the BEIR folder to write")
    p.add_argument("--books", help="a folder (or file) of books (default: the bundled Austen novels and Botchan)")
    p.add_argument("--passages_per_book", type=int, default=defaults.passages_per_book,
                   help="examples kept per book (default %(default)s)")
    p.add_argument("--test_books", type=int, default=defaults.test_books, help="default %(default)s")
    p.add_argument("--dev_books", type=int, default=defaults.dev_books, help="default %(default)s")
    p.add_argument("--prefix_words", type=int, default=defaults.prefix_words, help="default %(default)s")
    p.add_argument("--min_continuation_words", type=int, default=defaults.min_continuation_words,
                   help="default %(default)s")
    p.add_argument("--max_continuation_words", type=int, default=defaults.max_continuation_words,
                   help="default %(default)s")
    p.add_argument("--seed", type=int, default=defaults.seed, help="default %(default)s")
    p.set_defaults(run=_run_books_beir)


def _run_books_beir(args) -> dict:
    import json

    from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
    from rankgen_jax.data.documents import require_documents
    from rankgen_jax.experiments.retrieval_example import bundled_books

    books = bundled_books() if args.books is None else require_documents(args.books)[0]
    config = BooksCollectionConfig(passages_per_book=args.passages_per_book, test_books=args.test_books,
                                   dev_books=args.dev_books, prefix_words=args.prefix_words,
                                   min_continuation_words=args.min_continuation_words,
                                   max_continuation_words=args.max_continuation_words, seed=args.seed)
    summary = build_books_collection(books, args.out, config)
    print(json.dumps(summary))
    return summary


def add_suffix_benchmark(subparsers) -> None:
    from rankgen_jax.data.suffix_benchmarks import BENCHMARKS, CHAPTERBREAK_SPLITS

    p = subparsers.add_parser(
        "suffix-benchmark", help="a released ChapterBreak, HellaSwag or StoryCloze file as `score` items",
        description="Read a suffix-identification benchmark's released file and write the items `rankgen-jax "
        "score` reads ({id, prefix, candidates, label}), built as RankGen's App. C.4 builds them: ChapterBreak "
        "(chapterbreak_ctx_256.json; prefix = ctx, gold first, then the 5 negatives; --split pg19 or ao3), "
        "HellaSwag (the validation JSONL; prefix = ctx_a, each candidate = ctx_b + ending), StoryCloze (the "
        "CSV; prefix = the four sentences, the two endings). Records that cannot make an item are skipped and "
        "counted on stderr with their place. Then: rankgen-jax score --model MODEL --input OUT (accuracy).")
    p.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    p.add_argument("--input", required=True, help="the benchmark's released file")
    p.add_argument("--out", required=True, help="JSONL file to write (replaced)")
    p.add_argument("--split", choices=CHAPTERBREAK_SPLITS, default="pg19",
                   help="ChapterBreak's split (default %(default)s; the other benchmarks have one per file)")
    p.set_defaults(run=_run_suffix_benchmark)


def _run_suffix_benchmark(args) -> dict:
    import json
    import sys

    from rankgen_jax.data.jsonl import write_jsonl
    from rankgen_jax.data.suffix_benchmarks import benchmark_items

    items, skipped = benchmark_items(args.benchmark, args.input, args.split)
    if skipped.count:
        print(f"note: skipped {skipped.count} {skipped.unit}(s) of {args.input}: {skipped.describe()}", file=sys.stderr)
    write_jsonl(args.out, items)
    summary = {"benchmark": args.benchmark, "items": len(items), "skipped": skipped.count, "out": args.out,
               "candidates": sorted({len(item["candidates"]) for item in items})}
    print(json.dumps(summary))
    return summary
