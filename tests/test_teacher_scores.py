"""Teacher scores as data: Tevatron's "score" read and written, KL / MarginMSE training from a scored file using
those scores, and `score-candidates` (cross encoder or score file; resume; shards)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from test_inference import SHARED
from test_retrieval_training import DUAL_LISTS, joined, tevatron_records, write_jsonl

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.data.retrieval_files import Passage, read_training_queries, training_query_record
from rankgen_jax.data.source_configs import DataConfig, RetrievalData
from rankgen_jax.data.sources import make_sources
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.models.factory import build_model
from rankgen_jax.retrieval import resumable, teacher as teachers
from rankgen_jax.testing import random_params
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.metric_writers import read_metrics
from rankgen_jax.train.optimizers import OptimizerConfig


def scored_records(count=8, seed=0, altered=False):
    """tevatron_records with a teacher score on every passage; `altered` reverses each query's scores."""
    records = tevatron_records(count)
    rng = np.random.default_rng(seed)
    for r in records:
        passages = r["positive_passages"] + r["negative_passages"]
        scores = np.round(rng.normal(0, 3, len(passages)), 3)
        for p, s in zip(passages, scores[::-1] if altered else scores):
            p["score"] = float(s)
    return records


def test_scores_read_back_and_a_record_scored_in_part_is_skipped(tmp_path, capsys):
    records = scored_records(3)
    records[1]["positive_passages"][0].pop("score")
    records[0]["negative_passages"][0]["rank"] = 4
    path = write_jsonl(tmp_path / "scored.jsonl", records)
    queries = read_training_queries(path)
    assert [q.query_id for q in queries] == ["q-0", "q-2"]
    assert "a teacher score on some passages but not all" in capsys.readouterr().err
    assert [p.score for p in queries[0].positives] == [p["score"] for p in records[0]["positive_passages"]]
    assert queries[0].negatives[0].rank == 4 and queries[0].negatives[1].rank is None
    assert training_query_record(queries[0]) == records[0]
    for bad in ({"score": "high"}, {"score": float("nan")}, {"rank": 0}, {"score": True}):
        broken = scored_records(1)
        broken[0]["negative_passages"][0].update(bad)
        with pytest.raises(RankgenError, match="no usable training query"):
            read_training_queries(write_jsonl(tmp_path / "broken.jsonl", broken))


def _np_kl(scores, teacher, mask):
    total, rows = 0.0, 0
    for s, t, m in zip(scores, teacher, mask):
        s, t = s[m.astype(bool)].astype(np.float64), t[m.astype(bool)].astype(np.float64)
        log_q = s - np.log(np.sum(np.exp(s - s.max()))) - s.max()
        log_p = t - np.log(np.sum(np.exp(t - t.max()))) - t.max()
        total += np.sum(np.exp(log_p) * (log_p - log_q))
        rows += 1
    return total / rows


def _np_margin_mse(scores, teacher, mask):
    pairs = [((s[0] - s[j]) - (t[0] - t[j])) ** 2 for s, t, m in zip(scores, teacher, mask)
             for j in range(1, len(s)) if m[j] and m[0]]
    return float(np.mean(pairs))


@pytest.fixture(scope="module")
def init_checkpoint(tmp_path_factory, spiece_model):
    path = tmp_path_factory.mktemp("init") / "init"
    native.save_params(path, SHARED, random_params(SHARED, 3), vocab=spiece_model)
    return str(path)


