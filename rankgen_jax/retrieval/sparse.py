"""Lexical scoring without a dense model: tf-idf cosine and keyword ("concept") overlap candidate pools, and the
unigram-overlap baseline of suffix identification and generation re-ranking.

Both searches return fixed-shape arrays (scores [Q, k], ids [Q, k]) with
k clipped to the corpus size, rows sorted by score (highest first) and ties
broken by lower id first, so pools are the same on every run. Every corpus
passage is a candidate, also those scoring 0 (no shared word): they come
after all matches, in id order. Ids excluded for a query (e.g. its gold) are
never returned; when exclusions leave fewer than k candidates, the row is
padded with id -1 and score -inf.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from rankgen_jax.errors import RankgenError

# Runs of letters / digits (Unicode-aware); "_" is a word character for \w but not a word part here.
WORD_RE = re.compile(r"[^\W_]+")
# Dense score blocks stay below this many entries (float32: 64 MiB), whatever the corpus size.
MAX_BLOCK_ENTRIES = 1 << 24

# Function words that carry no topic; the "concept" overlap ignores them.
ENGLISH_STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most my
myself no nor not now of off on once only or other our ours ourselves out over own same she should so
some such than that the their theirs them themselves then there these they this those through to too
under until up very was we were what when where which while who whom why will with would you your
yours yourself yourselves s t d ll m re ve
""".split())


def tokenize(text: str) -> list[str]:
    """Lowercased words of a text (letters and digits; punctuation and "_" split words)."""
    return WORD_RE.findall(text.lower())


def unigrams(text: str) -> set[str]:
    """The set of a text's words as `tokenize` finds them (so "don't" -> {"don", "t"})."""
    return set(tokenize(text))


def unigram_overlap_scores(prefix: str, candidates: Sequence[str]) -> np.ndarray:
    """The RankGen paper's unigram-overlap baseline: F1 of the word sets of the prefix and each candidate.

    With P and C the unigram sets, precision = |P & C| / |C|, recall =
    |P & C| / |P|, score = 2 p r / (p + r) (0 when either set is empty or they
    share nothing). F1 rather than precision alone, so that a short candidate
    made only of common words does not score a perfect 1.
    """
    prefix_words = unigrams(prefix)
    scores_C = np.zeros(len(candidates), np.float32)
    for i, candidate in enumerate(candidates):
        words = unigrams(candidate)
        common = len(prefix_words & words)
        if common:
            precision, recall = common / len(words), common / len(prefix_words)
            scores_C[i] = 2 * precision * recall / (precision + recall)
    return scores_C


