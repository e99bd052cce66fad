"""Retrieval measures with trec_eval's definitions (ir-measures over pytrec_eval), and BLEU / ROUGE text scores.

`evaluate_run(run, qrels, measures)` computes ir-measures' measures (names as
ir-measures writes them: "nDCG@10", "RR@10", "R@100", "AP", "P@10",
"Success@20", "Rprec", "AP(rel=2)", ...) through its pytrec_eval provider,
i.e. with trec_eval's own C code. Conventions (docs/design/retrieval.md, 'Retrieval
metrics'), all trec_eval's:
- a run is ranked by score, descending; equal scores are ordered by docid,
  descending (trec_eval's rule; the order of the file or list does not
  count). A ranked list given instead of scores ranks as listed;
- nDCG@k is trec_eval's ndcg_cut.k: gain = the label itself (not 2^label - 1),
  discount log2(1 + rank), negative labels gain 0; the ideal ranking is the
  qrels' labels sorted, cut at k;
- binary measures (RR, AP, P, R, Success, Rprec) count a document relevant
  when its label is >= rel (default 1; TREC DL passages use rel=2,
  e.g. "AP(rel=2)");
- RR@k is trec_eval's recip_rank on each query's first k documents in that
  order (ir-measures hands RR@k to its MS MARCO provider instead, which
  orders equal scores by docid ascending; here the order is trec_eval's);
  "MRR@10", ir-measures' alias, is the same measure under MS MARCO's name,
  and equals MS MARCO's ms_marco_eval.py on a run whose ranks follow that
  order (as `search` writes them);
- queries: every query of the qrels counts, those the run misses scoring 0
  (trec_eval -c, and ir-measures' rule); missing_queries="skip" averages over
  the queries in both the run and the qrels instead (trec_eval without -c).
  Queries of the qrels without a relevant document are in the mean either
  way, as in trec_eval (most measures give them 0); queries of the run
  without qrels are ignored. The counts come back with the means.

BLEU is sacrebleu's sentence BLEU (0-100, exponential smoothing, effective
order); ROUGE is rouge-score's F1 (0-1).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import ir_measures
import numpy as np

from rankgen_jax.data.retrieval_files import Qrels, read_qrels, read_run, trec_eval_order
from rankgen_jax.errors import RankgenError

TEXT_METRICS = ("bleu", "rouge2", "rougeL")
DEFAULT_MEASURES = ("nDCG@10", "RR@10", "R@100", "AP", "P@10", "Success@20")
MISSING_QUERIES = ("zero", "skip")


# ---------------------------------------------------------------------------
# Retrieval measures


def _rr_cutoff(measure) -> int | None:
    """k of an RR@k measure (computed here as trec_eval's recip_rank on the first k documents), else None."""
    return measure["cutoff"] if measure.NAME == "RR" and "cutoff" in measure.params else None


def parse_measures(measures: str | Sequence[str]) -> dict[str, "ir_measures.Measure"]:
    """name -> ir-measures measure, for a space-separated string or a list of names; RankgenError for unknown ones."""
    names = measures.split() if isinstance(measures, str) else list(measures)
    if not names:
        raise RankgenError('no measures named (e.g. "nDCG@10 RR@10 R@100 AP P@10 Success@20")')
    parsed = {}
    for name in names:
        if not isinstance(name, str):
            raise RankgenError(f"a measure name must be a string, got {name!r}")
        try:
            measure = ir_measures.parse_measure(name)
            measure.validate_params()
        except (ValueError, NameError, TypeError, AssertionError) as e:
            raise RankgenError(f"measure {name!r}: {e} (ir-measures names: nDCG@10, RR@10, R@100, AP, P@10, "
                               "Success@20, Rprec, AP(rel=2), ...)") from None
        if _rr_cutoff(measure) is not None:
            if measure["judged_only"]:
                raise RankgenError(f"measure {name!r}: judged_only with a cut-off is not supported")
        elif not ir_measures.pytrec_eval.supports(measure):
            raise RankgenError(f"measure {name!r} is not one of trec_eval's (pytrec_eval cannot compute it)")
        parsed[name] = measure
    return parsed


def check_run_depth(depth: int, measures: Sequence[str], where: str) -> None:
    """A run of `depth` passages per query can be measured at every cut-off of `measures`; RankgenError naming
    `where` (the depth's setting) when one reads deeper."""
    cutoffs = [m["cutoff"] for m in parse_measures(list(measures)).values() if "cutoff" in m.params]
    if cutoffs and max(cutoffs) > depth:
        raise RankgenError(f"{where}={depth} ranks fewer passages than the measures read ({max(cutoffs)})")


def _labels(qrels) -> dict[str, dict[str, int]]:
    """qid -> {docid: int label} with string ids; RankgenError for labels that are not integers."""
    if isinstance(qrels, Qrels):
        return qrels.labels
    if not isinstance(qrels, Mapping):
        raise RankgenError("qrels must be a dict qid -> {doc id: integer label} (or a Qrels)")
    out = {}
    for qid, labels in qrels.items():
        if not isinstance(labels, Mapping):
            raise RankgenError(f"qrels[{qid!r}] must be a dict doc id -> label, got {type(labels).__name__}")
        judged = {}
        for docid, label in labels.items():
            if (isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, float, np.integer, np.floating))
                    or not float(label).is_integer()):
                raise RankgenError(f"qrels[{qid!r}][{docid!r}]: label {label!r} is not an integer "
                                   "(trec_eval reads integer labels)")
            judged[str(docid)] = int(label)
        out[str(qid)] = judged
    return out


