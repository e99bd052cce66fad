"""HuggingFace <-> canonical conversion: plain T5 encoders, the RankGen remote-code format, errors.

Every model is random-init and saved under tmp_path; nothing touches the hub.
"""

from __future__ import annotations

import json
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from rankgen_jax.checkpoints.hf import t5 as hf  # noqa: E402
from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402

BOTCHAN = os.path.join(os.path.dirname(__file__), "..", "data", "corpus", "botchan", "botchan.txt")
TINY = dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def hf_t5_config(activation: str, vocab_size: int = 100) -> transformers.T5Config:
    """A tiny HF T5 config (dropout off so forward passes are deterministic)."""
    return transformers.T5Config(vocab_size=vocab_size, feed_forward_proj=activation, dropout_rate=0.0, **TINY)


def save_hf_model(model_cls, activation: str, out, seed: int = 0, **save_kwargs) -> torch.nn.Module:
    """Random-init a transformers T5 model and save_pretrained it to `out`."""
    torch.manual_seed(seed)
    model = model_cls(hf_t5_config(activation)).eval()
    model.save_pretrained(str(out), **save_kwargs)
    return model


def flatten(tree, prefix=""):
    """{'a/b': leaf} of a nested dict."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else key
        out.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return out


def assert_same_params(a, b):
    fa, fb = flatten(a), flatten(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name].dtype == np.float32, name
        assert np.array_equal(fa[name], fb[name]), name


def random_params(cfg: T5Config, head: HeadConfig | None, seed: int = 0) -> dict:
    """Canonical params written out by hand from the documented tree (independent of hf/t5.py)."""
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.3

    d, inner = cfg.d_model, cfg.num_heads * cfg.d_kv
    encoder = {"relpos_bias": {"rel_embedding": rand(cfg.num_heads, cfg.relpos_buckets)},
               "encoder_norm": {"scale": 1.0 + rand(d)}}
    for i in range(cfg.num_layers):
        mlp = {"wo": {"kernel": rand(cfg.d_ff, d)}}
        names = ("wi_0", "wi_1") if cfg.mlp_activation == "gated-gelu" else ("wi",)
        mlp.update({name: {"kernel": rand(d, cfg.d_ff)} for name in names})
        encoder[f"layers_{i}"] = {
            "pre_attention_layer_norm": {"scale": 1.0 + rand(d)},
            "attention": {"query": {"kernel": rand(d, inner)}, "key": {"kernel": rand(d, inner)},
                          "value": {"kernel": rand(d, inner)}, "out": {"kernel": rand(inner, d)}},
            "pre_mlp_layer_norm": {"scale": 1.0 + rand(d)},
            "mlp": mlp,
        }
    params = {"token_embedder": {"embedding": rand(cfg.vocab_size, d)}, "encoder": encoder}
    if head is not None and head.projection_dim != 0:
        params["projection_layer"] = {"kernel": rand(d, head.output_dim(d))}
    return params


def reference_encoder(cfg: T5Config, params: dict) -> transformers.T5EncoderModel:
    """A transformers T5EncoderModel holding `params`, mapped by hand from docs/design/models.md, 'HF T5 names'."""
    hf_cfg = transformers.T5Config(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_ff=cfg.d_ff, num_layers=cfg.num_layers,
        num_heads=cfg.num_heads, d_kv=cfg.d_kv, feed_forward_proj=cfg.mlp_activation, dropout_rate=0.0,
        layer_norm_epsilon=cfg.layer_norm_eps)
    enc = params["encoder"]
    sd = {"shared.weight": params["token_embedder"]["embedding"],
          "encoder.embed_tokens.weight": params["token_embedder"]["embedding"],
          "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": enc["relpos_bias"]["rel_embedding"].T,
          "encoder.final_layer_norm.weight": enc["encoder_norm"]["scale"]}
    for i in range(cfg.num_layers):
        layer, b = enc[f"layers_{i}"], f"encoder.block.{i}.layer"
        sd[f"{b}.0.layer_norm.weight"] = layer["pre_attention_layer_norm"]["scale"]
        for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o")):
            sd[f"{b}.0.SelfAttention.{theirs}.weight"] = layer["attention"][ours]["kernel"].T
        sd[f"{b}.1.layer_norm.weight"] = layer["pre_mlp_layer_norm"]["scale"]
        for name, value in layer["mlp"].items():
            sd[f"{b}.1.DenseReluDense.{name}.weight"] = value["kernel"].T
    model = transformers.T5EncoderModel(hf_cfg).eval()
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=True)
    return model


def reference_vectors(model, head: HeadConfig, params: dict, input_ids, mask) -> np.ndarray:
    """The head computed by hand on top of a plain T5EncoderModel, in numpy."""
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
    last = out.last_hidden_state.numpy()
    m = mask.numpy()[..., None].astype(np.float32)
    if head.pooling == "first":
        vec = last[:, 0]
    else:
        other = {"mean": last, "first_last_avg": out.hidden_states[0].numpy(),
                 "last2_avg": out.hidden_states[-2].numpy()}[head.pooling]
        vec = (((other + last) / 2.0) * m).sum(1) / m.sum(1)
    if head.projection_dim != 0:
        vec = vec @ params["projection_layer"]["kernel"]
    if head.l2_normalize:
        vec = vec / np.linalg.norm(vec, axis=-1, keepdims=True)
    return vec


def rewrite_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        data = json.load(f)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    with open(path, "w") as f:
        json.dump(data, f)


def rewrite_weights(folder, edit):
    """Apply edit(state_dict) to the folder's model.safetensors."""
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    edit(sd)
    save_file(sd, path, metadata={"format": "pt"})


