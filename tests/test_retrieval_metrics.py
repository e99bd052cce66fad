"""Ranking metrics (MRR, recall, graded nDCG, AP/MAP, evaluate_run) and BLEU / ROUGE on hand-computed cases."""

import math

import numpy as np
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.retrieval_metrics import (average_precision, binarize, evaluate_run, mean_average_precision,
                                           metric_scores, mrr_at_k, ndcg_at_k, recall_at_k, rouge, sentence_bleu)

LOG2_3 = math.log2(3)  # discount at rank 2: 1.5849625


def test_mrr_at_k_and_cut_off():
    ranked = ["a", "b", "c", "d"]
    assert mrr_at_k(ranked, {"c"}, k=10) == pytest.approx(1 / 3)  # first relevant at rank 3
    assert mrr_at_k(ranked, {"c"}, k=2) == 0.0  # rank 3 is past the cut-off
    assert mrr_at_k(ranked, {"b", "d"}, k=10) == pytest.approx(1 / 2)  # only the first hit counts
    assert mrr_at_k(ranked, {"c"}, k=None) == pytest.approx(1 / 3)
    # A repeated id counts at its first position only: [a, b] -> b at rank 2, not 3.
    assert mrr_at_k(["a", "a", "b"], {"b"}, k=10) == pytest.approx(1 / 2)
    assert mrr_at_k(ranked, set(), k=10) == 0.0  # nothing to find


def test_recall_at_k():
    ranked = ["a", "b", "c", "d", "e"]
    relevant = {"b", "d", "x"}  # x is never retrieved
    assert recall_at_k(ranked, relevant, k=2) == pytest.approx(1 / 3)  # b
    assert recall_at_k(ranked, relevant, k=5) == pytest.approx(2 / 3)  # b, d
    assert recall_at_k(ranked, relevant, k=100) == pytest.approx(2 / 3)  # k past the list is fine
    assert recall_at_k(ranked, set(), k=5) == 0.0


def test_ndcg_with_graded_labels():
    ranked = ["d1", "d2", "d3", "d4"]
    gains = {"d1": 0, "d2": 3, "d3": 1, "d5": 2}  # d4 unjudged (gain 0), d5 judged but not retrieved
    # DCG@3 = (2^0-1)/log2(2) + (2^3-1)/log2(3) + (2^1-1)/log2(4) = 0 + 7/1.5849625 + 1/2 = 4.9165082
    # ideal: labels sorted 3, 2, 1 -> 7/1 + 3/1.5849625 + 1/2 = 9.3927893
    dcg = 7 / LOG2_3 + 0.5
    ideal = 7 + 3 / LOG2_3 + 0.5
    assert ndcg_at_k(ranked, gains, k=3) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(ranked, gains, k=3) == pytest.approx(0.5234344, abs=1e-6)
    # k=1: the top passage has label 0 -> 0.
    assert ndcg_at_k(ranked, gains, k=1) == 0.0
    # k=2: DCG = 7/1.5849625 = 4.4165082, ideal@2 = 7 + 3/1.5849625 = 8.8927893 -> 0.4966390
    assert ndcg_at_k(ranked, gains, k=2) == pytest.approx(0.4966390, abs=1e-6)
    # The ideal ordering scores 1 at any cut-off.
    assert ndcg_at_k(["d2", "d5", "d3", "d1"], gains, k=3) == pytest.approx(1.0)
    assert ndcg_at_k(["d2", "d5", "d3", "d1"], gains, k=None) == pytest.approx(1.0)
    # No positive label at all: nothing to normalise by -> 0.
    assert ndcg_at_k(ranked, {"d1": 0}, k=3) == 0.0
    assert ndcg_at_k(ranked, {}, k=3) == 0.0
    # Negative labels count as 0 (nDCG stays in [0, 1]).
    assert ndcg_at_k(["x", "y"], {"x": -1, "y": 1}, k=2) == pytest.approx((1 / LOG2_3) / 1)


def test_average_precision_and_map():
    ranked = ["a", "b", "c", "d", "e"]
    relevant = {"a", "c", "z"}  # hits at ranks 1 and 3; z never retrieved
    # AP = (1/1 + 2/3) / 3 = 5/9
    assert average_precision(ranked, relevant) == pytest.approx(5 / 9)
    # Cut at k=1: only the hit at rank 1 -> 1/3.
    assert average_precision(ranked, relevant, k=1) == pytest.approx(1 / 3)
    # Second query: hit at rank 2 -> AP = 1/2. MAP = (5/9 + 1/2) / 2 = 19/36.
    assert mean_average_precision([ranked, ["x", "y"]], [relevant, {"y"}]) == pytest.approx(19 / 36)
    assert average_precision(ranked, set()) == 0.0
    # In MAP every given query counts: (1/2 + 0) / 2.
    assert mean_average_precision([["x", "y"], ["x"]], [{"y"}, set()]) == pytest.approx(1 / 4)
    with pytest.raises(RankgenError, match="2 rankings but 1 relevant"):
        mean_average_precision([ranked, ranked], [relevant])


