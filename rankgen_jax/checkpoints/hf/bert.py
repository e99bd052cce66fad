"""HuggingFace <-> canonical conversion for BERT-family encoders (BERT/MiniLM, DistilBERT, RoBERTa).

Canonical parameters are nested dicts of float32 numpy arrays named as in
`rankgen_jax.models.bert` (one tree for all three variants). Folders:

- A plain HF folder (`BertModel`, `DistilBertModel`, `RobertaModel`, or any
  task model of these types) imports as a bare encoder. Keys may carry the
  task model's base prefix (`bert.`, `distilbert.`, `roberta.`); task heads
  (`cls.*`, `lm_head.*`, `vocab_transform/vocab_layer_norm/vocab_projector`,
  `pre_classifier`, `classifier`, `qa_outputs`) are dropped, as are the
  `position_ids`/`token_type_ids` buffers. Any other unknown tensor is an error.
  The pooler is kept when the checkpoint has one (`has_pooler`).
- A sentence-transformers folder (`modules.json`: Transformer -> Pooling
  [-> Dense] [-> Normalize]) imports as a dual encoder whose head is the
  pooling (mean or CLS), the bias-free Dense as `projection_layer/kernel`, and
  L2 normalisation when Normalize is present. Export writes the same layout
  (`hf.st_layout` reads and writes the sentence-transformers files; a
  two-tower model's Router layout is put together in `checkpoints.convert`).
- Cross encoders (rankers) have their own format, written and read by
  `hf.ranker` from this module's tensor table; `checkpoints.convert` picks the
  format of a folder or a model.

Weights are read and written as safetensors only; pickled `pytorch_model.bin`
files are refused.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import numpy as np

from rankgen_jax.checkpoints.hf import common, st_layout
from rankgen_jax.data.conventions import RELEASED, InputConventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import BertConfig, ModelConfig

BERT_MODEL_TYPES = ("bert", "distilbert", "roberta")
BASE_ARCHITECTURES = {"bert": "BertModel", "distilbert": "DistilBertModel", "roberta": "RobertaModel"}
# The tokenizer class of each model type, for folders whose config.json AutoTokenizer cannot map (rankers).
TOKENIZER_CLASSES = {"bert": "BertTokenizer", "distilbert": "DistilBertTokenizer", "roberta": "RobertaTokenizer"}
# Tokenizer files carried from an imported folder to an export, whichever exist.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "merges.txt", "vocab.json", "tokenizer_config.json",
                   "special_tokens_map.json")
# Task-model heads that are not part of the encoder (see the module docstring).
HEAD_PREFIXES = ("cls.", "lm_head.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
                 "pre_classifier.", "classifier.", "qa_outputs.")
# Non-persistent buffers that older checkpoints (e.g. all-MiniLM-L6-v2) still store.
BUFFER_SUFFIXES = (".position_ids", ".token_type_ids")

# sentence-transformers files (hf.st_layout), named here too for the modules that use this one's.
ST_FILES, ST_MODULE_DIR, ST_MODE_OF_POOLING = st_layout.ST_FILES, st_layout.ST_MODULE_DIR, st_layout.ST_MODE_OF_POOLING
# Files a previous export may have left that would shadow or confuse the new one.
STALE_FILES = (*common.WEIGHT_FILES, "config.json", common.RANKER_MODELING_FILE, *TOKENIZER_FILES, *ST_FILES)

# HF config defaults per model type, for keys an older config.json leaves out.
_BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "max_position_embeddings": 512,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
}
_HF_DEFAULTS = {
    "bert": _BERT_DEFAULTS,
    "roberta": {**_BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1},
    "distilbert": {
        "vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "activation": "gelu",
        "dropout": 0.1, "max_position_embeddings": 512, "pad_token_id": 0, "sinusoidal_pos_embds": False,
    },
}
# HF activation names that compute exactly one of ours.
_ACTIVATION_ALIASES = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "relu": "relu"}
# DistilBERT's LayerNorms have a hard-coded eps.
_DISTILBERT_EPS = 1e-12


# ---------------------------------------------------------------------------
# Configs


def is_bert_family(hf_config: Mapping[str, Any]) -> bool:
    """Whether an HF config.json describes a model this module converts."""
    return hf_config.get("model_type") in BERT_MODEL_TYPES


def is_bert_folder(path: str) -> bool:
    """Whether `path` is an HF or sentence-transformers folder of a BERT-family model (never raises)."""
    path = os.fspath(path)
    config_path = os.path.join(path, "config.json")
    try:
        if not os.path.isfile(config_path) and os.path.isfile(os.path.join(path, "modules.json")):
            # Older sentence-transformers folders keep the HF model in the Transformer module's subfolder.
            config_path = os.path.join(st_layout.st_modules(path)[0]["path"], "config.json")
        return os.path.isfile(config_path) and is_bert_family(common.read_json(config_path))
    except (RankgenError, OSError):
        return False


def _field(hf: Mapping[str, Any], model_type: str, key: str, expected: type, where: str):
    """One config.json field, defaulted like HF, with a clear error when it has the wrong type."""
    value = hf.get(key, _HF_DEFAULTS[model_type][key])
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise RankgenError(f"{where}: {key}={value!r} should be of type {expected.__name__}")
    return value


def _activation(name: str, key: str, where: str) -> str:
    if name not in _ACTIVATION_ALIASES:
        raise RankgenError(f"{where}: {key}={name!r} is not supported (expected one of {sorted(_ACTIVATION_ALIASES)})")
    return _ACTIVATION_ALIASES[name]


def bert_config_from_hf(hf: Mapping[str, Any], where: str) -> BertConfig:
    """Our `BertConfig` from an HF BERT / DistilBERT / RoBERTa config.json (`where` names it in errors).

    has_pooler defaults to what the HF base model builds (BERT and RoBERTa yes,
    DistilBERT no); load_bert_folder corrects it from the checkpoint's tensors.
    """
    model_type = hf.get("model_type")
    if model_type not in BERT_MODEL_TYPES:
        raise RankgenError(f"{where}: model_type={model_type!r} is not a BERT-family model"
                           f" (expected one of {BERT_MODEL_TYPES})")
    if model_type == "distilbert":
        if _field(hf, model_type, "sinusoidal_pos_embds", bool, where):
            raise RankgenError(f"{where}: DistilBERT with sinusoidal_pos_embds=true is not supported"
                               " (only learned absolute positions)")
        fields = dict(
            vocab_size=_field(hf, model_type, "vocab_size", int, where),
            d_model=_field(hf, model_type, "dim", int, where),
            d_ff=_field(hf, model_type, "hidden_dim", int, where),
            num_layers=_field(hf, model_type, "n_layers", int, where),
            num_heads=_field(hf, model_type, "n_heads", int, where),
            max_position_embeddings=_field(hf, model_type, "max_position_embeddings", int, where),
            type_vocab_size=0,
            layer_norm_eps=_DISTILBERT_EPS,
            hidden_act=_activation(_field(hf, model_type, "activation", str, where), "activation", where),
            pad_id=_pad_id(hf, model_type, where),
            position_offset=0,
            has_pooler=False,
            dropout_rate=_field(hf, model_type, "dropout", float, where),
        )
    else:
        position_type = hf.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise RankgenError(f"{where}: position_embedding_type={position_type!r} is not supported"
                               " (only 'absolute')")
        if hf.get("is_decoder") or hf.get("add_cross_attention"):
            raise RankgenError(f"{where}: a {model_type} decoder (is_decoder/add_cross_attention) is not supported;"
                               " only bidirectional encoders")
        pad_id = _pad_id(hf, model_type, where)
        fields = dict(
            vocab_size=_field(hf, model_type, "vocab_size", int, where),
            d_model=_field(hf, model_type, "hidden_size", int, where),
            d_ff=_field(hf, model_type, "intermediate_size", int, where),
            num_layers=_field(hf, model_type, "num_hidden_layers", int, where),
            num_heads=_field(hf, model_type, "num_attention_heads", int, where),
            max_position_embeddings=_field(hf, model_type, "max_position_embeddings", int, where),
            type_vocab_size=_field(hf, model_type, "type_vocab_size", int, where),
            layer_norm_eps=_field(hf, model_type, "layer_norm_eps", float, where),
            hidden_act=_activation(_field(hf, model_type, "hidden_act", str, where), "hidden_act", where),
            pad_id=pad_id,
            # RoBERTa counts positions from pad_id + 1 (fairseq's make_positions).
            position_offset=pad_id + 1 if model_type == "roberta" else 0,
            has_pooler=True,
            dropout_rate=_field(hf, model_type, "hidden_dropout_prob", float, where),
        )
    try:
        return BertConfig(variant=model_type, **fields)
    except RankgenError as e:
        raise RankgenError(f"{where}: {common.first_line(e)}") from None


def _pad_id(hf: Mapping[str, Any], model_type: str, where: str) -> int:
    pad_id = hf.get("pad_token_id", _HF_DEFAULTS[model_type]["pad_token_id"])
    if pad_id is None and model_type != "roberta":
        return 0  # no padding token declared: HF then has no padding_idx; 0 is BERT's [PAD]
    if not isinstance(pad_id, int) or isinstance(pad_id, bool) or pad_id < 0:
        raise RankgenError(f"{where}: pad_token_id={pad_id!r} should be a non-negative integer")
    return pad_id


def bert_config_to_hf(cfg: BertConfig) -> dict[str, Any]:
    """HF config.json fields (without `architectures`) for our config; RankgenError if HF cannot express it."""
    if cfg.variant == "distilbert":
        problems = []
        if cfg.type_vocab_size:
            problems.append(f"type_vocab_size={cfg.type_vocab_size} (DistilBERT has no token types)")
        if cfg.has_pooler:
            problems.append("has_pooler=True (DistilBertModel has no pooler)")
        if cfg.layer_norm_eps != _DISTILBERT_EPS:
            problems.append(f"layer_norm_eps={cfg.layer_norm_eps} (DistilBERT's is fixed at {_DISTILBERT_EPS})")
        if cfg.position_offset:
            problems.append(f"position_offset={cfg.position_offset} (DistilBERT positions start at 0)")
        if problems:
            raise RankgenError(f"cannot export as HF DistilBERT: {'; '.join(problems)}")
        return {
            "model_type": "distilbert", "vocab_size": cfg.vocab_size, "dim": cfg.d_model, "hidden_dim": cfg.d_ff,
            "n_layers": cfg.num_layers, "n_heads": cfg.num_heads, "activation": cfg.hidden_act,
            "max_position_embeddings": cfg.max_position_embeddings, "sinusoidal_pos_embds": False,
            "dropout": cfg.dropout_rate, "attention_dropout": cfg.dropout_rate, "pad_token_id": cfg.pad_id,
            "initializer_range": 0.02,
        }
    want_offset = cfg.pad_id + 1 if cfg.variant == "roberta" else 0
    if cfg.position_offset != want_offset:
        raise RankgenError(f"cannot export as HF {cfg.variant}: position_offset={cfg.position_offset},"
                           f" but HF's {BASE_ARCHITECTURES[cfg.variant]} uses {want_offset}")
    if cfg.type_vocab_size <= 0:
        raise RankgenError(f"cannot export as HF {cfg.variant}: type_vocab_size=0, but"
                           f" {BASE_ARCHITECTURES[cfg.variant]} always has token type embeddings")
    return {
        "model_type": cfg.variant, "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "hidden_act": cfg.hidden_act, "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.layer_norm_eps, "pad_token_id": cfg.pad_id,
        "hidden_dropout_prob": cfg.dropout_rate, "attention_probs_dropout_prob": cfg.dropout_rate,
        "position_embedding_type": "absolute", "initializer_range": 0.02,
    }


# ---------------------------------------------------------------------------
# Parameter names


def _linear(path: tuple[str, ...], hf_name: str, in_dim: int, out_dim: int) -> list[common.HFTensor]:
    """A torch nn.Linear (weight [out, in], bias [out]) as our kernel [in, out] and bias."""
    return [common.HFTensor((*path, "kernel"), f"{hf_name}.weight", (out_dim, in_dim), True),
            common.HFTensor((*path, "bias"), f"{hf_name}.bias", (out_dim,), False)]


def _layer_norm(path: tuple[str, ...], hf_name: str, d: int) -> list[common.HFTensor]:
    return [common.HFTensor((*path, "scale"), f"{hf_name}.weight", (d,), False),
            common.HFTensor((*path, "bias"), f"{hf_name}.bias", (d,), False)]


def bert_tensor_table(cfg: BertConfig) -> list[common.HFTensor]:
    """Name/shape table of an encoder in its HF base-model key names."""
    d, ff = cfg.d_model, cfg.d_ff
    emb = ("embeddings",)
    tensors = [
        common.HFTensor((*emb, "word_embeddings", "embedding"), "embeddings.word_embeddings.weight",
                (cfg.vocab_size, d), False),
        common.HFTensor((*emb, "position_embeddings", "embedding"), "embeddings.position_embeddings.weight",
                (cfg.max_position_embeddings, d), False),
    ]
    if cfg.type_vocab_size > 0:
        tensors.append(common.HFTensor((*emb, "token_type_embeddings", "embedding"), "embeddings.token_type_embeddings.weight",
                               (cfg.type_vocab_size, d), False))
    tensors += _layer_norm((*emb, "layer_norm"), "embeddings.LayerNorm", d)
    for i in range(cfg.num_layers):
        ours = ("encoder", f"layers_{i}")
        if cfg.variant == "distilbert":
            hf = f"transformer.layer.{i}"
            names = dict(query=f"{hf}.attention.q_lin", key=f"{hf}.attention.k_lin", value=f"{hf}.attention.v_lin",
                         out=f"{hf}.attention.out_lin", attention_ln=f"{hf}.sa_layer_norm", wi=f"{hf}.ffn.lin1",
                         wo=f"{hf}.ffn.lin2", mlp_ln=f"{hf}.output_layer_norm")
        else:
            hf = f"encoder.layer.{i}"
            names = dict(query=f"{hf}.attention.self.query", key=f"{hf}.attention.self.key",
                         value=f"{hf}.attention.self.value", out=f"{hf}.attention.output.dense",
                         attention_ln=f"{hf}.attention.output.LayerNorm", wi=f"{hf}.intermediate.dense",
                         wo=f"{hf}.output.dense", mlp_ln=f"{hf}.output.LayerNorm")
        for name in ("query", "key", "value", "out"):
            tensors += _linear((*ours, "attention", name), names[name], d, d)
        tensors += _layer_norm((*ours, "attention_layer_norm"), names["attention_ln"], d)
        tensors += _linear((*ours, "mlp", "wi"), names["wi"], d, ff)
        tensors += _linear((*ours, "mlp", "wo"), names["wo"], ff, d)
        tensors += _layer_norm((*ours, "mlp_layer_norm"), names["mlp_ln"], d)
    if cfg.has_pooler:
        tensors += _linear(("pooler", "dense"), "pooler.dense", d, d)
    return tensors


def _normalize_keys(state_dict: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """Strip the task model's base prefix (`bert.` ...) and rename legacy LayerNorm gamma/beta."""
    prefix = f"{variant}."
    out = {}
    for key, value in state_dict.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        # TF-converted checkpoints name LayerNorm parameters gamma/beta; HF renames them on load too.
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        if name in out:
            raise RankgenError(f"tensor {name} appears twice (with and without the {prefix} prefix)")
        out[name] = value
    return out


