"""Training from retrieval data (DataConfig.source=@RetrievalData()): Tevatron files, BEIR + qrels + a run, lists, the trainer."""

import collections
import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.data import retrieval_source
from rankgen_jax.data.text import PREFIX_MARKER, SUFFIX_MARKER
from rankgen_jax.resources import DEMO_VOCAB
from rankgen_jax.data.source_configs import DataConfig, RetrievalData
from rankgen_jax.data.sources import make_sources, missing_eval_data, training_conventions
from rankgen_jax.data.text import encode_pair_truncated, encode_truncated, load_text_encoder, pad_batch
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES, BatchLayout

DUAL_TRIPLES = BatchLayout("dual_encoder", TRIPLES)
DUAL_LISTS = BatchLayout("dual_encoder", CANDIDATE_LISTS)
CROSS_LISTS = BatchLayout("cross_encoder", CANDIDATE_LISTS)
WORDS = "emma woodhouse handsome clever rich comfortable home happy disposition seemed unite best blessings".split()


def _words(seed: int, n: int = 6) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n))


def _passage(docid: str, seed: int, title: str = "") -> dict:
    # Each passage's text is unique (its id is in it), so equal token ids mean the same passage.
    return {"docid": docid, "title": title, "text": f"{docid} {_words(seed)}"}


def tevatron_records(count: int = 8, negatives=(5, 5, 1, 0, 5, 4, 5, 5)) -> list[dict]:
    """Queries with 3 positives (string ids, pid "0", titles) and the given numbers of negatives."""
    records = []
    for q in range(count):
        positives = [_passage(f"austen-emma-{q:02d}{p:02d}", 100 * q + p, title="Emma") for p in range(3)]
        if q == 0:
            positives[0] = _passage("0", 7)  # MS MARCO's pid 0 stays "0"
        negs = [_passage(f"neg-{q}-{n}", 1000 + 100 * q + n) for n in range(negatives[q % len(negatives)])]
        records.append({"query_id": f"q-{q}", "query": f"who is {_words(q, 4)}", "positive_passages": positives,
                        "negative_passages": negs})
    return records