@pytest.mark.parametrize("loss_name, reference", [("kl_distillation", _np_kl), ("margin_mse", _np_margin_mse)])
def test_kl_and_margin_mse_train_from_the_files_teacher_scores(tmp_path, init_checkpoint, spiece_model, loss_name,
                                                               reference):
    """One step through the trainer from a scored Tevatron file; the step-1 eval loss equals the loss recomputed
    in NumPy from the saved parameters and the file's scores, and a file with other scores gives another loss."""
    losses = {}
    for altered in (False, True):
        records = scored_records(16, altered=altered)
        folder = tmp_path / f"altered_{altered}"
        folder.mkdir()
        data = DataConfig(RetrievalData(train_file=write_jsonl(folder / "train.jsonl", records), eval_file=write_jsonl(folder / "dev.jsonl", records[4:]), continuation_length=24, hard_negatives=3, list_size=4, vocab=spiece_model), batch_size=8, prefix_length=16)
        trainer = TrainerConfig(num_steps=1, log_every=1, eval_every=1, eval_batches=1, checkpoint_every=1,
                                init_checkpoint=init_checkpoint, async_checkpoints=False)
        train(str(folder / "run"), trainer=trainer, model_config=SHARED, data=data, loss=LossConfig(name=loss_name),
              optimizer=OptimizerConfig(name="adamw", learning_rate=1e-3))
        logged = [r["eval/loss"] for r in read_metrics(folder / "run" / "metrics.jsonl")
                  if "eval/loss" in r and r["step"] == 1][0]
        batch = make_sources(data, DUAL_LISTS)[1].batch(0)
        by_text = {}
        for r in records:
            for p in r["positive_passages"] + r["negative_passages"]:
                by_text[joined(p)] = p["score"]
        config, params = native.restore_params(folder / "run")
        model = build_model(config)
        query = np.asarray(model.apply({"params": params}, jnp.asarray(batch["query_ids"]), tower="query"))
        cands = np.asarray(model.apply({"params": params}, jnp.asarray(batch["candidate_ids"].reshape(-1, 24)),
                                       tower="document")).reshape(8, 4, -1)
        scores = np.einsum("bd,bcd->bc", query.astype(np.float64), cands.astype(np.float64))
        assert logged == pytest.approx(reference(scores, batch["teacher_scores"], batch["candidate_mask"]), rel=1e-4)
        # The batch's teacher scores are the file's scores of its candidates.
        source = make_sources(data, DUAL_LISTS)[1]
        for query_record, row in zip(*source.batches.members(0, None)):
            sampled = source.record(query_record, 0, row)
            want = [by_text[c] for c in sampled["candidates"]]
            np.testing.assert_allclose(batch["teacher_scores"][row][: len(want)], want, rtol=1e-6)
        losses[altered] = logged
    assert abs(losses[True] - losses[False]) > 1e-3


def test_list_labels_teacher_orders_by_the_teacher(tmp_path, spiece_model):
    records = scored_records(8)
    data = DataConfig(RetrievalData(train_file=write_jsonl(tmp_path / "t.jsonl", records), eval_file=write_jsonl(tmp_path / "d.jsonl", records[4:]), continuation_length=24, hard_negatives=3, list_size=4, vocab=spiece_model, list_labels="teacher"), batch_size=4, prefix_length=16)
    batch = make_sources(data, DUAL_LISTS)[0].batch(1)
    np.testing.assert_array_equal(batch["labels"], batch["teacher_scores"])
    unscored = tevatron_records(8)
    with pytest.raises(RankgenError, match="list_labels='teacher' needs teacher scores"):
        make_sources(data.with_source(train_file=write_jsonl(tmp_path / "u.jsonl", unscored)), DUAL_LISTS)
    mixed = scored_records(8)
    for p in mixed[5]["positive_passages"] + mixed[5]["negative_passages"]:
        p.pop("score")
    with pytest.raises(RankgenError, match="carry teacher scores .* and the others none"):
        make_sources(data.with_source(
            list_labels="relevance", train_file=write_jsonl(tmp_path / "m.jsonl", mixed)), DUAL_LISTS)


# ---------------------------------------------------------------------------
# score-candidates


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """A BEIR folder (12 passages, 4 queries with qrels) and a TREC run of 6 passages per query."""
    root = tmp_path_factory.mktemp("collection")
    words = "rain moor house letter candle storm harbour keeper stairs fire snow river".split()
    corpus = [{"_id": f"p{i}", "title": "", "text": " ".join(words[i:] + words[:i][:3])} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"{words[i]} and {words[i + 3]}"} for i in range(4)]
    write_jsonl(root / "corpus.jsonl", corpus)
    write_jsonl(root / "queries.jsonl", queries)
    (root / "qrels").mkdir()
    (root / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tp{i}\t1\n" for i in range(4)) + "q1\tp9\t1\n")
    rng = np.random.default_rng(5)
    run = []
    for i in range(4):
        for rank, d in enumerate(rng.permutation(12)[:6], start=1):
            run.append(f"q{i} Q0 p{d} {rank} {10 - rank} bm25\n")
    (root / "run.trec").write_text("".join(run))
    return root


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, spiece_model):
    config = ModelConfig(encoder=SHARED.encoder, head=HeadConfig(pooling="first", projection_dim=0),
                         kind="cross_encoder")
    path = tmp_path_factory.mktemp("teacher") / "ranker"
    native.save_params(path, config, random_params(config, 4), vocab=spiece_model)
    return str(path)


