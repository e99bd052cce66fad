"""HuggingFace <-> canonical parameter conversion for T5 encoders and RankGen dual encoders.

Canonical parameters are nested dicts of float32 numpy arrays with T5X names
(`rankgen_jax.models.t5`; the name mapping is in docs/design/models.md, 'HF T5 names'). Two HF folder formats are
supported (docs/design/checkpoints.md, 'RankGen format'):

- `t5-encoder`: a plain `T5EncoderModel` (`shared.weight`, `encoder.block...`).
  Reading also accepts `T5Model` / `T5ForConditionalGeneration` folders, whose
  decoder and LM head are dropped. A dual encoder whose pooling
  sentence-transformers has (first token, mean) also gets its head as
  sentence-transformers modules (Transformer -> Pooling [-> Dense]
  [-> Normalize], `hf.st_layout`), the Sentence-T5 / GTR layout; such a folder
  reads back as that dual encoder.
- `rankgen`: the released RankGen `T5EncoderWithProjection` (`t5_encoder.*`,
  `projection.weight`) with `modeling_rankgen.py` for `trust_remote_code`.
  Heads other than RankGen's (pooling, projection width, L2) are stored under
  the `rankgen_jax` key of config.json; absent fields mean released behaviour.

Cross encoders (rankers) have their own format, written and read by
`hf.ranker` from this module's tensor table; `checkpoints.convert` picks the
format of a folder or a model.

Weights are read and written as safetensors only; pickled `pytorch_model.bin`
files are refused.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

import numpy as np
import sentencepiece

from rankgen_jax.checkpoints.hf import st_layout
from rankgen_jax.checkpoints.hf.common import (
    RANKER_MODELING_FILE,
    RANKGEN_MODELING_FILE,
    SAFETENSORS_FILE,
    WEIGHT_FILES,
    HFTensor,
    check_folder,
    copy_modeling_file,
    first_line,
    is_ranker_config,
    params_from_tensor_table,
    prefixed,
    prepare_out_dir,
    projection_tensors,
    read_json,
    read_state_dict,
    state_dict_from_tensor_table,
    write_json,
    write_safetensors,
)
from rankgen_jax.data.conventions import RELEASED, InputConventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config

logger = logging.getLogger(__name__)

FORMATS = ("rankgen", "t5-encoder")
RANKGEN_ARCHITECTURE = "T5EncoderWithProjection"
# Architectures whose encoder we can read; the decoder/LM head of the last two is dropped.
T5_ARCHITECTURES = ("T5EncoderModel", "T5Model", "T5ForConditionalGeneration", RANKGEN_ARCHITECTURE)
HEAD_CONFIG_KEY = "rankgen_jax"
RANKGEN_PREFIX = "t5_encoder."
# Files a previous export may have left that would shadow or confuse the new one.
STALE_FILES = (*WEIGHT_FILES, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model",
               "config.json", RANKGEN_MODELING_FILE, RANKER_MODELING_FILE, *st_layout.ST_FILES)

# HF T5Config defaults, used for keys an (older) config.json leaves out.
_HF_DEFAULTS = {
    "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", "pad_token_id": 0, "eos_token_id": 1,
}
# Our activation names are HF's feed_forward_proj values.
_HF_ACTIVATIONS = ("gated-gelu", "relu")
# T5 reserves 100 sentinel ids above the SentencePiece vocabulary (32000 + 100 <= 32128).
_T5_EXTRA_IDS = 100


# ---------------------------------------------------------------------------
# Configs


def t5_config_to_hf(cfg: T5Config) -> dict[str, Any]:
    """HF `T5Config` fields (config.json content, without `architectures`) for an encoder config."""
    hf = {
        "model_type": "t5",
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "d_kv": cfg.d_kv,
        "d_ff": cfg.d_ff,
        "num_layers": cfg.num_layers,
        "num_decoder_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.relpos_buckets,
        "relative_attention_max_distance": cfg.relpos_max_distance,
        "dropout_rate": cfg.dropout_rate,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_factor": 1.0,
        "feed_forward_proj": cfg.mlp_activation,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.pad_id,
        # What T5EncoderModel sets on its config; the folder holds no decoder.
        "is_encoder_decoder": False,
        "use_cache": False,
    }
    if cfg.mlp_activation == "gated-gelu":
        # T5 1.1 has an untied embedding; its released configs say so (transformers 4.x
        # reads it, 5.x ignores it for encoders).
        hf["tie_word_embeddings"] = False
    return hf


def _hf_field(hf: Mapping[str, Any], key: str, expected: type, where: str):
    """One config.json field, defaulted like HF, with a clear error when it has the wrong type."""
    value = hf.get(key, _HF_DEFAULTS[key])
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise RankgenError(f"{where}: {key}={value!r} should be of type {expected.__name__}")
    return value


def t5_config_from_hf(hf: Mapping[str, Any], where: str) -> T5Config:
    """Our `T5Config` from the fields of an HF T5 config.json (`where` names it in errors)."""
    activation = _hf_field(hf, "feed_forward_proj", str, where)
    if activation not in _HF_ACTIVATIONS:
        raise RankgenError(
            f"{where}: feed_forward_proj={activation!r} is not supported (expected one of {_HF_ACTIVATIONS})")
    fields = dict(
        vocab_size=_hf_field(hf, "vocab_size", int, where),
        d_model=_hf_field(hf, "d_model", int, where),
        d_ff=_hf_field(hf, "d_ff", int, where),
        num_layers=_hf_field(hf, "num_layers", int, where),
        num_heads=_hf_field(hf, "num_heads", int, where),
        d_kv=_hf_field(hf, "d_kv", int, where),
        mlp_activation=activation,
        relpos_buckets=_hf_field(hf, "relative_attention_num_buckets", int, where),
        relpos_max_distance=_hf_field(hf, "relative_attention_max_distance", int, where),
        dropout_rate=_hf_field(hf, "dropout_rate", float, where),
        layer_norm_eps=_hf_field(hf, "layer_norm_epsilon", float, where),
        pad_id=_hf_field(hf, "pad_token_id", int, where),
        eos_id=_hf_field(hf, "eos_token_id", int, where),
    )
    try:
        return T5Config(**fields)
    except RankgenError as e:
        raise RankgenError(f"{where}: {first_line(e)}") from None


def head_to_hf(head: HeadConfig) -> dict[str, Any]:
    """The `rankgen_jax` config.json block that `modeling_rankgen.py` reads."""
    return dataclasses.asdict(head)


def head_from_hf(hf: Mapping[str, Any], where: str) -> HeadConfig:
    """The HeadConfig of a RankGen-format config.json; released RankGen when the block is absent."""
    block = hf.get(HEAD_CONFIG_KEY) or {}
    if not isinstance(block, Mapping):
        raise RankgenError(f"{where}: {HEAD_CONFIG_KEY} should be an object, got {block!r}")
    try:
        return HeadConfig(**{**dataclasses.asdict(RANKGEN_HEAD), **block})
    except TypeError as e:
        raise RankgenError(f"{where}: malformed {HEAD_CONFIG_KEY} block ({first_line(e)})") from None
    except RankgenError as e:
        raise RankgenError(f"{where}: {first_line(e)}") from None


# ---------------------------------------------------------------------------
# Parameter names


def t5_tensor_table(cfg: T5Config) -> list[HFTensor]:
    """Name/shape table of a T5 encoder, in HF `T5EncoderModel` key names."""
    d, inner = cfg.d_model, cfg.num_heads * cfg.d_kv
    tensors = [
        HFTensor(("token_embedder", "embedding"), "shared.weight", (cfg.vocab_size, d), False),
        HFTensor(("encoder", "relpos_bias", "rel_embedding"),
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                (cfg.relpos_buckets, cfg.num_heads), True),
    ]
    mlp_in = ("wi_0", "wi_1") if cfg.mlp_activation == "gated-gelu" else ("wi",)
    for i in range(cfg.num_layers):
        layer, hf = f"layers_{i}", f"encoder.block.{i}.layer"
        tensors.append(HFTensor(("encoder", layer, "pre_attention_layer_norm", "scale"),
                               f"{hf}.0.layer_norm.weight", (d,), False))
        for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v")):
            tensors.append(HFTensor(("encoder", layer, "attention", ours, "kernel"),
                                   f"{hf}.0.SelfAttention.{theirs}.weight", (inner, d), True))
        tensors.append(HFTensor(("encoder", layer, "attention", "out", "kernel"),
                               f"{hf}.0.SelfAttention.o.weight", (d, inner), True))
        tensors.append(HFTensor(("encoder", layer, "pre_mlp_layer_norm", "scale"),
                               f"{hf}.1.layer_norm.weight", (d,), False))
        for name in mlp_in:
            tensors.append(HFTensor(("encoder", layer, "mlp", name, "kernel"),
                                   f"{hf}.1.DenseReluDense.{name}.weight", (cfg.d_ff, d), True))
        tensors.append(HFTensor(("encoder", layer, "mlp", "wo", "kernel"),
                               f"{hf}.1.DenseReluDense.wo.weight", (d, cfg.d_ff), True))
    tensors.append(HFTensor(("encoder", "encoder_norm", "scale"), "encoder.final_layer_norm.weight", (d,), False))
    return tensors


def _tensor_table(model_config: ModelConfig, fmt: str) -> list[HFTensor]:
    """All tensors of `model_config` in format `fmt` (RankGen prefixes keys and adds the projection)."""
    _check_format(fmt)
    tensors = t5_tensor_table(model_config.encoder)
    if fmt == "t5-encoder":
        return tensors
    return prefixed(tensors, RANKGEN_PREFIX) + projection_tensors(model_config)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise RankgenError(f"unknown HF format {fmt!r}: expected one of {FORMATS}")


# ---------------------------------------------------------------------------
# State dicts


def params_to_hf_state_dict(model_config: ModelConfig, params: Mapping, fmt: str,
                            head_kept: bool = False) -> dict[str, np.ndarray]:
    """Canonical params -> HF state dict (float32 numpy, contiguous) for format `fmt`.

    head_kept: the caller stores a t5-encoder folder's head elsewhere (sentence-transformers modules).
    """
    _check_format(fmt)
    if fmt == "t5-encoder" and model_config.head is not None and not head_kept:
        # A plain T5EncoderModel has nowhere to keep the head; say so once.
        logger.warning("format 't5-encoder' stores the encoder only: the %s head (%s) is not exported",
                       model_config.kind.replace("_", "-"), _describe_head(model_config))
    return state_dict_from_tensor_table(_tensor_table(model_config, fmt), params)


def _describe_head(model_config: ModelConfig) -> str:
    head = model_config.head
    if model_config.kind == "cross_encoder":
        return f"pooling={head.pooling}, projection_dim={head.projection_dim}, num_scores={model_config.num_scores}"
    return f"pooling={head.pooling}, projection_dim={head.projection_dim}, l2_normalize={head.l2_normalize}"


def _droppable(key: str, fmt: str) -> bool:
    """Keys that belong to the checkpoint but not to the encoder we read (decoder, LM head)."""
    if fmt == "rankgen":
        return False
    return key.startswith(("decoder.", "lm_head."))


def hf_state_dict_to_params(model_config: ModelConfig, state_dict: Mapping[str, Any], fmt: str,
                            where: str) -> dict:
    """HF state dict -> canonical params, checking names and shapes against `model_config`."""
    tensors = _tensor_table(model_config, fmt)
    params = params_from_tensor_table(tensors, state_dict, where)
    _check_extra_keys(state_dict, {t.hf_key for t in tensors}, fmt, where)
    return params


def _check_extra_keys(state_dict: Mapping[str, Any], known: set[str], fmt: str, where: str) -> None:
    """Refuse tensors we would silently drop, except the decoder/LM head and the tied embedding copy."""
    prefix = RANKGEN_PREFIX if fmt == "rankgen" else ""
    for key in state_dict:
        if key in known or _droppable(key, fmt) or is_tied_copy(state_dict, key, prefix, where):
            continue
        raise RankgenError(f"{where}: unexpected tensor {key} (not part of the model config.json describes)")


def is_tied_copy(state_dict: Mapping[str, Any], key: str, prefix: str, where: str) -> bool:
    """Whether `key` is T5's tied embedding copy (prefix + encoder.embed_tokens.weight); an error when it differs."""
    shared, tied = prefix + "shared.weight", prefix + "encoder.embed_tokens.weight"
    if key != tied:
        return False
    # HF ties encoder.embed_tokens to shared; a checkpoint may store both copies.
    if shared not in state_dict or not np.array_equal(np.asarray(state_dict[key]), np.asarray(state_dict[shared])):
        raise RankgenError(f"{where}: {tied} differs from {shared} (they must be the same embedding)")
    return True