def _check_texts(texts: Sequence[str], what: str) -> list[str]:
    if isinstance(texts, str):
        raise RankgenError(f"{what} must be a list of strings, not a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise RankgenError(f"{what}[{i}] is a {type(t).__name__}, not a string")
    return texts


def _check_exclude(exclude: Sequence[Iterable[int]] | None, num_queries: int, num_docs: int) -> list[np.ndarray]:
    """Per-query arrays of excluded ids (empty when exclude is None); bad ids are a RankgenError."""
    if exclude is None:
        return [np.zeros(0, np.int64)] * num_queries
    if len(exclude) != num_queries:
        raise RankgenError(f"exclude has {len(exclude)} entries but there are {num_queries} queries")
    out = []
    for q, ids in enumerate(exclude):
        try:
            if ids is None:
                ids_E = np.zeros(0, np.int64)
            elif np.isscalar(ids):  # one gold id per query, given as a plain int
                ids_E = np.array([ids], np.int64)
            else:
                ids_E = np.asarray(list(ids), np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise RankgenError(f"exclude[{q}] must be corpus row ids (ints), got {ids!r}") from None
        bad = ids_E[(ids_E < 0) | (ids_E >= num_docs)]
        if bad.size:
            raise RankgenError(f"exclude[{q}]: id {int(bad[0])} is outside the corpus (0..{num_docs - 1})")
        out.append(ids_E)
    return out


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise RankgenError(f"k must be a positive integer, got {k!r}")
    return int(k)


def top_k(scores_N: np.ndarray, k: int, excluded_E: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores [k], ids [k]) of the k best entries, ties by lower id; padded with -inf / -1 when too few remain.

    O(N): a partition finds the k-th best value, everything strictly above it
    is taken, and the remaining slots go to the lowest ids tied at that value
    (argpartition alone would pick an arbitrary subset of the tied ids).
    """
    scores_N = np.array(scores_N, np.float32)  # a copy: excluded entries are overwritten below
    if excluded_E is not None and excluded_E.size:
        scores_N[excluded_E] = -np.inf
    available = int(np.count_nonzero(scores_N > -np.inf))
    take = min(k, available)
    ids_k = np.full(k, -1, np.int64)
    out_k = np.full(k, -np.inf, np.float32)
    if take == 0:
        return out_k, ids_k
    kth = np.partition(scores_N, scores_N.size - take)[scores_N.size - take]
    above_A = np.flatnonzero(scores_N > kth)
    tied_T = np.flatnonzero(scores_N == kth)[: take - above_A.size]
    chosen = np.concatenate([above_A, tied_T])
    # lexsort: last key is primary (score descending), then id ascending.
    order = np.lexsort((chosen, -scores_N[chosen]))
    ids_k[:take] = chosen[order]
    out_k[:take] = scores_N[ids_k[:take]]
    return out_k, ids_k


class TfidfIndex:
    """Tf-idf vectors of a corpus (CSR, L2-normalised rows) searched by cosine similarity.

    idf = log((1 + N) / (1 + df)) + 1 (smoothed, as if one extra passage held
    every word, so no idf is 0 or infinite); tf is the raw count, or
    1 + log(count) with sublinear_tf. Words seen only in queries are ignored.
    """

    def __init__(self, texts: Sequence[str], sublinear_tf: bool = False):
        texts = _check_texts(texts, "texts")
        if not texts:
            raise RankgenError("TfidfIndex needs at least one text")
        self.sublinear_tf = bool(sublinear_tf)
        self.vocabulary: dict[str, int] = {}
        counts = self._counts(texts, grow=True)
        num_docs = len(texts)
        # Document frequency: the number of rows with a non-zero entry in each column.
        df_V = np.bincount(counts.indices, minlength=len(self.vocabulary))
        self.idf_V = (np.log((1.0 + num_docs) / (1.0 + df_V)) + 1.0).astype(np.float64)
        self.matrix = self._weigh(counts)

    @property
    def num_docs(self) -> int:
        return self.matrix.shape[0]

    def _counts(self, texts: list[str], grow: bool) -> sp.csr_matrix:
        """Raw word counts [len(texts), V] (CSR); new words join the vocabulary only when `grow`."""
        cols, indptr = [], [0]
        for text in texts:
            for word in tokenize(text):
                col = self.vocabulary.get(word)
                if col is None:
                    if not grow:
                        continue
                    col = self.vocabulary[word] = len(self.vocabulary)
                cols.append(col)
            indptr.append(len(cols))
        data = np.ones(len(cols), np.float64)
        counts = sp.csr_matrix((data, np.asarray(cols, np.int64), np.asarray(indptr, np.int64)),
                               shape=(len(texts), len(self.vocabulary)))
        counts.sum_duplicates()  # repeated words become one entry holding their count
        return counts

    def _weigh(self, counts: sp.csr_matrix) -> sp.csr_matrix:
        """tf * idf with L2-normalised rows (rows without any known word stay all zero)."""
        weights = counts.astype(np.float64, copy=True)
        if self.sublinear_tf:
            weights.data = 1.0 + np.log(weights.data)
        weights.data *= self.idf_V[weights.indices]
        norms_R = np.sqrt(np.asarray(weights.multiply(weights).sum(axis=1)).ravel())
        row_of_entry = np.repeat(np.arange(weights.shape[0]), np.diff(weights.indptr))
        weights.data /= norms_R[row_of_entry]
        return weights.tocsr()

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Tf-idf rows [len(texts), V] of new texts with this corpus's vocabulary and idf."""
        return self._weigh(self._counts(_check_texts(texts, "texts"), grow=False))

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Iterable[int]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cosine scores [Q, k'], ids [Q, k']) with k' = min(k, corpus size); exclude[q]: ids never returned for q."""
        queries = _check_texts(queries, "queries")
        k = min(_check_k(k), self.num_docs)
        excluded = _check_exclude(exclude, len(queries), self.num_docs)
        query_QxV = self.transform(queries)
        corpus_T = self.matrix.T.tocsc()
        scores_QxK = np.full((len(queries), k), -np.inf, np.float32)
        ids_QxK = np.full((len(queries), k), -1, np.int64)
        block = max(1, MAX_BLOCK_ENTRIES // self.num_docs)
        for start in range(0, len(queries), block):
            dense_BxN = (query_QxV[start : start + block] @ corpus_T).toarray()
            for row, scores_N in enumerate(dense_BxN):
                q = start + row
                scores_QxK[q], ids_QxK[q] = top_k(scores_N, k, excluded[q])
        return scores_QxK, ids_QxK


def keyword_overlap_search(
    queries: Sequence[str],
    texts: Sequence[str],
    k: int,
    stopwords: Collection[str] = ENGLISH_STOPWORDS,
    exclude: Sequence[Iterable[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(overlap counts [Q, k'] as float32, ids [Q, k']): candidates ranked by how many distinct query words they hold.

    Query words are lowercased and de-duplicated, stopwords removed (pass an
    empty set to keep them); a candidate scores the number of those words it
    contains at least once. k' = min(k, len(texts)).
    """
    queries = _check_texts(queries, "queries")
    texts = _check_texts(texts, "texts")
    if not texts:
        raise RankgenError("keyword_overlap_search needs at least one text")
    k = min(_check_k(k), len(texts))
    excluded = _check_exclude(exclude, len(queries), len(texts))
    stop = frozenset(w.lower() for w in stopwords)
    # Inverted index: word -> ids of the texts containing it (each id once).
    postings: dict[str, list[int]] = {}
    for doc_id, text in enumerate(texts):
        for word in set(tokenize(text)) - stop:
            postings.setdefault(word, []).append(doc_id)
    arrays = {word: np.asarray(ids, np.int64) for word, ids in postings.items()}
    scores_QxK = np.full((len(queries), k), -np.inf, np.float32)
    ids_QxK = np.full((len(queries), k), -1, np.int64)
    for q, query in enumerate(queries):
        counts_N = np.zeros(len(texts), np.float32)
        for word in set(tokenize(query)) - stop:
            ids = arrays.get(word)
            if ids is not None:
                counts_N[ids] += 1  # ids are unique per word, so fancy-index += counts each once
        scores_QxK[q], ids_QxK[q] = top_k(counts_N, k, excluded[q])
    return scores_QxK, ids_QxK