def test_binarize_and_input_errors():
    qrels = {"q1": {"a": 3, "b": 2, "c": 1, "d": 0}, "q2": {"e": 1}}
    assert binarize(qrels) == {"q1": {"a", "b"}, "q2": set()}  # TREC-DL: relevant means >= 2
    assert binarize(qrels, threshold=1) == {"q1": {"a", "b", "c"}, "q2": {"e"}}
    with pytest.raises(RankgenError, match="not a dict of labels"):
        mrr_at_k(["a"], {"a": 0}, k=10)  # a label dict would make the 0-labelled id relevant
    with pytest.raises(RankgenError, match="positive integer"):
        recall_at_k(["a"], {"a"}, k=0)
    with pytest.raises(RankgenError, match="not a single string"):
        mrr_at_k("abc", {"a"}, k=10)


def test_evaluate_run_means_and_query_counting():
    run = {"q1": ["a", "b", "c"], "q2": ["x", "y"], "q3": ["a"]}  # q3 has no qrels: ignored
    qrels = {
        "q1": {"b": 2, "c": 1},
        "q2": {"y": 1},
        "q4": {"z": 0},  # no relevant id: left out of the means
        "q5": {"w": 1},  # missing from the run: counts, scores 0
    }
    result = evaluate_run(run, qrels, ks=(1, 10), relevance_threshold=1)
    assert result["queries"] == 3
    assert result["queries_without_relevant"] == 1
    assert result["queries_missing_from_run"] == 1
    assert result["queries_without_qrels"] == 1
    # MRR@10: q1 1/2 (b at rank 2), q2 1/2, q5 0 -> 1/3. MRR@1: all 0.
    assert result["mrr@10"] == pytest.approx(1 / 3)
    assert result["mrr@1"] == 0.0
    # recall@10: q1 2/2, q2 1/1, q5 0 -> 2/3.
    assert result["recall@10"] == pytest.approx(2 / 3)
    # nDCG@10, graded: q1 DCG = 3/log2(3) + 1/2 = 2.3927893, ideal = 3 + 1/log2(3) = 3.6309298 -> 0.6590018;
    # q2 = (1/log2(3)) / 1 = 0.6309298; q5 = 0 -> mean 0.4299772.
    assert result["ndcg@10"] == pytest.approx(0.4299772, abs=1e-6)
    # MAP: q1 (1/2 + 2/3) / 2 = 7/12, q2 1/2, q5 0 -> 13/36.
    assert result["map"] == pytest.approx(13 / 36)
    # TREC-DL threshold 2: only q1 has a relevant id (b).
    strict = evaluate_run(run, qrels, ks=(10,), relevance_threshold=2)
    assert strict["queries"] == 1 and strict["mrr@10"] == pytest.approx(1 / 2)
    assert strict["ndcg@10"] == pytest.approx(0.6590018, abs=1e-6)  # nDCG keeps the graded labels


def test_evaluate_run_matches_int_and_str_ids():
    assert evaluate_run({1: [10, 20]}, {"1": {"20": 1}})["mrr@10"] == pytest.approx(1 / 2)
    with pytest.raises(RankgenError, match="no query in qrels"):
        evaluate_run({"q": ["a"]}, {"q": {"a": 0}})


def test_bleu():
    text = "the quick brown fox jumps over the lazy dog"
    assert sentence_bleu(text, [text]) == pytest.approx(100.0)
    assert sentence_bleu(text, text) == pytest.approx(100.0)  # a single reference string is accepted
    assert sentence_bleu("completely unrelated words here", [text]) == 0.0
    # The best of several references counts: a matching one gives 100.
    assert sentence_bleu(text, ["something else entirely", text]) == pytest.approx(100.0)
    scores = metric_scores("bleu", [text, "completely unrelated words here"], [text])
    assert scores.dtype == np.float32 and scores.shape == (2,)
    np.testing.assert_allclose(scores, [100.0, 0.0], atol=1e-4)


def test_rouge_known_values():
    ref, hyp = "the cat sat on the mat", "the cat was on the mat"
    # Bigrams: ref {the cat, cat sat, sat on, on the, the mat}, hyp {the cat, cat was, was on, on the, the mat};
    # 3 shared of 5 each -> P = R = F1 = 0.6.
    assert rouge(hyp, ref, kind="rouge2") == pytest.approx(0.6)
    # LCS "the cat on the mat" = 5 of 6 tokens each -> F1 = 5/6.
    assert rouge(hyp, ref, kind="rougeL") == pytest.approx(5 / 6)
    # Stemming: "cats running" / "cat runs" share "cat run" only after the Porter stemmer.
    assert rouge("the cats running", "the cat runs", kind="rouge2", use_stemmer=True) == pytest.approx(1.0)
    assert rouge("the cats running", "the cat runs", kind="rouge2", use_stemmer=False) == 0.0
    np.testing.assert_allclose(metric_scores("rouge2", [hyp, ref, "dogs bark"], [ref]), [0.6, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(metric_scores("rougeL", [hyp], ref), [5 / 6], atol=1e-6)
    with pytest.raises(RankgenError, match="unknown text metric"):
        metric_scores("rouge1", [hyp], [ref])
    with pytest.raises(RankgenError, match="unknown ROUGE kind"):
        rouge(hyp, ref, kind="rouge1")
