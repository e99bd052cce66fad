"""Rankers (cross encoders) to HuggingFace and back: T5 and BERT-family backbones, PyTorch scores, errors.

Each backbone is initialised once (module fixture); heads of every shape are
drawn on top of it. Nothing touches the hub.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from rankgen_jax.checkpoints import native  # noqa: E402
from rankgen_jax.checkpoints.hf import bert as hf_bert, ranker, t5 as hf  # noqa: E402
from rankgen_jax.checkpoints.convert import export_hf, export_layout, import_checkpoint, read_source  # noqa: E402
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, T5Config  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402
from rankgen_jax.models.factory import abstract_variables, build_model, check_params_match, init_params  # noqa: E402
from test_hf_convert import assert_same_params  # noqa: E402

# Three layers, so hidden_states[-2] is neither the embedding output nor the first layer's.
TINY = dict(d_model=32, d_ff=64, num_layers=3, num_heads=4)
ENCODERS = {
    # T5 1.1 (gated-gelu); 1000 ids fit the session SentencePiece vocabulary.
    "t5": T5Config(vocab_size=1000, d_kv=8, mlp_activation="gated-gelu", **TINY),
    "bert": BertConfig(vocab_size=100, max_position_embeddings=64, **TINY),
    "roberta": BertConfig(variant="roberta", vocab_size=100, max_position_embeddings=64, type_vocab_size=1, pad_id=1,
                          position_offset=2, has_pooler=False, **TINY),
    "distilbert": BertConfig(variant="distilbert", vocab_size=100, max_position_embeddings=64, type_vocab_size=0,
                             has_pooler=False, **TINY),
    # With a pooler, for the `pooler` head (RoBERTa's sequence-classification head);
    # 1000 ids let its byte-level BPE learn whole words.
    "roberta+pooler": BertConfig(variant="roberta", vocab_size=1000, max_position_embeddings=64, type_vocab_size=1,
                                 pad_id=1, position_offset=2, **TINY),
    # MiniLM's WordPiece vocabulary, so text goes through its real tokenizer.json.
    "bert_minilm_vocab": BertConfig(vocab_size=30522, max_position_embeddings=64, **TINY),
}
HEAD_KEYS = ("projection_layer", "score_head")


def ranker_config(encoder: str, pooling: str, projection_dim: int, num_scores: int) -> ModelConfig:
    return ModelConfig(encoder=ENCODERS[encoder], head=HeadConfig(pooling, projection_dim, False),
                       kind="cross_encoder", num_scores=num_scores)




@pytest.fixture(scope="module")
def make_params():
    """make(config, seed) -> random CrossEncoder params; the backbone is initialised once per encoder config."""
    backbones = {}

    def make(config: ModelConfig, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        if config.encoder not in backbones:
            initial = jax.tree_util.tree_map(np.asarray, init_params(config, seed))
            # Noise makes zero biases and unit norms distinguishable from their defaults.
            backbones[config.encoder] = {k: jax.tree_util.tree_map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(
                np.float32), v) for k, v in initial.items() if k not in HEAD_KEYS}
        shapes = nn.unbox(abstract_variables(config))["params"]
        params = dict(backbones[config.encoder])
        for key in HEAD_KEYS:
            if key in shapes:
                params[key] = {name: 0.3 * rng.standard_normal(s.shape).astype(np.float32)
                               for name, s in shapes[key].items()}
        check_params_match(params, config, where="test")
        return params

    return make


def ids_for(config: ModelConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """[B=2, C=3, L=10] ids with padded tails, their mask, and token types for encoders that have them."""
    enc = config.encoder
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, enc.vocab_size, (2, 3, 10)).astype(np.int32)
    lengths = np.array([[10, 4, 7], [6, 9, 2]])
    mask = np.arange(10) < lengths[..., None]
    ids = np.where(mask, ids, enc.pad_id).astype(np.int32)
    types = None
    if isinstance(enc, BertConfig) and enc.type_vocab_size > 1:
        types = np.where(np.arange(10) >= lengths[..., None] // 2, 1, 0).astype(np.int32) * mask
    return ids, mask, types


def jax_scores(config, params, ids, mask, types) -> np.ndarray:
    return np.asarray(jax.jit(build_model(config).apply)({"params": params}, ids, mask, types))


def torch_scores(model, ids, mask, types) -> np.ndarray:
    """Scores of the [B, C, L] inputs flattened to [B*C, L], reshaped back to [B, C, ...]."""
    flat = lambda x: None if x is None else torch.from_numpy(x.reshape(-1, x.shape[-1])).long()  # noqa: E731
    with torch.no_grad():
        scores = model(input_ids=flat(ids), attention_mask=flat(mask), token_type_ids=flat(types)).numpy()
    return scores.reshape(*ids.shape[:2], *scores.shape[1:])


def load_torch(folder):
    model, info = transformers.AutoModel.from_pretrained(str(folder), trust_remote_code=True,
                                                         output_loading_info=True)
    assert type(model).__name__ == "RankerModel"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


def assert_scores_match(config, params, folder, seed=0):
    ids, mask, types = ids_for(config, seed)
    want = jax_scores(config, params, ids, mask, types)
    got = torch_scores(load_torch(folder), ids, mask, types)
    assert want.shape == ((2, 3) if config.num_scores == 1 else (2, 3, config.num_scores))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Checkpoint -> export -> PyTorch / load back


def test_t5_ranker_checkpoint_exports_loads_and_round_trips(tmp_path, make_params, spiece_model):
    config = ranker_config("t5", "first", -1, 1)
    params = make_params(config)
    native.save_params(tmp_path / "ckpt", config, params, vocab=spiece_model)
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    out = tmp_path / "hf"

    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "rankgen_ranker" and written["architectures"] == ["RankerModel"]
    assert written["auto_map"] == {"AutoConfig": "modeling_ranker.RankerConfig",
                                   "AutoModel": "modeling_ranker.RankerModel"}
    assert (written["pooling"], written["projection_dim"], written["num_scores"]) == ("first", -1, 1)
    assert written["backbone"]["model_type"] == "t5" and written["backbone"]["feed_forward_proj"] == "gated-gelu"
    source = os.path.join(os.path.dirname(ranker.__file__), "modeling_ranker.py")
    assert (out / "modeling_ranker.py").read_bytes() == Path(source).read_bytes()
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["projection.weight"].shape == (32, 32)
    assert tensors["score.weight"].shape == (1, 32) and tensors["score.bias"].shape == (1,)
    np.testing.assert_array_equal(tensors["score.weight"], params["score_head"]["kernel"].T)
    assert "backbone.shared.weight" in tensors and not any(k.startswith("t5_encoder.") for k in tensors)

    # Tokenised text through both: the exported tokenizer gives the ids, torch and JAX agree on the scores.
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    batch = tokenizer(["pre It was a fine day. suffi He laughed.", "pre The rain fell. suffi It stopped."],
                      padding=True, return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(bool)
    model = load_torch(out)
    np.testing.assert_allclose(torch_scores(model, ids[None], mask[None], None)[0],
                               jax_scores(config, params, ids, mask, None), rtol=1e-5, atol=1e-5)

    # Checkpoint -> export -> load: the same config and bit-identical tensors.
    _, restored = native.restore_params(tmp_path / "ckpt")
    loaded_config, loaded_params, spiece = read_source("hf", str(out))
    assert loaded_config == config
    assert_same_params(loaded_params, restored)
    assert spiece == str(out / "spiece.model")

    # A folder re-saved by transformers (e.g. after PyTorch fine-tuning) reads back unchanged.
    model.save_pretrained(str(tmp_path / "resaved"))
    again_config, again_params, _ = ranker.load_ranker_folder(str(tmp_path / "resaved"))
    assert again_config == config
    assert_same_params(again_params, restored)

    # `t5-encoder` keeps the plain T5EncoderModel layout: the encoder alone.
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "enc"), fmt="t5-encoder")
    bare_config, bare_params, _ = hf.load_hf_folder(str(tmp_path / "enc"))
    assert bare_config.kind == "encoder"
    assert_same_params(bare_params, {k: v for k, v in restored.items() if k not in HEAD_KEYS})


def test_bert_ranker_checkpoint_exports_imports_and_round_trips(tmp_path, make_params):
    config = ranker_config("bert", "mean", -1, 3)
    params = make_params(config)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "fox", "##es"]) + "\n")
    native.save_params(tmp_path / "ckpt", config, params, vocab=[str(vocab)])
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    out = tmp_path / "hf"

    written = json.loads((out / "config.json").read_text())
    assert written["backbone"]["model_type"] == "bert" and written["backbone_pooler"] is True
    assert (written["pooling"], written["projection_dim"], written["num_scores"]) == ("mean", -1, 3)
    tensors = load_file(str(out / "model.safetensors"))
    assert {"backbone.embeddings.word_embeddings.weight", "backbone.pooler.dense.weight", "projection.weight",
            "score.weight", "score.bias"} <= set(tensors)
    assert tensors["score.weight"].shape == (3, 32) and tensors["score.bias"].shape == (3,)
    assert not hf_bert.is_bert_folder(str(out))  # a ranker, not a plain BERT folder
    assert_scores_match(config, params, out)

    # The vocabulary travels, with the tokenizer class AutoTokenizer needs in a ranker folder.
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("the quick foxes").input_ids == [2, 5, 6, 7, 8, 3]

    _, restored = native.restore_params(tmp_path / "ckpt")
    for loader in (lambda p: read_source("hf", p), ranker.load_ranker_folder):
        loaded_config, loaded_params, tokenizer_files = loader(str(out))
        assert loaded_config == config
        assert_same_params(loaded_params, restored)
        assert sorted(os.path.basename(f) for f in tokenizer_files) == ["tokenizer_config.json", "vocab.txt"]
    # And into a checkpoint again: HF -> native is bit-exact too.
    import_checkpoint("hf", str(out), str(tmp_path / "back"))
    back_config, back_params = native.restore_params(tmp_path / "back")
    assert back_config == config
    assert_same_params(back_params, restored)


@pytest.mark.parametrize("encoder, pooling, projection_dim, num_scores", [
    ("t5", "mean", 0, 3),
    ("t5", "last2_avg", 8, 1),
    ("bert", "first", 0, 1),
    ("bert", "first_last_avg", 8, 3),
    ("roberta", "first", -1, 3),
    ("distilbert", "last2_avg", 0, 1),
])
def test_ranker_scores_match_jax(tmp_path, make_params, encoder, pooling, projection_dim, num_scores):
    config = ranker_config(encoder, pooling, projection_dim, num_scores)
    params = make_params(config, seed=1)
    ranker.save_ranker_folder(config, params, str(tmp_path))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert ("projection.weight" in tensors) == (projection_dim != 0)
    if encoder in ("roberta", "distilbert"):
        assert not any(k.startswith("backbone.pooler.") for k in tensors)
    assert_scores_match(config, params, tmp_path, seed=1)
    loaded_config, loaded_params, _ = ranker.load_ranker_folder(str(tmp_path))
    assert loaded_config == config
    assert_same_params(loaded_params, params)


# ---------------------------------------------------------------------------
# Errors


@pytest.fixture(scope="module")
def bert_ranker(tmp_path_factory, make_params):
    """A saved BERT ranker folder (mean, projection 8, 3 scores) and its config and params."""
    config = ranker_config("bert", "mean", 8, 3)
    params = make_params(config)
    folder = tmp_path_factory.mktemp("bert_ranker")
    ranker.save_ranker_folder(config, params, str(folder), overwrite=True)
    return folder, config, params


def _drop(name):
    return lambda sd: sd.pop(name)


def _add(name, value):
    return lambda sd: sd.update({name: value})


BROKEN_TENSORS = {
    "missing score bias": (_drop("score.bias"), "missing tensor score.bias"),
    "missing projection": (_drop("projection.weight"), "missing tensor projection.weight"),
    "score shape": (_add("score.weight", np.zeros((2, 8), np.float32)),
                    r"tensor score.weight has shape \(2, 8\), but config.json implies \(3, 8\)"),
    "unexpected": (_add("classifier.weight", np.zeros((2, 32), np.float32)), "unexpected tensor classifier.weight"),
}


@pytest.mark.parametrize("name", list(BROKEN_TENSORS))
def test_broken_ranker_weights_are_refused(tmp_path, bert_ranker, name):
    edit, match = BROKEN_TENSORS[name]
    shutil.copytree(bert_ranker[0], tmp_path / "f")
    tensors = load_file(str(tmp_path / "f" / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(tmp_path / "f" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RankgenError, match=match) as info:
        ranker.load_ranker_folder(str(tmp_path / "f"))
    assert str(tmp_path / "f") in str(info.value) and "\n" not in str(info.value)


BROKEN_CONFIGS = {
    "pooling": ({"pooling": "max"}, r"HeadConfig.pooling='max'"),
    "num_scores": ({"num_scores": 0}, "num_scores must be >= 1"),
    "projection type": ({"projection_dim": "8"}, "projection_dim='8' should be of type int"),
    "no backbone": ({"backbone": None}, "needs a `backbone` object"),
    "backbone type": ({"backbone": {"model_type": "gpt2"}}, "unsupported ranker backbone model_type='gpt2'"),
    "backbone field": ({"backbone": {"model_type": "bert", "hidden_size": "wide"}},
                       r"config.json \(backbone\): hidden_size='wide'"),
}


@pytest.mark.parametrize("name", list(BROKEN_CONFIGS))
def test_broken_ranker_configs_are_refused(tmp_path, bert_ranker, name):
    changes, match = BROKEN_CONFIGS[name]
    shutil.copytree(bert_ranker[0], tmp_path / "f")
    path = tmp_path / "f" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(RankgenError, match=match) as info:
        ranker.load_ranker_folder(str(tmp_path / "f"))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_ranker_export_requests(tmp_path, bert_ranker, make_params, spiece_model):
    _, config, params = bert_ranker
    with pytest.raises(RankgenError, match="needs a cross encoder, got kind='dual_encoder'"):
        ranker.save_ranker_folder(ModelConfig(encoder=config.encoder, head=config.head), params, str(tmp_path / "a"))
    without_score = {k: v for k, v in params.items() if k != "score_head"}
    with pytest.raises(RankgenError, match="parameters have no score_head"):
        ranker.save_ranker_folder(config, without_score, str(tmp_path / "b"))
    t5_config = ranker_config("t5", "first", 0, 1)
    with pytest.raises(RankgenError, match="one SentencePiece model, got 2 files"):
        ranker.save_ranker_folder(t5_config, make_params(t5_config), str(tmp_path / "c"),
                                  tokenizer_files=[spiece_model, spiece_model])
    assert not any((tmp_path / name).exists() for name in "abc")  # nothing written for a bad request
    # A ranker export replaces an older export's files (here a sentence-transformers layout) with --overwrite.
    hf_bert.save_bert_folder(ModelConfig(encoder=config.encoder, head=HeadConfig("mean", 0, True)),
                             params, str(tmp_path / "d"))
    with pytest.raises(RankgenError, match="not empty"):
        ranker.save_ranker_folder(config, params, str(tmp_path / "d"))
    ranker.save_ranker_folder(config, params, str(tmp_path / "d"), overwrite=True)
    assert not (tmp_path / "d" / "modules.json").exists() and not (tmp_path / "d" / "1_Pooling").exists()
    assert ranker.load_ranker_folder(str(tmp_path / "d"))[0] == config


def test_one_format_readers_and_writers_send_rankers_to_the_ranker_format(tmp_path, bert_ranker, make_params):
    """hf.t5 and hf.bert handle their own layouts only; a ranker gets a pointer to hf.ranker, nothing is written."""
    folder, config, params = bert_ranker
    for loader in (hf.load_hf_folder, hf_bert.load_bert_folder):
        with pytest.raises(RankgenError, match=r"a ranker \(cross encoder\) folder.*hf.ranker.load_ranker_folder"):
            loader(str(folder))
    with pytest.raises(RankgenError, match="hf.ranker.save_ranker_folder"):
        hf_bert.save_bert_folder(config, params, str(tmp_path / "a"))
    t5_config = ranker_config("t5", "first", 0, 1)
    with pytest.raises(RankgenError, match="hf.ranker.save_ranker_folder"):
        hf.save_hf_folder(t5_config, make_params(t5_config), str(tmp_path / "b"))
    assert not any((tmp_path / name).exists() for name in "ab")


# ---------------------------------------------------------------------------
# Bert/RobertaForSequenceClassification: no remote code, transformers' Auto class and sentence-transformers

PAIRS = [("The rain fell all night on the old town.", "By morning the river had risen."),
         ("She opened the letter slowly.", "It was from her brother, who had been away for years."),
         ("He laughed.", "The quick brown fox jumps over the lazy dog."),
         ("A short one.", "And a much longer continuation, with commas, that runs on for a while.")]


def pooler_config(encoder: str, num_scores: int, projection_dim: int = 0) -> ModelConfig:
    return ranker_config(encoder, "pooler", projection_dim, num_scores)


def pooler_params(make_params, config: ModelConfig, seed: int) -> dict:
    """Ranker params whose pooler is far from its near-zero init, so it visibly shapes the scores."""
    params = dict(make_params(config, seed))
    rng = np.random.default_rng(seed + 100)
    params["pooler"] = {"dense": {k: v + 0.5 * rng.standard_normal(v.shape).astype(np.float32)
                                  for k, v in params["pooler"]["dense"].items()}}
    return params


def roberta_tokenizer_files(folder: Path) -> list[str]:
    """A byte-level BPE RoBERTa tokenizer (ids 0-4: <s> <pad> </s> <unk> <mask>) trained on PAIRS."""
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([t for pair in PAIRS for t in pair], vocab_size=ENCODERS["roberta+pooler"].vocab_size,
                            min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    bpe._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    transformers.RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                      sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                      mask_token="<mask>").save_pretrained(str(folder))
    return [str(folder / name) for name in ("tokenizer.json", "tokenizer_config.json")]


def minilm_tokenizer_files() -> list[str]:
    from rankgen_jax.pretrained import resolve_model

    folder = resolve_model("minilm")
    return [os.path.join(folder, name) for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                                                    "special_tokens_map.json")]


def hf_logits(folder, ids, mask, types) -> np.ndarray:
    """AutoModelForSequenceClassification's logits of [B, C, L] inputs, as [B, C] (one label) or [B, C, N]."""
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    flat = lambda x: None if x is None else torch.from_numpy(x.reshape(-1, x.shape[-1])).long()  # noqa: E731
    with torch.no_grad():
        logits = model.eval()(input_ids=flat(ids), attention_mask=flat(mask), token_type_ids=flat(types)).logits
    return logits.numpy().reshape(*ids.shape[:2], *([] if logits.shape[-1] == 1 else [logits.shape[-1]]))