# ---------------------------------------------------------------------------
# Folders


def _folder_format(hf: Mapping[str, Any], where: str) -> str:
    """'rankgen' or 't5-encoder' from config.json; RankgenError for anything that is not T5."""
    architectures = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if model_type != "t5":
        found = ", ".join(architectures) if architectures else "none listed"
        raise RankgenError(f"{where}: not a T5 model (model_type={model_type!r}, architectures: {found})")
    unknown = [a for a in architectures if a not in T5_ARCHITECTURES]
    if unknown:
        raise RankgenError(f"{where}: unsupported architecture {', '.join(unknown)}"
                           f" (expected one of {', '.join(T5_ARCHITECTURES)})")
    return "rankgen" if RANKGEN_ARCHITECTURE in architectures else "t5-encoder"


def load_hf_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """Read an HF T5 folder (plain T5 encoder/encoder-decoder, or the RankGen `T5EncoderWithProjection` format) -> (model config, canonical params, path to spiece.model or None).

    A ranker folder is refused: `hf.ranker.load_ranker_folder` reads it
    (`checkpoints.convert.read_source` picks the reader of any folder).
    """
    check_folder(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{path}: no config.json (not an HF model folder)")
    hf = read_json(config_path)
    if is_ranker_config(hf):
        raise RankgenError(f"{config_path}: a ranker (cross encoder) folder, not a T5 or RankGen one;"
                           " read it with hf.ranker.load_ranker_folder (or `rankgen-jax import --from hf`)")
    fmt = _folder_format(hf, config_path)
    encoder = t5_config_from_hf(hf, config_path)
    head = head_from_hf(hf, config_path) if fmt == "rankgen" else None
    model_config = ModelConfig(encoder=encoder, head=head)
    params = hf_state_dict_to_params(model_config, read_state_dict(path), fmt, path)
    if fmt == "t5-encoder" and os.path.isfile(os.path.join(path, "modules.json")):
        # A sentence-transformers T5 (Sentence-T5 / GTR layout): the modules are the head.
        modules = st_layout.st_modules(path)
        if os.path.normpath(st_layout.transformer_dir(modules)) != os.path.normpath(path):
            raise RankgenError(f"{path}/modules.json: the Transformer module should be the folder itself (path '')")
        head, kernel = st_layout.read_st_head(modules, encoder.d_model)
        model_config = ModelConfig(encoder=encoder, head=head)
        if kernel is not None:
            params["projection_layer"] = {"kernel": kernel}
    spiece = os.path.join(path, "spiece.model")
    return model_config, params, spiece if os.path.isfile(spiece) else None


def _sentencepiece_size(spiece_model: str, cfg: T5Config) -> int:
    """Number of pieces; checks the special pieces sit at the ids T5's tokenizer and cfg use."""
    try:
        sp = sentencepiece.SentencePieceProcessor(model_file=spiece_model)
    except (OSError, RuntimeError) as e:
        raise RankgenError(f"{spiece_model}: not a SentencePiece model ({e})") from None
    # HF's T5Tokenizer takes pad/eos/unk ids from where these pieces are.
    for piece, want in (("<pad>", cfg.pad_id), ("</s>", cfg.eos_id), ("<unk>", 2)):
        got = sp.piece_to_id(piece)
        if sp.id_to_piece(got) != piece or got != want:
            raise RankgenError(f"{spiece_model}: piece {piece} should have id {want} for a T5 tokenizer"
                               f" (train it with pad_id={cfg.pad_id}, eos_id={cfg.eos_id}, unk_id=2, bos_id=-1)")
    return sp.get_piece_size()


def tokenizer_extra_ids(cfg: T5Config, spiece_model: str) -> int:
    """Check spiece_model fits the model; the number of T5 sentinel ids its tokenizer gets."""
    if not os.path.isfile(spiece_model):
        raise RankgenError(f"{spiece_model}: no such SentencePiece model file")
    pieces = _sentencepiece_size(spiece_model, cfg)
    if pieces > cfg.vocab_size:
        raise RankgenError(f"{spiece_model}: has {pieces} pieces but the model's vocab_size is {cfg.vocab_size}")
    # T5's 100 sentinel tokens get the ids after the pieces; only add them when they
    # fit in the embedding (a small test vocabulary has no room).
    return _T5_EXTRA_IDS if pieces + _T5_EXTRA_IDS <= cfg.vocab_size else 0


def write_tokenizer(spiece_bytes: bytes, extra_ids: int, out_dir: str) -> None:
    """Write spiece.model and the configs that make AutoTokenizer load a T5 tokenizer."""
    with open(os.path.join(out_dir, "spiece.model"), "wb") as f:
        f.write(spiece_bytes)
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    tokenizer_config = {"tokenizer_class": "T5Tokenizer", "extra_ids": extra_ids, "model_max_length": 512,
                        **special}
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config)
    write_json(os.path.join(out_dir, "special_tokens_map.json"), special)