def raises_one_line(match: str):
    """pytest.raises(RankgenError) that also checks the message is one line."""

    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(RankgenError, match=match)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self.ctx.__exit__(*exc)
            assert "\n" not in str(self.info.value)
            return suppressed

    return _Ctx()


@pytest.fixture(scope="module")
def tiny_spiece(tmp_path_factory) -> str:
    """A 500-piece SentencePiece model with T5's special ids (pad 0, eos 1, unk 2, no bos)."""
    out = tmp_path_factory.mktemp("sp")
    spm.SentencePieceTrainer.train(input=BOTCHAN, model_prefix=str(out / "sp"), vocab_size=500, pad_id=0,
                                   eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    return str(out / "sp.model")


@pytest.fixture(scope="module")
def gated_folder(tmp_path_factory):
    """A saved T5 1.1 (gated-gelu) T5EncoderModel folder and its model."""
    out = tmp_path_factory.mktemp("t5_gated")
    model = save_hf_model(transformers.T5EncoderModel, "gated-gelu", out)
    return str(out), model


# ---------------------------------------------------------------------------
# Plain T5 encoders
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "gated-gelu"])
def test_t5_encoder_round_trip_is_bit_identical(tmp_path, activation):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = save_hf_model(transformers.T5EncoderModel, activation, src, seed=1)
    model_config, params, spiece = hf.load_hf_folder(str(src))

    assert spiece is None
    assert model_config.head is None
    enc = model_config.encoder
    assert (enc.d_model, enc.d_ff, enc.num_layers, enc.num_heads, enc.d_kv, enc.vocab_size) == (32, 64, 2, 4, 8, 100)
    assert enc.mlp_activation == activation
    mlp = params["encoder"]["layers_1"]["mlp"]
    assert sorted(mlp) == (["wi_0", "wi_1", "wo"] if activation == "gated-gelu" else ["wi", "wo"])
    # Canonical layouts: kernels are [in, out], rel_embedding is [heads, buckets].
    assert params["encoder"]["layers_0"]["attention"]["out"]["kernel"].shape == (32, 32)
    assert mlp["wo"]["kernel"].shape == (64, 32)
    assert params["encoder"]["relpos_bias"]["rel_embedding"].shape == (4, 32)
    np.testing.assert_array_equal(params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"],
                                  model.encoder.block[0].layer[1].DenseReluDense.wo.weight.detach().numpy().T)

    hf.save_hf_folder(model_config, params, str(dst), fmt="t5-encoder")
    original, exported = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    assert sorted(original) == sorted(exported)
    for key in original:
        assert np.array_equal(original[key], exported[key]), key

    with open(src / "config.json") as f:
        src_cfg = json.load(f)
    with open(dst / "config.json") as f:
        dst_cfg = json.load(f)
    assert dst_cfg["architectures"] == ["T5EncoderModel"]
    for key in ("d_model", "d_ff", "d_kv", "num_layers", "num_heads", "vocab_size", "feed_forward_proj",
                "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
                "dropout_rate", "pad_token_id", "eos_token_id", "model_type"):
        assert dst_cfg[key] == src_cfg[key], key

    # transformers loads the export with nothing missing, and holds the same weights (tied copy included).
    reloaded, info = transformers.T5EncoderModel.from_pretrained(str(dst), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key


def test_encoder_decoder_folder_imports_as_encoder(tmp_path):
    model = save_hf_model(transformers.T5ForConditionalGeneration, "gated-gelu", tmp_path, seed=2)
    model_config, params, _ = hf.load_hf_folder(str(tmp_path))
    assert model_config.head is None
    assert sorted(params) == ["encoder", "token_embedder"]
    assert sorted(k for k in params["encoder"] if k.startswith("layers_")) == ["layers_0", "layers_1"]
    np.testing.assert_array_equal(params["token_embedder"]["embedding"], model.shared.weight.detach().numpy())
    np.testing.assert_array_equal(params["encoder"]["encoder_norm"]["scale"],
                                  model.encoder.final_layer_norm.weight.detach().numpy())
    np.testing.assert_array_equal(params["encoder"]["layers_1"]["attention"]["query"]["kernel"],
                                  model.encoder.block[1].layer[0].SelfAttention.q.weight.detach().numpy().T)


def test_sharded_and_bf16_folders_load(tmp_path, gated_folder):
    folder, model = gated_folder
    _, expected = hf.load_hf_folder(folder)[:2]

    sharded = tmp_path / "sharded"
    model.save_pretrained(str(sharded), max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert not (sharded / "model.safetensors").exists()
    assert_same_params(hf.load_hf_folder(str(sharded))[1], expected)

    # bfloat16 weights (numpy cannot hold them) are upcast to float32.
    half = tmp_path / "bf16"
    transformers.T5EncoderModel.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(str(half))
    params = hf.load_hf_folder(str(half))[1]
    emb = params["token_embedder"]["embedding"]
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(emb, model.shared.weight.detach().to(torch.bfloat16).float().numpy())


def test_tied_embedding_copy_is_accepted_only_when_equal(tmp_path, gated_folder):
    folder, _ = gated_folder
    _, expected, _ = hf.load_hf_folder(folder)
    emb = expected["token_embedder"]["embedding"]
    target = tmp_path / "tied"
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        (target / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    rewrite_weights(target, lambda sd: sd.update({"encoder.embed_tokens.weight": emb.copy()}))
    assert_same_params(hf.load_hf_folder(str(target))[1], expected)

    rewrite_weights(target, lambda sd: sd.update({"encoder.embed_tokens.weight": emb + 1.0}))
    with raises_one_line("encoder.embed_tokens.weight differs from shared.weight"):
        hf.load_hf_folder(str(target))


def test_config_translation_round_trips():
    cfg = T5Config(vocab_size=300, d_model=48, d_ff=96, num_layers=3, num_heads=6, d_kv=8, mlp_activation="relu",
                   relpos_buckets=16, relpos_max_distance=64, dropout_rate=0.1, layer_norm_eps=1e-5, pad_id=0,
                   eos_id=1)
    hf_cfg = hf.t5_config_to_hf(cfg)
    assert hf_cfg["feed_forward_proj"] == "relu" and hf_cfg["model_type"] == "t5"
    assert hf_cfg["relative_attention_num_buckets"] == 16 and hf_cfg["layer_norm_epsilon"] == 1e-5
    assert hf.t5_config_from_hf(hf_cfg, "x") == cfg
    # transformers accepts every field we write.
    parsed = transformers.T5Config(**hf_cfg)
    assert (parsed.d_model, parsed.num_heads, parsed.relative_attention_max_distance) == (48, 6, 64)


# ---------------------------------------------------------------------------
# RankGen format
# ---------------------------------------------------------------------------

HEADS = {
    "released": RANKGEN_HEAD,
    "st5": HeadConfig(pooling="mean", projection_dim=16, l2_normalize=True),
    "first_last_noproj": HeadConfig(pooling="first_last_avg", projection_dim=0, l2_normalize=False),
    "last2": HeadConfig(pooling="last2_avg", projection_dim=-1, l2_normalize=True),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_rankgen_export_loads_in_transformers(tmp_path, tiny_spiece, name):
    head = HEADS[name]
    # Three layers, so hidden_states[-2] is neither the embedding nor the first block's output.
    cfg = T5Config(vocab_size=512, mlp_activation="gated-gelu", **{**TINY, "num_layers": 3})
    model_config = ModelConfig(encoder=cfg, head=head)
    params = random_params(cfg, head, seed=3)
    out = tmp_path / f"rankgen_{name}"
    hf.save_hf_folder(model_config, params, str(out), fmt="rankgen", spiece_model=tiny_spiece)

    with open(out / "config.json") as f:
        written = json.load(f)
    assert written["architectures"] == ["T5EncoderWithProjection"]
    assert written["auto_map"] == {"AutoModel": "modeling_rankgen.T5EncoderWithProjection"}
    assert (out / "modeling_rankgen.py").exists()
    keys = load_file(str(out / "model.safetensors"))
    assert "t5_encoder.shared.weight" in keys
    assert ("projection.weight" in keys) == (head.projection_dim != 0)
    if name == "released":
        # A released RankGen folder has no rankgen_jax block: the defaults must be its behaviour.
        rewrite_config(out, rankgen_jax=None)

    model, info = transformers.AutoModel.from_pretrained(str(out), trust_remote_code=True, output_loading_info=True)
    assert type(model).__name__ == "T5EncoderWithProjection"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    model.eval()

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = ["pre It was a fine day in the country.", "suffi He laughed at me"]
    sp = spm.SentencePieceProcessor(model_file=tiny_spiece)
    assert tokenizer(texts[0]).input_ids == sp.encode(texts[0]) + [1]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert batch["attention_mask"][1, -1] == 0  # the second text is padded, so pooling sees a mask

    with torch.no_grad():
        got = model(**batch).numpy()
    want = reference_vectors(reference_encoder(cfg, params), head, params, batch["input_ids"],
                             batch["attention_mask"])
    assert got.shape == (2, head.output_dim(cfg.d_model))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    loaded_config, loaded_params, spiece = hf.load_hf_folder(str(out))
    assert loaded_config == model_config
    assert loaded_config.head == head
    assert_same_params(loaded_params, params)
    assert spiece == str(out / "spiece.model")

    # A folder re-saved by transformers (e.g. after PyTorch fine-tuning) imports back unchanged.
    resaved = tmp_path / "resaved"
    model.save_pretrained(str(resaved))
    again_config, again_params, _ = hf.load_hf_folder(str(resaved))
    assert again_config == model_config
    assert_same_params(again_params, params)

    # Re-exporting a loaded folder onto itself keeps its tokenizer.
    hf.save_hf_folder(loaded_config, loaded_params, str(out), spiece_model=spiece, overwrite=True)
    assert (out / "spiece.model").read_bytes() == open(tiny_spiece, "rb").read()


def test_tokenizer_keeps_t5_sentinels_when_they_fit(tmp_path, tiny_spiece):
    cfg = T5Config(vocab_size=640, **TINY)
    hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), random_params(cfg, RANKGEN_HEAD), str(tmp_path / "m"),
                      spiece_model=tiny_spiece)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert len(tokenizer) == 600  # 500 pieces + 100 sentinels, all below vocab_size
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == 599

    small = T5Config(vocab_size=512, **TINY)
    hf.save_hf_folder(ModelConfig(small, RANKGEN_HEAD), random_params(small, RANKGEN_HEAD), str(tmp_path / "s"),
                      spiece_model=tiny_spiece)
    assert len(transformers.AutoTokenizer.from_pretrained(str(tmp_path / "s"))) == 500


def test_t5_encoder_export_keeps_the_head_in_sentence_transformers_modules(tmp_path, caplog):
    """A plain T5EncoderModel has nowhere for the head: the sentence-transformers modules hold it, where they have
    its pooling; otherwise it is dropped with a warning."""
    cfg = T5Config(vocab_size=100, **TINY)
    params = random_params(cfg, RANKGEN_HEAD)
    hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), params, str(tmp_path / "st"), fmt="t5-encoder")
    assert not any("projection" in k for k in load_file(str(tmp_path / "st" / "model.safetensors")))
    loaded_config, loaded_params, _ = hf.load_hf_folder(str(tmp_path / "st"))
    assert loaded_config == ModelConfig(cfg, HeadConfig(pooling="first", projection_dim=cfg.d_model))
    assert_same_params(loaded_params, params)

    head = HeadConfig(pooling="first_last_avg")
    params = random_params(cfg, head)
    with caplog.at_level(logging.WARNING, logger=hf.__name__):
        hf.save_hf_folder(ModelConfig(cfg, head), params, str(tmp_path / "plain"), fmt="t5-encoder")
    assert any("head" in r.getMessage() and "not exported" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "plain" / "modules.json").exists()
    loaded_config, loaded_params, _ = hf.load_hf_folder(str(tmp_path / "plain"))
    assert loaded_config == ModelConfig(cfg, None)
    del params["projection_layer"]
    assert_same_params(loaded_params, params)


