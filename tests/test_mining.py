"""mine-negatives: BM25 rankings equal bm25s's (and the BM25 formula's), depth ranges, what is never taken, resume,
Tevatron output read back, bad input, and dense negatives equal to `search`'s ranks."""

import dataclasses
import json
import math
import random
from collections import Counter

import bm25s
import numpy as np
import pytest
from test_dense_index import model_dir  # noqa: F401 (a fixture: a tiny random-init dual-encoder folder)

from rankgen_jax.cli.main import main
from rankgen_jax.data.retrieval_files import join_title, read_training_queries
from rankgen_jax.errors import RankgenError
from rankgen_jax.retrieval import bm25, mining, resumable
from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, search_queries

WORDS = ("rain moor house letter candle storm harbour keeper stairs fire snow river bridge garden window night "
         "morning winter summer horse road village church bell ship sea wind cloud field stone").split()
# Ids as IR files write them: MS MARCO's pid "0", BEIR-style strings.
IDS = ["0"] + [f"doc-{i:02d}" for i in range(1, 40)]


def corpus_records():
    rng = random.Random(7)
    records = []
    for i, pid in enumerate(IDS):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        records.append({"_id": pid, "title": rng.choice(WORDS).title() if i % 3 == 0 else "", "text": text})
    return records


QUERIES = {"q0": "rain on the moor at night", "q1": "the keeper climbed the stairs in the storm",
           "q2": "a ship on the sea in winter wind", "q3": "church bell in the village", "q4": "fire and snow"}
