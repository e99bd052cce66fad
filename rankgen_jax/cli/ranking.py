"""`rankgen-jax score`, `encode`, `index`, `search`, `bm25`, `evaluate`, `mine-negatives` and `score-candidates`: a
trained model's scores, vectors, runs, hard negatives and teacher scores, and the BM25 baseline's runs."""

from __future__ import annotations

import json

from rankgen_jax.cli.renamed import add_renamed_flag
from rankgen_jax.data.conventions import ENCODE_SIDES
from rankgen_jax.data.retrieval_files import DEFAULT_RUN_TAG, DEFAULT_TITLE_JOIN, RUN_FORMATS, TRAINING_SPLIT, run_lines
from rankgen_jax.eval.ranking import METHODS, LmScoring, run_score
from rankgen_jax.eval.retrieval_metrics import DEFAULT_MEASURES, MISSING_QUERIES, evaluate_files
from rankgen_jax.inference.api import TRUNCATION_MODES, run_encode
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval import bm25, mining
from rankgen_jax.retrieval.dense_index import (DEFAULT_TRAIN_SAMPLE, INDEX_TYPES, IndexSpec, TextEncoding, index_corpus,
                                              search_queries)

CORPUS_HELP = (
    'passages: TSV `id<TAB>text` (MS MARCO collection.tsv), JSON lines {"id", "text"} (also BEIR\'s '
    '{"_id", "title", "text"} and Tevatron\'s {"docid", ...}), or a BEIR folder; ids are kept as written'
)

# Flags that override a model's recorded input conventions (data/conventions.py), named as its fields.
CONVENTION_FLAGS = ("prefix_marker", "suffix_marker", "prefix_length", "suffix_length", "prefix_keep", "suffix_keep",
                    "truncation")


TEACHER_HELP = ("a cross encoder (rankgen_jax checkpoint, HF sequence-classification or CrossEncoder folder), a "
                "bi-encoder (sentence-transformers model folder, rankgen_jax dual encoder, or 'mpnet' for "
                "all-mpnet-base-v2, fetched once), or a file of teacher scores (scored Tevatron JSONL, or a run)")

def add_convention_flags(p, truncation: bool = True) -> None:
    """The flags that override how the model reads text; unset ones keep what is recorded with it."""
    g = p.add_argument_group("input conventions (default: those recorded with the model; the released RankGen "
                             "ones for a folder without a record)")
    g.add_argument("--prefix_marker", help='text put before each prefix / query, e.g. "pre " ("" for none)')
    g.add_argument("--suffix_marker", help='text put before each continuation / passage, e.g. "suffi "')
    g.add_argument("--prefix_length", type=int, help="tokens per prefix / query")
    g.add_argument("--suffix_length", type=int, help="tokens per continuation / passage")
    g.add_argument("--prefix_keep", choices=("start", "end"), help="which end of an over-long prefix stays")
    g.add_argument("--suffix_keep", choices=("start", "end"), help="which end of an over-long continuation stays")
    if truncation:
        g.add_argument("--truncation", choices=TRUNCATION_MODES,
                       help="released: slice to the limit like the released code (a cut text loses EOS); "
                       "clean: cut but keep EOS")


def convention_args(args) -> dict:
    """{InputConventions field: value} of the convention flags given (None for those not given)."""
    return {name: getattr(args, name, None) for name in CONVENTION_FLAGS}