def test_state_dict_functions_match_the_documented_names():
    cfg = T5Config(vocab_size=100, mlp_activation="relu", **TINY)
    head = HeadConfig(projection_dim=16)
    params = random_params(cfg, head)
    sd = hf.params_to_hf_state_dict(ModelConfig(cfg, head), params, "rankgen")
    np.testing.assert_array_equal(sd["projection.weight"], params["projection_layer"]["kernel"].T)
    np.testing.assert_array_equal(sd["t5_encoder.encoder.block.1.layer.1.DenseReluDense.wi.weight"],
                                  params["encoder"]["layers_1"]["mlp"]["wi"]["kernel"].T)
    np.testing.assert_array_equal(
        sd["t5_encoder.encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
        params["encoder"]["relpos_bias"]["rel_embedding"].T)
    assert sum(k.startswith("t5_encoder.encoder.block.1.") for k in sd) == 8
    back = hf.hf_state_dict_to_params(ModelConfig(cfg, head), sd, "rankgen", "test")
    assert_same_params(back, params)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_error_missing_path_and_no_config(tmp_path):
    with raises_one_line("no such file or directory"):
        hf.load_hf_folder(str(tmp_path / "nope"))
    with raises_one_line("no config.json"):
        hf.load_hf_folder(str(tmp_path))


@pytest.mark.parametrize("model_type, arch", [("bert", "BertModel"), ("gpt2", "GPT2LMHeadModel")])
def test_error_not_t5(tmp_path, model_type, arch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [arch]}))
    with raises_one_line(f"not a T5 model.*{arch}"):
        hf.load_hf_folder(str(tmp_path))