# q0 and q2 have several positives; q1's label-1 passage is relevant at a lower level than --positive_level 2 asks.
QRELS = [("q0", "0", 2), ("q0", "doc-05", 1), ("q0", "doc-07", 0), ("q1", "doc-03", 2), ("q1", "doc-11", 1),
         ("q1", "doc-12", 0), ("q2", "doc-20", 1), ("q2", "doc-21", 1), ("q2", "doc-22", 1), ("q3", "doc-30", 1),
         ("q4", "doc-31", 1)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def write_beir(folder, split: str):
    """A BEIR folder of the corpus and QUERIES, with QRELS as the split's qrels; returns it."""
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", corpus_records())
    write_jsonl(folder / "queries.jsonl", [{"_id": q, "text": t} for q, t in QUERIES.items()])
    (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{r}\n" for q, d, r in QRELS), encoding="utf-8")
    return folder


@pytest.fixture
def files(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_records())
    queries = tmp_path / "queries.tsv"
    queries.write_text("".join(f"{q}\t{t}\n" for q, t in QUERIES.items()), encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in QRELS), encoding="utf-8")
    return {"corpus": corpus, "queries": str(queries), "qrels": str(qrels), "dir": tmp_path}


def bm25s_ranking(query, k1=bm25.DEFAULT_BM25_K1, b=bm25.DEFAULT_BM25_B):
    """(docid, score) of every passage with a query term, as bm25s ranks them when called directly."""
    texts = [join_title(r["title"], r["text"]) for r in corpus_records()]
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    docs, scores = retriever.retrieve(bm25s.tokenize([query], stopwords="en", show_progress=False), k=len(texts),
                                      show_progress=False)
    return [(IDS[d], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


def formula_scores(query, k1=bm25.DEFAULT_BM25_K1, b=bm25.DEFAULT_BM25_B):
    """Lucene's BM25 written out in NumPy: sum over query terms of idf * tf / (tf + k1 (1 - b + b dl / avgdl))."""
    docs = [bm25s.tokenize([join_title(r["title"], r["text"])], stopwords="en", return_ids=False,
                           show_progress=False)[0] for r in corpus_records()]
    terms = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    avgdl = np.mean([len(d) for d in docs])
    scores = np.zeros(len(docs))
    for term in terms:
        df = sum(term in d for d in docs)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(term)
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return scores


def by_score(ranking):
    """[(score, {docids})] in rank order: a ranking with ties made comparable."""
    groups = {}
    for docid, score in ranking:
        groups.setdefault(round(score, 5), set()).add(docid)
    return sorted(groups.items(), reverse=True)


def test_bm25_ranking_equals_bm25s_and_the_formula():
    records = corpus_records()
    retriever = bm25.Bm25Retriever([join_title(r["title"], r["text"]) for r in records], IDS, progress=False)
    worst = 0.0
    for query in QUERIES.values():
        (ranked,) = retriever.rank([query], len(IDS))
        ours = [(IDS[row], score) for row, score in ranked]
        want = bm25s_ranking(query)
        assert len(ours) == len(want) > 3
        assert by_score(ours) == by_score(want)
        # Equal scores rank by docid descending (trec_eval's order).
        assert ours == sorted(ours, key=lambda x: (round(x[1], 5), x[0]), reverse=True)
        formula = formula_scores(query)
        worst = max(worst, max(abs(score - formula[IDS.index(d)]) for d, score in ours))
        assert {d for d, _ in ours} == {IDS[i] for i in np.flatnonzero(formula > 0)}
    assert worst < 1e-5
    # A shorter depth is the same ranking's head; k1 and b reach bm25s.
    (head,) = retriever.rank([QUERIES["q0"]], 5)
    assert head == retriever.rank([QUERIES["q0"]], len(IDS))[0][:5]
    other = bm25.Bm25Retriever([join_title(r["title"], r["text"]) for r in records], IDS,
                               bm25.Bm25Params(k1=1.5, b=0.75), progress=False)
    (ranked,) = other.rank([QUERIES["q1"]], len(IDS))
    assert by_score([(IDS[r], s) for r, s in ranked]) == by_score(bm25s_ranking(QUERIES["q1"], 1.5, 0.75))
    # A query of stopwords and unknown words ranks nothing.
    assert retriever.rank(["the of zzzz"], 10) == [[]]


def test_parse_depth():
    assert mining.parse_depth("30-200") == ((30, 200),)
    assert mining.parse_depth("200") == ((1, 200),)
    assert mining.parse_depth("30-200, 1-10") == ((1, 10), (30, 200))
    assert mining.parse_depth("5-5") == ((5, 5),)
    for bad, message in (("0-5", "ranks start at 1"), ("9-3", "ranks start at 1"), ("1-10,5-20", "overlap"),
                         ("a-b", "expected ranks FROM-TO"), ("", "expected ranks")):
        with pytest.raises(RankgenError, match=message):
            mining.parse_depth(bad)


def read_output(path):
    return {q.query_id: q for q in read_training_queries(path)}


def test_bm25_mining_takes_the_depth_range_and_never_a_positive_or_judged_passage(files):
    out = files["dir"] / "mined.jsonl"
    summary = mining.mine_negatives(
        str(out),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="3-12", negatives=5),
        progress=False,
    )
    mined = read_output(out)
    assert list(mined) == ["q0", "q1", "q2", "q3", "q4"]
    assert summary["queries_written"] == 5 and summary["queries_skipped"] == 0
    assert summary["negatives_written"] == sum(len(q.negatives) for q in mined.values())
    records = {r["_id"]: r for r in corpus_records()}
    for qid, query in mined.items():
        positives = {d for q, d, r in QRELS if q == qid and r >= 1}
        assert [p.id for p in query.positives] == [d for q, d, r in QRELS if q == qid and r >= 1]
        ranking = [d for d, _ in sorted(bm25s_ranking(QUERIES[qid]), key=lambda x: (round(x[1], 5), x[0]),
                                        reverse=True)]
        want = [d for d in ranking[2:12] if d not in positives][:5]
        assert [p.id for p in query.negatives] == want
        assert not positives & {p.id for p in query.negatives}
        # Passages come back with their titles kept apart, as the corpus gives them.
        for p in query.negatives + query.positives:
            assert (p.title, p.text) == (records[p.id]["title"], records[p.id]["text"])
    assert any(p.title for q in mined.values() for p in q.negatives)
    assert mined["q2"].query == QUERIES["q2"] and len(mined["q2"].positives) == 3

    # --positive_level 2: q0's and q1's label-1 passages may be negatives unless --drop_judged; "all" drops label 0.
    ranked = {qid: [d for d, _ in sorted(bm25s_ranking(QUERIES[qid]), key=lambda x: (round(x[1], 5), x[0]),
                                         reverse=True)] for qid in QUERIES}
    for drop, dropped in ((None, set()), ("relevant", {"doc-05", "doc-11"}), ("all", {"doc-05", "doc-11", "doc-07",
                                                                                      "doc-12"})):
        path = files["dir"] / f"level2_{drop}.jsonl"
        mining.mine_negatives(
            str(path),
            files["corpus"],
            queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"], positive_level=2),
            picking=mining.NegativePicking(depth="40", negatives=40, drop_judged=drop),
            progress=False,
        )
        got = read_output(path)
        assert list(got) == ["q0", "q1"]  # the others have no label-2 passage
        for qid in got:
            never = {d for q, d, r in QRELS if q == qid and r >= 2} | {d for d in dropped
                                                                      if (qid, d) in {(q, d) for q, d, _ in QRELS}}
            assert [p.id for p in got[qid].negatives] == [d for d in ranked[qid] if d not in never]
    # The label-1 passages of q0 and q1 that BM25 ranks were taken without --drop_judged.
    plain = read_output(files["dir"] / "level2_None.jsonl")
    assert {"doc-05", "doc-11", "doc-07", "doc-12"} & {p.id for q in plain.values() for p in q.negatives}


def test_skips_are_counted_with_their_reason(files):
    queries = files["dir"] / "more_queries.tsv"
    queries.write_text(open(files["queries"]).read() + "q9\tunjudged query about the rain\n"
                       "q8\tthe of and\n", encoding="utf-8")
    qrels = files["dir"] / "more_qrels.txt"
    qrels.write_text(open(files["qrels"]).read() + "q8 0 doc-01 1\n", encoding="utf-8")
    out = files["dir"] / "skips.jsonl"
    summary = mining.mine_negatives(
        str(out),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=str(queries), qrels=str(qrels)),
        picking=mining.NegativePicking(depth="1-40", negatives=3),
        progress=False,
    )
    # q8's query is all stopwords: BM25 ranks nothing for it. q9 is judged nowhere.
    assert summary["skipped"] == {mining.NOT_JUDGED: 1, mining.NOTHING_RANKED: 1}
    assert summary["queries_written"] == 5 and summary["queries_skipped"] == 2
    # A depth past what BM25 ranks leaves nothing; a range holding only positives leaves nothing after dropping them.
    far = mining.mine_negatives(
        str(files["dir"] / "far.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="39-40"),
        progress=False,
    )
    assert far["queries_written"] == 0 and far["skipped"] == {mining.NOTHING_RANKED: 5}
    assert (files["dir"] / "far.jsonl").read_text() == ""
    top = [d for d, _ in sorted(bm25s_ranking(QUERIES["q3"]), key=lambda x: (round(x[1], 5), x[0]), reverse=True)]
    qrels_top = files["dir"] / "qrels_top.txt"
    qrels_top.write_text(f"q3 0 {top[0]} 1\n", encoding="utf-8")
    only = mining.mine_negatives(
        str(files["dir"] / "only.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=str(qrels_top)),
        picking=mining.NegativePicking(depth="1-1"),
        progress=False,
    )
    assert only["skipped"] == {mining.ALL_DROPPED: 1, mining.NOT_JUDGED: 4}
    # Fewer candidates than asked: all of them, counted.
    short = mining.mine_negatives(
        str(files["dir"] / "short.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="1-4", negatives=10),
        progress=False,
    )
    assert short["queries_with_fewer_negatives"] == 5


def test_sampled_negatives_are_seeded_and_in_rank_order(files):
    def mine(name, seed):
        path = files["dir"] / name
        mining.mine_negatives(
            str(path),
            files["corpus"],
            queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
            picking=mining.NegativePicking(depth="1-40", negatives=4, pick="sample", seed=seed),
            progress=False,
        )
        return {q: [p.id for p in t.negatives] for q, t in read_output(path).items()}

    first = mine("first.jsonl", 0)
    assert mine("again.jsonl", 0) == first
    assert mine("other_seed.jsonl", 1) != first
    for qid, picked in first.items():
        positives = {d for q, d, r in QRELS if q == qid and r >= 1}
        ranked = [d for d, _ in sorted(bm25s_ranking(QUERIES[qid]), key=lambda x: (round(x[1], 5), x[0]),
                                       reverse=True) if d not in positives]
        assert len(picked) == 4 and picked == [d for d in ranked if d in picked]
    assert any(picked != [d for d, _ in sorted(bm25s_ranking(QUERIES[q]), key=lambda x: (round(x[1], 5), x[0]),
                                               reverse=True) if d not in {p for qq, p, r in QRELS if qq == q}][:4]
               for q, picked in first.items())


def test_resume_after_an_interruption_writes_the_uninterrupted_file(files, monkeypatch):
    args = dict(corpus_path=files["corpus"],
                queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
                picking=mining.NegativePicking(depth="2-20", negatives=3, pick="sample"), query_batch=2, progress=False)
    whole = files["dir"] / "whole.jsonl"
    want = mining.mine_negatives(str(whole), **args)

    out = files["dir"] / "resumed.jsonl"
    real_write_progress = resumable.write_progress
    calls = []

    def dies_on_the_second_record(path, record):
        calls.append(record["handled"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # the second batch is on disk, its progress record is not
        real_write_progress(path, record)

    monkeypatch.setattr(resumable, "write_progress", dies_on_the_second_record)
    with pytest.raises(KeyboardInterrupt):
        mining.mine_negatives(str(out), **args)
    monkeypatch.setattr(resumable, "write_progress", real_write_progress)
    assert len(out.read_text().splitlines()) == 4
    with out.open("a", encoding="utf-8") as f:
        f.write('{"query_id": "q4", "query": "fi')  # and a crash mid-line
    got = mining.mine_negatives(str(out), **args)
    assert out.read_bytes() == whole.read_bytes()
    assert got["mined_now"] == 3 and {k: v for k, v in got.items() if k not in ("output", "mined_now")} == {
        k: v for k, v in want.items() if k not in ("output", "mined_now")}
    # Done: a rerun mines nothing and keeps the file.
    assert mining.mine_negatives(str(out), **args)["mined_now"] == 0 and out.read_bytes() == whole.read_bytes()

    # Other settings or a changed input are refused; overwrite starts over.
    with pytest.raises(RankgenError, match="other settings or inputs \\(negatives differ\\)"):
        mining.mine_negatives(str(out), **{**args, "picking": dataclasses.replace(args["picking"], negatives=4)})
    with open(files["qrels"], "a", encoding="utf-8") as f:
        f.write("q4 0 doc-01 1\n")
    with pytest.raises(RankgenError, match="qrels differ"):
        mining.mine_negatives(str(out), **args)
    mining.mine_negatives(str(out), **{**args, "overwrite": True})
    assert read_output(out)["q4"].positives[1].id == "doc-01"
    # A file that is not ours is never appended to.
    (files["dir"] / "theirs.jsonl").write_text("{}\n")
    with pytest.raises(RankgenError, match="has no theirs.jsonl.progress.json"):
        mining.mine_negatives(str(files["dir"] / "theirs.jsonl"), **args)


def test_tevatron_and_beir_inputs_and_ids_missing_from_the_corpus(files, capsys):
    records = {r["_id"]: r for r in corpus_records()}

    def passage(docid):
        return {"docid": docid, "title": records[docid]["title"], "text": records[docid]["text"]}

    train = files["dir"] / "train.jsonl"
    write_jsonl(train, [
        {"query_id": "q0", "query": QUERIES["q0"], "positive_passages": [passage("0"), passage("doc-05")],
         "negative_passages": [passage("doc-09")]},
        {"query_id": "q1", "query": QUERIES["q1"], "positive_passages": [passage("doc-03")]},
    ])
    out = files["dir"] / "from_train.jsonl"
    mining.mine_negatives(
        str(out),
        files["corpus"],
        queries=mining.TrainingQuerySource(train_file=str(train)),
        picking=mining.NegativePicking(depth="1-10", negatives=4),
        progress=False,
    )
    mined = read_output(out)
    assert [p.id for p in mined["q0"].positives] == ["0", "doc-05"]
    ranked = [d for d, _ in sorted(bm25s_ranking(QUERIES["q0"]), key=lambda x: (round(x[1], 5), x[0]),
                                   reverse=True)]
    assert [p.id for p in mined["q0"].negatives] == [d for d in ranked[:10] if d not in ("0", "doc-05")][:4]
    # With qrels, --drop_judged also drops what they judge (doc-07 is judged 0 for q0).
    mining.mine_negatives(
        str(files["dir"] / "judged.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(train_file=str(train), qrels=files["qrels"]),
        picking=mining.NegativePicking(drop_judged="all", depth="1-40", negatives=40),
        progress=False,
    )
    assert "doc-07" not in {p.id for p in read_output(files["dir"] / "judged.jsonl")["q0"].negatives}
    with pytest.raises(RankgenError, match="`drop_judged` needs `qrels`"):
        mining.mine_negatives(
            str(files["dir"] / "x.jsonl"),
            files["corpus"],
            queries=mining.TrainingQuerySource(train_file=str(train)),
            picking=mining.NegativePicking(drop_judged="all"),
        )

    # A positive missing from the corpus: an error naming the file and line, or a counted skip.
    bad = files["dir"] / "bad_train.jsonl"
    write_jsonl(bad, [{"query_id": "q0", "query": QUERIES["q0"], "positive_passages": [passage("0")]},
                      {"query_id": "q1", "query": QUERIES["q1"],
                       "positive_passages": [{"docid": "nowhere", "text": "lost"}]}])
    with pytest.raises(RankgenError, match="bad_train.jsonl: 1 queries have a positive passage missing from the "
                       "corpus .*'nowhere' of query 'q1' not in the corpus \\(line 2\\)"):
        mining.mine_negatives(
            str(files["dir"] / "y.jsonl"),
            files["corpus"],
            queries=mining.TrainingQuerySource(train_file=str(bad)),
            progress=False,
        )
    skipped = mining.mine_negatives(
        str(files["dir"] / "y.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(train_file=str(bad), on_missing="skip"),
        picking=mining.NegativePicking(depth="1-5"),
        progress=False,
    )
    assert skipped["queries_written"] == 1 and skipped["skipped"] == {mining.POSITIVE_MISSING: 1}
    assert "bad_train.jsonl: skipped 1 queries" in capsys.readouterr().err
    # A qrels passage missing from the corpus: the same.
    qrels = files["dir"] / "bad_qrels.txt"
    qrels.write_text("q0 0 0 1\nq1 0 missing-doc 1\n", encoding="utf-8")
    with pytest.raises(RankgenError, match="bad_qrels.txt: 1 judgements name ids that are missing: 1 document not in "
                       "the corpus \\(line 2\\)"):
        mining.mine_negatives(
            str(files["dir"] / "z.jsonl"),
            files["corpus"],
            queries=mining.TrainingQuerySource(queries=files["queries"], qrels=str(qrels)),
            progress=False,
        )
    summary = mining.mine_negatives(
        str(files["dir"] / "z.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=str(qrels), on_missing="skip"),
        picking=mining.NegativePicking(depth="1-5"),
        progress=False,
    )
    assert summary["skipped"] == {mining.POSITIVE_MISSING: 1, mining.NOT_JUDGED: 3}

    # A BEIR folder: corpus, queries and the split's qrels from one place.
    beir = write_beir(files["dir"] / "beir", "train")
    mining.mine_negatives(
        str(files["dir"] / "beir.jsonl"),
        str(beir),
        queries=mining.TrainingQuerySource(queries=str(beir), split="train"),
        picking=mining.NegativePicking(depth="3-12", negatives=5),
        progress=False,
    )
    mining.mine_negatives(
        str(files["dir"] / "tsv.jsonl"),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="3-12", negatives=5),
        progress=False,
    )
    assert read_output(files["dir"] / "beir.jsonl") == read_output(files["dir"] / "tsv.jsonl")
    # Mining reads a BEIR folder's train split unless told otherwise (never its test queries by default).
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq4\tdoc-31\t1\n", encoding="utf-8")
    mining.mine_negatives(
        str(files["dir"] / "default.jsonl"),
        str(beir),
        queries=mining.TrainingQuerySource(queries=str(beir)),
        picking=mining.NegativePicking(depth="3-12", negatives=5),
        progress=False,
    )
    assert read_output(files["dir"] / "default.jsonl") == read_output(files["dir"] / "beir.jsonl")
    # An output inside the BEIR folder is not taken for a changed input when resuming.
    for mined_now in (5, 0):
        assert (
            mining.mine_negatives(
                str(beir / "mined.jsonl"),
                str(beir),
                queries=mining.TrainingQuerySource(queries=str(beir), split="train"),
                picking=mining.NegativePicking(depth="3-12", negatives=5),
                progress=False,
            )["mined_now"]
            == mined_now
        )


def test_cli(files, capsys):
    out = files["dir"] / "cli.jsonl"
    assert main(["mine-negatives", "--bm25", "--corpus", files["corpus"], "--queries", files["queries"], "--qrels",
                 files["qrels"], "--depth", "3-12", "--negatives", "5", "--output", str(out), "--no_progress"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["queries_written"] == 5 and summary["output"] == str(out)
    library = files["dir"] / "library.jsonl"
    mining.mine_negatives(
        str(library),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="3-12", negatives=5),
        progress=False,
    )
    assert out.read_bytes() == library.read_bytes()
    assert main(["mine-negatives", "--corpus", files["corpus"], "--queries", files["queries"], "--output",
                 str(files["dir"] / "none.jsonl")]) == 2
    assert "give one retriever: --bm25 or --model" in capsys.readouterr().err
    # The library's errors name its arguments; the command line says them as its flags.
    with pytest.raises(RankgenError, match="`judge` 'teacher' needs a `teacher`"):
        mining.FalseNegativeFilter(relative_margin=0.1, judge="teacher")
    assert main(["mine-negatives", "--bm25", "--corpus", files["corpus"], "--queries", files["queries"], "--output",
                 str(files["dir"] / "none.jsonl"), "--relative_margin", "0.1", "--judge", "teacher"]) == 2
    assert "--judge 'teacher' needs a --teacher (a cross encoder" in capsys.readouterr().err


def test_dense_negatives_are_the_dense_search_ranks_in_range(files, model_dir):
    index = files["dir"] / "index"
    index_corpus(model_dir, files["corpus"], str(index), encoding=TextEncoding("suffix", batch_size=16), progress=False)
    results = search_queries(
        model_dir, str(index), files["queries"], 15, encoding=TextEncoding("prefix", batch_size=16), progress=False
    )
    want = {}
    for result in results:
        positives = {d for q, d, r in QRELS if q == result["query_id"] and r >= 1}
        assert len(set(np.round(result["scores"], 5))) == len(result["scores"])  # no ties: one order
        want[result["query_id"]] = [d for d in result["ids"][4:15] if d not in positives][:6]
    for name, index_dir in (("with_index", str(index)), ("encoded", None)):
        out = files["dir"] / f"{name}.jsonl"
        summary = mining.mine_negatives(
            str(out),
            files["corpus"],
            queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
            retriever=mining.MiningRetriever(model=model_dir, index=index_dir, batch_size=16),
            picking=mining.NegativePicking(depth="5-15", negatives=6),
            progress=False,
        )
        assert summary["queries_written"] == 5
        assert {q: [p.id for p in t.negatives] for q, t in read_output(out).items()} == want
    # An index of another corpus is refused.
    other = files["dir"] / "other.jsonl"
    write_jsonl(other, [{"_id": "elsewhere", "text": "the rain fell"}] + corpus_records())
    index_corpus(
        model_dir,
        str(other),
        str(files["dir"] / "other_index"),
        encoding=TextEncoding("suffix", batch_size=16),
        progress=False,
    )
    with pytest.raises(RankgenError, match="1 indexed passages are not in the corpus .*'elsewhere', row 0"):
        mining.mine_negatives(
            str(files["dir"] / "x.jsonl"),
            files["corpus"],
            queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
            retriever=mining.MiningRetriever(model=model_dir, index=str(files["dir"] / "other_index")),
            progress=False,
        )


def test_summary_counts_match_the_file(files):
    out = files["dir"] / "count.jsonl"
    summary = mining.mine_negatives(
        str(out),
        files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
        picking=mining.NegativePicking(depth="1-30", negatives=7),
        progress=False,
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["queries_written"] == len(lines)
    assert summary["negatives_written"] == sum(len(r["negative_passages"]) for r in lines)
    assert Counter(len(r["negative_passages"]) < 7 for r in lines)[True] == summary["queries_with_fewer_negatives"]


def test_bm25_command_writes_a_trec_run_of_bm25s_rankings(files, capsys):
    """`rankgen-jax bm25`: each query's top K as bm25s ranks them, in a TREC run that `evaluate` reads."""
    beir = write_beir(files["dir"] / "beir", "test")
    run = files["dir"] / "bm25.trec"
    assert main(["bm25", "--corpus", str(beir), "--queries", str(beir), "--split", "test", "--k", "6", "--output",
                 str(run), "--no_progress"]) == 0, capsys.readouterr().err
    rows = [line.split() for line in run.read_text().splitlines()]
    assert {r[0] for r in rows} == set(QUERIES) - {"q4"} or {r[0] for r in rows} == set(QUERIES)
    for qid, query in QUERIES.items():
        mine = [(r[2], float(r[4])) for r in rows if r[0] == qid]
        assert [int(r[3]) for r in rows if r[0] == qid] == list(range(1, len(mine) + 1))
        assert all(r[1] == "Q0" and r[5] == "bm25" for r in rows if r[0] == qid)
        want = sorted(bm25s_ranking(query), key=lambda x: (round(x[1], 5), x[0]), reverse=True)[:6]
        assert [d for d, _ in mine] == [d for d, _ in want]
        np.testing.assert_allclose([s for _, s in mine], [s for _, s in want], rtol=1e-5)
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--qrels", str(beir), "--split", "test"]) == 0
    assert json.loads(capsys.readouterr().out)["queries"] == len(QUERIES)
    # A BEIR folder's queries are read at a split named on purpose, by bm25 and search alike.
    for command in (["bm25", "--corpus", str(beir), "--output", str(files["dir"] / "x.trec")],
                    ["search", "--model", "unused", "--index", "unused"]):
        assert main([*command, "--queries", str(beir)]) == 2
        assert "is a BEIR folder: name the split whose queries to read with --split (its splits: test)" in \
            capsys.readouterr().err


# ---------------------------------------------------------------------------
# The false-negative filter


def test_false_negative_filter_on_a_case_computed_by_hand():
    """Positives 2.0 and 5.0: the lower, p = 2.0, is the bar. Absolute margin 0.1 drops s > 1.9; relative margin
    0.1 then drops s > 2.0 - 0.2 = 1.8."""
    rules = mining.FalseNegativeFilter(absolute_margin=0.1, relative_margin=0.1).drops(
        np.array([2.0, 5.0]), np.array([2.5, 2.0, 1.95, 1.85, 1.8, 1.0, -3.0]))
    assert rules == ["absolute_margin"] * 3 + ["relative_margin", None, None, None]
    # Margin 0: only candidates above the positive go; an equal score stays.
    assert mining.FalseNegativeFilter(absolute_margin=0.0).drops(np.array([1.0]), np.array([1.5, 1.0, 0.5])) == [
        "absolute_margin", None, None]
    # A negative positive score: the bar is p - |p| r = -2 - 1 = -3, not (1 - r) p = -1 (sentence-transformers #3819).
    assert mining.FalseNegativeFilter(relative_margin=0.5).drops(np.array([-2.0]), np.array([-2.5, -3.5, -0.5])) == [
        "relative_margin", None, "relative_margin"]
    assert not mining.FalseNegativeFilter().active
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(RankgenError, match="`absolute_margin` must be a finite number >= 0"):
            mining.FalseNegativeFilter(absolute_margin=bad)


def test_bm25_filter_drops_what_scores_above_the_positive_and_counts_it(files):
    # Each query's positive is the passage BM25 ranks 5th, so about four candidates score above it.
    qrels = files["dir"] / "fifth.txt"
    qrels.write_text("".join(f"{q} 0 {sorted(bm25s_ranking(t), key=lambda x: (-x[1], x[0]))[4][0]} 1\n"
                             for q, t in QUERIES.items()), encoding="utf-8")
    args = dict(
        corpus_path=files["corpus"],
        queries=mining.TrainingQuerySource(queries=files["queries"], qrels=str(qrels)),
        picking=mining.NegativePicking(depth="1-30", negatives=30),
        progress=False,
    )
    plain = (
        read_output(files["dir"] / "plain.jsonl")
        if mining.mine_negatives(str(files["dir"] / "plain.jsonl"), **args)
        else None
    )
    summary = mining.mine_negatives(
        str(files["dir"] / "filtered.jsonl"), false_negatives=mining.FalseNegativeFilter(absolute_margin=0.0), **args
    )
    filtered = read_output(files["dir"] / "filtered.jsonl")
    records = {json.loads(l)["query_id"]: json.loads(l) for l in (files["dir"] / "filtered.jsonl").read_text()
               .splitlines()}
    total = 0
    for qid, query in plain.items():
        scores = dict(bm25s_ranking(QUERIES[qid]))
        bar = min(scores.get(p.id, 0.0) for p in query.positives)
        want_kept = [p.id for p in query.negatives if scores[p.id] <= bar + 1e-6]
        dropped = len(query.negatives) - len(want_kept)
        total += dropped
        if want_kept:
            assert [p.id for p in filtered[qid].negatives] == want_kept, qid
            assert records[qid]["dropped_false_negatives"] == dropped
        else:
            assert qid not in filtered
    report = summary["false_negative_filter"]
    assert report["dropped_total"] == report["dropped"]["absolute_margin"] == total > 0
    assert report["candidates_judged"] == sum(len(q.negatives) for q in plain.values())
    assert report["queries_with_drops"] >= 1 and report["most_dropped_in_one_query"] >= 1
    assert summary["skipped"].get(mining.ALL_FILTERED, 0) == sum(qid not in filtered for qid in plain)


def test_teacher_judge_uses_the_teachers_scores_and_writes_them(files):
    """A teacher given as a run of scores: the filter reads its scores, not BM25's; the passages carry them."""
    args = dict(corpus_path=files["corpus"],
                queries=mining.TrainingQuerySource(queries=files["queries"], qrels=files["qrels"]),
                picking=mining.NegativePicking(depth="1-30", negatives=30), progress=False)
    plain = (
        read_output(files["dir"] / "plain.jsonl")
        if mining.mine_negatives(str(files["dir"] / "plain.jsonl"), **args)
        else None
    )
    teacher_scores = {}
    lines = []
    rng = np.random.RandomState(3)
    for qid, query in plain.items():
        for p in query.positives:
            teacher_scores[(qid, p.id)] = 4.0
        for p in query.negatives:
            teacher_scores[(qid, p.id)] = float(np.round(rng.uniform(0, 5), 3))
    for (qid, docid), score in teacher_scores.items():
        lines.append(f"{qid} Q0 {docid} 1 {score} teacher\n")
    run = files["dir"] / "teacher.trec"
    run.write_text("".join(lines), encoding="utf-8")
    out = files["dir"] / "judged.jsonl"
    summary = mining.mine_negatives(
        str(out),
        false_negatives=mining.FalseNegativeFilter(relative_margin=0.25, judge="teacher", teacher=str(run)),
        **args,
    )
    judged = read_output(out)
    dropped = 0
    for qid, query in plain.items():
        kept = [p.id for p in query.negatives if teacher_scores[(qid, p.id)] <= 4.0 - 1.0]
        dropped += len(query.negatives) - len(kept)
        assert [p.id for p in judged[qid].negatives] == kept
        assert [p.score for p in judged[qid].negatives] == pytest.approx([teacher_scores[(qid, d)] for d in kept])
        assert all(p.score == 4.0 for p in judged[qid].positives)
    assert summary["false_negative_filter"]["dropped"] == {"absolute_margin": 0, "relative_margin": dropped}
    with pytest.raises(RankgenError, match="needs a `teacher`"):
        mining.mine_negatives(
            str(files["dir"] / "x.jsonl"),
            false_negatives=mining.FalseNegativeFilter(relative_margin=0.1, judge="teacher"),
            **args,
        )
    with pytest.raises(RankgenError, match="give `absolute_margin` or `relative_margin`"):
        mining.mine_negatives(
            str(files["dir"] / "x.jsonl"),
            false_negatives=mining.FalseNegativeFilter(judge="teacher", teacher=str(run)),
            **args,
        )