def write_jsonl(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return str(path)


def tevatron_config(tmp_path, records=None, batch_size=4, seed=0, **overrides) -> DataConfig:
    records = records if records is not None else tevatron_records()
    train = write_jsonl(tmp_path / "train.jsonl", records)
    dev = write_jsonl(tmp_path / "dev.jsonl", records[4:])
    fields = dict(train_file=train, eval_file=dev, continuation_length=24, hard_negatives=3)
    fields.update(overrides)
    return DataConfig(RetrievalData(**fields), batch_size=batch_size, prefix_length=16, seed=seed)


def joined(passage: dict) -> str:
    return passage["title"] + " " + passage["text"] if passage["title"] else passage["text"]


@pytest.fixture(scope="module")
def text():
    return load_text_encoder(DEMO_VOCAB)


def test_tevatron_triples_sample_positives_and_k_negatives(tmp_path, text, capsys):
    records = tevatron_records()
    records[5]["negative_passages"].append(records[5]["positive_passages"][1])  # a positive listed as a negative
    train, _ = make_sources(tevatron_config(tmp_path, records), DUAL_TRIPLES)
    err = capsys.readouterr().err
    # The query without negatives (q-3, line 4) is skipped and counted; q-5's negative that is its own positive
    # is dropped from its pool and counted.
    assert train.pool.skipped.by_reason == {retrieval_source.NO_NEGATIVE: [4]}
    assert train.pool.dropped_negatives == 1 and "dropped 1 negatives" in err and "(line 4)" in err
    by_id = {r["query_id"]: r for r in records}
    assert "q-3" not in {q.query_id for q in train.pool.queries}

    batch = train.batch(1)
    assert set(batch) == {"query_ids", "positive_ids", "negative_ids"}
    assert batch["query_ids"].shape == (4, 16) and batch["positive_ids"].shape == (4, 24)
    assert batch["negative_ids"].shape == (4, 3, 24)

    def ids(passage_text):
        return pad_batch([encode_truncated(text, SUFFIX_MARKER, passage_text, 24)], 24, text.pad_id)[0]

    chosen_positive = collections.defaultdict(set)
    for index in range(40):
        batch = train.batch(index)
        queries, rows = train.batches.members(index, None)
        for row, query in zip(rows, queries):
            record = by_id[query.query_id]
            positives = {joined(p) for p in record["positive_passages"]}
            pool = [joined(p) for p in record["negative_passages"] if p["docid"] not in
                    {x["docid"] for x in record["positive_passages"]}]
            sampled = train.record(query, index, row)
            positive, negatives = sampled["candidates"][0], sampled["candidates"][1:]
            assert positive in positives and len(negatives) == 3 and set(negatives) <= set(pool)
            chosen_positive[query.query_id].add(positive)
            if len(pool) >= 3:
                assert len(set(negatives)) == 3  # without replacement
            else:  # q-2 has one negative: it fills all K slots (never other text)
                assert negatives == pool * 3
            # The arrays are those texts, tokenised as the list source does ("pre " / "suffi ", titles joined).
            assert np.array_equal(batch["positive_ids"][row], ids(positive))
            assert all(np.array_equal(batch["negative_ids"][row, k], ids(n)) for k, n in enumerate(negatives))
            query_ids = encode_truncated(text, PREFIX_MARKER, record["query"], 16, "end")
            assert np.array_equal(batch["query_ids"][row], pad_batch([query_ids], 16, text.pad_id)[0])
    # One positive per step, drawn among all of a query's positives.
    assert all(len(seen) == 3 for seen in chosen_positive.values())

    # Deterministic for (seed, index); a fresh source gives the same batches; row slices are the full batch's rows.
    again, _ = make_sources(tevatron_config(tmp_path, records), DUAL_TRIPLES)
    for index in (0, 3, 11):
        full = train.batch(index)
        assert all(np.array_equal(full[k], again.batch(index)[k]) for k in full)
        for rows in (slice(0, 2), slice(2, 4), slice(1, 3)):
            part = train.batch(index, rows)
            assert all(np.array_equal(full[k][rows], part[k]) for k in full)
    other_seed, _ = make_sources(tevatron_config(tmp_path, records, seed=1), DUAL_TRIPLES)
    assert not np.array_equal(other_seed.batch(0)["negative_ids"], train.batch(0)["negative_ids"])

    first, _ = make_sources(tevatron_config(tmp_path, records, positive_choice="first"), DUAL_TRIPLES)
    for index in range(5):
        for query, row in zip(*first.batches.members(index, None)):
            assert first.record(query, index, row)["candidates"][0] == joined(by_id[query.query_id]["positive_passages"][0])


def test_too_few_negatives_skip_and_no_titles(tmp_path, capsys):
    train, _ = make_sources(tevatron_config(tmp_path, too_few_negatives="skip", title_join=None), DUAL_TRIPLES)
    # q-2 (one negative) and q-3 (none) are left out, each counted with its line.
    assert train.pool.skipped.by_reason == {retrieval_source.TOO_FEW: [3], retrieval_source.NO_NEGATIVE: [4]}
    assert "fewer negatives than hard_negatives" in capsys.readouterr().err
    assert all(len(q.negatives) >= 3 for q in train.pool.queries)
    query, row = train.batches.members(0, None)[0][0], 0
    assert all(not c.startswith("Emma ") for c in train.record(query, 0, row)["candidates"])
    # K = 0: in-batch negatives only; no negative_ids, and queries without negatives are kept.
    in_batch, _ = make_sources(tevatron_config(tmp_path, hard_negatives=0), DUAL_TRIPLES)
    assert set(in_batch.batch(0)) == {"query_ids", "positive_ids"} and len(in_batch.pool.queries) == 8


def write_beir(folder, run_lines: list[str]) -> dict:
    """A BEIR folder: 6 train and 2 dev queries over string-id passages, qrels with a header, and a TREC run."""
    corpus = [{"_id": "0", "title": "Emma", "text": "pid zero " + _words(1)}]
    corpus += [{"_id": f"austen-emma-{i:04d}", "title": "Emma" if i % 2 else "", "text": f"passage {i} " + _words(i)}
               for i in range(1, 40)]
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", [{"_id": f"q{q}", "text": f"query {q} " + _words(50 + q, 3)}
                                           for q in range(8)])
    train = ["query-id\tcorpus-id\tscore"]
    for q in range(6):
        # Two relevant passages per query; q0's second relevant one is pid "0"; q5 is judged non-relevant only.
        train += [f"q{q}\taustin\t0".replace("austin", f"austen-emma-{5 * q + 1:04d}")]
        if q != 5:
            train += [f"q{q}\t{'0' if q == 0 else f'austen-emma-{5 * q + 2:04d}'}\t1",
                      f"q{q}\tausten-emma-{5 * q + 3:04d}\t2"]
    (folder / "qrels" / "train.tsv").write_text("\n".join(train) + "\n")
    (folder / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq6\taustin\t1\nq7\taustin\t1\n"
                                              .replace("austin", "austen-emma-0033"))
    (folder / "run.trec").write_text("".join(line + "\n" for line in run_lines))
    return {p["_id"]: p for p in corpus}


