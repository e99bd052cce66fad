"""Ranking metrics over ranked id lists (MRR, recall, graded nDCG, MAP) and BLEU / ROUGE text scores.

Conventions (docs/design.md, 'Retrieval metrics'):
- ranks are 1-based; `k` cuts the ranking to its first k entries (None: no cut);
- an id that appears more than once in a ranking counts at its first position
  only (later copies are dropped before ranks are assigned), so a run cannot
  earn credit twice for one document;
- nDCG uses gain 2^y - 1 and discount log2(1 + rank); the ideal DCG is that of
  the judged items sorted by label; labels below 0 count as 0 and unjudged
  ids have label 0;
- per-query functions return 0.0 for a query with no relevant id (there is
  nothing to find); `evaluate_run` instead leaves such queries out of its
  means and counts them, as trec_eval does;
- TREC-DL passage labels are 0-3 with "relevant" meaning >= 2: use
  `binarize(qrels, threshold=2)` or `evaluate_run(..., relevance_threshold=2)`.

BLEU is sacrebleu's sentence BLEU (0-100, exponential smoothing, effective
order); ROUGE is rouge-score's F1 (0-1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence

import numpy as np

from rankgen_jax.errors import RankgenError

TEXT_METRICS = ("bleu", "rouge2", "rougeL")


# ---------------------------------------------------------------------------
# Ranking metrics


def _check_k(k: int | None) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise RankgenError(f"cut-off k must be a positive integer or None, got {k!r}")


def _top(ranked_ids: Iterable[Hashable], k: int | None) -> list[Hashable]:
    """The first k distinct ids of a ranking, in rank order."""
    _check_k(k)
    if isinstance(ranked_ids, str):
        raise RankgenError("a ranking must be a list of ids, not a single string")
    seen: set = set()
    top = []
    for doc_id in ranked_ids:
        if doc_id in seen:
            continue
        seen.add(doc_id)
        top.append(doc_id)
        if k is not None and len(top) == k:
            break
    return top


def _relevant_set(relevant: Collection[Hashable]) -> set:
    """The relevant ids as a set; graded label dicts are refused (their keys include non-relevant ids)."""
    if isinstance(relevant, Mapping):
        raise RankgenError("pass the relevant ids as a set, not a dict of labels "
                           "(binarize(qrels, threshold) turns graded labels into sets)")
    if isinstance(relevant, str):
        raise RankgenError("relevant ids must be a collection of ids, not a single string")
    return set(relevant)


def mrr_at_k(ranked_ids: Sequence[Hashable], relevant: Collection[Hashable], k: int | None = 10) -> float:
    """Reciprocal rank of the first relevant id within the top k (0.0 when none is there)."""
    relevant = _relevant_set(relevant)
    for rank, doc_id in enumerate(_top(ranked_ids, k), start=1):
        if doc_id in relevant:
            return 1.0 / rank
    return 0.0


def recall_at_k(ranked_ids: Sequence[Hashable], relevant: Collection[Hashable], k: int | None = 10) -> float:
    """Share of the relevant ids found in the top k (0.0 when there is no relevant id)."""
    relevant = _relevant_set(relevant)
    if not relevant:
        return 0.0
    found = sum(1 for doc_id in _top(ranked_ids, k) if doc_id in relevant)
    return found / len(relevant)


def _gain(label: float) -> float:
    # Negative labels (some collections mark "harmful" as -1) would give a
    # negative gain and could push nDCG below 0; they count as not relevant.
    return 2.0 ** max(float(label), 0.0) - 1.0


def ndcg_at_k(ranked_ids: Sequence[Hashable], gains: Mapping[Hashable, float], k: int | None = 10) -> float:
    """Graded nDCG@k: gain 2^y - 1, discount log2(1 + rank); 0.0 when no judged id has a positive label."""
    if not isinstance(gains, Mapping):
        raise RankgenError("ndcg_at_k needs graded labels as a dict id -> relevance")
    top = _top(ranked_ids, k)
    dcg = sum(_gain(gains.get(doc_id, 0)) / math.log2(1 + rank) for rank, doc_id in enumerate(top, start=1))
    ideal_gains = sorted((_gain(y) for y in gains.values()), reverse=True)
    if k is not None:
        ideal_gains = ideal_gains[:k]
    ideal = sum(g / math.log2(1 + rank) for rank, g in enumerate(ideal_gains, start=1))
    return dcg / ideal if ideal > 0 else 0.0


def average_precision(ranked_ids: Sequence[Hashable], relevant: Collection[Hashable], k: int | None = None) -> float:
    """Mean of precision@rank over the relevant ids (missed ones add 0); 0.0 when there is no relevant id."""
    relevant = _relevant_set(relevant)
    if not relevant:
        return 0.0
    hits, total = 0, 0.0
    for rank, doc_id in enumerate(_top(ranked_ids, k), start=1):
        if doc_id in relevant:
            hits += 1
            total += hits / rank
    # Divide by all relevant ids, not the retrieved ones: unretrieved ones count as precision 0.
    return total / len(relevant)


def mean_average_precision(
    ranked_lists: Sequence[Sequence[Hashable]], relevant_sets: Sequence[Collection[Hashable]], k: int | None = None,
) -> float:
    """Mean AP over parallel lists of rankings and relevant sets (every query counts, AP 0 without relevant ids)."""
    if len(ranked_lists) != len(relevant_sets):
        raise RankgenError(f"mean_average_precision: {len(ranked_lists)} rankings "
                           f"but {len(relevant_sets)} relevant sets")
    if not ranked_lists:
        raise RankgenError("mean_average_precision: no queries")
    return float(np.mean([average_precision(r, s, k) for r, s in zip(ranked_lists, relevant_sets)]))


def binarize(qrels: Mapping[Hashable, Mapping[Hashable, float]], threshold: float = 2) -> dict[Hashable, set]:
    """qid -> set of ids whose label is >= threshold (TREC-DL: 2 = "highly relevant" and above)."""
    if not isinstance(qrels, Mapping):
        raise RankgenError("qrels must be a dict qid -> {doc id: relevance}")
    out = {}
    for qid, labels in qrels.items():
        if not isinstance(labels, Mapping):
            raise RankgenError(f"qrels[{qid!r}] must be a dict doc id -> relevance, got {type(labels).__name__}")
        out[qid] = {doc_id for doc_id, y in labels.items() if y >= threshold}
    return out


def evaluate_run(
    run: Mapping[Hashable, Sequence[Hashable]],
    qrels: Mapping[Hashable, Mapping[Hashable, float]],
    ks: Sequence[int] = (10,),
    relevance_threshold: float = 1,
) -> dict[str, float | int]:
    """Means over queries of MRR@k, recall@k, nDCG@k (each k in ks) and MAP (whole ranking).

    Query and document ids are compared as strings, so a run with int ids and
    qrels with str ids (or the reverse) still match.
    Which queries count: those in qrels with at least one id labelled
    >= relevance_threshold. A counted query missing from the run scores 0 on
    everything (the system returned nothing for it). Queries in qrels without
    a relevant id are left out of the means (nothing can be found), and run
    queries without qrels are ignored; both are reported as counts.
    nDCG uses the graded labels as given; the other metrics the binarised ones.
    Returns {"mrr@10": ..., "recall@10": ..., "ndcg@10": ..., "map": ...,
    "queries": counted, "queries_without_relevant": n, "queries_missing_from_run": n,
    "queries_without_qrels": n}.
    """
    if isinstance(ks, int):
        ks = (ks,)
    for k in ks:
        _check_k(k)
    if not ks:
        raise RankgenError("evaluate_run: ks must name at least one cut-off")
    if not isinstance(run, Mapping):
        raise RankgenError("run must be a dict qid -> ranked list of doc ids")
    graded = {str(q): {str(d): y for d, y in labels.items()} for q, labels in _checked_qrels(qrels).items()}
    ranked = {str(q): [str(d) for d in _top(ids, None)] for q, ids in run.items()}
    relevant = binarize(graded, relevance_threshold)
    counted = [q for q in graded if relevant[q]]
    if not counted:
        raise RankgenError(f"evaluate_run: no query in qrels has a document labelled >= {relevance_threshold}")
    per_metric: dict[str, list[float]] = {}
    for qid in counted:
        ids = ranked.get(qid, [])
        for k in ks:
            per_metric.setdefault(f"mrr@{k}", []).append(mrr_at_k(ids, relevant[qid], k))
            per_metric.setdefault(f"recall@{k}", []).append(recall_at_k(ids, relevant[qid], k))
            per_metric.setdefault(f"ndcg@{k}", []).append(ndcg_at_k(ids, graded[qid], k))
        per_metric.setdefault("map", []).append(average_precision(ids, relevant[qid]))
    result: dict[str, float | int] = {name: float(np.mean(values)) for name, values in per_metric.items()}
    result["queries"] = len(counted)
    result["queries_without_relevant"] = len(graded) - len(counted)
    result["queries_missing_from_run"] = sum(1 for q in counted if q not in ranked)
    result["queries_without_qrels"] = sum(1 for q in ranked if q not in graded)
    return result


def _checked_qrels(qrels: Mapping) -> Mapping:
    if not isinstance(qrels, Mapping):
        raise RankgenError("qrels must be a dict qid -> {doc id: relevance}")
    for qid, labels in qrels.items():
        if not isinstance(labels, Mapping):
            raise RankgenError(f"qrels[{qid!r}] must be a dict doc id -> relevance, got {type(labels).__name__}")
    return qrels


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
def _rouge_scorer(kind: str, use_stemmer: bool):
    from rouge_score.rouge_scorer import RougeScorer  # only ROUGE-scored pools need it

    return RougeScorer([kind], use_stemmer=use_stemmer)


def sentence_bleu(hypothesis: str, references: str | Sequence[str]) -> float:
    """sacrebleu sentence BLEU (0-100) of one hypothesis against one or more references."""
    if not isinstance(hypothesis, str):
        raise RankgenError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    return float(_bleu_metric().sentence_score(hypothesis, _references(references)).score)


def rouge(hypothesis: str, reference: str | Sequence[str], kind: str = "rouge2", use_stemmer: bool = True) -> float:
    """rouge-score F1 (0-1) of `kind` ("rouge2" or "rougeL"); with several references, the best one."""
    if kind not in ("rouge2", "rougeL"):
        raise RankgenError(f"unknown ROUGE kind {kind!r}: expected 'rouge2' or 'rougeL'")
    if not isinstance(hypothesis, str):
        raise RankgenError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    scorer = _rouge_scorer(kind, bool(use_stemmer))
    refs = _references(reference)
    # rouge-score takes (target, prediction); the max over references is score_multi's rule.
    return float(max(scorer.score(ref, hypothesis)[kind].fmeasure for ref in refs))


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