def _ignorable(key: str) -> bool:
    return key.startswith(HEAD_PREFIXES) or key.endswith(BUFFER_SUFFIXES)


def hf_state_dict_to_params(cfg: BertConfig, state_dict: Mapping[str, Any], where: str) -> dict:
    """HF state dict (base or task model) -> canonical encoder params, checking names and shapes against `cfg`.

    Task heads and position_ids/token_type_ids buffers are dropped (module docstring); any
    other tensor the config does not describe is an error, so nothing is lost silently.
    """
    try:
        state_dict = _normalize_keys(state_dict, cfg.variant)
    except RankgenError as e:
        raise RankgenError(f"{where}: {e}") from None
    tensors = bert_tensor_table(cfg)
    params = common.params_from_tensor_table(tensors, state_dict, where)
    known = {t.hf_key for t in tensors}
    for key in state_dict:
        if key not in known and not _ignorable(key):
            raise RankgenError(f"{where}: unexpected tensor {key} (not part of the model config.json describes)")
    return params


def params_to_hf_state_dict(cfg: BertConfig, params: Mapping) -> dict[str, np.ndarray]:
    """Canonical encoder params -> HF base-model state dict (float32 numpy, kernels transposed, contiguous)."""
    return common.state_dict_from_tensor_table(bert_tensor_table(cfg), params)


