"""Lexical scoring without a dense model: tf-idf cosine and keyword ("concept") overlap candidate pools, and the
word-overlap baselines of suffix identification and generation re-ranking: the RankGen paper's token overlap
(`token_overlap_scores`) and this project's unigram-overlap F1 (`unigram_overlap_scores`).

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
import string
from collections import Counter
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

# NLTK's English stop word list (nltk_data corpora/stopwords "english", the 179 words of 2022), which the
# RankGen paper's token overlap removes. Only its 153 entries without an apostrophe can match a word of
# `normalized_words`, which has no punctuation left (docs/design/rankgen.md, 'RankGen generation metrics').
NLTK_ENGLISH_STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves
he him his himself she she's her hers herself it it's its itself they them their theirs themselves
what which who whom this that that'll these those am is are was were be been being have has had
having do does did doing a an the and but if or because as until while of at by for with about
against between into through during before after above below to from up down in out on off over
under again further then once here there when where why how all any both each few more most other
some such no nor not only own same so than too very s t can will just don don't should should've
now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn
shouldn't wasn wasn't weren weren't won won't wouldn wouldn't
""".split())
# The paper's normalisation deletes ASCII punctuation (no space put in its place) and the articles.
ASCII_PUNCTUATION = str.maketrans("", "", string.punctuation)
ARTICLE_RE = re.compile(r"\b(a|an|the)\b")


def tokenize(text: str) -> list[str]:
    """Lowercased words of a text (letters and digits; punctuation and "_" split words)."""
    return WORD_RE.findall(text.lower())


def unigrams(text: str) -> set[str]:
    """The set of a text's words as `tokenize` finds them (so "don't" -> {"don", "t"})."""
    return set(tokenize(text))


def unigram_overlap_scores(prefix: str, candidates: Sequence[str]) -> np.ndarray:
    """This project's unigram-overlap baseline: F1 of the word sets of the prefix and each candidate.

    Not the RankGen paper's baseline (that is `token_overlap_scores`): words
    are `tokenize`'s (letters and digits, so "don't" -> "don", "t"), stop
    words and articles are kept, and repeats count once. With P and C the
    unigram sets, precision = |P & C| / |C|, recall = |P & C| / |P|, score =
    2 p r / (p + r) (0 when either set is empty or they share nothing). F1
    rather than precision alone, so that a short candidate made only of
    common words does not score a perfect 1.
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


def normalized_words(text: str) -> list[str]:
    """The RankGen paper's words of a text: lower case, ASCII punctuation deleted, "a" / "an" / "the" removed,
    split on whitespace (so "Don't stop, the END." -> ["dont", "stop", "end"])."""
    return ARTICLE_RE.sub(" ", text.lower().translate(ASCII_PUNCTUATION)).split()


def token_overlap(text: str, prefix: str, stopwords: Collection[str] = NLTK_ENGLISH_STOPWORDS) -> float:
    """The RankGen paper's token overlap of a text with its prefix: the precision of the text's words.

    Both sides are `normalized_words` without stop words; the score is the
    number of the text's words matched by a word of the prefix, each prefix
    word matching at most as often as it occurs there, over the number of the
    text's words. 1.0 when both sides have no word left, 0.0 when only one of
    them has.
    """
    stop = stopwords if isinstance(stopwords, (set, frozenset)) else frozenset(stopwords)
    words = [w for w in normalized_words(text) if w not in stop]
    prefix_words = [w for w in normalized_words(prefix) if w not in stop]
    if not words and not prefix_words:
        return 1.0
    matched = sum((Counter(words) & Counter(prefix_words)).values())
    return matched / len(words) if matched else 0.0


def token_overlap_scores(prefix: str, candidates: Sequence[str]) -> np.ndarray:
    """The RankGen paper's token-overlap baseline: `token_overlap` of each candidate with the prefix, [C] float64."""
    return np.array([token_overlap(candidate, prefix) for candidate in candidates], np.float64)


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
