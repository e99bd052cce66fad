"""Every export is checked against the JAX model as its users load it: a corrupted export (a changed config value,
a dropped or altered tensor) is refused and left unusable, and the measured difference goes in the model card."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import check_export, export_hf
from rankgen_jax.checkpoints.export_check import FAILED_MARKER, TOLERANCE
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, T5Config
from rankgen_jax.testing import random_params

T5_TINY = T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16)
MEAN_L2 = HeadConfig(pooling="mean", projection_dim=16, l2_normalize=True)
CONVENTIONS = InputConventions(prefix_length=32, suffix_length=32, truncation="clean")


def _checkpoint(tmp_path, spiece_model, config: ModelConfig):
    native.save_params(tmp_path / "ckpt", config, random_params(config, 5), vocab=spiece_model,
                       conventions=CONVENTIONS)
    return str(tmp_path / "ckpt")


def _edit_json(path, **changes):
    settings = json.loads(path.read_text())
    settings.update(changes)
    path.write_text(json.dumps(settings))


def _edit_tensors(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _assert_refused(checkpoint, out, fmt="rankgen"):
    with pytest.raises(RankgenError, match="differs from the JAX model") as caught:
        check_export(checkpoint, str(out), fmt)
    assert (out / FAILED_MARKER).is_file() and not list(out.rglob("*.safetensors"))
    assert list(out.rglob("*.safetensors.unverified"))
    return str(caught.value)


def _first_tensor(tensors, part):
    return next(name for name in sorted(tensors) if part in name)


@pytest.mark.parametrize("corruption", ["config value", "dropped tensor", "altered tensor"])
def test_a_corrupted_rankgen_export_is_refused(tmp_path, spiece_model, corruption):
    checkpoint = _checkpoint(tmp_path, spiece_model, ModelConfig(encoder=T5_TINY))
    out = tmp_path / "hf"
    export_hf(checkpoint, str(out))
    card = (out / "README.md").read_text()
    assert "Checked when exported: probe texts through rankgen-jax (JAX) and through " \
           "`AutoModel.from_pretrained(folder, trust_remote_code=True)`" in card
    good = check_export(checkpoint, str(out))
    assert good.difference <= TOLERANCE and f"{good.difference:.1e}" in card
    if corruption == "config value":
        _edit_json(out / "config.json", layer_norm_epsilon=0.5)
    elif corruption == "dropped tensor":
        _edit_tensors(out / "model.safetensors", lambda t: t.pop(_first_tensor(t, "layer_norm")))
    else:
        _edit_tensors(out / "model.safetensors", lambda t: t.update(
            {(name := _first_tensor(t, "projection")): t[name] * 1.01}))
    assert "prefix vectors" in _assert_refused(checkpoint, out)
    # The folder no longer loads: transformers finds no weights.
    transformers = pytest.importorskip("transformers")
    with pytest.raises(OSError):
        transformers.AutoModel.from_pretrained(str(out), trust_remote_code=True)
    # A new export over it starts clean.
    export_hf(checkpoint, str(out), overwrite=True)
    assert not (out / FAILED_MARKER).exists() and (out / "model.safetensors").is_file()


def test_a_corrupted_sentence_transformers_export_is_refused(tmp_path, spiece_model):
    pytest.importorskip("sentence_transformers")
    checkpoint = _checkpoint(tmp_path, spiece_model, ModelConfig(encoder=T5_TINY, head=MEAN_L2))
    out = tmp_path / "hf"
    export_hf(checkpoint, str(out), fmt="t5-encoder")
    assert "`SentenceTransformer(folder)`" in (out / "README.md").read_text()
    pooling = next(out.glob("*Pooling/config.json"))
    _edit_json(pooling, pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    assert "suffix vectors" in _assert_refused(checkpoint, out, "t5-encoder")


def _bert_checkpoint(tmp_path, config: ModelConfig) -> str:
    """A tiny BERT-family checkpoint with a word-piece tokenizer rankgen-jax reads."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(59))]) + "\n")
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(str(vocab))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    native.save_params(tmp_path / "ckpt", config, random_params(config, 6), vocab=str(tmp_path / "tokenizer.json"),
                       conventions=CONVENTIONS)
    return str(tmp_path / "ckpt")


BERT_TINY = BertConfig(vocab_size=64, d_model=32, d_ff=64, num_layers=1, num_heads=2, max_position_embeddings=64)


