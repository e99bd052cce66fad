"""A "nano" retrieval set cut from a BEIR folder: small enough to evaluate during training, hard enough to rank.

As sentence-transformers' NanoBEIR sets are built: a fixed, seeded sample of
the split's judged queries; every passage their qrels judge; and for each
query its top `distractors` BM25 passages of the full corpus (bm25.py), which
are the ones a retriever has to rank below the judged ones. The result is a
BEIR folder of its own (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) with
nano.json recording the source and the settings. It is written once: a later
call with the same source and settings reuses it, with others is refused.

The source may also be passages with queries and qrels in files of their own
(CL-DRD's selection queries held out of MS MARCO's training queries), and a
title_join other than the default joins each title into its text as the set
is written, so that any reader sees the passages as the source's reader does.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from rankgen_jax.data.retrieval_files import DEFAULT_TITLE_JOIN, join_title, read_judged, write_beir
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval.bm25 import Bm25Retriever

NANO_RECORD = "nano.json"
# What nano.json holds only when the set was built with it: a set built otherwise is another set.
OPTIONAL_RECORD = ("queries_file", "qrels_file", "title_join")


@dataclasses.dataclass(frozen=True)
class NanoSpec:
    """queries: how many judged queries are sampled (all when fewer); distractors: BM25 passages kept per query;
    seed: the sample's seed."""

    queries: int = 50
    distractors: int = 50
    seed: int = 0

    def __post_init__(self):
        if self.queries < 1 or self.distractors < 0:
            raise RankgenError(f"a nano set needs queries >= 1 and distractors >= 0, got {self.queries} and "
                               f"{self.distractors}")


def _record(source: str | Path, split: str, spec: NanoSpec, queries: str | Path | None,
            qrels: str | Path | None, title_join: str | None) -> dict:
    record = {"source": str(Path(source).resolve()), "split": split, **dataclasses.asdict(spec)}
    # Recorded only when given, so that a set written before these options reads as the same set.
    record.update({name: str(Path(path).resolve()) for name, path in (("queries_file", queries),
                                                                       ("qrels_file", qrels)) if path is not None})
    if title_join != DEFAULT_TITLE_JOIN:
        record["title_join"] = title_join
    return record


def build_nano_set(source: str | Path, split: str, out_dir: str | Path, spec: NanoSpec = NanoSpec(),
                   progress: bool = False, queries: str | Path | None = None, qrels: str | Path | None = None,
                   title_join: str | None = DEFAULT_TITLE_JOIN) -> dict:
    """Write (or reuse) the nano set of `source` at `split` in out_dir; returns nano.json's content with the counts.

    queries / qrels: files (or BEIR folders, read at split) of their own; default the source, a BEIR folder.
    The set's qrels are written as `split` either way."""
    out = Path(out_dir)
    wanted = _record(source, split, spec, queries, qrels, title_join)
    record_path = out / NANO_RECORD
    if record_path.is_file():
        found = json.loads(record_path.read_text(encoding="utf-8"))
        keys, absent = {*wanted, *OPTIONAL_RECORD}, object()  # an absent title_join differs from None's
        if any(found.get(k, absent) != wanted.get(k, absent) for k in keys):
            raise RankgenError(f"{out}: holds the nano set of {found.get('source')} at {found.get('split')!r} "
                               f"({found}); choose another folder for {wanted}")
        return found
    beir = read_judged(source, queries or source, qrels or source, split)
    judged = [q for q in beir.queries.ids if beir.qrels.relevant(q)]
    if not judged:
        raise RankgenError(f"{source}: split {split!r} judges no passage of the corpus relevant to any query")
    rng = np.random.default_rng(spec.seed)
    rows = sorted(rng.choice(len(judged), size=min(spec.queries, len(judged)), replace=False))
    query_ids = [judged[r] for r in rows]
    keep = {d for q in query_ids for d in beir.qrels.labels[q]}
    if spec.distractors:
        passages = beir.passages
        retriever = Bm25Retriever(passages.joined(title_join), passages.ids, progress=progress)
        texts = [beir.queries.texts[beir.queries.rows[q]] for q in query_ids]
        for ranked in retriever.rank(texts, spec.distractors):
            keep.update(passages.ids[row] for row, _ in ranked)
    joined = title_join != DEFAULT_TITLE_JOIN
    corpus = [{"_id": pid, "title": "", "text": join_title(title, text, title_join)} if joined else
              {"_id": pid, "title": title, "text": text}
              for pid, title, text in zip(beir.passages.ids, beir.passages.titles, beir.passages.texts) if pid in keep]
    query_records = [{"_id": q, "text": beir.queries.texts[beir.queries.rows[q]]} for q in query_ids]
    judgements = [(q, d, label) for q in query_ids for d, label in beir.qrels.labels[q].items()]
    write_beir(out, corpus, query_records, {split: judgements})
    summary = {**wanted, "corpus": len(corpus), "query_count": len(query_records), "judgements": len(judgements)}
    # Last: a folder without it is an unfinished one, built again.
    record_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
