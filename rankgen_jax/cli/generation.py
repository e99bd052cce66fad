"""`rankgen-jax generate-negatives`, `generate`, `generation-metrics` and `generation-sweep`: text from a causal LM,
and its metrics."""

from __future__ import annotations

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.generation_metrics import (MAUVE_MAX_LENGTH, MAUVE_SEED, REP_WINDOW, MauveSettings,
                                                 run_generation_metrics)
from rankgen_jax.lm.generation import (BEAM_SAMPLES, BEAM_SIZE, CUTS, MAX_NEW_TOKENS, RERANK_LENGTH, RERANK_SAMPLES,
                                      RERANKERS, SAMPLERS, STRATEGIES, Decoding, RerankerSpec,
                                      SearchSettings, generate_file)
from rankgen_jax.lm.generative_negatives import NegativeSampling, generate_negatives, merge_negatives


def add_generate_negatives(subparsers) -> None:
    p = subparsers.add_parser(
        "generate-negatives",
        help="sample a generative negative for every prefix with a causal LM (resumable)",
        description="Read JSONL objects with a \"prefix\" and write them back with a \"generative_negative\": "
        "a nucleus sample (top-p, as RankGen) from a local HuggingFace causal LM folder, a GGUF file or a "
        "named pretrained LM, cut at a sentence end to its gold continuation's length (--length_match). "
        "Rerun with the same arguments to resume: "
        "records already in --out are skipped. Across machines: run --num_shards N --shard_index I on each "
        "(shard I samples the batches k with k mod N = I, each under seed + k, into its own --out), then "
        "merge-negatives; the merged file equals one unsharded run's.",
    )
    p.add_argument(
        "--lm",
        required=True,
        help="causal LM: a local HuggingFace folder (model + tokenizer), a GGUF file, or gemma3-270m (Gemma 3 270M, fetched into the cache)",
    )
    p.add_argument("--input", required=True, help="JSONL file with a \"prefix\" string per line")
    p.add_argument("--out", required=True, help="JSONL file to write (appended to when it exists: resume)")
    p.add_argument("--batch_size", type=int, default=8, help="prompts per generate call (default 8)")
    p.add_argument("--top_p", type=float, default=0.9, help="nucleus sampling p (default 0.9, as RankGen)")
    p.add_argument(
        "--min_words", type=int, default=10, help="shortest continuation; shorter ones are resampled (default 10)"
    )
    p.add_argument("--max_words", type=int, default=128, help="longest continuation in words (default 128)")
    p.add_argument("--length_match", choices=("gold", "range"), default="gold",
                   help="gold (default): cut each sample at the sentence end nearest its record's \"continuation\" "
                   "word count, so negatives and golds share one length distribution (records without one are "
                   "skipped and counted); range: at the last sentence end within --min_words..--max_words")
    p.add_argument("--max_new_tokens", type=int, default=192, help="tokens sampled per prompt (default 192)")
    p.add_argument(
        "--max_prompt_tokens", type=int, help="keep the last N prompt tokens (default: context size - max_new_tokens)"
    )
    p.add_argument("--seed", type=int, default=0, help="batch k samples under seed + k (default 0)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    p.add_argument("--num_shards", type=int, default=1,
                   help="split the work into N shards, one per machine; N > 1 writes a shard file (default 1)")
    p.add_argument("--shard_index", type=int, default=0, help="the shard this run samples, 0..N-1 (default 0)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_generate_negatives)


def _run_generate_negatives(args) -> dict:
    sampling = NegativeSampling(args.batch_size, args.top_p, args.min_words, args.max_words, args.max_new_tokens,
                                args.max_prompt_tokens, args.seed, args.length_match)
    return generate_negatives(args.lm, args.input, args.out, sampling, device=args.device, num_shards=args.num_shards,
                              shard_index=args.shard_index, progress=not args.no_progress)


def add_merge_negatives(subparsers) -> None:
    p = subparsers.add_parser(
        "merge-negatives",
        help="join the shard files of `generate-negatives --num_shards N` into one file, in input order",
        description="Read the input given to generate-negatives and the N shard files it wrote with --num_shards N "
        "--shard_index I, check that they are the N shards of one run (same LM, input, seed, top_p, word and "
        "token limits, batch size; each index once) and that every input record is in its shard exactly once, "
        "and write the records in input order: the file one unsharded run writes.",
    )
    p.add_argument("--input", required=True, help="the JSONL file the shards were made from")
    p.add_argument("--shards", required=True, nargs="+", help="the N shard files, in any order")
    p.add_argument("--out", required=True, help="JSONL file to write (replaced; nothing written on an error)")
    p.set_defaults(run=_run_merge_negatives, flag_of={"shard_paths": "--shards"})


def _run_merge_negatives(args) -> dict:
    return merge_negatives(args.input, args.shards, args.out)


def add_generate(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="continue prefixes with a causal LM: RankGen beam search, re-ranking, or plain sampling",
        description='Read JSONL objects with a "prefix" and write them back with a "generation", the strategy, '
        'the final "beams" (rerank / beam), "new_tokens" and the seconds spent generating and re-ranking. '
        "beam: RankGen beam search (B beams, N samples per beam, re-rank every L tokens); rerank: N samples "
        "re-ranked once; nucleus / greedy / ancestral / top_k / typical: one plain sample. The defaults are the "
        "RankGen paper's protocol: 128-token generations cut after their last sentence end, 20 samples for "
        "rerank, B=2 beams of N=10 samples re-ranked every L=20 tokens for beam. Lines without a "
        "non-empty string prefix are skipped and counted.",
    )
    p.add_argument(
        "--lm",
        required=True,
        help="causal LM: a local HuggingFace folder (model + tokenizer), a GGUF file, or gemma3-270m (Gemma 3 270M, fetched into the cache)",
    )
    p.add_argument("--model", help="RankGen dual encoder (checkpoint, workdir or HF folder) for --reranker rankgen")
    p.add_argument("--input", required=True, help='JSONL file with a "prefix" string per line')
    p.add_argument("--output", required=True, help="JSONL file to write (replaced)")
    p.add_argument("--strategy", choices=STRATEGIES, default="beam", help="default: beam")
    p.add_argument("--reranker", choices=RERANKERS, default="rankgen",
                   help="re-ranker of rerank / beam (default rankgen)")
    p.add_argument("--sampling", choices=[s for s in SAMPLERS if s != "greedy"], default="nucleus",
                   help="token sampler of rerank / beam (default nucleus)")
    p.add_argument("--beam_size", type=int, default=BEAM_SIZE, help=f"B, beams kept per prefix (default {BEAM_SIZE})")
    p.add_argument("--num_samples", type=int,
                   help=f"N, samples per beam (default: {RERANK_SAMPLES} for rerank, {BEAM_SAMPLES} for beam)")
    p.add_argument("--rerank_length", type=int, default=RERANK_LENGTH,
                   help=f"L, tokens sampled between re-rankings (default {RERANK_LENGTH})")
    p.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS,
                   help=f"token budget of each prefix (default {MAX_NEW_TOKENS})")
    p.add_argument("--cut", choices=CUTS, default="sentence",
                   help="sentence: a finished text is cut after its last . ? ! or ; (the paper's); none: kept whole "
                   "(default sentence)")
    p.add_argument("--top_p", type=float, default=0.9, help="nucleus p (default 0.9)")
    p.add_argument("--top_k", type=int, default=40, help="k of top-k sampling (default 40)")
    p.add_argument("--typical_p", type=float, default=0.95, help="mass of typical sampling (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--max_batch_rows", type=int, default=64,
                   help="sequences the LM samples at once: lower it on a small GPU; results do not change (default 64)")
    p.add_argument("--prefix_batch", type=int, default=8, help="prefixes decoded together (default 8)")
    p.add_argument("--max_prompt_tokens", type=int, help="keep the last N prefix tokens (default: LM context - budget)")
    p.add_argument("--rankgen_batch_size", type=int, default=64, help="texts per RankGen encoder call (default 64)")
    p.add_argument("--device", default="cpu", help="torch device of the LM, e.g. cpu or cuda (default cpu)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_generate)


def _run_generate(args) -> dict:
    settings = SearchSettings(
        beam_size=args.beam_size, num_samples=args.num_samples, rerank_length=args.rerank_length,
        max_new_tokens=args.max_new_tokens, decoding=Decoding(args.sampling, args.top_p, args.top_k, args.typical_p),
        max_prompt_tokens=args.max_prompt_tokens, cut=args.cut, seed=args.seed, max_batch_rows=args.max_batch_rows)
    reranker = RerankerSpec(args.reranker, args.model, args.rankgen_batch_size)
    return generate_file(args.lm, args.input, args.output, args.strategy, settings, reranker=reranker,
                         prefix_batch=args.prefix_batch, device=args.device, progress=not args.no_progress)


def add_generation_metrics(subparsers) -> None:
    p = subparsers.add_parser(
        "generation-metrics",
        help="the RankGen paper's rep, token overlap, length and (with mauve-text) MAUVE of `generate` output",
        description='Read `rankgen-jax generate` output (JSONL with "prefix" and "generation") and print one JSON '
        "object with the RankGen paper's metrics as its released code defines them, each averaged over examples: "
        "rep (share of the generation's normalised words seen in the previous --rep_window words of prefix + "
        "generation), token_overlap (precision of the generation's words against the prefix's, stop words "
        "removed), length_words, and MAUVE of prefix + generation against prefix + --reference_field when "
        "--mauve_model is given (needs the optional mauve-text package; both texts cut at their last sentence "
        "end; the mean and standard deviation over the runs, one per input file and --mauve_seeds seed); then "
        "the variants rep_pooled (tokens of --tokenizer, pooled over the corpus) and unigram_overlap (F1 of word sets), and the mean new tokens and "
        "seconds.",
    )
    p.add_argument("--input", required=True, nargs="+",
                   help="JSONL output of `rankgen-jax generate`; several files (one per generation seed) are "
                   "MAUVE's runs, the other metrics pooled over them")
    p.add_argument("--tokenizer", help="HF tokenizer folder for rep_pooled, e.g. the LM's (default: whitespace words)")
    p.add_argument("--rep_window", type=int, default=REP_WINDOW, help="words / tokens looked back over (default 20)")
    p.add_argument("--rep_no_prefix", action="store_true", help="rep_pooled looks at the generation alone")
    p.add_argument("--reference_field", help='field holding the human continuation (e.g. "continuation"), for MAUVE')
    p.add_argument("--mauve_model", help="causal LM (folder, GGUF file or gemma3-270m) whose features MAUVE compares "
                   "(the paper: gpt2-large)")
    p.add_argument("--mauve_max_length", type=int, default=MAUVE_MAX_LENGTH,
                   help=f"first tokens of each text MAUVE reads (default {MAUVE_MAX_LENGTH}, as the paper)")
    p.add_argument("--mauve_no_prefix", action="store_true",
                   help="MAUVE of the generations against the references alone, without the prefix before them")
    p.add_argument("--mauve_seeds", type=int, nargs="+", default=[MAUVE_SEED],
                   help=f"k-means seeds of mauve-text, one run per input file and seed (default {MAUVE_SEED}, "
                   "mauve-text's own)")
    p.add_argument("--mauve_no_cut", action="store_true",
                   help="compare the texts whole instead of cut after their last sentence end (the paper's)")
    p.add_argument("--device", default="cpu", help="torch device of the MAUVE feature model (default cpu)")
    p.add_argument("--output", help="also write the metrics to this JSON file")
    p.set_defaults(run=_run_generation_metrics, flag_of={"model": "--mauve_model", "max_length": "--mauve_max_length"})


def _run_generation_metrics(args) -> dict:
    return run_generation_metrics(
        args.input, tokenizer=args.tokenizer, rep_window=args.rep_window, with_prefix=not args.rep_no_prefix,
        mauve=_mauve_settings(args, max_length=args.mauve_max_length, with_prefix=not args.mauve_no_prefix,
                              cut=not args.mauve_no_cut),
        mauve_seeds=args.mauve_seeds, device=args.device, output_path=args.output,
    )


def _mauve_settings(args, **settings) -> MauveSettings | None:
    """MAUVE's settings when --mauve_model is given; --reference_field alone would be read by nothing."""
    if not args.mauve_model:
        if args.reference_field:
            raise RankgenError("--reference_field is what MAUVE compares with: give --mauve_model too")
        return None
    return MauveSettings(args.mauve_model, args.reference_field, **settings)


def add_generation_sweep(subparsers) -> None:
    p = subparsers.add_parser(
        "generation-sweep",
        help="the RankGen paper's generation grid (App. A.3): MAUVE and time per rerank length, beams and samples",
        description="Generate the prefixes of --input with every configuration of a grid file (rerank length L x "
        "[beams B, samples per beam N], plus full re-ranking with N samples) under every seed of the grid, then "
        "report per configuration MAUVE against --reference_field (the paper's: cut at sentence ends, mean ± std "
        "over the seeds), the words on both sides, rep and the seconds per generation, in "
        "WORKDIR/generation_grid.md. gin_configs/generation/grid_paper_a3.json is the paper's grid; a rerun "
        "resumes (finished seeds are kept).",
    )
    p.add_argument(
        "--grid", required=True, help="grid JSON (e.g. generation/grid_paper_a3.json, generation/grid_cpu.json)"
    )
    p.add_argument("--lm", required=True, help="the causal LM that generates: a local HuggingFace folder, a GGUF file, "
                   "or gemma3-270m")
    p.add_argument("--input", required=True, help='JSONL file with a "prefix" (and the reference field) per line')
    p.add_argument("--workdir", required=True, help="folder of the runs and the table")
    p.add_argument("--model", help="RankGen dual encoder for --reranker rankgen")
    p.add_argument("--reranker", choices=RERANKERS, default="rankgen", help="default rankgen")
    p.add_argument("--reference_field", help='field holding the human continuation (e.g. "continuation"), for MAUVE')
    p.add_argument("--mauve_model", help="causal LM (folder, GGUF file or gemma3-270m) whose features MAUVE compares "
                   "(the paper: gpt2-large)")
    p.add_argument("--device", default="cpu", help="torch device of the LMs (default cpu)")
    p.add_argument("--prefix_batch", type=int, default=8, help="prefixes decoded together (default 8)")
    p.add_argument("--max_batch_rows", type=int, default=64, help="sequences the LM samples at once (default 64)")
    p.add_argument("--rankgen_batch_size", type=int, default=64, help="texts per RankGen encoder call (default 64)")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_run_generation_sweep, flag_of={"model": "--mauve_model"})


def _run_generation_sweep(args) -> dict:
    from rankgen_jax.experiments.generation_sweep import run_generation_sweep

    return run_generation_sweep(args.grid, args.lm, args.input, args.workdir,
                                reranker=RerankerSpec(args.reranker, args.model, args.rankgen_batch_size),
                                mauve=_mauve_settings(args), device=args.device, prefix_batch=args.prefix_batch,
                                max_batch_rows=args.max_batch_rows, progress=not args.no_progress)
