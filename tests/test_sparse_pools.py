"""Tf-idf and keyword-overlap candidate pools: known top-1, scores equal a dense recomputation, exclusion, ties, k."""

import math
from collections import Counter

import numpy as np
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.sparse import TfidfIndex, keyword_overlap_search, tokenize, top_k

CORPUS = [
    "The cat sat on the mat.",
    "Dogs chase cats in the park.",
    "Stock markets fell sharply today.",
    "The cat and the dog play.",
    "Markets rallied after the stock report, and the stock rose.",
]


def dense_tfidf(texts, queries, sublinear=False):
    """Cosine scores [Q, N] recomputed with plain dense NumPy from the definitions."""
    docs = [tokenize(t) for t in texts]
    vocab = sorted({w for d in docs for w in d})
    col = {w: i for i, w in enumerate(vocab)}

    def counts(tokens_list):
        out = np.zeros((len(tokens_list), len(vocab)))
        for r, tokens in enumerate(tokens_list):
            for w, c in Counter(tokens).items():
                if w in col:
                    out[r, col[w]] = c
        return out

    doc_counts = counts(docs)
    df = (doc_counts > 0).sum(axis=0)
    idf = np.log((1 + len(texts)) / (1 + df)) + 1

    def weigh(c):
        tf = np.where(c > 0, 1 + np.log(np.maximum(c, 1)), 0) if sublinear else c
        w = tf * idf
        norms = np.linalg.norm(w, axis=1, keepdims=True)
        return np.divide(w, norms, out=np.zeros_like(w), where=norms > 0)

    return weigh(counts([tokenize(q) for q in queries])) @ weigh(doc_counts).T


def test_known_top1():
    index = TfidfIndex(CORPUS)
    scores, ids = index.search(["a cat on a mat", "stock markets", "dog in a park"], k=2)
    assert ids.shape == (3, 2) and scores.dtype == np.float32
    assert ids[:, 0].tolist() == [0, 4, 1]
    # "stock markets": doc 4 says "stock" twice, which outweighs its greater length against doc 2.
    assert ids[1].tolist() == [4, 2]


@pytest.mark.parametrize("sublinear", [False, True])
def test_scores_equal_dense_recomputation(sublinear):
    queries = ["the cat", "stock stock markets report", "play with the dog and the cat", "unknown words only"]
    index = TfidfIndex(CORPUS, sublinear_tf=sublinear)
    want = dense_tfidf(CORPUS, queries, sublinear)
    scores, ids = index.search(queries, k=len(CORPUS))
    for q in range(len(queries)):
        np.testing.assert_allclose(scores[q], want[q][ids[q]], rtol=1e-5, atol=1e-6)
        # Every row is a permutation of the corpus, best first, ties by lower id.
        assert sorted(ids[q].tolist()) == list(range(len(CORPUS)))
        assert ids[q].tolist() == sorted(range(len(CORPUS)), key=lambda i: (-round(want[q][i], 5), i))
    # idf: smoothed log((1 + N) / (1 + df)) + 1; "the" is in 4 of 5 passages.
    assert index.idf_V[index.vocabulary["the"]] == pytest.approx(math.log(6 / 5) + 1)
    norms = np.sqrt(np.asarray(index.matrix.multiply(index.matrix).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)


def test_exclusion_and_padding():
    index = TfidfIndex(CORPUS)
    _, ids = index.search(["stock markets"], k=2, exclude=[[2]])
    assert ids[0].tolist() == [4, 0]  # gold 2 left out; the rest score 0 and follow in id order
    _, ids = index.search(["stock markets", "mat"], k=1, exclude=[4, None])  # a bare int per query works
    assert ids[:, 0].tolist() == [2, 0]
    # Exclusions leave fewer than k candidates: padded with -1 / -inf.
    scores, ids = index.search(["cat"], k=3, exclude=[[0, 1, 2, 3]])
    assert ids[0].tolist() == [4, -1, -1] and np.isneginf(scores[0, 1:]).all()
    with pytest.raises(RankgenError, match="outside the corpus"):
        index.search(["cat"], k=1, exclude=[[5]])
    with pytest.raises(RankgenError, match="1 entries but there are 2 queries"):
        index.search(["cat", "dog"], k=1, exclude=[[0]])


def test_ties_are_deterministic_lower_id_first():
    index = TfidfIndex(["a b", "c d", "a b", "a b", "c d"])
    scores, ids = index.search(["a"], k=5)
    assert ids[0].tolist() == [0, 2, 3, 1, 4]
    assert scores[0, 0] == scores[0, 1] == scores[0, 2] and scores[0, 3] == scores[0, 4] == 0
    # A cut inside a tie keeps the lowest ids.
    assert index.search(["a"], k=2)[1][0].tolist() == [0, 2]
    assert index.search(["c"], k=1)[1][0].tolist() == [1]
    # top_k directly: three entries tie at 5 for two slots.
    scores_k, ids_k = top_k(np.array([1.0, 5.0, 5.0, 5.0, 0.0]), 2)
    assert ids_k.tolist() == [1, 2] and scores_k.tolist() == [5.0, 5.0]


def test_k_larger_than_corpus_and_empty_query():
    index = TfidfIndex(CORPUS)
    scores, ids = index.search(["cat", ""], k=100)
    assert ids.shape == scores.shape == (2, len(CORPUS))  # k is clipped to the corpus size
    # An empty query matches nothing: every passage scores 0, in id order.
    assert ids[1].tolist() == list(range(len(CORPUS))) and (scores[1] == 0).all()
    scores, ids = index.search([], k=3)
    assert ids.shape == (0, 3)
    with pytest.raises(RankgenError, match="k must be a positive integer"):
        index.search(["cat"], k=0)
    with pytest.raises(RankgenError, match="not a single string"):
        index.search("cat", k=1)
    with pytest.raises(RankgenError, match="at least one text"):
        TfidfIndex([])


def test_keyword_overlap_counts_distinct_content_words():
    query = "The cat chased the dog in the park, the dog!"
    # Content words {cat, chased, dog, park} (no stemming: "cats" != "cat"):
    # doc 0 cat -> 1; doc 1 park -> 1; doc 2 -> 0; doc 3 cat, dog -> 2; doc 4 -> 0.
    scores, ids = keyword_overlap_search([query], CORPUS, k=5)
    assert ids[0].tolist() == [3, 0, 1, 2, 4]
    assert scores[0].tolist() == [2.0, 1.0, 1.0, 0.0, 0.0]
    # Stopwords only: nothing counts; with no stopword list, "the" is in docs 0, 1, 3, 4.
    assert keyword_overlap_search(["the"], CORPUS, k=5)[0][0].tolist() == [0.0] * 5
    scores, ids = keyword_overlap_search(["the"], CORPUS, k=4, stopwords=())
    assert ids[0].tolist() == [0, 1, 3, 4] and scores[0].tolist() == [1.0] * 4
    # Exclusion and clipping as in the tf-idf search.
    _, ids = keyword_overlap_search([query, ""], CORPUS, k=50, exclude=[[3], []])
    assert ids.shape == (2, 5) and ids[0].tolist() == [0, 1, 2, 4, -1]
    assert ids[1].tolist() == [0, 1, 2, 3, 4]
