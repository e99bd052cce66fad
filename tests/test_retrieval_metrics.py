"""Retrieval measures equal trec_eval's (pytrec_eval called directly, MS MARCO's own script) and BLEU / ROUGE."""

import json
import math

import numpy as np
import pytest
import pytrec_eval
from ir_measures.bin import msmarco_eval

from rankgen_jax.cli.main import main
from rankgen_jax.data.retrieval_files import write_run
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.retrieval_metrics import evaluate_files, evaluate_run, metric_scores, rouge, sentence_bleu

LOG2_3 = math.log2(3)  # discount at rank 2: 1.5849625

# Our names -> trec_eval's (pytrec_eval's) names for the same measure.
TREC_NAMES = {"nDCG@10": "ndcg_cut_10", "nDCG@5": "ndcg_cut_5", "nDCG": "ndcg", "AP": "map", "AP@10": "map_cut_10",
              "P@5": "P_5", "P@10": "P_10", "R@5": "recall_5", "R@100": "recall_100", "Success@1": "success_1",
              "Success@20": "success_20", "Rprec": "Rprec", "RR": "recip_rank"}
CUT_RR = {"RR@10": 10, "MRR@10": 10, "RR@3": 3}


def test_conventions_by_hand():
    """trec_eval's conventions, computed by hand: gain = label, ties by docid descending, empty and missing queries."""
    qrels = {"q1": {"a": 1, "b": 0}, "q2": {"x": 0}, "q3": {"c": 2, "d": 3, "e": -1}, "q4": {"z": 1}}
    run = {"q1": {"a": 1.0, "b": 1.0, "c": 1.0}, "q2": {"x": 3.0, "y": 2.0},
           "q3": {"e": 5.0, "c": 1.0, "d": 0.5}, "q9": {"a": 1.0}}
    result = evaluate_run(run, qrels, ["RR", "RR@2", "nDCG@10", "AP", "P@1"], per_query=True)
    per_query = result["per_query"]
    # q1: three equal scores rank c, b, a (docid descending), so the relevant a is third.
    assert per_query["q1"]["RR"] == pytest.approx(1 / 3) and per_query["q1"]["RR@2"] == 0.0
    # q3: gain = label (3 and 2, not 2^y - 1), e's label -1 gains 0; ideal = labels sorted.
    dcg = 0 + 2 / LOG2_3 + 3 / 2
    ideal = 3 + 2 / LOG2_3
    assert per_query["q3"]["nDCG@10"] == pytest.approx(dcg / ideal)
    assert per_query["q3"]["AP"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    # q2 has no relevant document: in the mean, scoring 0; q4 is missing from the run: 0 (trec_eval -c).
    assert per_query["q2"] == {"RR": 0.0, "RR@2": 0.0, "nDCG@10": 0.0, "AP": 0.0, "P@1": 0.0}
    assert per_query["q4"]["RR"] == 0.0
    assert result["RR"] == pytest.approx((1 / 3 + 0 + 1 / 2 + 0) / 4)
    assert (result["queries"], result["queries_missing_from_run"], result["queries_without_relevant"],
            result["run_queries_without_qrels"]) == (4, 1, 1, 1)
    # Without -c: the queries in both run and qrels (q4 out, q2 still in).
    skip = evaluate_run(run, qrels, ["RR"], missing_queries="skip")
    assert skip["RR"] == pytest.approx((1 / 3 + 0 + 1 / 2) / 3) and skip["queries"] == 3
    # A ranked list ranks as listed; int ids match str ones.
    assert evaluate_run({1: [10, 20]}, {"1": {"20": 1}}, ["RR@10"])["RR@10"] == pytest.approx(1 / 2)


def random_case(rng, num_queries=40, num_docs=60):
    """Graded qrels 0-3 (some queries with no relevant document), runs of 0-40 documents with many tied scores."""
    qrels, run = {}, {}
    for q in range(num_queries):
        qid = f"q{q}"
        judged = rng.choice(num_docs, size=rng.integers(1, 15), replace=False)
        labels = rng.integers(0, 4, size=len(judged))
        if q % 7 == 0:
            labels[:] = 0  # no relevant document
        qrels[qid] = {f"d{j}": int(y) for j, y in zip(judged, labels)}
        if q % 9 == 4:
            continue  # missing from the run
        depth = int(rng.integers(1, 41))  # often shorter than the cut-offs
        retrieved = rng.choice(num_docs, size=depth, replace=False)
        # One decimal: many equal scores, ordered by docid ("d7" > "d10" > "d1" as strings).
        run[qid] = {f"d{j}": float(s) for j, s in zip(retrieved, np.round(rng.random(depth), 1))}
    run["unjudged-query"] = {"d1": 1.0}
    return qrels, run


def pytrec_means(qrels, run, names, complete: bool, relevance_level: int = 1):
    """Means of pytrec_eval's own per-query values: over the qrels' queries (missing ones 0, trec_eval -c) or over
    those it evaluated (trec_eval's default)."""
    trec = {TREC_NAMES[n] for n in names if n in TREC_NAMES} | {"recip_rank"}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, trec, relevance_level=relevance_level).evaluate(run)
    count = len(qrels) if complete else len(per_query)
    means = {}
    for name in names:
        if name in CUT_RR:
            # RR@k: the first relevant document within the first k, i.e. recip_rank when it is >= 1/k.
            k = CUT_RR[name]
            values = [v["recip_rank"] if v["recip_rank"] >= 1 / k - 1e-12 else 0.0 for v in per_query.values()]
        else:
            values = [v[TREC_NAMES[name]] for v in per_query.values()]
        means[name] = sum(values) / count
    return means, per_query