def save_hf_folder(model_config: ModelConfig, params: Mapping, out_dir: str, fmt: str = "rankgen",
                   spiece_model: str | None = None, overwrite: bool = False,
                   conventions: InputConventions | None = None) -> list[str]:
    """Write safetensors + config.json (+ modeling_rankgen.py for fmt='rankgen') + tokenizer files.

    fmt='t5-encoder' of a dual encoder adds its head as sentence-transformers
    modules where they have its pooling, with prompts and max_seq_length from
    `conventions` (default: the released RankGen ones); returns what those
    files cannot say about them (hf.st_layout.st_limits). A cross encoder has
    no RankGen layout (it has a score layer): fmt='rankgen' refuses it
    (`hf.ranker.save_ranker_folder` writes rankers), fmt='t5-encoder' writes
    its encoder alone.
    """
    _check_format(fmt)
    if fmt == "rankgen" and model_config.kind == "cross_encoder":
        raise RankgenError("format 'rankgen' has no score layer for a cross encoder; write rankers with"
                           " hf.ranker.save_ranker_folder (or `rankgen-jax export-hf`)")
    if fmt == "rankgen" and model_config.head is None:
        raise RankgenError("format 'rankgen' needs a dual-encoder head (ModelConfig.head is None);"
                           " export the bare encoder with fmt='t5-encoder'")
    # Check everything first, so bad input fails before anything is written.
    route = st_layout.st_route(model_config, params) if fmt == "t5-encoder" else None
    state_dict = params_to_hf_state_dict(model_config, params, fmt, head_kept=route is not None)
    extra_ids, spiece_bytes = None, None
    if spiece_model is not None:
        extra_ids = tokenizer_extra_ids(model_config.encoder, spiece_model)
        # Read now: spiece_model may be out_dir/spiece.model, which overwrite clears.
        with open(spiece_model, "rb") as f:
            spiece_bytes = f.read()
    prepare_out_dir(out_dir, overwrite, STALE_FILES, st_layout.ST_MODULE_DIR)
    write_safetensors(os.path.join(out_dir, SAFETENSORS_FILE), state_dict)
    hf = t5_config_to_hf(model_config.encoder)
    if fmt == "rankgen":
        hf["architectures"] = [RANKGEN_ARCHITECTURE]
        hf["auto_map"] = {"AutoModel": f"{RANKGEN_MODELING_FILE[:-3]}.{RANKGEN_ARCHITECTURE}"}
        hf[HEAD_CONFIG_KEY] = head_to_hf(model_config.head)
        copy_modeling_file(RANKGEN_MODELING_FILE, out_dir)
    else:
        hf["architectures"] = ["T5EncoderModel"]
    write_json(os.path.join(out_dir, "config.json"), hf)
    if spiece_model is not None:
        write_tokenizer(spiece_bytes, extra_ids, out_dir)
    if route is None:
        return []
    conventions = conventions or RELEASED
    st_layout.write_st_modules(out_dir, route, conventions, None)
    return st_layout.st_limits(conventions, [route], None)