def _scores(run: Mapping) -> dict[str, dict[str, float]]:
    """qid -> {docid: score}; a ranked list of ids gets scores that rank it as listed."""
    if not isinstance(run, Mapping):
        raise RankgenError("run must be a dict qid -> {doc id: score} or qid -> ranked list of doc ids")
    out = {}
    for qid, ranking in run.items():
        if isinstance(ranking, Mapping):
            scores = {str(d): float(s) for d, s in ranking.items()}
        elif isinstance(ranking, str) or not isinstance(ranking, Sequence):
            raise RankgenError(f"run[{qid!r}] must be a dict doc id -> score or a list of doc ids")
        else:
            ids = [str(d) for d in ranking]
            if len(set(ids)) != len(ids):
                raise RankgenError(f"run[{qid!r}] lists a document twice; a run holds each document once")
            scores = {d: float(len(ids) - position) for position, d in enumerate(ids)}
        if not all(np.isfinite(list(scores.values()))):
            raise RankgenError(f"run[{qid!r}] holds a score that is not finite")
        out[str(qid)] = scores
    return out


def _cut(run: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
    """Each query's first k documents in trec_eval's order."""
    return {q: dict(trec_eval_order(scores)[:k]) for q, scores in run.items()}


def per_query_values(run: Mapping, qrels, measures: str | Sequence[str] = DEFAULT_MEASURES,
                     ) -> tuple[dict[str, dict[str, float]], dict[str, "ir_measures.Measure"]]:
    """(qid -> {name: value} for every query of the qrels, the parsed measures); a query the run misses holds 0."""
    named = parse_measures(measures)
    labels = _labels(qrels)
    scores = _scores(run)
    if not labels:
        raise RankgenError("the qrels judge no query")
    # Several names can be one measure (MRR@10 is ir-measures' alias of RR@10): each gets its value.
    names_of: dict = {}
    for name, measure in named.items():
        names_of.setdefault(measure, []).append(name)
    # One pytrec_eval call for the measures on the whole run, and one per RR cut-off k on the run cut
    # to its first k documents: cut -> {measure pytrec_eval computes: the measure it stands for}.
    calls: dict[int | None, dict] = {}
    for measure in names_of:
        k = _rr_cutoff(measure)
        computed = measure if k is None else ir_measures.RR(rel=measure["rel"])
        calls.setdefault(k, {})[computed] = measure
    values: dict[str, dict[str, float]] = {q: {} for q in labels}
    for k, stands_for in calls.items():
        evaluator = ir_measures.pytrec_eval.evaluator(list(stands_for), labels)
        # The evaluator also yields the measure's default (0) for every qrels query the run lacks.
        for metric in evaluator.iter_calc(scores if k is None else _cut(scores, k)):
            if metric.query_id in values:
                for name in names_of[stands_for[metric.measure]]:
                    values[metric.query_id][name] = float(metric.value)
    return values, named


def evaluate_run(run: Mapping, qrels, measures: str | Sequence[str] = DEFAULT_MEASURES, *,
                 missing_queries: str = "zero", per_query: bool = False) -> dict:
    """Means over queries of trec_eval's measures for a run; see the module docstring for the conventions.

    run: qid -> {docid: score} (pytrec_eval's form) or qid -> ranked list of
    docids; qrels: qid -> {docid: integer label}, or a Qrels. Ids are compared
    as strings. Returns {name: mean, ..., "queries": averaged over,
    "queries_missing_from_run", "queries_without_relevant" (no label >= 1),
    "run_queries_without_qrels"} and, with per_query, "per_query": {qid: {name: value}}.
    """
    if missing_queries not in MISSING_QUERIES:
        raise RankgenError(f"missing_queries must be one of {MISSING_QUERIES}, got {missing_queries!r}")
    values, named = per_query_values(run, qrels, measures)
    labels = _labels(qrels)
    run_ids = {str(q) for q in run}
    missing = [q for q in labels if q not in run_ids]
    if len(missing) == len(labels):
        example_run, example_qrels = next(iter(run_ids), None), next(iter(labels))
        raise RankgenError(f"no query of the run is in the qrels (run query {example_run!r}, qrels query "
                           f"{example_qrels!r}): ids are compared as exact strings")
    counted = [q for q in labels if missing_queries == "zero" or q in run_ids]
    result: dict = {}
    for name, measure in named.items():
        aggregator = measure.aggregator()
        for q in counted:
            aggregator.add(values[q][name])
        result[name] = float(aggregator.result())
    result["queries"] = len(counted)
    result["queries_missing_from_run"] = len(missing)
    result["queries_without_relevant"] = sum(1 for q in counted if not any(y >= 1 for y in labels[q].values()))
    result["run_queries_without_qrels"] = sum(1 for q in run_ids if q not in labels)
    if per_query:
        result["per_query"] = {q: values[q] for q in counted}
    return result


def evaluate_files(run_path: str, qrels_path: str, measures: str | Sequence[str] = DEFAULT_MEASURES, *,
                   split: str | None = None, missing_queries: str = "zero", per_query: bool = False) -> dict:
    """evaluate_run on a run file (TREC, MS MARCO or search's JSON lines) and a qrels file or BEIR folder."""
    qrels = read_qrels(qrels_path, split=split)
    return evaluate_run(read_run(run_path), qrels, measures, missing_queries=missing_queries, per_query=per_query)


# ---------------------------------------------------------------------------
# Text metrics (distillation targets: how close a candidate is to the gold text)


def _references(references: str | Sequence[str]) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs or not all(isinstance(r, str) for r in refs):
        raise RankgenError("references must be a string or a non-empty list of strings")
    return refs


@functools.lru_cache(maxsize=4)
def _bleu_metric():
    from sacrebleu.metrics import BLEU  # only the BLEU-scored pools need sacrebleu

    # The settings of sacrebleu.sentence_bleu; effective order keeps short
    # sentences without 4-gram matches from scoring 0 outright.
    return BLEU(effective_order=True)


@functools.lru_cache(maxsize=8)
def _rouge_scorer(variant: str, use_stemmer: bool):
    from rouge_score.rouge_scorer import RougeScorer  # only ROUGE-scored pools need it

    return RougeScorer([variant], use_stemmer=use_stemmer)


def sentence_bleu(hypothesis: str, references: str | Sequence[str]) -> float:
    """sacrebleu sentence BLEU (0-100) of one hypothesis against one or more references."""
    if not isinstance(hypothesis, str):
        raise RankgenError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    return float(_bleu_metric().sentence_score(hypothesis, _references(references)).score)


def rouge(hypothesis: str, reference: str | Sequence[str], variant: str = "rouge2", use_stemmer: bool = True) -> float:
    """rouge-score F1 (0-1) of `variant` ("rouge2" or "rougeL"); with several references, the best one."""
    if variant not in ("rouge2", "rougeL"):
        raise RankgenError(f"unknown ROUGE variant {variant!r}: expected 'rouge2' or 'rougeL'")
    if not isinstance(hypothesis, str):
        raise RankgenError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    scorer = _rouge_scorer(variant, bool(use_stemmer))
    refs = _references(reference)
    # rouge-score takes (target, prediction); the max over references is score_multi's rule.
    return float(max(scorer.score(ref, hypothesis)[variant].fmeasure for ref in refs))


def metric_scores(
    metric_name: str, candidates: Sequence[str], references: str | Sequence[str], use_stemmer: bool = True,
) -> np.ndarray:
    """Scores [C] (float32) of each candidate against the same reference(s) with "bleu", "rouge2" or "rougeL".

    BLEU is 0-100 and ROUGE 0-1, as their libraries give them; normalise
    before mixing them in one loss.
    """
    if metric_name not in TEXT_METRICS:
        raise RankgenError(f"unknown text metric {metric_name!r}: expected one of {TEXT_METRICS}")
    if isinstance(candidates, str):
        raise RankgenError("metric_scores takes a list of candidates, not a single string")
    refs = _references(references)
    for i, c in enumerate(candidates):
        if not isinstance(c, str):
            raise RankgenError(f"candidate {i} is a {type(c).__name__}, not a string")
    # One scorer for all candidates (building a RougeScorer loads the stemmer and tokenizer).
    if metric_name == "bleu":
        bleu = _bleu_metric()
        values = [bleu.sentence_score(c, refs).score for c in candidates]
    else:
        scorer = _rouge_scorer(metric_name, bool(use_stemmer))
        values = [max(scorer.score(r, c)[metric_name].fmeasure for r in refs) for c in candidates]
    return np.asarray(values, np.float32).reshape(len(candidates))