MEASURES = list(TREC_NAMES) + list(CUT_RR)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_evaluate_equals_pytrec_eval_on_random_runs(tmp_path, seed):
    rng = np.random.default_rng(seed)
    qrels, run = random_case(rng)
    for missing, complete in (("zero", True), ("skip", False)):
        want, per_query = pytrec_means(qrels, run, MEASURES, complete)
        got = evaluate_run(run, qrels, MEASURES, missing_queries=missing, per_query=True)
        for name in MEASURES:
            assert got[name] == pytest.approx(want[name], abs=1e-12), (name, missing)
        assert got["queries"] == (len(qrels) if complete else len(per_query))
        for qid, values in per_query.items():
            assert got["per_query"][qid]["nDCG@10"] == pytest.approx(values["ndcg_cut_10"], abs=1e-12)
    # Another relevant level (TREC DL passages: 2).
    want, _ = pytrec_means(qrels, run, ["AP", "P@10"], True, relevance_level=2)
    got = evaluate_run(run, qrels, ["AP(rel=2)", "P(rel=2)@10"])
    assert got["AP(rel=2)"] == pytest.approx(want["AP"], abs=1e-12)
    assert got["P(rel=2)@10"] == pytest.approx(want["P@10"], abs=1e-12)

    # The same through files: a TREC run and TREC qrels, then the CLI.
    results = [{"query_id": q, "ids": list(s), "scores": list(s.values())} for q, s in run.items()]
    run_path = write_run(tmp_path / "run.trec", results, "trec")
    qrels_path = tmp_path / "qrels.txt"
    qrels_path.write_text("".join(f"{q} 0 {d} {y}\n" for q, labels in qrels.items() for d, y in labels.items()))
    want, _ = pytrec_means(qrels, run, MEASURES, True)
    from_files = evaluate_files(str(run_path), str(qrels_path), MEASURES)
    assert {n: from_files[n] for n in MEASURES} == pytest.approx(want, abs=1e-12)
    # An MS MARCO run of the same ranking (ranks in trec_eval's order) gives the same numbers.
    msmarco_path = write_run(tmp_path / "run.tsv", results, "msmarco")
    again = evaluate_files(str(msmarco_path), str(qrels_path), MEASURES)
    assert {n: again[n] for n in MEASURES} == pytest.approx(want, abs=1e-12)