def _records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_score_candidates_of_a_run_with_a_cross_encoder(collection, cross_encoder, tmp_path):
    out = tmp_path / "scored.jsonl"
    candidates = teachers.CandidateSource(run_file=str(collection / "run.trec"), queries=str(collection),
                                          corpus=str(collection), depth=5)
    summary = teachers.score_candidates(str(out), teachers.load_teacher(cross_encoder, 16, 24), candidates,
                                        progress=False)
    records = _records(out)
    assert summary["queries_written"] == 4 == len(records)
    run_lines = [line.split() for line in (collection / "run.trec").read_text().splitlines()]
    ranker = load_model(cross_encoder, kind="cross_encoder")
    texts = {json.loads(l)["_id"]: json.loads(l)["text"] for l in open(collection / "corpus.jsonl")}
    queries = {json.loads(l)["_id"]: json.loads(l)["text"] for l in open(collection / "queries.jsonl")}
    for record in records:
        qid = record["query_id"]
        ranked = [d for q, _, d, *_ in run_lines if q == qid][:5]
        relevant = {"q1": {"p1", "p9"}}.get(qid, {f"p{qid[1:]}"})
        passages = record["positive_passages"] + record["negative_passages"]
        assert {p["docid"] for p in record["positive_passages"]} == relevant
        assert [p["docid"] for p in record["negative_passages"]] == [d for d in ranked if d not in relevant]
        assert all(p.get("rank") == (ranked.index(p["docid"]) + 1 if p["docid"] in ranked else None) for p in passages)
        # Each score is the cross encoder's, scored on its own.
        (alone,) = ranker.score_pairs([queries[qid]], [[texts[p["docid"]] for p in passages]], 16, 24)
        np.testing.assert_allclose([p["score"] for p in passages], alone, rtol=1e-5, atol=1e-6)
    assert summary["passages_scored"] == sum(len(r["positive_passages"]) + len(r["negative_passages"])
                                             for r in records)


