"""HuggingFace <-> canonical conversion for cross encoders (rankers), whatever their backbone.

Two folder formats. A BERT or RoBERTa cross encoder whose head is exactly HF's
sequence-classification head (pooling `pooler`, no projection) is written as
that HF class, with no remote code:

- config.json: the encoder's own HF config with `architectures`
  `BertForSequenceClassification` / `RobertaForSequenceClassification`,
  `id2label` / `label2id` for num_labels = num_scores, and
  `sentence_transformers.activation_fn` = Identity so that
  sentence-transformers' CrossEncoder returns the raw scores as we do.
- model.safetensors: BERT: `bert.*` (pooler included), `classifier.weight`
  [N, d], `classifier.bias` [N]. RoBERTa: `roberta.*` (no pooler); its
  classifier holds the pooler's dense layer as `classifier.dense` and the score
  layer as `classifier.out_proj`.
- The tokenizer files, copied as they are.

`AutoModelForSequenceClassification` and `sentence_transformers.CrossEncoder`
load it; such folders (ours or anyone's) import back as cross encoders.

Every other cross encoder uses the `rankgen_ranker` format, one for T5 and
BERT-family backbones:

- config.json: model_type `rankgen_ranker`, `backbone` (the encoder's own HF
  config: T5, BERT, RoBERTa or DistilBERT), `backbone_pooler`, `pooling`,
  `projection_dim`, `num_scores`, and an `auto_map` to modeling_ranker.py.
- model.safetensors: the backbone's tensors under their own HF names behind
  `backbone.` (`hf.t5` or `hf.bert` names them), then `projection.weight` [P, d]
  (absent when projection_dim is 0), `score.weight` [N, P], `score.bias` [N].
- modeling_ranker.py for `trust_remote_code`, and the backbone's tokenizer.

Weights are read and written as safetensors only; pickled `pytorch_model.bin`
files are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from rankgen_jax.checkpoints.hf import bert as hf_bert
from rankgen_jax.checkpoints.hf import t5 as hf_t5
from rankgen_jax.checkpoints.hf import common
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import POOLER_POOLING, BertConfig, HeadConfig, ModelConfig, T5Config

RANKER_ARCHITECTURE = "RankerModel"
RANKER_PREFIX = "backbone."
# An export replaces whatever an earlier T5, RankGen, BERT or sentence-transformers export left.
STALE_FILES = (*hf_t5.STALE_FILES, *hf_bert.STALE_FILES)

# What modeling_ranker.RankerConfig assumes for a key config.json leaves out.
_RANKER_DEFAULTS = {"pooling": "first", "projection_dim": -1, "num_scores": 1, "backbone_pooler": True}


def ranker_head_tensors(model_config: ModelConfig) -> list[common.HFTensor]:
    """The cross-encoder head (whatever the backbone): optional projection, then the score layer with its bias."""
    width = model_config.head.output_dim(model_config.encoder.d_model)
    n = model_config.num_scores
    return common.projection_tensors(model_config) + [
        common.HFTensor(("score_head", "kernel"), "score.weight", (n, width), True),
        common.HFTensor(("score_head", "bias"), "score.bias", (n,), False),
    ]


def ranker_tensor_table(model_config: ModelConfig) -> list[common.HFTensor]:
    """Backbone tensors (its own HF names under `backbone.`) followed by the head tensors."""
    if isinstance(model_config.encoder, T5Config):
        backbone = hf_t5.t5_tensor_table(model_config.encoder)
    else:
        backbone = hf_bert.bert_tensor_table(model_config.encoder)
    return common.prefixed(backbone, RANKER_PREFIX) + ranker_head_tensors(model_config)


def ranker_config_to_hf(model_config: ModelConfig) -> dict[str, Any]:
    """The config.json of a ranker folder; RankgenError if HF cannot express the backbone."""
    encoder = model_config.encoder
    if isinstance(encoder, T5Config):
        backbone = hf_t5.t5_config_to_hf(encoder)
    else:
        backbone = hf_bert.bert_config_to_hf(encoder)
    module = common.RANKER_MODELING_FILE[:-3]
    return {
        "model_type": common.RANKER_MODEL_TYPE,
        "architectures": [RANKER_ARCHITECTURE],
        "auto_map": {"AutoConfig": f"{module}.RankerConfig", "AutoModel": f"{module}.{RANKER_ARCHITECTURE}"},
        "backbone": backbone,
        # T5 and DistilBERT have no pooler; HF BERT / RoBERTa build one unless told otherwise.
        "backbone_pooler": bool(getattr(encoder, "has_pooler", False)),
        "pooling": model_config.head.pooling,
        "projection_dim": model_config.head.projection_dim,
        "num_scores": model_config.num_scores,
    }


def _ranker_field(hf: Mapping[str, Any], key: str, expected: type, where: str):
    """One ranker setting of config.json, defaulted like modeling_ranker.py, type-checked."""
    value = hf.get(key, _RANKER_DEFAULTS[key])
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise RankgenError(f"{where}: {key}={value!r} should be of type {expected.__name__}")
    return value


def ranker_config_from_hf(hf: Mapping[str, Any], where: str) -> ModelConfig:
    """The cross-encoder ModelConfig of a ranker config.json (`where` names it in errors)."""
    backbone = hf.get("backbone")
    if not isinstance(backbone, Mapping) or not isinstance(backbone.get("model_type"), str):
        raise RankgenError(f"{where}: a ranker config needs a `backbone` object with a model_type, got {backbone!r}")
    backbone_type, backbone_where = backbone["model_type"], f"{where} (backbone)"
    if backbone_type == "t5":
        encoder = hf_t5.t5_config_from_hf(backbone, backbone_where)
    elif backbone_type in hf_bert.BERT_MODEL_TYPES:
        encoder = hf_bert.bert_config_from_hf(backbone, backbone_where)
        if encoder.variant != "distilbert":
            encoder = dataclasses.replace(encoder, has_pooler=_ranker_field(hf, "backbone_pooler", bool, where))
    else:
        raise RankgenError(f"{where}: unsupported ranker backbone model_type={backbone_type!r}"
                           f" (expected 't5' or one of {hf_bert.BERT_MODEL_TYPES})")
    try:
        # Cross encoders never normalise their pooled vector.
        head = HeadConfig(pooling=_ranker_field(hf, "pooling", str, where),
                          projection_dim=_ranker_field(hf, "projection_dim", int, where), l2_normalize=False)
        return ModelConfig(encoder=encoder, head=head, kind="cross_encoder",
                           num_scores=_ranker_field(hf, "num_scores", int, where))
    except RankgenError as e:
        raise RankgenError(f"{where}: {common.first_line(e)}") from None


def _with_tokenizer_class(files: dict[str, bytes], tokenizer_class: str) -> dict[str, bytes]:
    """Tokenizer files whose tokenizer_config.json names its class (added when missing).

    AutoTokenizer falls back to config.json's model_type, which in a ranker
    folder is not a model transformers knows.
    """
    if not files:
        return files
    name = "tokenizer_config.json"
    try:
        tokenizer_config = json.loads(files.get(name, b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RankgenError(f"the tokenizer's {name} is not valid JSON ({e})") from None
    if not isinstance(tokenizer_config, dict):
        raise RankgenError(f"the tokenizer's {name} is not a JSON object")
    if tokenizer_config.get("tokenizer_class"):
        return files
    text = json.dumps({**tokenizer_config, "tokenizer_class": tokenizer_class}, indent=2, sort_keys=True) + "\n"
    return {**files, name: text.encode("utf-8")}


def save_ranker_folder(model_config: ModelConfig, params: Mapping, out_dir: str,
                       tokenizer_files: list[str] | None = None, overwrite: bool = False) -> None:
    """Write a cross encoder as config.json + model.safetensors + modeling_ranker.py + tokenizer files.

    tokenizer_files: a T5 backbone takes one SentencePiece model (written as
    T5's tokenizer, as hf.t5.save_hf_folder does); a BERT-family backbone takes
    its tokenizer files, copied as they are.
    """
    out_dir = os.fspath(out_dir)
    if model_config.kind != "cross_encoder":
        raise RankgenError(f"save_ranker_folder needs a cross encoder, got kind={model_config.kind!r}")
    # Check and gather everything first, so bad input fails before anything is written.
    hf = ranker_config_to_hf(model_config)
    state_dict = common.state_dict_from_tensor_table(ranker_tensor_table(model_config), params)
    files = [os.fspath(f) for f in tokenizer_files or []]
    spiece_bytes, extra_ids, copies = None, None, {}
    if isinstance(model_config.encoder, T5Config):
        if len(files) > 1:
            raise RankgenError(f"a T5 ranker's tokenizer is one SentencePiece model, got {len(files)} files: {files}")
        if files:
            extra_ids = hf_t5.tokenizer_extra_ids(model_config.encoder, files[0])
            spiece_bytes = common.read_files(files)[os.path.basename(files[0])]
    else:
        copies = _with_tokenizer_class(common.read_files(files), hf_bert.TOKENIZER_CLASSES[model_config.encoder.variant])

    common.prepare_out_dir(out_dir, overwrite, STALE_FILES, hf_bert.ST_MODULE_DIR)
    common.write_safetensors(os.path.join(out_dir, common.SAFETENSORS_FILE), state_dict)
    common.write_json(os.path.join(out_dir, "config.json"), hf)
    common.copy_modeling_file(common.RANKER_MODELING_FILE, out_dir)
    if spiece_bytes is not None:
        hf_t5.write_tokenizer(spiece_bytes, extra_ids, out_dir)
    common.write_files(out_dir, copies)


def _read_config(path: str) -> tuple[str, dict]:
    """(path of config.json, its contents) of an HF model folder; RankgenError if there is none."""
    common.check_folder(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{path}: no config.json (not an HF model folder)")
    return config_path, common.read_json(config_path)


def load_ranker_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """Read a ranker folder -> (cross-encoder model config, canonical params, tokenizer).

    The tokenizer is what the backbone's own loader gives: a T5 backbone's
    spiece.model path (or None), a BERT-family backbone's tokenizer files.
    """
    path = os.fspath(path)
    config_path, hf = _read_config(path)
    model_config = ranker_config_from_hf(hf, config_path)
    state_dict = common.read_state_dict(path)
    tensors = ranker_tensor_table(model_config)
    params = common.params_from_tensor_table(tensors, state_dict, path)
    known, is_t5 = {t.hf_key for t in tensors}, isinstance(model_config.encoder, T5Config)
    for key in state_dict:
        if key in known or (is_t5 and hf_t5.is_tied_copy(state_dict, key, RANKER_PREFIX, path)):
            continue
        if not is_t5 and key.startswith(RANKER_PREFIX) and key.endswith(hf_bert.BUFFER_SUFFIXES):
            continue  # position_ids / token_type_ids buffers an older transformers may have saved
        raise RankgenError(f"{path}: unexpected tensor {key} (not part of the ranker config.json describes)")
    if is_t5:
        spiece = os.path.join(path, "spiece.model")
        return model_config, params, spiece if os.path.isfile(spiece) else None
    tokenizer = [os.path.join(path, name) for name in hf_bert.TOKENIZER_FILES]
    return model_config, params, [f for f in tokenizer if os.path.isfile(f)]


# ---------------------------------------------------------------------------
# The HF sequence-classification layout (no remote code)

# The HF class whose head is exactly our `pooler` head without a projection, per BERT variant.
# DistilBERT's (pre_classifier -> ReLU -> classifier, no pooler) is no head of ours.
SEQUENCE_CLASSIFICATION_ARCHITECTURES = {"bert": "BertForSequenceClassification",
                                         "roberta": "RobertaForSequenceClassification"}
# What sentence-transformers' CrossEncoder applies to the logits (it defaults to a sigmoid for one label).
ST_IDENTITY_ACTIVATION = "torch.nn.modules.linear.Identity"
# PretrainedConfig's num_labels when config.json names no labels.
_HF_DEFAULT_NUM_LABELS = 2


def fits_sequence_classification(model_config: ModelConfig) -> bool:
    """Whether a cross encoder is exactly HF's Bert/RobertaForSequenceClassification (pooler -> linear)."""
    encoder, head = model_config.encoder, model_config.head
    return (model_config.kind == "cross_encoder" and isinstance(encoder, BertConfig)
            and encoder.variant in SEQUENCE_CLASSIFICATION_ARCHITECTURES
            and head.pooling == POOLER_POOLING and head.projection_dim == 0)


def sequence_classification_tensor_table(model_config: ModelConfig) -> list[common.HFTensor]:
    """The HF class's tensors: the base model behind its prefix, then the classifier."""
    encoder, n, d = model_config.encoder, model_config.num_scores, model_config.encoder.d_model

    def linear(path: tuple[str, ...], hf_name: str, out_dim: int) -> list[common.HFTensor]:
        return [common.HFTensor((*path, "kernel"), f"{hf_name}.weight", (out_dim, d), True),
                common.HFTensor((*path, "bias"), f"{hf_name}.bias", (out_dim,), False)]

    if encoder.variant == "bert":
        return common.prefixed(hf_bert.bert_tensor_table(encoder), "bert.") + linear(("score_head",), "classifier", n)
    # RobertaForSequenceClassification builds its base model without a pooler; its
    # classification head's dense + tanh is the pooler of our model.
    base = dataclasses.replace(encoder, has_pooler=False)
    return (common.prefixed(hf_bert.bert_tensor_table(base), "roberta.")
            + linear(("pooler", "dense"), "classifier.dense", d) + linear(("score_head",), "classifier.out_proj", n))


def sequence_classification_config_to_hf(model_config: ModelConfig) -> dict[str, Any]:
    """config.json of the HF class; RankgenError if the model is not exactly that class."""
    if not fits_sequence_classification(model_config):
        head = model_config.head
        got = "no head" if head is None else f"pooling={head.pooling!r}, projection_dim={head.projection_dim}"
        raise RankgenError("only a BERT or RoBERTa cross encoder with pooling='pooler' and projection_dim=0 is an HF"
                           f" *ForSequenceClassification model (got a {type(model_config.encoder).__name__}"
                           f" {model_config.kind}, {got}); save_ranker_folder writes the other cross encoders")
    encoder = model_config.encoder
    labels = [f"LABEL_{i}" for i in range(model_config.num_scores)]
    return {
        "architectures": [SEQUENCE_CLASSIFICATION_ARCHITECTURES[encoder.variant]],
        **hf_bert.bert_config_to_hf(encoder),
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
        "classifier_dropout": None,
        "sentence_transformers": {"activation_fn": ST_IDENTITY_ACTIVATION},
    }


def is_sequence_classification_config(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json is a BERT / RoBERTa model of the sequence-classification class."""
    architectures = hf.get("architectures")
    wanted = SEQUENCE_CLASSIFICATION_ARCHITECTURES.get(hf.get("model_type"))
    return wanted is not None and isinstance(architectures, list) and architectures[:1] == [wanted]


def is_sequence_classification_folder(path: str) -> bool:
    """Whether `path` holds a Bert/RobertaForSequenceClassification model (never raises)."""
    config_path = os.path.join(os.fspath(path), "config.json")
    try:
        return os.path.isfile(config_path) and is_sequence_classification_config(common.read_json(config_path))
    except (RankgenError, OSError, UnicodeDecodeError):
        return False


def _num_labels(hf: Mapping[str, Any], where: str) -> int:
    """The label count as PretrainedConfig reads it: id2label's size, else num_labels, else 2."""
    id2label = hf.get("id2label")
    if id2label is not None:
        if not isinstance(id2label, Mapping) or not id2label:
            raise RankgenError(f"{where}: id2label={id2label!r} should be a non-empty object")
        return len(id2label)
    value = hf.get("num_labels", _HF_DEFAULT_NUM_LABELS)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RankgenError(f"{where}: num_labels={value!r} should be a positive integer")
    return value


def save_sequence_classification_folder(model_config: ModelConfig, params: Mapping, out_dir: str,
                                        tokenizer_files: list[str] | None = None, overwrite: bool = False) -> None:
    """Write a cross encoder that fits_sequence_classification as the HF class: config.json,
    model.safetensors and the tokenizer files (copied as they are)."""
    out_dir = os.fspath(out_dir)
    # Check and gather everything first, so bad input fails before anything is written.
    hf = sequence_classification_config_to_hf(model_config)
    state_dict = common.state_dict_from_tensor_table(sequence_classification_tensor_table(model_config), params)
    tokenizers = common.read_files([os.fspath(f) for f in tokenizer_files or []])
    common.prepare_out_dir(out_dir, overwrite, STALE_FILES, hf_bert.ST_MODULE_DIR)
    common.write_safetensors(os.path.join(out_dir, common.SAFETENSORS_FILE), state_dict)
    common.write_json(os.path.join(out_dir, "config.json"), hf)
    common.write_files(out_dir, tokenizers)


def load_sequence_classification_folder(path: str) -> tuple[ModelConfig, dict, list[str]]:
    """Read a Bert/RobertaForSequenceClassification folder -> (cross-encoder config, canonical params, tokenizer files).

    The head is pooling `pooler`, no projection, num_scores = the number of
    labels; the scores are the class's logits (whatever activation a
    sentence-transformers CrossEncoder would put on them).
    """
    path = os.fspath(path)
    config_path, hf = _read_config(path)
    if not is_sequence_classification_config(hf):
        raise RankgenError(f"{config_path}: not a {' or '.join(SEQUENCE_CLASSIFICATION_ARCHITECTURES.values())}"
                           f" config (model_type={hf.get('model_type')!r}, architectures={hf.get('architectures')!r})")
    # Both classes have the pooler's dense layer (RoBERTa's inside its classifier).
    encoder = dataclasses.replace(hf_bert.bert_config_from_hf(hf, config_path), has_pooler=True)
    model_config = ModelConfig(encoder=encoder, head=HeadConfig(POOLER_POOLING, 0, False), kind="cross_encoder",
                               num_scores=_num_labels(hf, config_path))
    state_dict = common.read_state_dict(path)
    tensors = sequence_classification_tensor_table(model_config)
    params = common.params_from_tensor_table(tensors, state_dict, path)
    known = {t.hf_key for t in tensors}
    for key in state_dict:
        if key not in known and not key.endswith(hf_bert.BUFFER_SUFFIXES):
            raise RankgenError(f"{path}: unexpected tensor {key} (not part of the"
                               f" {hf['architectures'][0]} config.json describes)")
    tokenizer = [os.path.join(path, name) for name in hf_bert.TOKENIZER_FILES]
    return model_config, params, [f for f in tokenizer if os.path.isfile(f)]