def test_mrr_at_10_equals_ms_marco_eval_script(tmp_path):
    """MRR@10 (= RR@10) equals MS MARCO's ms_marco_eval.py (as ir-measures ships it) on the files search writes."""
    rng = np.random.default_rng(5)
    run, reference = {}, {}
    for q in range(30):
        depth = int(rng.integers(1, 30))
        pids = rng.choice(200, size=depth, replace=False)
        run[str(1000 + q)] = {str(p): float(s) for p, s in zip(pids, np.round(rng.random(depth), 1))}
        # MS MARCO's qrels list relevant passages only; some queries' relevant ones are not retrieved.
        reference[1000 + q] = [int(p) for p in rng.choice(200, size=int(rng.integers(1, 3)), replace=False)]
        if q % 3 == 0:
            reference[1000 + q][0] = int(pids[rng.integers(0, depth)])
    reference[5000] = [1]  # a query the run misses: MS MARCO divides by all of its queries
    results = [{"query_id": q, "ids": list(s), "scores": list(s.values())} for q, s in run.items()]
    run_path = write_run(tmp_path / "run.tsv", results, "msmarco")
    with open(run_path) as f:
        candidates = msmarco_eval.load_candidate_from_stream(f)
    by_query = msmarco_eval.compute_metrics(reference, candidates, 10)["MRR @10 by query"]
    official = sum(by_query.values()) / len(reference)
    qrels = {str(q): {str(p): 1 for p in pids} for q, pids in reference.items()}
    ours = evaluate_run(run, qrels, ["MRR@10", "RR@10"])
    assert ours["MRR@10"] == ours["RR@10"] == pytest.approx(official, abs=1e-12)
    assert 0 < official < 1


def test_measure_and_input_errors():
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1.0}}
    with pytest.raises(RankgenError, match="measure 'nDCG10'"):
        evaluate_run(run, qrels, ["nDCG10"])
    with pytest.raises(RankgenError, match="'ERR@10' is not one of trec_eval's"):
        evaluate_run(run, qrels, ["ERR@10"])
    with pytest.raises(RankgenError, match="no measures named"):
        evaluate_run(run, qrels, "")
    with pytest.raises(RankgenError, match="no query of the run is in the qrels"):
        evaluate_run({"Q": {"a": 1.0}}, qrels)
    with pytest.raises(RankgenError, match="label 1.5 is not an integer"):
        evaluate_run(run, {"q": {"a": 1.5}})
    with pytest.raises(RankgenError, match="lists a document twice"):
        evaluate_run({"q": ["a", "a"]}, qrels)
    with pytest.raises(RankgenError, match="missing_queries"):
        evaluate_run(run, qrels, missing_queries="drop")


def test_evaluate_command(tmp_path, capsys):
    run = tmp_path / "run.trec"
    run.write_text("1 Q0 d2 1 2.0 t\n1 Q0 d1 2 1.0 t\n2 Q0 d9 1 1.0 t\n")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("1 0 d1 2\n2 0 d3 1\n3 0 d4 1\n")
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "RR@10 nDCG@10",
                 "--per_query"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    assert result["RR@10"] == pytest.approx((1 / 2 + 0 + 0) / 3)
    assert result["nDCG@10"] == pytest.approx((2 / LOG2_3 / 2) / 3)
    assert result["per_query"]["3"] == {"RR@10": 0.0, "nDCG@10": 0.0}
    assert result["queries"] == 3 and result["queries_missing_from_run"] == 1
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "RR@10",
                 "--missing_queries", "skip"]) == 0
    assert json.loads(capsys.readouterr().out)["RR@10"] == pytest.approx(1 / 4)
    # A bad file: one error line naming the file and line.
    qrels.write_text("1 0 d1 2\n1 0 d3\n")
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels)]) == 2
    assert f"{qrels}:2: 3 fields, expected 4" in capsys.readouterr().err


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
    assert rouge(hyp, ref, variant="rouge2") == pytest.approx(0.6)
    # LCS "the cat on the mat" = 5 of 6 tokens each -> F1 = 5/6.
    assert rouge(hyp, ref, variant="rougeL") == pytest.approx(5 / 6)
    # Stemming: "cats running" / "cat runs" share "cat run" only after the Porter stemmer.
    assert rouge("the cats running", "the cat runs", variant="rouge2", use_stemmer=True) == pytest.approx(1.0)
    assert rouge("the cats running", "the cat runs", variant="rouge2", use_stemmer=False) == 0.0
    np.testing.assert_allclose(metric_scores("rouge2", [hyp, ref, "dogs bark"], [ref]), [0.6, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(metric_scores("rougeL", [hyp], ref), [5 / 6], atol=1e-6)
    with pytest.raises(RankgenError, match="unknown text metric"):
        metric_scores("rouge1", [hyp], [ref])
    with pytest.raises(RankgenError, match="unknown ROUGE variant"):
        rouge(hyp, ref, variant="rouge1")