# ---------------------------------------------------------------------------
# Folders


def load_bert_folder(path: str) -> tuple[ModelConfig, dict, list[str]]:
    """Read an HF or sentence-transformers BERT-family folder -> (model config, canonical params, tokenizer files).

    A plain HF folder is a bare encoder (kind='encoder'); a folder with
    modules.json is a dual encoder with the sentence-transformers head. A ranker
    folder is refused: `hf.ranker.load_ranker_folder` reads it
    (`checkpoints.convert.read_source` picks the reader of any folder).
    """
    path = os.fspath(path)
    common.check_folder(path)
    root_config = os.path.join(path, "config.json")
    if os.path.isfile(root_config) and common.is_ranker_config(common.read_json(root_config)):
        raise RankgenError(f"{root_config}: a ranker (cross encoder) folder, not a BERT-family one;"
                           " read it with hf.ranker.load_ranker_folder (or `rankgen-jax import --from hf`)")
    head, modules, model_dir = None, None, path
    if os.path.isfile(os.path.join(path, "modules.json")):
        modules = st_layout.st_modules(path)
        if st_layout.module_class(modules[0]["type"]) == "Router":
            raise RankgenError(f"{path}: a sentence-transformers Router (two towers); read it with "
                               "checkpoints.convert.read_hf_folder (or `rankgen-jax import --from hf`)")
        # Current sentence-transformers keeps the HF model in the root (path ""); older ones in a subfolder.
        model_dir = st_layout.transformer_dir(modules)
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{model_dir}: no config.json (not an HF model folder)")
    hf = common.read_json(config_path)
    if not is_bert_family(hf):
        raise RankgenError(f"{config_path}: model_type={hf.get('model_type')!r} is not a BERT-family model"
                           f" (expected one of {BERT_MODEL_TYPES})")
    cfg = bert_config_from_hf(hf, config_path)
    state_dict = common.read_state_dict(model_dir)
    # HF config.json does not say whether the base model has a pooler; the tensors do.
    try:
        has_pooler = any(k.startswith("pooler.") for k in _normalize_keys(state_dict, cfg.variant))
    except RankgenError as e:
        raise RankgenError(f"{model_dir}: {e}") from None
    if cfg.variant != "distilbert":
        cfg = dataclasses.replace(cfg, has_pooler=has_pooler)
    params = hf_state_dict_to_params(cfg, state_dict, model_dir)
    if modules is not None:
        head, kernel = st_layout.read_st_head(modules, cfg.d_model)
        if kernel is not None:
            params["projection_layer"] = {"kernel": kernel}
    model_config = ModelConfig(encoder=cfg, head=head)
    tokenizer_files = [os.path.join(model_dir, name) for name in TOKENIZER_FILES
                       if os.path.isfile(os.path.join(model_dir, name))]
    return model_config, params, tokenizer_files


