"""Rankers and distillation through the one sharded step: list/pair batches, list losses, multi-perspective heads."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.runtime import partitioning
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, t5_config
from rankgen_jax.data.jsonl import read_jsonl
from rankgen_jax.data.lists import ListBatches, PairBatches, check_list_record, check_pair_record
from rankgen_jax.resources import DEMO_VOCAB
from rankgen_jax.data.source_configs import DataConfig, ListsData, RandomData
from rankgen_jax.data.sources import make_sources
from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import registry as losses
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.data.text import TokenWindows, encode_pair_truncated, load_text_encoder
from rankgen_jax.models import batch_layout
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES, BatchLayout
from rankgen_jax.train.step import StepOptions
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.compiled import build_step_functions
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
from step_harness import TOL, assert_trees_close, run_steps

DUAL_LISTS = BatchLayout("dual_encoder", CANDIDATE_LISTS)
DUAL_TRIPLES = BatchLayout("dual_encoder", TRIPLES)
CROSS_LISTS = BatchLayout("cross_encoder", CANDIDATE_LISTS)
CROSS_TOWERS = batch_layout.towers("cross_encoder")
BERT = BertConfig(vocab_size=128, d_model=32, d_ff=64, num_layers=1, num_heads=4, max_position_embeddings=64)
WORDS = "the old house stood by the river where many boats passed every morning and evening".split()


def _text(rng, n):
    return " ".join(rng.choice(WORDS, n))


def list_records(count, size, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(2, size + 1))
        out.append({"query": _text(rng, 12), "candidates": [_text(rng, 6) for _ in range(n)],
                    "labels": [float(x) for x in rng.integers(0, 4, n)],
                    "teacher_scores": [float(x) for x in rng.normal(size=n)]})
    return out


@pytest.fixture(scope="module")
def t5_text():
    return load_text_encoder(DEMO_VOCAB)


def test_list_batches_layouts(t5_text):
    records = list_records(12, 5)
    dual = ListBatches(records, TokenWindows(t5_text, 16, 8), 4, DUAL_LISTS, list_size=5, seed=3)
    batch = dual.batch(2)
    assert batch["query_ids"].shape == (4, 16) and batch["candidate_ids"].shape == (4, 5, 8)
    assert batch["candidate_mask"].shape == batch["labels"].shape == batch["teacher_scores"].shape == (4, 5)
    # Deterministic per index; row slices give the same rows as the whole batch (multi-host input).
    again = dual.batch(2)
    assert all(np.array_equal(batch[k], again[k]) for k in batch)
    half = dual.batch(2, slice(2, 4))
    assert all(np.array_equal(batch[k][2:4], half[k]) for k in batch)
    # Masked candidates are exactly the padding beyond each record's list.
    members, _ = dual.batches.members(2, None)
    for row, record in enumerate(members):
        n = len(record["candidates"])
        assert batch["candidate_mask"][row].tolist() == [1] * n + [0] * (5 - n)
        assert batch["labels"][row, :n].tolist() == record["labels"]
    in_batch = ListBatches(records, TokenWindows(t5_text, 16, 8), 4, DUAL_TRIPLES, list_size=3)
    b = in_batch.batch(0)
    assert b["positive_ids"].shape == (4, 8) and b["negative_ids"].shape == (4, 2, 8)
    cross = ListBatches(records, TokenWindows(t5_text, 16, 8), 4, CROSS_LISTS, list_size=5)
    c = cross.batch(0)
    assert c["pair_ids"].shape == (4, 5, 24) and "pair_type_ids" not in c  # T5: no token types


def _ids(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k.endswith("_ids") and not k.endswith("_type_ids")}


def test_sources_build_the_arrays_their_layout_declares(t5_text):
    """The batch-layout table is what the sources build: its ids arrays, at its lengths; each read by a tower."""
    records = list_records(12, 4)
    for layout in (DUAL_LISTS, DUAL_TRIPLES, CROSS_LISTS):
        batch = _ids(ListBatches(records, TokenWindows(t5_text, 16, 8), 4, layout, list_size=4).batch(0))
        assert {k: v.shape[-1] for k, v in batch.items()} == layout.lengths(16, 8)
        assert {a.key for a in layout.arrays} <= {t.ids_key for t in layout.towers}
    data = DataConfig(RandomData(continuation_length=6, vocab_size=128), batch_size=4, prefix_length=12)
    for with_negative in (True, False):
        batch = _ids(make_sources(data.with_source(with_negative=with_negative))[0].batch(0))
        assert {k: v.shape[-1] for k, v in batch.items()} == DUAL_TRIPLES.lengths(12, 6, optional=with_negative)


def test_layouts_by_model_kind_and_loss(tmp_path):
    assert losses.batch_form("in_batch_softmax") == losses.batch_form("per_example_softmax") == TRIPLES
    assert {losses.batch_form(name) for name in ("listmle", "kl_distillation", "multi_perspective_bce")} == {
        CANDIDATE_LISTS}
    with pytest.raises(RankgenError, match="unknown loss 'listnet'"):
        losses.batch_form("listnet")
    with pytest.raises(RankgenError, match="a cross_encoder trains on candidate lists, not triples"):
        BatchLayout("cross_encoder", TRIPLES)
    with pytest.raises(RankgenError, match="no training batch layout for model kind 'encoder'"):
        BatchLayout("encoder", TRIPLES)
    # The trainer checks the model kind against its loss before reading any data.
    with pytest.raises(RankgenError, match="loss 'in_batch_softmax' does not train a cross_encoder: it compares "
                                           "separate query and candidate vectors"):
        train(str(tmp_path / "run"), TrainerConfig(num_steps=1), CROSS, DataConfig(ListsData()), LossConfig("in_batch_softmax"))


def test_bert_pairs_have_token_types():
    from rankgen_jax.pretrained import resolve_model

    text = load_text_encoder(resolve_model("minilm") + "/tokenizer.json")
    ids, types = encode_pair_truncated(text, "one two three four five six", "seven eight nine ten", 5, 4)
    full_ids, full_types = text.encode_pair("four five six", "seven eight nine")
    # The query keeps its end, the candidate its start; same specials and types as the tokenizer's own pairs.
    assert ids == full_ids and types == full_types
    batch = ListBatches(list_records(8, 3), TokenWindows(text, 16, 8), 4, CROSS_LISTS, list_size=3).batch(0)
    assert batch["pair_type_ids"].shape == batch["pair_ids"].shape and batch["pair_type_ids"].max() == 1


def test_bad_records_are_skipped_and_counted(tmp_path, capsys):
    path = tmp_path / "lists.jsonl"
    good = list_records(3, 3)
    lines = [json.dumps(good[0]), "{not json", json.dumps({"query": "q", "candidates": []}),
             json.dumps({**good[1], "labels": [1.0]}), "", json.dumps(good[2]), "[1, 2]"]
    path.write_text("\n".join(lines) + "\n")
    records = read_jsonl(path, check_list_record)
    assert records == [good[0], good[2]]
    err = capsys.readouterr().err
    assert "skipped 4 lines" in err and "malformed JSON (line 2)" in err and "labels not one finite number" in err
    useless = tmp_path / "useless.jsonl"
    useless.write_text("{}\n")
    with pytest.raises(RankgenError, match="no usable records"):
        read_jsonl(useless, check_list_record)
    with pytest.raises(RankgenError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl", check_pair_record)


def test_pairs_need_one_label_count(t5_text):
    records = [{"a": "x y", "b": "y z", "labels": [1, 0]}, {"a": "x", "b": "z", "labels": [1]}]
    with pytest.raises(RankgenError, match="different numbers of perspective labels"):
        PairBatches(records, t5_text, 1, DUAL_LISTS, 8)
    pairs = PairBatches(records[:1] * 4, t5_text, 2, CROSS_LISTS, 12).batch(0)
    assert pairs["pair_ids"].shape == (2, 12) and pairs["labels"].shape == (2, 2)


def test_dual_encoder_vectors_of_lists_equal_flat_calls():
    config = ModelConfig(encoder=BERT, head=HeadConfig("mean", 0, True))
    model, params = build_model(config), init_params(config)
    ids = np.random.default_rng(0).integers(3, 128, (2, 3, 7)).astype(np.int32)
    lists = model.apply({"params": params}, ids, tower="document")
    flat = model.apply({"params": params}, ids.reshape(6, 7), tower="document")
    assert lists.shape == (2, 3, 32)
    np.testing.assert_allclose(lists.reshape(6, 32), flat, atol=1e-6)


def test_multi_perspective_head_is_n_normalised_projections():
    config = ModelConfig(encoder=BERT, head=HeadConfig("mean", -1, True), num_scores=3)
    model, params = build_model(config), init_params(config)
    assert params["perspective_projections"]["kernel"].shape == (32, 96) and "projection_layer" not in params
    ids = np.random.default_rng(1).integers(3, 128, (4, 9)).astype(np.int32)
    vectors = model.apply({"params": params}, ids)
    assert vectors.shape == (4, 3, 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
    # Perspective n is the pooled vector through its own d -> d block of the kernel.
    pooled = build_model(ModelConfig(encoder=BERT, head=HeadConfig("mean", 0, False))).apply(
        {"params": {k: v for k, v in params.items() if k != "perspective_projections"}}, ids)
    kernel = np.asarray(params["perspective_projections"]["kernel"]).reshape(32, 3, 32)
    expect = np.einsum("bd,dnp->bnp", np.asarray(pooled), kernel)
    expect /= np.linalg.norm(expect, axis=-1, keepdims=True)
    np.testing.assert_allclose(vectors, expect, atol=1e-5)


def _list_batch(index, batch=8, size=4, q=10, c=8, floats=("labels", "teacher_scores")):
    rng = np.random.default_rng([21, index])
    out = {"query_ids": rng.integers(3, 128, (batch, q)).astype(np.int32),
           "candidate_ids": rng.integers(3, 128, (batch, size, c)).astype(np.int32)}
    mask = np.ones((batch, size), np.int32)
    mask[::3, -1] = 0
    out["candidate_mask"] = mask
    out["labels"] = rng.integers(0, 3, (batch, size)).astype(np.float32)
    out["teacher_scores"] = rng.normal(size=(batch, size)).astype(np.float32)
    out["tie_break"] = rng.random((batch, size)).astype(np.float32)
    return out


def _cross_batch(index, batch=8, size=4, length=12):
    rng = np.random.default_rng([22, index])
    ids = rng.integers(3, 128, (batch, size, length)).astype(np.int32)
    ids[:, :, -2:] = 0
    types = np.zeros_like(ids)
    types[:, :, 5:] = 1
    base = _list_batch(index, batch, size)
    return {"pair_ids": ids, "pair_type_ids": types, **{k: base[k] for k in ("candidate_mask", "labels", "tie_break")}}


def _mp_pairs(index, batch=8, length=10, perspectives=3):
    rng = np.random.default_rng([23, index])
    return {"query_ids": rng.integers(3, 128, (batch, length)).astype(np.int32),
            "positive_ids": rng.integers(3, 128, (batch, length)).astype(np.int32),
            "labels": rng.integers(0, 2, (batch, perspectives)).astype(np.float32)}


def _mp_cross(index, batch=8, length=12, perspectives=3):
    pairs = _mp_pairs(index, batch, length, perspectives)
    return {"pair_ids": pairs["query_ids"], "labels": pairs["labels"]}


DUAL = ModelConfig(encoder=BERT, head=HeadConfig("mean", 0, True))
CROSS = ModelConfig(encoder=BERT, head=HeadConfig("first", 0, False), kind="cross_encoder")
CASES = {
    "dual_kl": (DUAL, StepOptions("kl_distillation", (("temperature", 2.0),)), _list_batch),
    "dual_lambdarank_grad_cache": (DUAL, StepOptions("lambdarank_mrr", num_chunks=2), _list_batch),
    "cross_listmle": (CROSS, StepOptions("listmle", towers=CROSS_TOWERS), _cross_batch),
    "mp_bi_encoder": (ModelConfig(encoder=BERT, head=HeadConfig("mean", -1, True), num_scores=3),
                      StepOptions("multi_perspective_bce"), _mp_pairs),
    "mp_cross_encoder": (ModelConfig(encoder=BERT, head=HeadConfig("first", -1, False), kind="cross_encoder",
                                     num_scores=3),
                         StepOptions("sigmoid_bce", towers=CROSS_TOWERS), _mp_cross),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_step_equals_single_device(case):
    config, options, batch_fn = CASES[case]
    single = run_steps(config, options, batch_fn, partitioning.make_mesh(1, 1, devices=jax.devices()[:1]), "standard")
    sharded = run_steps(config, options, batch_fn, partitioning.make_mesh(4, 2), "standard")
    assert np.all(np.isfinite(single[0])) and single[0][0] > 0
    np.testing.assert_allclose(sharded[0], single[0], rtol=TOL, atol=TOL)
    assert_trees_close(sharded[1], single[1])
    assert_trees_close(sharded[2], single[2])
    # The step learns something: the loss moves.
    assert single[0][-1] != single[0][0]


def test_grad_cache_and_accumulation_equal_plain_for_lists():
    mesh = partitioning.make_mesh(1, 1, devices=jax.devices()[:1])
    plain = run_steps(DUAL, StepOptions("lambdarank_mrr"), _list_batch, mesh, "standard", num_steps=1)
    cached = CASES["dual_lambdarank_grad_cache"]
    chunked = run_steps(cached[0], cached[1], _list_batch, mesh, "standard", num_steps=1)
    np.testing.assert_allclose(chunked[0], plain[0], rtol=TOL)
    assert_trees_close(chunked[1], plain[1])
    # Accumulation is exact when every microbatch has as many valid entries (the losses are means).
    def full_lists(index):
        return {**_cross_batch(index), "candidate_mask": np.ones((8, 4), np.int32)}

    bce_plain = run_steps(CROSS, StepOptions("sigmoid_bce", towers=CROSS_TOWERS), full_lists, mesh,
                          "standard", num_steps=1)
    bce_accum = run_steps(CROSS, StepOptions("sigmoid_bce", towers=CROSS_TOWERS, accum_steps=2), full_lists,
                          mesh, "standard", num_steps=1)
    np.testing.assert_allclose(bce_accum[0], bce_plain[0], rtol=TOL)
    assert_trees_close(bce_accum[1], bce_plain[1])


def test_trainer_trains_a_ranker_from_list_files(tmp_path):
    records = list_records(24, 4, seed=1)
    for split, part in (("train", records[:16]), ("eval", records[16:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=8064, num_layers=1), head=HeadConfig("first", 0, False),
                         kind="cross_encoder")
    data = DataConfig(ListsData(train_file=str(tmp_path / "train.jsonl"), eval_file=str(tmp_path / "eval.jsonl"), continuation_length=8, list_size=4), batch_size=8, prefix_length=16)
    metrics = train(str(tmp_path / "run"), TrainerConfig(num_steps=3, log_every=1, eval_every=3, checkpoint_every=3,
                                                         async_checkpoints=False),
                    config, data, LossConfig(name="listmle"))
    assert metrics["steps"] == 3 and np.isfinite(metrics["loss"])
    from rankgen_jax.inference.encoder import load_model

    ranker = load_model(str(tmp_path / "run"), kind="cross_encoder")
    scores = ranker.score_pairs([records[0]["query"]], [records[0]["candidates"]], 16, 8)
    assert scores[0].shape == (len(records[0]["candidates"]),) and np.all(np.isfinite(scores[0]))
    # score_pairs equals the model applied to the batch layout the trainer used.
    batch = ListBatches(records[:1], TokenWindows(ranker.text, 16, 8), 1, CROSS_LISTS, list_size=4).batch(0)
    direct = build_model(ranker.config).apply({"params": ranker.params}, jnp.asarray(batch["pair_ids"]))
    n = len(records[0]["candidates"])
    np.testing.assert_allclose(scores[0], np.asarray(direct)[0, :n], atol=1e-5)
    with pytest.raises(RankgenError, match="this needs a dual encoder"):
        load_model(str(tmp_path / "run"))
    with pytest.raises(RankgenError, match="cross encoder trains on candidate lists"):
        train(str(tmp_path / "bad"), TrainerConfig(num_steps=1), config, DataConfig(RandomData()),
              LossConfig(name="listmle"))


def test_make_sources_requires_list_files(tmp_path):
    with pytest.raises(RankgenError, match="needs ListsData.train_file"):
        make_sources(DataConfig(ListsData()), CROSS_LISTS)
    # The held-out file is optional; a run that evaluates without one is refused before any data is read.
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in list_records(40, 3)))
    data = DataConfig(ListsData(train_file=str(tmp_path / "train.jsonl")))
    train_source, eval_source = make_sources(data, CROSS_LISTS)
    assert train_source.batch(0)["pair_ids"].shape[0] == 32 and eval_source is None
    with pytest.raises(RankgenError, match=r"TrainerConfig.eval_every=5 evaluates on held-out data, which this data "
                                           r"config does not name: give ListsData.eval_file .* or set "
                                           r"TrainerConfig.eval_every=0"):
        train(str(tmp_path / "run"), TrainerConfig(num_steps=1, eval_every=5), CROSS,
              data.with_source(train_file=str(tmp_path / "absent.jsonl")), LossConfig(name="listmle"))


def _triples(index, batch=8, q=10, c=8):
    rng = np.random.default_rng([24, index])
    return {"query_ids": rng.integers(3, 128, (batch, q)).astype(np.int32),
            "positive_ids": rng.integers(3, 128, (batch, c)).astype(np.int32),
            "negative_ids": rng.integers(3, 128, (batch, c)).astype(np.int32)}


# A batch of what each loss reads from a model of each kind: the trainer's towers give these outputs.
KIND_CASES = {
    ("dual_encoder", TRIPLES): (DUAL, _triples),
    ("dual_encoder", CANDIDATE_LISTS): (DUAL, _list_batch),
    ("cross_encoder", CANDIDATE_LISTS): (CROSS, lambda i: {k: v for k, v in _cross_batch(i).items()
                                                          if k != "pair_type_ids"} | {"teacher_scores": np.ones(
                                                              (8, 4), np.float32)}),
}


@pytest.mark.parametrize("name,kind", [(n, k) for n in sorted(losses.LOSS_SPECS) for k in losses.model_kinds(n)])
def test_every_loss_traces_with_every_model_kind_it_is_registered_for(name, kind):
    """A loss registered for a model kind gets through the train step with that kind's outputs (traced, not run:
    each loss's numbers are checked against NumPy elsewhere)."""
    config, batch_fn = KIND_CASES[(kind, losses.batch_form(name))]
    if name == "multi_perspective_bce":  # N perspective vectors per passage, from labelled pairs
        config, batch_fn = dataclasses.replace(config, num_scores=3), _mp_pairs
    options = StepOptions(name, towers=batch_layout.towers(kind))
    mesh = partitioning.make_mesh(1, 1, devices=jax.devices()[:1])
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3))
    fns = build_step_functions(config, options, tx, schedule, losses.init_loss_params(name), mesh,
                               partitioning.rules_by_name("standard"), seed=0)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_fn(0).items()}
    with jax.set_mesh(mesh):
        _, metrics = jax.eval_shape(fns.train_step, fns.abstract_state, batch)
    assert metrics["loss"].shape == () and metrics["loss"].dtype == jnp.float32


@pytest.mark.parametrize("name,kind", sorted((n, k) for n, s in losses.LOSS_SPECS.items() for k in s.refused))
def test_losses_refuse_other_model_kinds_with_the_reason(tmp_path, name, kind):
    assert kind not in losses.model_kinds(name)
    model = CROSS if kind == "cross_encoder" else DUAL
    data = DataConfig(RandomData(vocab_size=128) if losses.batch_form(name) == TRIPLES else ListsData())
    with pytest.raises(RankgenError, match=f"loss {name!r} does not train a {kind}: ") as e:
        train(str(tmp_path / "run"), TrainerConfig(num_steps=1), model, data, LossConfig(name))
    assert losses.loss_spec(name).refused[kind] in str(e.value)
    assert not (tmp_path / "run").exists()
