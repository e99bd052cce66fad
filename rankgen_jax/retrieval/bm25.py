"""BM25 over a passage corpus: the retriever of `mine-negatives --bm25`, and the `bm25` command's TREC runs (the
baseline row of a retrieval table).

bm25s, Lucene's BM25 variant (idf log(1 + (N - df + 0.5) / (df + 0.5))), with
k1 = 0.9 and b = 0.4 by default: Anserini's / Pyserini's defaults, with which
MS MARCO and Tevatron BM25 negatives are usually mined. Text is tokenised as
bm25s.tokenize does: lower-cased, scikit-learn's token pattern
`(?u)\\b\\w\\w+\\b` (words of 2+ word characters), bm25s's English stopwords
removed (stopwords=None keeps them), no stemming (Lucene's English analyzer
stems with Porter; PyStemmer is not a dependency here), so rankings are close
to, not equal to, Pyserini's. A query term counts once per occurrence. A
passage holding no query term scores 0 and is not ranked, as in Lucene.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.retrieval_files import (DEFAULT_TITLE_JOIN, RUN_FORMATS, read_passages, read_queries,
                                              require_split, write_run)
from rankgen_jax.errors import RankgenError

DEFAULT_BM25_K1 = 0.9
DEFAULT_BM25_B = 0.4
DEFAULT_STOPWORDS = "en"


def ranked_order(rows: Iterable[int], scores: np.ndarray, ids: list[str], depth: int) -> list[tuple[int, float]]:
    """(row, score) of the best `depth` rows, by score descending, equal scores by id descending (trec_eval's order)."""
    return sorted(((int(r), float(scores[i])) for i, r in enumerate(rows)), key=lambda x: (x[1], ids[x[0]]),
                  reverse=True)[:depth]


@dataclasses.dataclass(frozen=True)
class Bm25Params:
    """BM25's k1 and b (Pyserini's defaults), and the stopword list bm25s drops ("en"; None keeps every token)."""

    k1: float = DEFAULT_BM25_K1
    b: float = DEFAULT_BM25_B
    stopwords: str | None = DEFAULT_STOPWORDS

    def __post_init__(self):
        if self.stopwords not in (DEFAULT_STOPWORDS, None):
            raise RankgenError(f"stopwords must be {DEFAULT_STOPWORDS!r} (bm25s's English list) or None")


class Bm25Retriever:
    """bm25s over the corpus texts; rank() gives each query's passages with a query term, best first."""

    def __init__(self, texts: list[str], ids: list[str], params: Bm25Params = Bm25Params(), progress: bool = True):
        # Optional (the retrieval extra), and bm25s runs a jax op when imported (its top-k backend), which
        # must come after the CLI sets XLA's flags.
        import bm25s

        # bm25s sets its logger to DEBUG on import, which prints its steps wherever logging is configured.
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self._bm25s = bm25s
        self.ids = ids
        self.stopwords = params.stopwords
        self.retriever = bm25s.BM25(k1=params.k1, b=params.b, method="lucene")
        self.retriever.index(bm25s.tokenize(texts, stopwords=params.stopwords, show_progress=progress),
                             show_progress=progress)

    def query_tokens(self, query: str) -> list[str]:
        return self._bm25s.tokenize([query], stopwords=self.stopwords, return_ids=False, show_progress=False)[0]

    def scores(self, query: str) -> np.ndarray:
        """BM25 scores [N] of every passage for a query (zeros when no query term is in the corpus)."""
        token_ids = self.retriever.get_tokens_ids(self.query_tokens(query))
        if not token_ids:
            return np.zeros(len(self.ids), np.float32)
        return self.retriever.get_scores_from_ids(token_ids)

    def passage_scores(self, queries: list[str], rows: list[list[int]]) -> list[np.ndarray]:
        """BM25 scores of the given corpus rows for each query."""
        return [np.asarray(self.scores(query), np.float64)[r] for query, r in zip(queries, rows)]

    def rank(self, queries: list[str], depth: int) -> list[list[tuple[int, float]]]:
        out = []
        for query in queries:
            scores_N = self.scores(query)
            rows = np.flatnonzero(scores_N > 0)
            if len(rows) > depth:
                # Every row scoring at least the depth-th best score, so that ties at the cut break by id.
                kth = np.partition(scores_N[rows], len(rows) - depth)[len(rows) - depth]
                rows = rows[scores_N[rows] >= kth]
            out.append(ranked_order(rows, scores_N[rows], self.ids, depth))
        return out


def bm25_search(corpus_path: str, queries_path: str, k: int, split: str | None = None, params: Bm25Params = Bm25Params(),
                title_join: str | None = DEFAULT_TITLE_JOIN, out_path: str | None = None, out_format: str = "trec",
                run_tag: str = "bm25", progress: bool = True) -> list[dict[str, Any]]:
    """Each query's top-k passages by BM25: [{"query_id", "query", "ids", "scores"}], as `search` returns them.

    Passages are the corpus's (titles joined with title_join, None drops them);
    queries a file, or the queries a BEIR folder's `split` judges (which must be
    named: a run on test queries by default would be one on the wrong split
    when meant for training). With out_path, the run is written there in
    out_format ("trec", "msmarco" or "jsonl"; retrieval_files.run_lines), each
    query's passages in trec_eval's order.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    if out_format not in RUN_FORMATS:
        raise RankgenError(f"unknown output format {out_format!r}: expected one of {RUN_FORMATS}")
    for given in (corpus_path, queries_path):
        if out_path is not None and Path(given).resolve() == Path(out_path).resolve():
            raise RankgenError(f"{out_path}: the output would overwrite an input")
    require_split(queries_path, split)
    queries = read_queries(queries_path, split=split)
    corpus = read_passages(corpus_path)
    retriever = Bm25Retriever(corpus.joined(title_join), corpus.ids, params, progress)
    texts = queries.joined(DEFAULT_TITLE_JOIN)
    results = []
    for query_id, query in tqdm(list(zip(queries.ids, texts)), unit="query", desc="bm25", file=sys.stderr,
                                dynamic_ncols=True, disable=not progress):
        ranked = retriever.rank([query], k)[0]
        results.append({"query_id": query_id, "query": query, "ids": [corpus.ids[row] for row, _ in ranked],
                        "scores": [score for _, score in ranked]})
    if out_path is not None:
        write_run(out_path, results, out_format, run_tag)
    return results