def test_a_corrupted_ranker_export_is_refused(tmp_path):
    checkpoint = _bert_checkpoint(tmp_path, ModelConfig(encoder=BERT_TINY, head=HeadConfig(pooling="mean", projection_dim=8),
                                                        kind="cross_encoder"))
    out = tmp_path / "hf"
    export_hf(checkpoint, str(out))
    assert "Checked when exported" in (out / "README.md").read_text()
    _edit_tensors(out / "model.safetensors", lambda t: t.pop("score.bias"))
    assert "pair scores" in _assert_refused(checkpoint, out)


def test_a_bfloat16_model_is_checked_at_float32(tmp_path, spiece_model):
    """A model trained with bfloat16 activations: its export holds the weights, which loaders run in float32, so
    the check compares at float32 (a bfloat16 forward differs by ~1e-2 and would refuse every such export)."""
    bf16 = dataclasses.replace(T5_TINY, dtype="bfloat16")
    checkpoint = _checkpoint(tmp_path, spiece_model, ModelConfig(encoder=bf16))
    export_hf(checkpoint, str(tmp_path / "hf"))
    assert check_export(checkpoint, str(tmp_path / "hf")).difference <= TOLERANCE
    _edit_tensors(tmp_path / "hf" / "model.safetensors", lambda t: t.update(
        {(name := _first_tensor(t, "projection")): t[name] * 1.01}))
    _assert_refused(checkpoint, tmp_path / "hf")


@pytest.mark.parametrize("model", ["bare T5", "T5 ranker's encoder", "bare BERT", "two-tower T5, perspectives"])
def test_an_encoder_alone_is_checked_by_its_hidden_states(tmp_path, spiece_model, model):
    if model == "bare BERT":
        checkpoint = _bert_checkpoint(tmp_path, ModelConfig(encoder=BERT_TINY, head=None, kind="encoder"))
        fmt, loader, tensor = "rankgen", "AutoModel", "attention.output.dense.weight"
    else:
        config = {"bare T5": ModelConfig(encoder=T5_TINY, head=None, kind="encoder"),
                  "T5 ranker's encoder": ModelConfig(encoder=T5_TINY, head=HeadConfig(pooling="mean"),
                                                     kind="cross_encoder"),
                  # Several perspectives: a head sentence-transformers cannot express, so the towers go alone.
                  "two-tower T5, perspectives": ModelConfig(encoder=T5_TINY, head=MEAN_L2, shared_towers=False,
                                                            num_scores=2)}[model]
        checkpoint = _checkpoint(tmp_path, spiece_model, config)
        fmt, loader, tensor = "t5-encoder", "T5EncoderModel", "SelfAttention.o.weight"
    out = tmp_path / "hf"
    export_hf(checkpoint, str(out), fmt=fmt)
    assert f"`{loader}.from_pretrained(folder), the encoder's last hidden states`" in (out / "README.md").read_text()
    assert check_export(checkpoint, str(out), fmt).difference <= TOLERANCE
    weights = sorted(out.rglob("model.safetensors"))[-1]
    _edit_tensors(weights, lambda t: t.update({(name := _first_tensor(t, tensor)): t[name] * 1.01}))
    assert "last hidden states" in _assert_refused(checkpoint, out, fmt)


def test_what_cannot_be_compared_is_said(tmp_path):
    """A checkpoint without a tokenizer rankgen-jax reads: no probe texts, so nothing compared, and the card
    says so."""
    config = ModelConfig(encoder=T5_TINY)
    native.save_params(tmp_path / "ckpt", config, random_params(config, 5))
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    assert "Not checked when exported: the checkpoint has no tokenizer rankgen-jax reads the probe texts with." in \
        (tmp_path / "hf" / "README.md").read_text()
    assert np.isnan(check_export(str(tmp_path / "ckpt"), str(tmp_path / "hf")).difference)


def test_a_folder_whose_remote_code_is_not_the_packages_is_not_loaded(tmp_path, spiece_model):
    """check_export on a folder it did not just write: remote code that came with it never runs."""
    checkpoint = _checkpoint(tmp_path, spiece_model, ModelConfig(encoder=T5_TINY))
    out = tmp_path / "hf"
    export_hf(checkpoint, str(out))
    marker = tmp_path / "ran"
    modeling = out / "modeling_rankgen.py"
    modeling.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + modeling.read_text())
    with pytest.raises(RankgenError, match="not rankgen-jax's own modeling_rankgen.py"):
        check_export(checkpoint, str(out))
    assert not marker.exists()
