"""Retrieval file readers: MS MARCO / TREC TSV, JSON lines (ours, BEIR, Tevatron), BEIR folders, qrels, runs."""

import gzip
import json

import pytest

from rankgen_jax.data.retrieval_files import (Passage, TrainingQuery, check_qrels, iter_texts, join_title, read_beir,
                                              read_passages, read_qrels, read_queries, read_run, read_texts,
                                              read_training_queries, run_lines, training_query_record,
                                              trec_eval_order, write_run)
from rankgen_jax.errors import RankgenError


def write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(path, records):
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_msmarco_tsv_keeps_ids_and_counts_bad_lines(tmp_path, capsys):
    raw = ("0\tThe presence of communication amid scientific minds\n"
           "1\tThe Manhattan Project and its atomic bomb\n"
           "\n"
           "007\tleading zeros stay\n"
           "8\ttoo\tmany fields\n").encode() + b"9\tcaf\xe9 latin-1\n" + b"10\t   \n11\tlast one, no newline"
    path = write(tmp_path / "collection.tsv", raw)
    passages = read_passages(path)
    # pid "0" stays "0", the text has no "pid\t" prefix, "007" is not 7.
    assert passages.ids == ["0", "1", "007", "11"]
    assert passages.texts[0] == "The presence of communication amid scientific minds"
    assert list(passages.lines) == [1, 2, 4, 8]
    assert passages.passage("007") == Passage("007", "leading zeros stay")
    assert passages.skipped.by_reason == {
        "wrong number of tab-separated fields (expected 2: id, text)": [5], "not UTF-8": [6],
        "missing or empty text": [7]}
    err = capsys.readouterr().err
    assert f"{path}: skipped 3 lines" in err and "(line 5)" in err and "(line 6)" in err
    # Gzipped, and under a name that says nothing (told by its first line): the same.
    gz = write(tmp_path / "collection.tsv.gz", gzip.compress(raw))
    assert read_passages(gz, quiet=True).ids == passages.ids
    other = write(tmp_path / "passages.dat", raw)
    assert read_passages(other, quiet=True).ids == passages.ids


def test_duplicate_ids_and_untellable_files_are_errors(tmp_path):
    dup = write(tmp_path / "dup.tsv", "a\tone\nb\ttwo\na\tthree\n")
    with pytest.raises(RankgenError, match=r"dup.tsv: passage id 'a' occurs twice \(lines 1 and 3\)"):
        read_passages(dup)
    dup_json = jsonl(tmp_path / "dup.jsonl", [{"_id": "x", "text": "one"}, {"_id": "x", "text": "two"}])
    with pytest.raises(RankgenError, match=r"query id 'x' occurs twice \(lines 1 and 2\)"):
        read_queries(dup_json)
    # Plain text has no ids: refused, never numbered by line.
    plain = write(tmp_path / "passages.txt", "one passage\nanother passage\n")
    with pytest.raises(RankgenError, match="cannot tell the format.*plain text"):
        read_passages(plain)
    with pytest.raises(RankgenError, match="the file is empty"):
        read_passages(write(tmp_path / "empty.txt", "\n\n"))
    with pytest.raises(RankgenError, match="no usable passage.*wrong number of tab-separated fields"):
        read_passages(write(tmp_path / "three.tsv", "a\tb\tc\n"))
    with pytest.raises(RankgenError, match="no such text file"):
        read_passages(tmp_path / "missing.tsv")