def our_pair_scores(folder) -> np.ndarray:
    """PAIRS scored by `LoadedModel.score_pairs` (the `score` path), [P] or [P, N]."""
    from rankgen_jax.inference.encoder import load_model

    model = load_model(str(folder), kind="cross_encoder")
    scores = model.score_pairs([q for q, _ in PAIRS], [[c] for _, c in PAIRS], query_length=24, candidate_length=32)
    return np.stack([s[0] for s in scores])


@pytest.mark.parametrize("encoder, num_scores", [("bert_minilm_vocab", 1), ("roberta+pooler", 3)])
def test_sequence_classification_export_scores_in_transformers_and_sentence_transformers(
        tmp_path, make_params, encoder, num_scores):
    from sentence_transformers import CrossEncoder

    config = pooler_config(encoder, num_scores)
    params = pooler_params(make_params, config, seed=2)
    vocab = (minilm_tokenizer_files() if encoder == "bert_minilm_vocab"
             else roberta_tokenizer_files(tmp_path / "tokenizer"))
    native.save_params(tmp_path / "ckpt", config, params, vocab=vocab)
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    out = tmp_path / "hf"

    written = json.loads((out / "config.json").read_text())
    variant = config.encoder.variant
    assert written["architectures"] == [ranker.SEQUENCE_CLASSIFICATION_ARCHITECTURES[variant]]
    assert written["model_type"] == variant and "auto_map" not in written
    assert written["id2label"] == {str(i): f"LABEL_{i}" for i in range(num_scores)}
    assert not (out / "modeling_ranker.py").exists()
    assert export_layout(config, "rankgen") == f"{written['architectures'][0]}, no remote code"

    # transformers' own class, on ids (token types included for BERT): the logits are our scores.
    ids, mask, types = ids_for(config, seed=2)
    want = jax_scores(config, params, ids, mask, types)
    got = hf_logits(out, ids, mask, types)
    assert got.shape == want.shape and np.ptp(want) > 0.1  # scores that differ, not one constant
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # sentence-transformers on text, against `score`'s path on the checkpoint; raw logits (no sigmoid).
    cross_encoder = CrossEncoder(str(out), device="cpu")
    assert cross_encoder.num_labels == num_scores and type(cross_encoder.activation_fn).__name__ == "Identity"
    st_scores = cross_encoder.predict(PAIRS, batch_size=3)
    ours = our_pair_scores(tmp_path / "ckpt")
    assert st_scores.shape == ours.shape == ((len(PAIRS),) if num_scores == 1 else (len(PAIRS), num_scores))
    assert np.ptp(ours, axis=0).min() > 1e-2  # the pairs get different scores
    np.testing.assert_allclose(st_scores, ours, rtol=1e-5, atol=1e-5)

    # Import back: the same cross encoder, bit for bit, and the same scores from the HF folder.
    _, restored = native.restore_params(tmp_path / "ckpt")
    loaded_config, loaded_params, tokenizer_files = read_source("hf", str(out))
    assert loaded_config == config
    assert_same_params(loaded_params, restored)
    assert "tokenizer.json" in {os.path.basename(f) for f in tokenizer_files}
    import_checkpoint("hf", str(out), str(tmp_path / "back"))
    np.testing.assert_allclose(our_pair_scores(tmp_path / "back"), ours, rtol=1e-6, atol=1e-6)

    # A folder the library itself re-saves (sentence-transformers' own modules.json layout) imports the same.
    cross_encoder.save_pretrained(str(tmp_path / "st_saved"))
    assert (tmp_path / "st_saved" / "modules.json").is_file()
    resaved_config, resaved_params, _ = read_source("hf", str(tmp_path / "st_saved"))
    assert resaved_config == config
    assert_same_params(resaved_params, restored)