def test_score_file_teacher_resume_and_shards(collection, tmp_path, monkeypatch, capsys):
    """A score file as the teacher: its scores are copied, a pair it lacks is left out and counted; an interrupted
    run resumes to the same bytes; shards merge to the unsharded file."""
    run_lines = [line.split() for line in (collection / "run.trec").read_text().splitlines()]
    missing = next((q, d) for q, _, d, *_ in run_lines if q == "q2" and d != "p2")  # a pair the file lacks
    score_of = {(f"q{q}", f"p{p}"): round(0.5 * q - 0.25 * p, 2) for q in range(4) for p in range(12)}
    del score_of[missing]
    (tmp_path / "teacher.trec").write_text("".join(f"{q} Q0 {d} 1 {s} teacher\n" for (q, d), s in score_of.items()))
    args = dict(candidates=teachers.CandidateSource(run_file=str(collection / "run.trec"), queries=str(collection),
                                                    corpus=str(collection), depth=6), query_batch=1, progress=False)
    teacher = teachers.load_teacher(str(tmp_path / "teacher.trec"))
    whole = tmp_path / "whole.jsonl"
    summary = teachers.score_candidates(str(whole), teacher, **args)
    assert summary["passages_without_teacher_score"] == 1
    records = _records(whole)
    for record in records:
        for p in record["positive_passages"] + record["negative_passages"]:
            assert p["score"] == score_of[(record["query_id"], p["docid"])]
    assert missing[1] not in [p["docid"] for p in records[2]["negative_passages"]]

    resumed = tmp_path / "resumed.jsonl"
    real = resumable.write_progress
    calls = []

    def dies_on_the_third(path, record):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(path, record)

    monkeypatch.setattr(resumable, "write_progress", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        teachers.score_candidates(str(resumed), teacher, **args)
    monkeypatch.setattr(resumable, "write_progress", real)
    assert teachers.score_candidates(str(resumed), teacher, **args)["scored_now"] == 2
    assert resumed.read_bytes() == whole.read_bytes()

    shards = [tmp_path / f"shard{i}.jsonl" for i in range(3)]
    for i, shard in enumerate(shards):
        teachers.score_candidates(str(shard), teacher, num_shards=3, shard_index=i, **args)
    assert [r["query_id"] for r in _records(shards[1])] == ["q1"]
    merged = teachers.merge_shards(shards, tmp_path / "merged.jsonl", ["q0", "q1", "q2", "q3"])
    assert merged.read_bytes() == whole.read_bytes()

    # The same through the command line, from the scored file itself as the teacher of a training file.
    cli_out = tmp_path / "cli.jsonl"
    assert main(["score-candidates", "--teacher", str(whole), "--train_file", str(whole), "--output", str(cli_out),
                 "--no_progress"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["queries_written"] == 4
    assert cli_out.read_bytes() == whole.read_bytes()
    with pytest.raises(RankgenError, match="give a Tevatron training file \\(`train_file`\\) or a run"):
        teachers.score_candidates(str(tmp_path / "x.jsonl"), teacher, teachers.CandidateSource(), progress=False)


def test_file_scores_are_sentence_transformers_labels(tmp_path, one_torch_thread):
    """A record's scores in the order positive, negatives are the `label` list sentence-transformers' MarginMSELoss
    and DistillKLDivLoss take: on the same embeddings their losses equal ours on the file's teacher scores."""
    import torch
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MarginMSELoss

    from rankgen_jax.losses.listwise import kl_distillation_loss, margin_mse_loss

    records = [r for r in scored_records(8, seed=4) if len(r["negative_passages"]) >= 3][:4]
    queries = read_training_queries(write_jsonl(tmp_path / "scored.jsonl", records))
    labels = np.array([[q.positives[0].score] + [p.score for p in q.negatives[:3]] for q in queries], np.float32)
    rng = np.random.default_rng(2)
    query, columns = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(4, 4, 8)).astype(np.float32)
    embeddings = [torch.from_numpy(query)] + [torch.from_numpy(columns[:, c]) for c in range(4)]
    ours = {"query": query, "candidates": columns}
    batch = {"teacher_scores": labels}
    st_margin = MarginMSELoss(None).compute_loss_from_embeddings(embeddings, torch.from_numpy(labels))
    st_kl = DistillKLDivLoss(None).compute_loss_from_embeddings(embeddings, torch.from_numpy(labels))
    assert float(margin_mse_loss(ours, batch, {})[0]) == pytest.approx(float(st_margin), rel=1e-5)
    assert float(kl_distillation_loss(ours, batch, {})[0]) == pytest.approx(float(st_kl), rel=1e-5)


def test_score_pairs_refuses_plain_strings(cross_encoder):
    """A string is a sequence: without the check, score_pairs("q", ["a", "b"]) would score single characters."""
    ranker = load_model(cross_encoder, kind="cross_encoder")
    for queries, candidates in (("rain moor", [["house"]]), (["rain moor"], ["house", "letter"]),
                                (["rain moor"], "house")):
        with pytest.raises(RankgenError, match="list"):
            ranker.score_pairs(queries, candidates, 16, 24)


def test_a_bi_encoder_teacher_scores_by_sentence_transformers_own_similarity(collection, tmp_path, one_torch_thread):
    """A sentence-transformers bi-encoder folder as the teacher: each score is the model's similarity of the query's
    encode_query vector and the passage's encode_document vector, as sentence-transformers computes it, with the
    corpus encoded once and looked up, or each passage encoded with its query batch."""
    import torch
    from sentence_transformers import SentenceTransformer

    from rankgen_jax.pretrained import resolve_model

    folder = resolve_model("minilm")
    assert teachers.teacher_kind(folder) == "bi_encoder"
    model = SentenceTransformer(folder, device="cpu")
    texts = {json.loads(l)["_id"]: json.loads(l)["text"] for l in open(collection / "corpus.jsonl")}
    queries = {json.loads(l)["_id"]: json.loads(l)["text"] for l in open(collection / "queries.jsonl")}
    outs = {}
    for name, corpus in (("looked_up", str(collection)), ("encoded", None)):
        outs[name] = tmp_path / f"{name}.jsonl"
        teacher = teachers.load_teacher(folder, batch_size=4, corpus=corpus)
        candidates = teachers.CandidateSource(run_file=str(collection / "run.trec"), queries=str(collection),
                                              corpus=str(collection), depth=5)
        teachers.score_candidates(str(outs[name]), teacher, candidates, progress=False)
    for record in _records(outs["looked_up"]):
        passages = record["positive_passages"] + record["negative_passages"]
        want = model.similarity(torch.from_numpy(model.encode_query([queries[record["query_id"]]])),
                                torch.from_numpy(model.encode_document([texts[p["docid"]] for p in passages])))
        np.testing.assert_allclose([p["score"] for p in passages], want.numpy()[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(_records(outs["looked_up"]), _records(outs["encoded"])):
        np.testing.assert_allclose([p["score"] for p in a["positive_passages"] + a["negative_passages"]],
                                   [p["score"] for p in b["positive_passages"] + b["negative_passages"]], atol=1e-5)


def test_a_dual_encoder_checkpoint_teaches_with_its_towers(collection, cross_encoder, tmp_path, spiece_model):
    path = tmp_path / "dual"
    native.save_params(path, SHARED, random_params(SHARED, 9), vocab=spiece_model)
    assert teachers.teacher_kind(str(path)) == "bi_encoder"
    assert teachers.teacher_kind(cross_encoder) == "cross_encoder"
    assert teachers.teacher_kind(str(collection / "run.trec")) == "scores"
    teacher = teachers.load_teacher(str(path), 16, 24, corpus=str(collection))
    model = load_model(str(path))
    texts = {json.loads(l)["_id"]: json.loads(l)["text"] for l in open(collection / "corpus.jsonl")}
    # One passage of the corpus (its vector encoded once and looked up), one from elsewhere (encoded here).
    passages = [Passage("p5", texts["p5"]), Passage("x1", "rain moor house")]
    (scores,) = teacher.score(["q0"], ["rain and letter"], [passages])
    want = model.encode(["rain and letter"], side="prefix", max_length=16) @ model.encode(
        [p.text for p in passages], side="suffix", max_length=24).T
    np.testing.assert_allclose(scores, want[0], rtol=1e-5, atol=1e-6)


def test_an_ensemble_teacher_averages_standardised_scores(collection, tmp_path):
    """Members on different scales weigh the same: the mean of each member's z-scores within a query's candidates
    (NumPy reference); a pair a member cannot score gets no ensemble score."""
    rng = np.random.default_rng(3)
    pairs = [(f"q{q}", f"p{p}") for q in range(4) for p in range(12)]
    tables = []
    for i, scale in enumerate((1.0, 100.0)):
        scores = {pair: float(np.round(rng.normal(0, scale), 3)) for pair in pairs}
        if i == 1:
            del scores[("q0", "p3")]
        (tmp_path / f"m{i}.trec").write_text("".join(f"{q} Q0 {d} 1 {s} m\n" for (q, d), s in scores.items()))
        tables.append(scores)
    teacher = teachers.load_teacher(f"{tmp_path / 'm0.trec'} + {tmp_path / 'm1.trec'}")
    assert isinstance(teacher, teachers.EnsembleTeacher) and len(teacher.stamp["members"]) == 2
    candidates = [[Passage(f"p{p}", "x") for p in (1, 3, 4, 7)], [Passage(f"p{p}", "x")
                                                                          for p in (0, 2, 5)]]
    got = teacher.score(["q0", "q1"], ["a", "b"], candidates)
    for qid, cands, row in zip(("q0", "q1"), candidates, got):
        members = []
        for table in tables:
            values = np.array([table.get((qid, p.id), np.nan) for p in cands])
            finite = np.isfinite(values)
            members.append((values - values[finite].mean()) / values[finite].std())
        np.testing.assert_allclose(row, np.mean(members, axis=0), rtol=1e-5, atol=1e-6)
    assert np.isnan(got[0][1]) and np.isfinite(got[1]).all()
    with pytest.raises(RankgenError, match="no such teacher score file"):
        teachers.load_teacher(f"{tmp_path / 'm0.trec'} + {tmp_path / 'nothing.trec'}")