def add_score(subparsers) -> None:
    p = subparsers.add_parser(
        "score",
        help="score prefix / candidate lists from a JSONL file; accuracy@1, MRR and pairwise accuracy when labelled",
        description='Score JSONL lines {"prefix": str, "candidates": [str, ...], "label": int (optional)} with a '
        'dual encoder (prefix vector . candidate vector, RankGen\'s "pre " / "suffi " markers), the RankGen '
        "paper's token-overlap baseline (token_overlap), the unigram-overlap F1 baseline (unigram), or a causal "
        "LM's mean log-likelihood of the candidate given the prefix (lm_loglik), PMI, log p(c|prefix) - log p(c) "
        "(pmi), or the average unconditional log-likelihood of prefix + candidate, log p(p c) / (|p| + |c|) "
        '(avg_ull, the paper\'s Appendix C.6). With labels, the last stdout line is a JSON object {"n": ..., "accuracy": ..., "mrr": ..., '
        '"pairwise_accuracy": ...} (pairwise: the paper\'s share of negatives the gold beats, averaged over '
        "lines). Malformed lines are skipped and counted on stderr; a file with no well-formed line is an error "
        "(exit status 2).",
    )
    p.add_argument("--model", help="rankgen_jax checkpoint folder, training workdir, or HF folder (dual encoder)")
    p.add_argument("--input", required=True, help="JSONL file to score")
    p.add_argument("--output", help="JSONL file to write: each well-formed input line plus its \"scores\"")
    p.add_argument("--method", choices=METHODS, default="model", help="default: model")
    p.add_argument("--batch_size", type=int, default=64, help="texts per encoder call (default 64)")
    lm = p.add_argument_group("LM baselines (--method lm_loglik / pmi / avg_ull)")
    lm.add_argument("--lm", help="causal LM: a local HuggingFace folder, a GGUF file, or gemma3-270m")
    lm.add_argument("--lm_reduce", choices=("mean", "sum"), default="mean",
                    help="per-token mean (default, as the paper) or sum of token log-probabilities")
    lm.add_argument("--lm_batch_size", type=int, default=16, help="sequences per LM forward pass (default 16)")
    lm.add_argument("--device", default="cpu", help="torch device of the LM, e.g. cpu or cuda (default cpu)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    add_convention_flags(p)
    p.set_defaults(run=_run_score)


def _run_score(args) -> dict:
    return run_score(args.input, args.output, method=args.method, model_path=args.model, batch_size=args.batch_size,
                     lm_path=args.lm, lm_scoring=LmScoring(args.lm_reduce, args.lm_batch_size), device=args.device,
                     progress=not args.no_progress, conventions=convention_args(args))


def add_suffix_negatives(subparsers) -> None:
    p = subparsers.add_parser(
        "suffix-negatives",
        help="suffix identification items with hard negatives mined by a trained dual encoder (RankGen App. C.1)",
        description="Cut documents into items (a sentence-bounded prefix of up to --prefix_words words and its gold "
        "continuation of up to --continuation_words) and give each the --negatives spans of its document that the "
        "model scores highest against the prefix, among every sentence-bounded run of up to --span_words words "
        "(at least --min_words) that overlaps neither the prefix nor the gold. Writes JSONL {prefix, candidates "
        "(gold first), label 0, doc_id, spans, scores}: the input of `rankgen-jax score`.",
    )
    p.add_argument("--model", required=True, help="the trained dual encoder (checkpoint, workdir or HF folder)")
    p.add_argument("--documents", required=True, nargs="+", help="folders or files of documents (as training reads)")
    p.add_argument("--out", required=True, help="JSONL file to write (replaced)")
    p.add_argument("--prefix_words", type=int, default=256, help="longest prefix in words (default 256)")
    p.add_argument("--continuation_words", type=int, default=128, help="longest gold continuation (default 128)")
    p.add_argument("--span_words", type=int, default=128, help="longest candidate span in words (default 128)")
    p.add_argument("--min_words", type=int, default=10, help="shortest gold and candidate span (default 10)")
    p.add_argument("--negatives", type=int, default=10, help="hard negatives per item (default 10, as the paper)")
    p.add_argument("--items_per_document", type=int, default=0,
                   help="items drawn per document (default 0: every non-overlapping item)")
    p.add_argument("--seed", type=int, default=0, help="seed of the items drawn per document (default 0)")
    p.add_argument("--batch_size", type=int, default=64, help="texts per encoder call (default 64)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_suffix_negatives)


def _run_suffix_negatives(args) -> dict:
    from rankgen_jax.eval.hard_negatives import HardNegativeConfig, mine_hard_negatives

    config = HardNegativeConfig(prefix_words=args.prefix_words, continuation_words=args.continuation_words,
                                span_words=args.span_words, min_words=args.min_words, negatives=args.negatives,
                                items_per_document=args.items_per_document, seed=args.seed)
    return mine_hard_negatives(args.model, args.documents, args.out, config, args.batch_size,
                               progress=not args.no_progress)


def _add_title_flags(parser, join_help: str, no_title_help: str) -> None:
    parser.add_argument("--title_join", default=DEFAULT_TITLE_JOIN, help=join_help)
    parser.add_argument("--no_title", action="store_true", help=no_title_help)


def _title_join(args) -> str | None:
    """The title_join the library takes: None drops titles."""
    return None if args.no_title else args.title_join


TRUNCATE_HELP = ("keep each vector's first N dimensions (a Matryoshka-trained model's; normalised again when the "
                 "model's head normalises)")


def add_index(subparsers) -> None:
    p = subparsers.add_parser("index", help="encode a corpus into a FAISS index",
                              description="Encode passages (MS MARCO / TREC TSV, JSON lines, or a BEIR folder) with a "
                              "dual encoder's document tower into a FAISS inner-product index. Malformed lines are "
                              "skipped and counted on stderr; a duplicate id is an error.")
    p.add_argument("--model", required=True, help="dual-encoder checkpoint, training workdir or HF folder")
    p.add_argument("--corpus", required=True, help=CORPUS_HELP)
    p.add_argument("--out", required=True, help="index folder to write")
    add_renamed_flag(p, "--index_type", "--kind", choices=INDEX_TYPES,
                     help="flat: exact inner product (default); ivf / hnsw: approximate, for millions of vectors")
    p.add_argument("--index_factory",
                   help='a FAISS index factory string instead of --index_type, e.g. "IVF4096,PQ64" or "HNSW32" '
                   "(inner-product metric)")
    p.add_argument("--train_sample", type=int,
                   help="vectors an index that needs training (IVF, PQ) trains on, drawn at random from the shard "
                   f"(default: {DEFAULT_TRAIN_SAMPLE}, or 256 per IVF list if more; all when fewer)")
    p.add_argument("--train_seed", type=int, default=0, help="seed of the training sample (default 0)")
    p.add_argument("--nprobe", type=int, help="IVF lists searched (default: min(nlist, 8))")
    p.add_argument("--num_shards", type=int, default=1,
                   help="split the corpus into this many shards (one run, e.g. one host, per shard; default 1)")
    p.add_argument("--shard_index", type=int, default=0,
                   help="the shard this run encodes, 0 .. num_shards-1: the passages at positions p (0-based, "
                   "usable passages in file order) with p %% num_shards == shard_index (default 0)")
    add_renamed_flag(p, "--encode_side", "--encode_kind", choices=ENCODE_SIDES, default="suffix",
                     help="the encoding side of the passages: their marker, length and tower (default: suffix)")
    p.add_argument("--max_length", type=int, help="tokens per passage (default: the encoding side's)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--truncate_dim", type=int, help=TRUNCATE_HELP)
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out")
    _add_title_flags(p, "what joins a passage's title to its text: title + SEP + text (default: a space)",
                     "drop titles: encode the text alone")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    add_convention_flags(p)
    p.set_defaults(run=_run_index)


def _run_index(args) -> None:
    config = index_corpus(
        args.model, args.corpus, args.out,
        IndexSpec(index_type=args.index_type, nprobe=args.nprobe, index_factory=args.index_factory,
                  train_sample=args.train_sample, train_seed=args.train_seed),
        TextEncoding(args.encode_side, args.batch_size, args.max_length, convention_args(args),
                     truncate_dim=args.truncate_dim),
        title_join=_title_join(args), num_shards=args.num_shards, shard_index=args.shard_index,
        overwrite=args.overwrite, progress=not args.no_progress)
    what = config.get("index_factory") or config["index_type"]
    shard = f"shard {args.shard_index} of {args.num_shards} " if args.num_shards > 1 else ""
    print(f"wrote the {what} index of {shard}{args.corpus} ({config['count']} passages) to {args.out}")


def add_search(subparsers) -> None:
    p = subparsers.add_parser("search", help="top-K passages of each query from a FAISS index",
                              description="Encode queries with the model's query tower and search an index "
                              "made by `rankgen-jax index`; writes JSONL {query_id, query, ids, scores}, a TREC run "
                              "(qid Q0 docid rank score tag) or an MS MARCO run (qid<TAB>pid<TAB>rank). Runs list "
                              "each query's passages in trec_eval's order (score descending, equal scores by docid "
                              "descending), ranks from 1. The top K of an index's shards (`index --num_shards`) merge "
                              "into exactly that of one index over the corpus (equal scores by corpus position).")
    p.add_argument("--model", required=True, help="the model the index was built with")
    p.add_argument("--index", required=True, nargs="+",
                   help="index folder; or the shard folders of one index, or a folder holding them")
    p.add_argument("--queries", required=True,
                   help="queries: TSV `qid<TAB>text` (MS MARCO queries.*.tsv), JSON lines {\"id\", \"text\"} (or "
                   "BEIR's / Tevatron's), or a BEIR folder (the queries its --split judges)")
    p.add_argument("--split", help="a BEIR folder's qrels split whose queries to search (required with a BEIR folder)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--output", help="file to write (default: stdout)")
    p.add_argument("--format", choices=RUN_FORMATS, default="jsonl", help="output format (default: jsonl)")
    p.add_argument("--run_tag", default=DEFAULT_RUN_TAG, help=f"a TREC run's tag column (default {DEFAULT_RUN_TAG})")
    add_renamed_flag(p, "--encode_side", "--encode_kind", choices=ENCODE_SIDES, default="prefix",
                     help="the encoding side of the queries (default: prefix)")
    p.add_argument("--truncate_dim", type=int, help=TRUNCATE_HELP + "; the index's own")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    add_convention_flags(p)
    p.set_defaults(run=_run_search, flag_of={"out_format": "--format"})


def _run_search(args) -> None:
    results = search_queries(args.model, args.index, args.queries, args.k,
                             TextEncoding(args.encode_side, conventions=convention_args(args),
                                          truncate_dim=args.truncate_dim), split=args.split,
                             out_path=args.output, out_format=args.format, run_tag=args.run_tag,
                             progress=not args.no_progress)
    if not args.output:
        for line in run_lines(results, args.format, args.run_tag):
            print(line)


def add_bm25(subparsers) -> None:
    p = subparsers.add_parser(
        "bm25", help="top-K passages of each query by BM25, as a TREC run (the baseline row of a retrieval table)",
        description="Rank the corpus for each query with BM25 (bm25s, Lucene's variant; lower-cased words of 2+ "
        "characters, English stopwords removed, no stemming; k1 / b default to Pyserini's 0.9 / 0.4, the retriever "
        "mine-negatives --bm25 uses) and write the top K as a run: TREC (qid Q0 docid rank score tag, the default), "
        "MS MARCO or search's JSON lines, each query's passages in trec_eval's order. Evaluate it with "
        "`rankgen-jax evaluate`.")
    p.add_argument("--corpus", required=True, help=CORPUS_HELP)
    p.add_argument(
        "--queries",
        required=True,
        help='queries: TSV `qid<TAB>text`, JSON lines {"id", "text"} (or BEIR\'s / Tevatron\'s), or a BEIR '
        "folder with --split",
    )
    p.add_argument("--split", help="a BEIR folder's qrels split whose queries to rank (required with a BEIR folder)")
    p.add_argument("--k", type=int, default=100, help="passages per query (default 100)")
    p.add_argument("--output", required=True, help="run file to write")
    p.add_argument("--format", choices=RUN_FORMATS, default="trec", help="output format (default: trec)")
    p.add_argument("--run_tag", default="bm25", help="a TREC run's tag column (default bm25)")
    p.add_argument("--k1", type=float, default=bm25.DEFAULT_BM25_K1, help="BM25 k1 (default %(default)s, Pyserini's)")
    p.add_argument("--b", type=float, default=bm25.DEFAULT_BM25_B, help="BM25 b (default %(default)s, Pyserini's)")
    p.add_argument("--keep_stopwords", action="store_true", help="keep English stopwords in BM25's tokens")
    _add_title_flags(p, "what joins a passage's title to its text (default: a space)", "rank passages without titles")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_bm25, flag_of={"out_format": "--format"})


def _run_bm25(args) -> None:
    params = bm25.Bm25Params(args.k1, args.b, None if args.keep_stopwords else bm25.DEFAULT_STOPWORDS)
    results = bm25.bm25_search(args.corpus, args.queries, args.k, args.split, params, title_join=_title_join(args),
                               out_path=args.output, out_format=args.format, run_tag=args.run_tag,
                               progress=not args.no_progress)
    print(f"wrote the BM25 run of {len(results)} queries over {args.corpus} to {args.output}")


def add_evaluate(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate", help="trec_eval's measures of a run against qrels (one JSON object of means)",
        description="Evaluate a run (TREC `qid Q0 docid rank score tag`, MS MARCO `qid<TAB>pid<TAB>rank`, or "
        "search's JSON lines) against qrels (TREC `qid 0 docid rel`, MS MARCO's `qid docid`, BEIR's qrels/*.tsv, or "
        "a BEIR folder) with trec_eval's definitions (ir-measures over pytrec_eval): documents ranked by score, equal "
        "scores by docid descending; nDCG's gain is the label; every qrels query counts, those the run misses "
        "scoring 0 (trec_eval -c). Prints one JSON object: each measure's mean and the query counts.",
    )
    # dest: `args.run` is the handler every subcommand sets.
    p.add_argument("--run", dest="run_file", required=True, help="run file")
    p.add_argument("--qrels", required=True, help="qrels file or BEIR folder")
    p.add_argument("--split", help="a BEIR folder's qrels split (default: test)")
    p.add_argument("--measures", default=" ".join(DEFAULT_MEASURES),
                   help="ir-measures names, space-separated (default: \"%(default)s\"); MRR@10 is MS MARCO's name "
                   "for RR@10, AP(rel=2) etc. set the relevant level")
    p.add_argument("--missing_queries", choices=MISSING_QUERIES, default="zero",
                   help="qrels queries absent from the run: zero (default; trec_eval -c, ir-measures) or skip "
                   "(average over the queries in both, trec_eval without -c)")
    p.add_argument("--per_query", action="store_true", help="add \"per_query\": {qid: {measure: value}}")
    p.set_defaults(run=_run_evaluate)


def _run_evaluate(args) -> dict:
    result = evaluate_files(args.run_file, args.qrels, args.measures, split=args.split,
                            missing_queries=args.missing_queries, per_query=args.per_query)
    print(json.dumps(result))
    return result


def add_encode(subparsers) -> None:
    p = subparsers.add_parser(
        "encode",
        help="encode texts into an .npy of vectors, read the way the model records (released RankGen by default)",
        description="Encode texts (JSONL with a \"text\" field, or the side's \"prefix\" / \"suffix\" field; or "
        "plain text, one per line) with a dual encoder: a rankgen_jax checkpoint or training workdir, an exported "
        "folder, or any HF folder in the released RankGen format. Texts are read with the model's recorded input "
        "conventions (markers, lengths, kept end, truncation; the released RankGen ones where none are recorded), "
        "which one stderr line names; the flags below override them. Writes [N, D] float32 vectors in input order. "
        "Blank or malformed lines are skipped and counted on stderr; OUTPUT.ids.json then lists each row's "
        "input line number.",
    )
    p.add_argument("--model", required=True, help="checkpoint folder, training workdir or HF folder (dual encoder)")
    p.add_argument("--input", required=True, help="JSONL or plain-text file of texts")
    add_renamed_flag(p, "--side", "--kind", required=True, choices=ENCODE_SIDES,
                     help='the encoding side: prefix (the prefix marker, released: "pre ", 512 tokens), suffix '
                     '("suffi ", 128) or raw (the prefix side without a marker)')
    p.add_argument("--output", required=True, help=".npy file to write")
    p.add_argument("--batch_size", type=int, help="rows per batch (default: chosen from device memory)")
    p.add_argument("--max_length", type=int, help="tokens per text (default: the side's)")
    add_convention_flags(p)
    p.set_defaults(run=_run_encode)


def _run_encode(args) -> dict:
    return run_encode(args.model, args.input, args.side, args.output, batch_size=args.batch_size,
                      max_length=args.max_length, conventions=convention_args(args))


MINE_NEGATIVES_DESCRIPTION = (
    "Rank the corpus for each training query with BM25 (bm25s; lower-cased words of 2+ characters, "
    "English stopwords removed, no stemming, Lucene's BM25 with --bm25_k1 / --bm25_b, default 0.9 / 0.4 as "
    "Pyserini) or a dual encoder (--model, with --index an index folder of `rankgen-jax index`, else the corpus "
    "is encoded into an exact index), keep the passages at the --depth ranks (1-based, both ends, equal scores "
    "by docid descending), drop the query's positives (and with --drop_judged the passages its qrels judge), "
    "keep --negatives of them and write Tevatron JSON lines {query_id, query, positive_passages, "
    "negative_passages}. Resumable: rerunning the same command continues an interrupted run "
    "(OUTPUT.progress.json records what is done). The last stdout line is a JSON summary.")


def add_mine_negatives(subparsers) -> None:
    p = subparsers.add_parser("mine-negatives", description=MINE_NEGATIVES_DESCRIPTION,
                              help="hard negatives for training queries from BM25 or a dense model, as Tevatron JSONL")
    q = p.add_argument_group("training queries (a Tevatron file, or queries with qrels)")
    q.add_argument("--train_file", help="Tevatron training JSON lines (its positives are kept, its negatives "
                   "replaced)")
    q.add_argument("--queries", help="queries: TSV `qid<TAB>text`, JSON lines, or a BEIR folder (its --split's qrels "
                   "give the positives unless --qrels is given)")
    q.add_argument("--qrels", help="qrels (TREC, MS MARCO, BEIR file or folder): the positives of --queries; with "
                   "--train_file, what --drop_judged drops")
    q.add_argument("--split", help=f"a BEIR folder's qrels split (default: {TRAINING_SPLIT})")
    q.add_argument("--positive_level", type=int, default=1, help="qrels label of a positive (default: >= 1)")
    p.add_argument("--corpus", required=True, help=CORPUS_HELP)
    p.add_argument("--output", required=True, help="Tevatron JSON-lines file to write (or to resume)")
    r = p.add_argument_group("retriever (one of --bm25, --model)")
    r.add_argument("--bm25", action="store_true", help="BM25 over the corpus (bm25s, the retrieval extra)")
    r.add_argument("--bm25_k1", type=float, default=bm25.DEFAULT_BM25_K1, help="BM25 k1 (default %(default)s, "
                   "Pyserini's)")
    r.add_argument("--bm25_b", type=float, default=bm25.DEFAULT_BM25_B, help="BM25 b (default %(default)s, "
                   "Pyserini's)")
    r.add_argument("--bm25_keep_stopwords", action="store_true", help="keep English stopwords in BM25's tokens")
    r.add_argument("--model", help="dual encoder (checkpoint, training workdir or HF folder)")
    r.add_argument("--index", help="index folder built from this corpus with `rankgen-jax index` and --model "
                   "(default: encode the corpus into an exact index in memory)")
    r.add_argument("--batch_size", type=int, default=64, help="texts per encoder call (default 64)")
    m = p.add_argument_group("mining")
    m.add_argument("--depth", default=mining.DEFAULT_DEPTH,
                   help="ranks to take candidates from, 1-based, both ends: FROM-TO, TO (= 1-TO), or ranges joined "
                   "by commas (default: %(default)s)")
    m.add_argument("--negatives", type=int, default=mining.DEFAULT_NEGATIVES,
                   help="negatives per query (default %(default)s; fewer when the range holds fewer)")
    m.add_argument("--pick", choices=mining.PICKS, default="first",
                   help="first: the best-ranked candidates (default); sample: a seeded sample, written in rank order")
    m.add_argument("--seed", type=int, default=0, help="seed of --pick sample (default 0)")
    m.add_argument("--drop_judged", choices=mining.DROP_JUDGED,
                   help="also drop what the qrels judge for the query: relevant (label > 0 at any level) or all "
                   "(label 0 and negative labels too); default: only the positives are dropped")
    m.add_argument("--on_missing", choices=mining.ON_MISSING, default="error",
                   help="a positive or qrels passage missing from the corpus: error (default) or skip (counted)")
    _add_title_flags(m, "what joins a passage's title to its text for the retriever (default: a space)",
                     "the retriever reads passages without their titles")
    f = p.add_argument_group("false negatives (off unless a margin is given; sentence-transformers' rules)")
    f.add_argument("--absolute_margin", type=float,
                   help="drop a candidate whose score s has s + MARGIN > p, p the query's lowest positive score "
                   "(0: drop what scores above the positive)")
    f.add_argument("--relative_margin", type=float,
                   help="drop a candidate with s > p - |p| * MARGIN (e.g. 0.05, NV-Retriever's)")
    f.add_argument("--judge", choices=mining.JUDGES, default="retriever",
                   help="whose scores the margins compare: the retriever's (default) or --teacher's")
    f.add_argument("--teacher", help="the judge 'teacher': " + TEACHER_HELP + "; the written passages then carry "
                   "its scores")
    m.add_argument("--query_batch", type=int, default=mining.DEFAULT_QUERY_BATCH,
                   help="queries per written batch (default %(default)s)")
    m.add_argument("--overwrite", action="store_true", help="start over instead of resuming an existing --output")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    add_convention_flags(p)
    p.set_defaults(run=_run_mine_negatives)


def _run_mine_negatives(args) -> dict:
    if args.bm25 == (args.model is not None):
        raise RankgenError("give one retriever: --bm25 or --model")
    summary = mining.mine_negatives(
        args.output, args.corpus,
        mining.TrainingQuerySource(args.train_file, args.queries, args.qrels, args.split, args.positive_level,
                                   args.on_missing),
        mining.MiningRetriever(args.model, args.index,
                               bm25.Bm25Params(args.bm25_k1, args.bm25_b,
                                               None if args.bm25_keep_stopwords else bm25.DEFAULT_STOPWORDS),
                               args.batch_size, convention_args(args)),
        mining.NegativePicking(args.depth, args.negatives, args.pick, args.seed, args.drop_judged),
        mining.FalseNegativeFilter(args.absolute_margin, args.relative_margin, args.judge, args.teacher),
        title_join=_title_join(args), query_batch=args.query_batch, overwrite=args.overwrite,
        progress=not args.no_progress)
    print(json.dumps(summary))
    return summary


SCORE_CANDIDATES_DESCRIPTION = (
    "Score candidate passages with a teacher and write a Tevatron training file whose every passage carries its "
    "teacher \"score\" (Tevatron's distillation field): KL, MarginMSE, ListMLE on the teacher's order "
    "(RetrievalData.list_labels='teacher') and CL-DRD train from it. Input: a Tevatron training file (e.g. from "
    "mine-negatives), or a run (TREC, MS MARCO or search's JSON lines) with --queries, --corpus and --qrels: each "
    'query\'s first --depth passages are its candidates (each keeps its "rank"), those the qrels judge relevant '
    "its positives (relevant ones the run missed are added). The teacher: a cross encoder, a bi-encoder (scored "
    "by its own similarity) or a file of scores; a pair a score file lacks is left out and counted. Resumable (OUTPUT.progress.json); --num_shards / "
    "--shard_index split the queries over processes or hosts. The last stdout line is a JSON summary."
)


def add_score_candidates(subparsers) -> None:
    p = subparsers.add_parser("score-candidates", description=SCORE_CANDIDATES_DESCRIPTION,
                              help="teacher scores for a run's or a training file's candidates, as Tevatron JSONL")
    p.add_argument("--teacher", required=True, help=TEACHER_HELP)
    p.add_argument("--output", required=True, help="Tevatron JSON-lines file to write (or to resume)")
    p.add_argument("--train_file", help="Tevatron training file whose passages to score")
    p.add_argument("--run", dest="run_file", help="run whose candidates to score (with --queries, --corpus, --qrels)")
    p.add_argument("--queries", help="queries: TSV, JSON lines or a BEIR folder")
    p.add_argument("--corpus", help=CORPUS_HELP)
    p.add_argument("--qrels", help="qrels (default: the BEIR folder of --queries)")
    p.add_argument("--split", help=f"a BEIR folder's qrels split (default: {TRAINING_SPLIT}: the output is "
                   "training data)")
    p.add_argument("--depth", type=int, default=200, help="candidates per query from the run (default 200)")
    p.add_argument("--positive_level", type=int, default=1, help="qrels label of a positive (default: >= 1)")
    p.add_argument("--query_length", type=int, help="a rankgen_jax teacher's query tokens (default: its "
                   "conventions'; a sentence-transformers bi-encoder reads with its own max_seq_length)")
    p.add_argument("--candidate_length", type=int, help="a rankgen_jax teacher's passage tokens (default: its "
                   "conventions')")
    p.add_argument("--batch_size", type=int, default=64, help="pairs per cross-encoder call, texts per bi-encoder "
                   "batch (default 64)")
    p.add_argument("--query_batch", type=int, default=64, help="queries per written batch (default 64)")
    p.add_argument("--num_shards", type=int, default=1, help="split the queries into this many shards (default 1)")
    p.add_argument("--shard_index", type=int, default=0, help="the shard this process scores: the queries at "
                   "positions p %% num_shards == shard_index (default 0)")
    _add_title_flags(p, "what joins a passage's title to its text (default: a space)", "score passages without titles")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming an existing --output")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_score_candidates)


def _run_score_candidates(args) -> dict:
    from rankgen_jax.retrieval.teacher import CandidateSource, load_teacher, score_candidates

    teacher = load_teacher(args.teacher, args.query_length, args.candidate_length, args.batch_size,
                           corpus=args.corpus, title_join=_title_join(args))
    candidates = CandidateSource(args.train_file, args.run_file, args.queries, args.corpus, args.qrels, args.split,
                                 args.depth, args.positive_level)
    summary = score_candidates(args.output, teacher, candidates, title_join=_title_join(args),
                               num_shards=args.num_shards, shard_index=args.shard_index, query_batch=args.query_batch,
                               overwrite=args.overwrite, progress=not args.no_progress)
    print(json.dumps(summary))
    return summary