def trec_run(depth: int = 8) -> list[str]:
    """Each query's top passages: its own judged ones (relevant and not) and others, as a retriever would list them."""
    lines = []
    for q in range(8):
        docs = [f"austen-emma-{(5 * q + d) % 39 + 1:04d}" for d in range(depth)]
        if q == 0:
            docs[1] = "0"
        lines += [f"q{q} Q0 {d} {rank} {10.0 - rank} bm25" for rank, d in enumerate(docs, start=1)]
    return lines


def test_beir_qrels_and_run_as_the_negative_pool(tmp_path, capsys):
    folder = tmp_path / "beir"
    corpus = write_beir(folder, trec_run())
    config = DataConfig(RetrievalData(retrieval_corpus=str(folder), negatives_run=str(folder / "run.trec"), continuation_length=24, hard_negatives=2), batch_size=2, prefix_length=16)
    train, dev = make_sources(config, DUAL_TRIPLES)
    # q5's qrels judge nothing relevant: skipped, counted by its qrels line.
    assert train.pool.skipped.by_reason == {retrieval_source.NO_RELEVANT: [17]}
    assert [q.query_id for q in dev.pool.queries] == ["q6", "q7"]
    qrels = {}
    for line in (folder / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        qid, docid, label = line.split("\t")
        qrels.setdefault(qid, {})[docid] = int(label)
    for query in train.pool.queries:
        relevant = {d for d, label in qrels[query.query_id].items() if label >= 1}
        assert {p.id for p in query.positives} == relevant
        pool = {p.id for p in query.negatives}
        # The run lists the query's relevant passages near the top: never in its pool. A passage judged 0 is.
        assert pool and not pool & relevant
        run_ids = [line.split()[2] for line in trec_run() if line.split()[0] == query.query_id]
        assert [p.id for p in query.negatives] == [d for d in run_ids if d not in relevant]
        assert f"austen-emma-{5 * int(query.query_id[1:]) + 1:04d}" in pool
    q0 = next(q for q in train.pool.queries if q.query_id == "q0")
    assert "0" in {p.id for p in q0.positives}
    # Titles join the text; sampling over many steps never draws a relevant passage as a negative.
    for index in range(30):
        for query, row in zip(*train.batches.members(index, None)):
            sampled = train.record(query, index, row)
            texts = {joined({"title": corpus[p.id]["title"], "text": corpus[p.id]["text"]}): p.id
                     for p in query.positives + query.negatives}
            positive, negatives = sampled["candidates"][0], sampled["candidates"][1:]
            assert texts[positive] in {p.id for p in query.positives}
            assert not {texts[n] for n in negatives} & {p.id for p in query.positives}
    assert dev.batch(0)["negative_ids"].shape == (2, 2, 24)

    # The same from separate files: TSV passages, JSON-lines queries, TREC qrels, an MS MARCO run.
    tsv = tmp_path / "collection.tsv"
    tsv.write_text("".join(f"{i}\t{p['text']}\n" for i, p in corpus.items()))
    qrels_trec = tmp_path / "qrels.train.trec"
    qrels_trec.write_text("".join(f"{q} 0 {d} {label}\n" for q, docs in qrels.items() for d, label in docs.items()))
    dev_qrels = tmp_path / "qrels.dev.tsv"
    dev_qrels.write_text("q6\tausten-emma-0033\nq7\tausten-emma-0033\n")
    run = tmp_path / "run.msmarco.tsv"
    run.write_text("".join(f"{line.split()[0]}\t{line.split()[2]}\t{line.split()[3]}\n" for line in trec_run()))
    files = DataConfig(RetrievalData(retrieval_corpus=str(tsv), queries=str(folder / "queries.jsonl"), qrels=str(qrels_trec), eval_qrels=str(dev_qrels), negatives_run=str(run), continuation_length=24, hard_negatives=2), batch_size=2, prefix_length=16)
    from_files, _ = make_sources(files, DUAL_TRIPLES)
    assert [(q.query_id, [p.id for p in q.positives], [p.id for p in q.negatives]) for q in from_files.pool.queries] \
        == [(q.query_id, [p.id for p in q.positives], [p.id for p in q.negatives]) for q in train.pool.queries]

    # Tevatron files with qrels: what the qrels judge relevant never becomes a negative either.
    records = tevatron_records()
    judged = tmp_path / "judged.trec"
    judged.write_text("q-0 0 neg-0-1 1\nq-0 0 neg-0-2 0\n")
    tev, _ = make_sources(tevatron_config(tmp_path, records, qrels=str(judged)), DUAL_TRIPLES)
    pool = {p.id for p in tev.pool.queries[0].negatives}
    assert "neg-0-1" not in pool and "neg-0-2" in pool and tev.pool.dropped_negatives == 1


def test_bad_retrieval_data_give_clear_errors(tmp_path, capsys):
    folder = tmp_path / "beir"
    write_beir(folder, trec_run() + ["q1 Q0 not-in-corpus 99 0.5 bm25"])
    beir = dict(retrieval_corpus=str(folder), hard_negatives=2)
    with pytest.raises(RankgenError, match="1 passages of the run are not in .*beir.*another corpus"):
        make_sources(DataConfig(RetrievalData(**beir, negatives_run=str(folder / "run.trec")), batch_size=2),
                     DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="hard_negatives=2 with qrels needs a run"):
        make_sources(DataConfig(RetrievalData(**beir), batch_size=2), DUAL_TRIPLES)
    # Held-out qrels are optional: without them there is no eval source, and what to give is known up front.
    no_dev = DataConfig(RetrievalData(**dict(beir, hard_negatives=0), eval_split="validation"), batch_size=2)
    assert make_sources(no_dev, DUAL_TRIPLES)[1] is None
    assert "no qrels/validation.tsv; its splits: dev, train" in missing_eval_data(no_dev)
    assert missing_eval_data(DataConfig(dataclasses.replace(no_dev.source, eval_split="dev"))) == ""
    with pytest.raises(RankgenError, match="RetrievalData.queries is needed when retrieval_corpus"):
        make_sources(DataConfig(RetrievalData(retrieval_corpus=str(folder / "corpus.jsonl"))), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="needs Tevatron files .* or RetrievalData.retrieval_corpus"):
        make_sources(DataConfig(RetrievalData()), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="not both"):
        make_sources(tevatron_config(tmp_path, retrieval_corpus=str(folder)), DUAL_TRIPLES)
    assert make_sources(tevatron_config(tmp_path, eval_file=""), DUAL_TRIPLES)[1] is None
    assert "RetrievalData.eval_file" in missing_eval_data(tevatron_config(tmp_path, eval_file=""))
    with pytest.raises(RankgenError, match="needs RetrievalData.train_file"):
        make_sources(tevatron_config(tmp_path, train_file=""), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="positive_choice must be one of"):
        make_sources(tevatron_config(tmp_path, positive_choice="all"), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="too_few_negatives must be one of"):
        make_sources(tevatron_config(tmp_path, too_few_negatives="pad"), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="list_size is for candidate lists"):
        make_sources(tevatron_config(tmp_path, list_size=4), DUAL_TRIPLES)
    with pytest.raises(RankgenError, match="list_size=3 cannot hold one positive and hard_negatives=3"):
        make_sources(tevatron_config(tmp_path, list_size=3), CROSS_LISTS)
    with pytest.raises(RankgenError, match="fewer than one batch of 8"):
        make_sources(tevatron_config(tmp_path, batch_size=8), DUAL_TRIPLES)
    # Bad lines of a Tevatron file are skipped and counted by line; a file with none usable is an error.
    records = tevatron_records()
    lines = [records[0], "{not json", {"query_id": "x", "query": "no positives"}, *records[1:]]
    train, _ = make_sources(tevatron_config(tmp_path, lines), DUAL_TRIPLES)
    err = capsys.readouterr().err
    assert "skipped 2 lines" in err and "(line 2)" in err and "(line 3)" in err
    assert len(train.pool.queries) == 7
    with pytest.raises(RankgenError, match="no usable training query"):
        make_sources(tevatron_config(tmp_path, ["{not json"] * 4), DUAL_TRIPLES)
    no_negatives = [dict(r, negative_passages=[]) for r in records]
    with pytest.raises(RankgenError, match=r"no usable training query \(8 no negative passage"):
        make_sources(tevatron_config(tmp_path, no_negatives), DUAL_TRIPLES)


def test_tevatron_as_candidate_lists(tmp_path, text):
    records = tevatron_records()
    config = tevatron_config(tmp_path, records, hard_negatives=2, list_size=5)
    by_id = {r["query_id"]: r for r in records}
    lists, _ = make_sources(config, CROSS_LISTS)
    batch = lists.batch(2)
    assert batch["pair_ids"].shape == (4, 5, 40) and batch["labels"].shape == batch["candidate_mask"].shape == (4, 5)
    for query, row in zip(*lists.batches.members(2, None)):
        record = by_id[query.query_id]
        sampled = lists.record(query, 2, row)
        pool = [joined(p) for p in record["negative_passages"]]
        # Up to list_size - K = 3 positives (label 1), then K negatives (label 0); a short pool leaves masked slots.
        count = min(2, len(pool))
        assert sampled["labels"] == [1.0] * 3 + [0.0] * count
        assert set(sampled["candidates"][:3]) == {joined(p) for p in record["positive_passages"]}
        assert batch["candidate_mask"][row].tolist() == [1] * (3 + count) + [0] * (2 - count)
        assert batch["labels"][row].tolist() == [1.0] * 3 + [0.0] * 2
        for c, candidate in enumerate(sampled["candidates"]):
            pair = encode_pair_truncated(text, record["query"], candidate, 16, 24, "end")[0]
            assert np.array_equal(batch["pair_ids"][row, c], pad_batch([pair], 40, text.pad_id)[0])
    assert any(len(by_id[q.query_id]["negative_passages"]) == 1 for q in lists.pool.queries)
    dual, _ = make_sources(config, DUAL_LISTS)
    assert dual.batch(2)["candidate_ids"].shape == (4, 5, 24)
    for rows in (slice(0, 1), slice(1, 4)):
        part = lists.batch(2, rows)
        assert all(np.array_equal(batch[k][rows], part[k]) for k in batch)
    # A cross encoder reads retrieval data without markers, as it reads any candidate list.
    assert training_conventions(config, CROSS_LISTS).prefix_marker == ""
    assert training_conventions(config, DUAL_TRIPLES).prefix_marker == PREFIX_MARKER


def test_batch_shapes_for_compile():
    from rankgen_jax.tpu.aot import batch_shapes

    config = DataConfig(RetrievalData(continuation_length=24, hard_negatives=3), batch_size=8, prefix_length=16)
    assert batch_shapes(config, DUAL_TRIPLES) == {"query_ids": (8, 16), "positive_ids": (8, 24),
                                                  "negative_ids": (8, 3, 24)}
    assert "negative_ids" not in batch_shapes(config.with_source(hard_negatives=0), DUAL_TRIPLES)


def _softmax_loss(query_BxD, positive_BxD, negative_BxKxD, batch) -> float:
    """in_batch_softmax in NumPy: every query against all B positives then all B*K negatives; same-text columns out."""
    candidates = np.concatenate([positive_BxD, negative_BxKxD.reshape(-1, negative_BxKxD.shape[-1])])
    ids = np.concatenate([batch["positive_ids"], batch["negative_ids"].reshape(-1, batch["positive_ids"].shape[1])])
    scores = query_BxD.astype(np.float64) @ candidates.T.astype(np.float64)
    losses = []
    for i in range(len(query_BxD)):
        valid = [j == i or not np.array_equal(ids[j], batch["positive_ids"][i]) for j in range(len(candidates))]
        row = scores[i][valid]
        gold = int(np.sum(valid[:i]))
        losses.append(np.log(np.sum(np.exp(row - row.max()))) + row.max() - row[gold])
    return float(np.mean(losses))


def test_rankgen_jax_train_on_a_tevatron_file(tmp_path, capsys):
    """`rankgen-jax train` with the shipped gin file: K = 3 hard negatives per query, in-batch softmax."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.cli.main import main
    from rankgen_jax.models.factory import build_model
    from rankgen_jax.train.metric_writers import read_metrics

    records = tevatron_records(16)
    train_file = write_jsonl(tmp_path / "train.jsonl", records)
    dev_file = write_jsonl(tmp_path / "dev.jsonl", records[4:])
    workdir = tmp_path / "run"
    code = main(["train", "--gin_file=retrieval_t5_tiny_tevatron.gin", f"--workdir={workdir}",
                 f"--gin.RetrievalData.train_file='{train_file}'", f"--gin.RetrievalData.eval_file='{dev_file}'",
                 "--gin.DataConfig.batch_size=8", "--gin.DataConfig.prefix_length=16",
                 "--gin.RetrievalData.continuation_length=24", "--gin.t5_config.num_layers=1",
                 "--gin.TrainerConfig.num_steps=2", "--gin.OptimizerConfig.warmup_steps=1",
                 "--gin.TrainerConfig.log_every=1",
                 "--gin.TrainerConfig.eval_every=2", "--gin.TrainerConfig.eval_batches=1",
                 "--gin.TrainerConfig.checkpoint_every=2", "--gin.TrainerConfig.async_checkpoints=False"])
    assert code == 0, capsys.readouterr().err
    records_out = read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in records_out if "train/loss" in r] == [1, 2]
    final_eval = [r for r in records_out if "eval/loss" in r and r["step"] == 2][0]["eval/loss"]

    # The logged eval loss is the in-batch softmax over the eval source's batch 0 with its [B, 3, Lc] negatives:
    # recomputed in NumPy from the saved step-2 parameters and the source's own arrays.
    config, params = native.restore_params(workdir)
    data = DataConfig(RetrievalData(train_file=train_file, eval_file=dev_file, continuation_length=24, hard_negatives=3), batch_size=8, prefix_length=16)
    batch = make_sources(data, DUAL_TRIPLES)[1].batch(0)
    assert batch["negative_ids"].shape == (8, 3, 24)
    model = build_model(config)

    def embed(ids, tower):
        return np.asarray(model.apply({"params": params}, jnp.asarray(ids.reshape(-1, ids.shape[-1])), tower=tower))

    negatives = embed(batch["negative_ids"], "document").reshape(8, 3, -1)
    expected = _softmax_loss(embed(batch["query_ids"], "query"), embed(batch["positive_ids"], "document"),
                             negatives, batch)
    assert final_eval == pytest.approx(expected, rel=1e-4)
    conventions = native.load_input_conventions(workdir)
    assert (conventions.prefix_marker, conventions.suffix_marker, conventions.suffix_length) == ("pre ", "suffi ", 24)