def test_error_unsupported_t5_architecture_and_activation(tmp_path, gated_folder):
    folder, _ = gated_folder
    (tmp_path / "config.json").write_bytes(open(os.path.join(folder, "config.json"), "rb").read())
    rewrite_config(tmp_path, architectures=["T5ForSequenceClassification"])
    with raises_one_line("unsupported architecture T5ForSequenceClassification"):
        hf.load_hf_folder(str(tmp_path))
    rewrite_config(tmp_path, architectures=["T5EncoderModel"], feed_forward_proj="gated-silu")
    with raises_one_line("feed_forward_proj='gated-silu' is not supported"):
        hf.load_hf_folder(str(tmp_path))


def test_error_pickle_only_folder(tmp_path, gated_folder):
    folder, _ = gated_folder
    (tmp_path / "config.json").write_bytes(open(os.path.join(folder, "config.json"), "rb").read())
    # Never unpickled, so the content does not matter.
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with raises_one_line(r"pytorch_model\.bin.*safe_serialization=True"):
        hf.load_hf_folder(str(tmp_path))


def copy_folder(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())
    return dst


def test_error_missing_tensor(tmp_path, gated_folder):
    folder = copy_folder(gated_folder[0], tmp_path / "m")
    key = "encoder.block.1.layer.1.DenseReluDense.wi_1.weight"
    rewrite_weights(folder, lambda sd: sd.pop(key))
    with raises_one_line(f"missing tensor {key}"):
        hf.load_hf_folder(str(folder))