def positions(cfg: BertConfig) -> int:
    """The longest input the encoder's position table takes."""
    return cfg.max_position_embeddings - cfg.position_offset


def save_bert_folder(model_config: ModelConfig, params: Mapping, out_dir: str,
                     tokenizer_files: list[str] | None = None, overwrite: bool = False,
                     conventions: InputConventions | None = None) -> list[str]:
    """Write config.json + model.safetensors (HF base-model names) + tokenizer files, and for a dual
    encoder the sentence-transformers modules (Pooling [, Dense] [, Normalize]).

    conventions (default: the released RankGen ones) set the prompts and
    max_seq_length; returns what the sentence-transformers files cannot say
    about them (hf.st_layout.st_limits). A cross encoder is refused:
    `hf.ranker.save_ranker_folder` writes rankers.
    """
    cfg = model_config.encoder
    out_dir = os.fspath(out_dir)
    if not isinstance(cfg, BertConfig):
        raise RankgenError("save_bert_folder needs a BERT-family encoder config (got a T5 config)")
    if model_config.kind == "cross_encoder":
        raise RankgenError("a cross encoder has no BERT or sentence-transformers layout; write rankers with"
                           " hf.ranker.save_ranker_folder (or `rankgen-jax export-hf`)")
    if not model_config.shared_towers:
        raise RankgenError("exporting a dual encoder with separate towers (shared_towers=False) to HF is not supported")
    # Check and gather everything first, so bad input fails before anything is written.
    hf = {"architectures": [BASE_ARCHITECTURES[cfg.variant]], **bert_config_to_hf(cfg)}
    state_dict = params_to_hf_state_dict(cfg, params)
    route = st_layout.st_route(model_config, params)
    tokenizers = common.read_files(list(tokenizer_files or []))
    if not cfg.has_pooler and cfg.variant != "distilbert":
        print(f"note: the encoder has no pooler; HF {BASE_ARCHITECTURES[cfg.variant]} will initialise"
              " pooler.dense randomly (it does not affect hidden states)")

    common.prepare_out_dir(out_dir, overwrite, STALE_FILES, ST_MODULE_DIR)
    common.write_safetensors(os.path.join(out_dir, common.SAFETENSORS_FILE), state_dict)
    common.write_json(os.path.join(out_dir, "config.json"), hf)
    common.write_files(out_dir, tokenizers)
    if route is None:
        return []
    conventions = conventions or RELEASED
    st_layout.write_st_modules(out_dir, route, conventions, positions(cfg))
    return st_layout.st_limits(conventions, [route], positions(cfg))