def test_jsonl_records_ours_beir_and_tevatron(tmp_path, capsys):
    path = jsonl(tmp_path / "corpus.jsonl", [
        {"_id": "doc-0", "title": "Emma", "text": "Emma Woodhouse, handsome, clever, and rich"},
        {"id": 0, "text": "an integer id becomes its decimal string"},
        {"docid": "t1", "title": "", "text": "Tevatron corpus line, empty title"},
        {"text": "no id: skipped, not numbered"},
        "{broken json",
        {"id": "two", "_id": "ids", "text": "two id fields"},
        {"id": True, "text": "a boolean is no id"},
        {"id": "no-text"},
        {"id": "bad-title", "title": 3, "text": "x"},
        {"id": "q", "text": "both", "query": "fields"},
    ])
    passages = read_passages(path)
    assert passages.ids == ["doc-0", "0", "t1"]
    assert passages.titles == ["Emma", "", ""]
    assert passages.texts[0] == "Emma Woodhouse, handsome, clever, and rich"
    # The one title rule: title + join + text; no title, or title_join None, gives the text.
    assert passages.joined()[0] == "Emma Emma Woodhouse, handsome, clever, and rich"
    assert passages.joined(": ")[:2] == ["Emma: Emma Woodhouse, handsome, clever, and rich",
                                         "an integer id becomes its decimal string"]
    assert passages.joined(None)[0] == passages.texts[0]
    assert join_title("T", "body", " | ") == "T | body" and join_title("", "body") == "body"
    assert passages.skipped.by_reason == {
        "no id field (_id, id, docid, query_id)": [4], "malformed JSON": [5], "more than one id field": [6],
        "id that is not a non-empty string or integer": [7], "missing or empty text": [8],
        "title that is not a string": [9], "both a text and a query field": [10]}
    assert f"{path}: skipped 7 lines" in capsys.readouterr().err
    # Tevatron queries {"query_id", "query"}; a Tevatron training file read as queries gives its queries.
    queries = jsonl(tmp_path / "train.jsonl", [{"query_id": "q7", "query": "who wrote emma", "positive_passages": []}])
    assert [(n, p) for n, p in iter_texts(queries)] == [(1, Passage("q7", "who wrote emma"))]


def beir_folder(tmp_path):
    folder = tmp_path / "beir"
    jsonl(folder / "corpus.jsonl", [{"_id": "austen-emma-0042", "title": "Emma", "text": "a passage"},
                                    {"_id": "0", "title": "", "text": "pid zero"},
                                    {"_id": "doc3", "title": "T", "text": "third"}])
    jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "first query", "metadata": {}},
                                     {"_id": "q2", "text": "second query"},
                                     {"_id": "q3", "text": "a train query"}])
    write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\tausten-emma-0042\t2\nq1\t0\t0\n"
                                         "q2\tmissing-doc\t1\nq2\tdoc3\t1\n")
    write(folder / "qrels" / "train.tsv", "query-id\tcorpus-id\tscore\nq3\t0\t1\n")
    return folder