def test_error_shape_disagrees_with_config(tmp_path, gated_folder):
    folder = copy_folder(gated_folder[0], tmp_path / "m")
    rewrite_config(folder, d_ff=48)
    with raises_one_line(r"tensor encoder\.block\.0\.layer\.1\.DenseReluDense\.wi_0\.weight has shape \(64, 32\),"
                         r" but config.json implies \(48, 32\)"):
        hf.load_hf_folder(str(folder))


def test_error_unexpected_tensor(tmp_path, gated_folder):
    folder = copy_folder(gated_folder[0], tmp_path / "m")
    # A checkpoint with more layers than its config says must not lose them silently.
    rewrite_config(folder, num_layers=1)
    with raises_one_line("unexpected tensor encoder.block.1"):
        hf.load_hf_folder(str(folder))


def test_error_rankgen_projection_shape(tmp_path):
    cfg = T5Config(vocab_size=100, **TINY)
    head = HeadConfig(projection_dim=16)
    hf.save_hf_folder(ModelConfig(cfg, head), random_params(cfg, head), str(tmp_path))
    rewrite_config(tmp_path, rankgen_jax={"pooling": "first", "projection_dim": 8, "l2_normalize": False})
    with raises_one_line(r"projection\.weight has shape \(16, 32\), but config.json implies \(8, 32\)"):
        hf.load_hf_folder(str(tmp_path))
    rewrite_config(tmp_path, rankgen_jax={"pooling": "max"})
    with raises_one_line("pooling='max'"):
        hf.load_hf_folder(str(tmp_path))