@pytest.mark.parametrize("hf_class, num_labels", [("BertForSequenceClassification", 2),
                                                  ("RobertaForSequenceClassification", 1)])
def test_sequence_classification_models_from_transformers_import_as_cross_encoders(tmp_path, hf_class, num_labels):
    """A model transformers made (not our export) imports with the scores transformers computes."""
    variant = "bert" if hf_class.startswith("Bert") else "roberta"
    config_class = transformers.BertConfig if variant == "bert" else transformers.RobertaConfig
    hf_config = config_class(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                             type_vocab_size=2 if variant == "bert" else 1, pad_token_id=0 if variant == "bert" else 1)
    torch.manual_seed(0)
    model = getattr(transformers, hf_class)(hf_config).eval()
    with torch.no_grad():  # transformers initialises the head to near zero; make it matter
        for p in model.classifier.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(str(tmp_path))

    config, params, _ = read_source("hf", str(tmp_path))
    assert config.kind == "cross_encoder" and config.num_scores == num_labels
    assert config.head == HeadConfig("pooler", 0, False) and config.encoder.variant == variant
    ids, mask, types = ids_for(config, seed=3)
    want = hf_logits(tmp_path, ids, mask, types)
    got = jax_scores(config, params, ids, mask, types)
    assert got.shape == want.shape and np.ptp(want) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_only_the_exact_sequence_classification_head_leaves_the_ranker_format(tmp_path, make_params):
    """A projection after the pooler, or another pooling, keeps modeling_ranker.py (which scores the pooler too)."""
    for config in (pooler_config("bert", 3, projection_dim=8), ranker_config("bert", "first", 0, 1),
                   ranker_config("distilbert", "first", 0, 1)):
        assert not ranker.fits_sequence_classification(config)
        assert export_layout(config, "rankgen") == "ranker format, modeling_ranker.py"
    config = pooler_config("roberta+pooler", 1, projection_dim=-1)
    params = pooler_params(make_params, config, seed=4)
    ranker.save_ranker_folder(config, params, str(tmp_path / "ranker"))
    assert json.loads((tmp_path / "ranker" / "config.json").read_text())["pooling"] == "pooler"
    assert_scores_match(config, params, tmp_path / "ranker", seed=4)
    assert ranker.load_ranker_folder(str(tmp_path / "ranker"))[0] == config
    with pytest.raises(RankgenError, match=r"only a BERT or RoBERTa cross encoder with pooling='pooler'.*"
                                           r"pooling='first', projection_dim=0"):
        ranker.save_sequence_classification_folder(ranker_config("bert", "first", 0, 1), params, str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("model_config, match", [
    (lambda: ModelConfig(encoder=ENCODERS["bert"], head=HeadConfig("pooler", 0, False)), "kind='dual_encoder'"),
    (lambda: ranker_config("roberta", "pooler", 0, 1), "a roberta encoder with has_pooler=False"),
    (lambda: ranker_config("distilbert", "pooler", 0, 1), "a distilbert encoder with has_pooler=False"),
    (lambda: ranker_config("t5", "pooler", 0, 1), "a T5 encoder"),
])
def test_pooler_head_needs_a_cross_encoder_with_a_pooler(model_config, match):
    # A dual encoder is refused at once; an encoder without a pooler when a model is built from the config (a run
    # from a checkpoint takes the checkpoint's encoder, whatever gin's would be).
    with pytest.raises(RankgenError, match=rf"HeadConfig.pooling='pooler' reads the BERT / RoBERTa pooler.*{match}"):
        build_model(model_config())


@pytest.fixture(scope="module")
def sequence_classification_folder(tmp_path_factory, make_params):
    config = pooler_config("bert", 3)
    folder = tmp_path_factory.mktemp("sequence_classification")
    ranker.save_sequence_classification_folder(config, pooler_params(make_params, config, seed=5), str(folder),
                                               overwrite=True)
    return folder


BROKEN_SEQUENCE_CLASSIFICATION = {
    "fewer labels": (lambda c, t: c.update(id2label={"0": "a", "1": "b"}),
                     r"tensor classifier.weight has shape \(3, 32\), but config.json implies \(2, 32\)"),
    "no labels": (lambda c, t: [c.pop("id2label"), c.pop("label2id")],  # PretrainedConfig's default: 2
                  r"tensor classifier.weight has shape \(3, 32\), but config.json implies \(2, 32\)"),
    "bad id2label": (lambda c, t: c.update(id2label=[]), r"id2label=\[\] should be a non-empty object"),
    "missing pooler": (lambda c, t: t.pop("bert.pooler.dense.bias"), "missing tensor bert.pooler.dense.bias"),
    "unexpected": (lambda c, t: t.update({"classifier.dense.weight": np.zeros((32, 32), np.float32)}),
                   "unexpected tensor classifier.dense.weight"),
}


@pytest.mark.parametrize("name", list(BROKEN_SEQUENCE_CLASSIFICATION))
def test_broken_sequence_classification_folders_are_refused(tmp_path, sequence_classification_folder, name):
    edit, match = BROKEN_SEQUENCE_CLASSIFICATION[name]
    folder = tmp_path / "f"
    shutil.copytree(sequence_classification_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    edit(config, tensors)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RankgenError, match=match) as info:
        read_source("hf", str(folder))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def test_pooler_head_trains_the_pooler(make_params):
    """The pooler is part of the `pooler` head's forward pass, so training reaches it (other heads leave it be)."""
    grads = {}
    for pooling in ("pooler", "first"):
        config = ranker_config("bert", pooling, 0, 1)
        params = make_params(config, seed=6)
        ids, mask, types = ids_for(config, seed=6)
        model = build_model(config)
        grads[pooling] = jax.grad(lambda p: model.apply({"params": p}, ids, mask, types).sum())(params)
    assert float(np.abs(grads["pooler"]["pooler"]["dense"]["kernel"]).max()) > 1e-4
    assert float(np.abs(grads["first"]["pooler"]["dense"]["kernel"]).max()) == 0.0