def test_beir_folder(tmp_path, capsys):
    folder = beir_folder(tmp_path)
    # Passages: its corpus.jsonl; queries: those the split judges (test unless named).
    assert read_passages(folder).ids == ["austen-emma-0042", "0", "doc3"]
    assert read_queries(folder).ids == ["q1", "q2"]
    assert read_queries(folder, split="train").ids == ["q3"]
    qrels = read_qrels(folder)
    assert qrels.labels == {"q1": {"austen-emma-0042": 2, "0": 0}, "q2": {"missing-doc": 1, "doc3": 1}}
    assert qrels.relevant("q1", 1) == {"austen-emma-0042"} and qrels.relevant("q9") == set()
    # A judged passage missing from the corpus: counted and dropped, naming the qrels line...
    data = read_beir(folder)
    assert data.qrels.labels["q2"] == {"doc3": 1} and len(data.qrels) == 3
    assert data.queries.ids == ["q1", "q2"] and data.passages.joined()[0] == "Emma a passage"
    err = capsys.readouterr().err
    assert f"{folder / 'qrels' / 'test.tsv'}: skipped 1 judgements: 1 document not in the corpus (line 4)" in err
    # ... or an error, when asked.
    with pytest.raises(RankgenError, match=r"test.tsv: 1 judgements name ids that are missing.*\(line 4\)"):
        read_beir(folder, on_missing="error")
    with pytest.raises(RankgenError, match=r"no qrels for split 'dev'.*\(splits there: test, train\)"):
        read_qrels(folder, split="dev")
    # A judged query missing from queries.jsonl is always an error.
    write(folder / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq9\t0\t1\n")
    with pytest.raises(RankgenError, match=r"1 query not among the queries \(line 2\)"):
        read_queries(folder)
    with pytest.raises(RankgenError, match="not a BEIR one"):
        read_passages(tmp_path)


def test_qrels_formats_and_errors(tmp_path):
    trec = write(tmp_path / "2019qrels-pass.txt", "19335 0 1017759 0\n19335 0 0 3\nq-b Q0 doc:x -1\n\n19335 0 88 2\n")
    qrels = read_qrels(trec)
    assert qrels.labels == {"19335": {"1017759": 0, "0": 3, "88": 2}, "q-b": {"doc:x": -1}}
    assert qrels.lines[("19335", "88")] == 5
    msmarco = read_qrels(write(tmp_path / "pairs.tsv", "1048585\t7187158\n2\t0\n"))
    assert msmarco.labels == {"1048585": {"7187158": 1}, "2": {"0": 1}}
    beir = read_qrels(write(tmp_path / "test.tsv", "query-id\tcorpus-id\tscore\nPLAIN-1\tMED-2421\t2\n"))
    assert beir.labels == {"PLAIN-1": {"MED-2421": 2}}
    cases = {
        "1 0 a 1\n2 0 b\n": r"bad.txt:2: 3 fields, expected 4 \(trec qrels: qid iter docid rel\)",
        "1 0 a 1\n1 0 a 2\n": r"query '1' judges document 'a' twice \(lines 1 and 2\)",
        "1 0 a 1.5\n": r"bad.txt:1: relevance '1.5' is not an integer",
        "1 0 a 1 extra\n": r"cannot tell the qrels format from line 1 \(5 fields\)",
        "query-id\tcorpus-id\tscore\nq\td\n": r"bad.txt:2: 2 fields, expected 3",
        "": "the qrels file is empty",
    }
    for text, message in cases.items():
        with pytest.raises(RankgenError, match=message):
            read_qrels(write(tmp_path / "bad.txt", text))
    with pytest.raises(RankgenError, match="a split .* names a BEIR folder"):
        read_qrels(trec, split="test")
    with pytest.raises(RankgenError, match="2 judgements name ids that are missing"):
        check_qrels(qrels, passage_ids={"0", "88"})


def test_runs_read_write_and_errors(tmp_path):
    results = [{"query_id": "q1", "query": "x", "ids": ["d2", "d10", "d1", "d3"], "scores": [0.5, 0.5, 0.9, 0.1]},
               {"query_id": "0", "query": "y", "ids": ["0"], "scores": [-1.25]}]
    # trec_eval's order: score descending, equal scores by docid descending ("d2" > "d10" as strings).
    assert [d for d, _ in trec_eval_order({"d2": 0.5, "d10": 0.5, "d1": 0.9})] == ["d1", "d2", "d10"]
    assert list(run_lines(results, "trec", "tag")) == [
        "q1 Q0 d1 1 0.9 tag", "q1 Q0 d2 2 0.5 tag", "q1 Q0 d10 3 0.5 tag", "q1 Q0 d3 4 0.1 tag", "0 Q0 0 1 -1.25 tag"]
    assert list(run_lines(results, "msmarco"))[:2] == ["q1\td1\t1", "q1\td2\t2"]
    scores = {"q1": {"d2": 0.5, "d10": 0.5, "d1": 0.9, "d3": 0.1}, "0": {"0": -1.25}}
    for format in ("trec", "jsonl"):
        assert read_run(write_run(tmp_path / f"run.{format}", results, format)) == scores
    # An MS MARCO run has no scores: score -rank keeps its order.
    assert read_run(write_run(tmp_path / "run.tsv", results, "msmarco")) == {
        "q1": {"d1": -1.0, "d2": -2.0, "d10": -3.0, "d3": -4.0}, "0": {"0": -1.0}}
    with pytest.raises(RankgenError, match="document 'd1' is listed twice"):
        list(run_lines([{"query_id": "q", "ids": ["d1", "d1"], "scores": [1, 2]}], "trec"))
    with pytest.raises(RankgenError, match="holds whitespace"):
        list(run_lines([{"query_id": "q 1", "ids": ["d1"], "scores": [1]}], "trec"))
    cases = {
        "q Q0 a 1 0.5 t\nq Q0 b 2 0.4\n": r"bad.run:2: 5 fields, expected 6",
        "q Q0 a 1 0.5 t\nq Q0 a 2 0.4 t\n": r"query 'q' lists document 'a' twice \(line 1 and 2\)",
        "q Q0 a 1 high t\n": r"bad.run:1: score 'high' is not a number",
        "q Q0 a 1 nan t\n": r"bad.run:1: score 'nan' is not finite",
        "q\ta\t1\nq\tb\t1\n": r"query 'q' has two documents at rank 1 \(lines 1 and 2\)",
        "q\ta\t0\n": r"bad.run:1: rank 0",
        "q a\n": r"cannot tell the run format from line 1 \(2 fields\)",
        '{"query_id": "q", "ids": ["a"], "scores": [1, 2]}\n': r"bad.run:1: scores is not a list as long as ids",
    }
    for text, message in cases.items():
        with pytest.raises(RankgenError, match=message):
            read_run(write(tmp_path / "bad.run", text))


def test_tevatron_training_queries(tmp_path, capsys):
    good = {"query_id": "3", "query": "who is emma",
            "positive_passages": [{"docid": "0", "title": "Emma", "text": "Emma Woodhouse"},
                                  {"docid": 17, "text": "a second positive, no title"}],
            "negative_passages": [{"docid": "n1", "title": "", "text": "Mr. Knightley"}]}
    path = jsonl(tmp_path / "train.jsonl", [
        good,
        {"query_id": "4", "query": "no negatives listed", "positive_passages": [{"docid": "p", "text": "t"}]},
        {"query_id": "5", "query": "no positive", "positive_passages": [], "negative_passages": []},
        {"query_id": "6", "query": "passage without docid", "positive_passages": [{"text": "t"}]},
        {"query": "no id", "positive_passages": [{"docid": "p", "text": "t"}]},
    ])
    queries = read_training_queries(path)
    assert [q.query_id for q in queries] == ["3", "4"]
    first = queries[0]
    assert first.positives == (Passage("0", "Emma Woodhouse", "Emma"), Passage("17", "a second positive, no title"))
    assert first.positives[0].joined() == "Emma Emma Woodhouse" and first.positives[0].joined(None) == "Emma Woodhouse"
    assert first.negatives == (Passage("n1", "Mr. Knightley"),) and queries[1].negatives == ()
    assert training_query_record(first) == {**good, "positive_passages": [
        {"docid": "0", "title": "Emma", "text": "Emma Woodhouse"},
        {"docid": "17", "title": "", "text": "a second positive, no title"}]}
    err = capsys.readouterr().err
    assert f"{path}: skipped 3 lines" in err and "1 no positive passage (line 3)" in err
    assert isinstance(first, TrainingQuery)
    dup = jsonl(tmp_path / "dup.jsonl", [good, good])
    with pytest.raises(RankgenError, match=r"query id '3' occurs twice \(lines 1 and 2\)"):
        read_training_queries(dup)


def test_read_texts_format_names(tmp_path):
    path = write(tmp_path / "q.tsv", "1\tone\n")
    assert read_texts(path, format="tsv").ids == ["1"]
    with pytest.raises(RankgenError, match="unknown text file format"):
        read_texts(path, format="csv")