def test_error_out_dir_not_empty(tmp_path):
    cfg = T5Config(vocab_size=100, **TINY)
    params = random_params(cfg, RANKGEN_HEAD)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "model.safetensors.index.json").write_text("{}")  # stale index from an older export
    with raises_one_line("exists and is not empty.*`overwrite`"):
        hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), params, str(out))
    hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), params, str(out), overwrite=True)
    assert (out / "notes.txt").read_text() == "keep me"
    assert not (out / "model.safetensors.index.json").exists()
    assert_same_params(hf.load_hf_folder(str(out))[1], params)


def test_error_bad_export_requests(tmp_path, tiny_spiece):
    cfg = T5Config(vocab_size=100, **TINY)
    params = random_params(cfg, RANKGEN_HEAD)
    with raises_one_line("unknown HF format 'onnx'"):
        hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), params, str(tmp_path / "a"), fmt="onnx")
    with raises_one_line("needs a dual-encoder head"):
        hf.save_hf_folder(ModelConfig(cfg, None), params, str(tmp_path / "b"), fmt="rankgen")
    params["encoder"]["layers_0"]["attention"]["key"]["kernel"] = np.zeros((32, 16), np.float32)
    with raises_one_line(r"encoder/layers_0/attention/key/kernel has shape \(32, 16\).*\(32, 32\)"):
        hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), params, str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()  # nothing written for a bad tree
    with raises_one_line("has 500 pieces but the model's vocab_size is 100"):
        hf.save_hf_folder(ModelConfig(cfg, RANKGEN_HEAD), random_params(cfg, RANKGEN_HEAD), str(tmp_path / "d"),
                          spiece_model=tiny_spiece)
    assert not (tmp_path / "d").exists()
