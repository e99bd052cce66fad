"""HuggingFace <-> canonical parameter conversion for T5 encoders and RankGen dual encoders.

Canonical parameters are nested dicts of float32 numpy arrays with T5X names
(docs/design.md, 'HF T5 names'). Two HF folder formats are supported (docs/design.md, 'RankGen format'):

- `t5-encoder`: a plain `T5EncoderModel` (`shared.weight`, `encoder.block...`).
  Reading also accepts `T5Model` / `T5ForConditionalGeneration` folders, whose
  decoder and LM head are dropped.
- `rankgen`: the released RankGen `T5EncoderWithProjection` (`t5_encoder.*`,
  `projection.weight`) with `modeling_rankgen.py` for `trust_remote_code`.
  Heads other than RankGen's (pooling, projection width, L2) are stored under
  the `rankgen_jax` key of config.json; absent fields mean released behaviour.

Cross encoders (rankers, T5 or BERT-family backbone) have their own format,
`rankgen_ranker`: the backbone's tensors under `backbone.`, the head as
`projection.weight` / `score.weight` / `score.bias`, and `modeling_ranker.py`
for `trust_remote_code` (see the Rankers section below and that file).

Weights are read and written as safetensors only; pickled `pytorch_model.bin`
files are refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Any, Mapping

import numpy as np

from rankgen_jax.models.configs import RANKGEN_HEAD, HeadConfig, ModelConfig, T5Config
from rankgen_jax.errors import RankgenError

logger = logging.getLogger(__name__)

FORMATS = ("rankgen", "t5-encoder")
RANKGEN_ARCHITECTURE = "T5EncoderWithProjection"
# Architectures whose encoder we can read; the decoder/LM head of the last two is dropped.
T5_ARCHITECTURES = ("T5EncoderModel", "T5Model", "T5ForConditionalGeneration", RANKGEN_ARCHITECTURE)
HEAD_CONFIG_KEY = "rankgen_jax"
RANKGEN_PREFIX = "t5_encoder."
MODELING_FILE = "modeling_rankgen.py"
RANKER_MODELING_FILE = "modeling_ranker.py"
RANKER_MODEL_TYPE = "rankgen_ranker"
RANKER_ARCHITECTURE = "RankerModel"
RANKER_PREFIX = "backbone."
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Files a previous export may have left that would shadow or confuse the new one.
STALE_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json",
               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model",
               "config.json", MODELING_FILE, RANKER_MODELING_FILE)

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


def _hf_field(hf: Mapping[str, Any], key: str, kind: type, where: str):
    """One config.json field, defaulted like HF, with a clear error when it has the wrong type."""
    value = hf.get(key, _HF_DEFAULTS[key])
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RankgenError(f"{where}: {key}={value!r} should be of type {kind.__name__}")
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


def first_line(error: Exception) -> str:
    """The first line of an error's message (its type name if the message is empty)."""
    # gin appends "In call to configurable ..." on a second line; errors here stay one line.
    return str(error).splitlines()[0] if str(error) else type(error).__name__


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


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """One tensor: its canonical path, HF key, HF shape, and whether HF stores it transposed."""

    path: tuple[str, ...]
    hf_key: str
    hf_shape: tuple[int, ...]
    transpose: bool


def _encoder_tensors(cfg: T5Config) -> list[HFTensor]:
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


def _projection_tensors(model_config: ModelConfig) -> list[HFTensor]:
    """The head's bias-free projection as a torch nn.Linear weight [P, d] (none when projection_dim is 0)."""
    if model_config.head is None or model_config.head.projection_dim == 0:
        return []
    d = model_config.encoder.d_model
    return [HFTensor(("projection_layer", "kernel"), "projection.weight", (model_config.head.output_dim(d), d), True)]


def _prefixed(tensors: list[HFTensor], prefix: str) -> list[HFTensor]:
    return [dataclasses.replace(t, hf_key=prefix + t.hf_key) for t in tensors]


def _tensor_table(model_config: ModelConfig, fmt: str) -> list[HFTensor]:
    """All tensors of `model_config` in format `fmt` (RankGen prefixes keys and adds the projection)."""
    _check_format(fmt)
    tensors = _encoder_tensors(model_config.encoder)
    if fmt == "t5-encoder":
        return tensors
    return _prefixed(tensors, RANKGEN_PREFIX) + _projection_tensors(model_config)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise RankgenError(f"unknown HF format {fmt!r}: expected one of {FORMATS}")


def get_path(params: Mapping, path: tuple[str, ...]):
    """params[path[0]][path[1]]...; a RankgenError naming the path when absent."""
    node = params
    for i, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node:
            raise RankgenError(f"parameters have no {'/'.join(path[:i + 1])} (needed for {'/'.join(path)})")
        node = node[key]
    return node


def _set_path(params: dict, path: tuple[str, ...], value) -> None:
    node = params
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


# ---------------------------------------------------------------------------
# State dicts


def params_to_hf_state_dict(model_config: ModelConfig, params: Mapping, fmt: str) -> dict[str, np.ndarray]:
    """Canonical params -> HF state dict (float32 numpy, contiguous) for format `fmt`."""
    _check_format(fmt)
    if fmt == "t5-encoder" and model_config.head is not None:
        # A plain T5EncoderModel has nowhere to keep the head; say so once.
        logger.warning("format 't5-encoder' stores the encoder only: the %s head (%s) is not exported",
                       model_config.kind.replace("_", "-"), _describe_head(model_config))
    return state_dict_from_tensor_table(_tensor_table(model_config, fmt), params)


def state_dict_from_tensor_table(tensors, params: Mapping) -> dict[str, np.ndarray]:
    """HF state dict (float32 numpy, contiguous) from canonical params, one table row per tensor."""
    state_dict = {}
    for t in tensors:
        value = np.asarray(get_path(params, t.path), dtype=np.float32)
        expected = t.hf_shape[::-1] if t.transpose else t.hf_shape
        if value.shape != expected:
            raise RankgenError(f"parameter {'/'.join(t.path)} has shape {value.shape},"
                               f" but the model config needs {expected}")
        state_dict[t.hf_key] = np.ascontiguousarray(value.T if t.transpose else value)
    return state_dict


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


def params_from_tensor_table(tensors, state_dict: Mapping[str, Any], where: str) -> dict:
    """Canonical params from an HF state dict, one table row (hf_key, hf_shape, path, transpose) per tensor."""
    params: dict = {}
    for t in tensors:
        if t.hf_key not in state_dict:
            raise RankgenError(f"{where}: missing tensor {t.hf_key}")
        value = np.asarray(state_dict[t.hf_key])
        if tuple(value.shape) != t.hf_shape:
            raise RankgenError(f"{where}: tensor {t.hf_key} has shape {tuple(value.shape)},"
                               f" but config.json implies {t.hf_shape}")
        value = value.astype(np.float32)
        _set_path(params, t.path, np.ascontiguousarray(value.T if t.transpose else value))
    return params


def _check_extra_keys(state_dict: Mapping[str, Any], known: set[str], fmt: str, where: str) -> None:
    """Refuse tensors we would silently drop, except the decoder/LM head and the tied embedding copy."""
    prefix = RANKGEN_PREFIX if fmt == "rankgen" else ""
    for key in state_dict:
        if key in known or _droppable(key, fmt) or _is_tied_copy(state_dict, key, prefix, where):
            continue
        raise RankgenError(f"{where}: unexpected tensor {key} (not part of the model config.json describes)")


def _is_tied_copy(state_dict: Mapping[str, Any], key: str, prefix: str, where: str) -> bool:
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


def read_json(path: str) -> dict:
    """A JSON object from a file; RankgenError naming the file if it is not valid JSON or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise RankgenError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RankgenError(f"{path}: expected a JSON object")
    return data


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


def safetensors_files(folder: str) -> list[str]:
    """The safetensors files holding the weights (one file, or the shards of an index)."""
    single = os.path.join(folder, SAFETENSORS_FILE)
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise RankgenError(f"{index}: no weight_map")
        files = [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]
        for f in files:
            if not os.path.isfile(f):
                raise RankgenError(f"{index}: shard {os.path.basename(f)} is missing")
        return files
    if any(name.startswith("pytorch_model") and ".bin" in name for name in os.listdir(folder)):
        raise RankgenError(
            f"{folder}: has only pytorch_model.bin (pickle), which is not read for safety; re-save it with"
            " safetensors: model.save_pretrained(out_dir, safe_serialization=True)")
    raise RankgenError(f"{folder}: no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX}")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as float32 numpy (bf16/fp16 files are upcast)."""
    from safetensors import SafetensorError, safe_open

    out = {}
    try:
        with safe_open(path, framework="numpy") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
        return out
    except (SafetensorError, TypeError, ValueError) as numpy_error:
        # numpy has no bfloat16; torch reads every dtype safetensors can hold.
        try:
            import torch
        except ImportError:
            raise RankgenError(f"{path}: cannot read ({numpy_error})") from None
    try:
        with safe_open(path, framework="pt") as f:
            return {key: f.get_tensor(key).to(torch.float32).numpy() for key in f.keys()}
    except Exception as e:  # noqa: BLE001 - any read failure is a bad file for the user
        raise RankgenError(f"{path}: cannot read safetensors ({e})") from None


def load_hf_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """Read an HF T5 folder (plain T5 encoder/encoder-decoder, or the RankGen `T5EncoderWithProjection` format) -> (model config, canonical params, path to spiece.model or None).

    A ranker folder (`rankgen_ranker`, T5 or BERT-family backbone) reads as a
    cross encoder; see load_ranker_folder for what it returns.
    """
    if not os.path.exists(path):
        raise RankgenError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise RankgenError(f"{path}: not a folder (expected an HF model folder with config.json)")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{path}: no config.json (not an HF model folder)")
    hf = read_json(config_path)
    if is_ranker_config(hf):
        return load_ranker_folder(path)
    fmt = _folder_format(hf, config_path)
    encoder = t5_config_from_hf(hf, config_path)
    head = head_from_hf(hf, config_path) if fmt == "rankgen" else None
    model_config = ModelConfig(encoder=encoder, head=head)
    state_dict: dict[str, np.ndarray] = {}
    for f in safetensors_files(path):
        state_dict.update(read_safetensors(f))
    params = hf_state_dict_to_params(model_config, state_dict, fmt, path)
    spiece = os.path.join(path, "spiece.model")
    return model_config, params, spiece if os.path.isfile(spiece) else None


def prepare_out_dir(out_dir: str, overwrite: bool, stale_files=STALE_FILES, stale_dir=None) -> None:
    """Create out_dir; refuse a non-empty one unless overwrite, then clear only files we would write.

    Stale weights / tokenizer files (and folders whose name matches the
    stale_dir pattern, e.g. sentence-transformers modules) would shadow or
    contradict the new export; anything else the user keeps there stays.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RankgenError(f"{out_dir}: exists and is not a folder")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not overwrite:
            raise RankgenError(f"{out_dir}: exists and is not empty (pass --overwrite to replace its contents)")
        for name in os.listdir(out_dir):
            full = os.path.join(out_dir, name)
            if name in stale_files or (name.startswith("model-") and name.endswith(".safetensors")):
                os.remove(full)
            elif stale_dir is not None and stale_dir.match(name) and os.path.isdir(full):
                shutil.rmtree(full)
    os.makedirs(out_dir, exist_ok=True)


def _sentencepiece_size(spiece_model: str, cfg: T5Config) -> int:
    """Number of pieces; checks the special pieces sit at the ids T5's tokenizer and cfg use."""
    import sentencepiece

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


def _tokenizer_extra_ids(cfg: T5Config, spiece_model: str) -> int:
    """Check spiece_model fits the model; the number of T5 sentinel ids its tokenizer gets."""
    if not os.path.isfile(spiece_model):
        raise RankgenError(f"{spiece_model}: no such SentencePiece model file")
    pieces = _sentencepiece_size(spiece_model, cfg)
    if pieces > cfg.vocab_size:
        raise RankgenError(f"{spiece_model}: has {pieces} pieces but the model's vocab_size is {cfg.vocab_size}")
    # T5's 100 sentinel tokens get the ids after the pieces; only add them when they
    # fit in the embedding (a small test vocabulary has no room).
    return _T5_EXTRA_IDS if pieces + _T5_EXTRA_IDS <= cfg.vocab_size else 0


def _write_tokenizer(spiece_bytes: bytes, extra_ids: int, out_dir: str) -> None:
    """Write spiece.model and the configs that make AutoTokenizer load a T5 tokenizer."""
    with open(os.path.join(out_dir, "spiece.model"), "wb") as f:
        f.write(spiece_bytes)
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    tokenizer_config = {"tokenizer_class": "T5Tokenizer", "extra_ids": extra_ids, "model_max_length": 512,
                        **special}
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config)
    write_json(os.path.join(out_dir, "special_tokens_map.json"), special)


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """A dict as indented JSON with sorted keys and a final newline, as HF folders have it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def save_hf_folder(model_config: ModelConfig, params: Mapping, out_dir: str, fmt: str = "rankgen",
                   spiece_model: str | None = None, overwrite: bool = False) -> None:
    """Write safetensors + config.json (+ modeling_rankgen.py for fmt='rankgen') + tokenizer files.

    A cross encoder with fmt='rankgen' writes the ranker format (save_ranker_folder);
    fmt='t5-encoder' writes its encoder alone.
    """
    from safetensors.numpy import save_file

    _check_format(fmt)
    if fmt == "rankgen" and model_config.kind == "cross_encoder":
        # A RankGen folder has no score layer; rankers have their own format.
        save_ranker_folder(model_config, params, out_dir, [spiece_model] if spiece_model else None, overwrite)
        return
    if fmt == "rankgen" and model_config.head is None:
        raise RankgenError("format 'rankgen' needs a dual-encoder head (ModelConfig.head is None);"
                           " export the bare encoder with fmt='t5-encoder'")
    # Check everything first, so bad input fails before anything is written.
    state_dict = params_to_hf_state_dict(model_config, params, fmt)
    extra_ids, spiece_bytes = None, None
    if spiece_model is not None:
        extra_ids = _tokenizer_extra_ids(model_config.encoder, spiece_model)
        # Read now: spiece_model may be out_dir/spiece.model, which overwrite clears.
        with open(spiece_model, "rb") as f:
            spiece_bytes = f.read()
    prepare_out_dir(out_dir, overwrite)
    # HF's loader requires the "format" metadata.
    save_file(state_dict, os.path.join(out_dir, SAFETENSORS_FILE), metadata={"format": "pt"})
    hf = t5_config_to_hf(model_config.encoder)
    if fmt == "rankgen":
        hf["architectures"] = [RANKGEN_ARCHITECTURE]
        hf["auto_map"] = {"AutoModel": f"{MODELING_FILE[:-3]}.{RANKGEN_ARCHITECTURE}"}
        hf[HEAD_CONFIG_KEY] = head_to_hf(model_config.head)
        shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), MODELING_FILE),
                        os.path.join(out_dir, MODELING_FILE))
    else:
        hf["architectures"] = ["T5EncoderModel"]
    write_json(os.path.join(out_dir, "config.json"), hf)
    if spiece_model is not None:
        _write_tokenizer(spiece_bytes, extra_ids, out_dir)


# ---------------------------------------------------------------------------
# Rankers (cross encoders)
#
# config.json: model_type `rankgen_ranker`, `backbone` (the encoder's own HF
# config: T5, BERT, RoBERTa or DistilBERT), `backbone_pooler`, `pooling`,
# `projection_dim`, `num_scores`, and an `auto_map` to modeling_ranker.py.
# Tensors: the backbone's HF names under `backbone.`, then `projection.weight`
# [P, d] (absent when projection_dim is 0), `score.weight` [N, P], `score.bias` [N].

# What modeling_ranker.RankerConfig assumes for a key config.json leaves out.
_RANKER_DEFAULTS = {"pooling": "first", "projection_dim": -1, "num_scores": 1, "backbone_pooler": True}


def is_ranker_config(hf: Mapping[str, Any]) -> bool:
    """Whether an HF config.json describes a ranker exported by rankgen_jax."""
    return hf.get("model_type") == RANKER_MODEL_TYPE


def ranker_head_tensors(model_config: ModelConfig) -> list[HFTensor]:
    """The cross-encoder head (whatever the backbone): optional projection, then the score layer with its bias."""
    width = model_config.head.output_dim(model_config.encoder.d_model)
    n = model_config.num_scores
    return _projection_tensors(model_config) + [
        HFTensor(("score_head", "kernel"), "score.weight", (n, width), True),
        HFTensor(("score_head", "bias"), "score.bias", (n,), False),
    ]


def _ranker_tensor_table(model_config: ModelConfig) -> list[HFTensor]:
    """Backbone tensors (its own HF names under `backbone.`) followed by the head tensors."""
    if isinstance(model_config.encoder, T5Config):
        backbone = _encoder_tensors(model_config.encoder)
    else:
        from rankgen_jax.checkpoints.hf.bert import bert_tensor_table

        backbone = bert_tensor_table(model_config.encoder)
    return _prefixed(backbone, RANKER_PREFIX) + ranker_head_tensors(model_config)


def ranker_config_to_hf(model_config: ModelConfig) -> dict[str, Any]:
    """The config.json of a ranker folder; RankgenError if HF cannot express the backbone."""
    encoder = model_config.encoder
    if isinstance(encoder, T5Config):
        backbone = t5_config_to_hf(encoder)
    else:
        from rankgen_jax.checkpoints.hf.bert import bert_config_to_hf

        backbone = bert_config_to_hf(encoder)
    module = RANKER_MODELING_FILE[:-3]
    return {
        "model_type": RANKER_MODEL_TYPE,
        "architectures": [RANKER_ARCHITECTURE],
        "auto_map": {"AutoConfig": f"{module}.RankerConfig", "AutoModel": f"{module}.{RANKER_ARCHITECTURE}"},
        "backbone": backbone,
        # T5 and DistilBERT have no pooler; HF BERT / RoBERTa build one unless told otherwise.
        "backbone_pooler": bool(getattr(encoder, "has_pooler", False)),
        "pooling": model_config.head.pooling,
        "projection_dim": model_config.head.projection_dim,
        "num_scores": model_config.num_scores,
    }


def _ranker_field(hf: Mapping[str, Any], key: str, kind: type, where: str):
    """One ranker setting of config.json, defaulted like modeling_ranker.py, type-checked."""
    value = hf.get(key, _RANKER_DEFAULTS[key])
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RankgenError(f"{where}: {key}={value!r} should be of type {kind.__name__}")
    return value


def ranker_config_from_hf(hf: Mapping[str, Any], where: str) -> ModelConfig:
    """The cross-encoder ModelConfig of a ranker config.json (`where` names it in errors)."""
    from rankgen_jax.checkpoints.hf import bert as hf_bert

    backbone = hf.get("backbone")
    if not isinstance(backbone, Mapping) or not isinstance(backbone.get("model_type"), str):
        raise RankgenError(f"{where}: a ranker config needs a `backbone` object with a model_type, got {backbone!r}")
    backbone_type, backbone_where = backbone["model_type"], f"{where} (backbone)"
    if backbone_type == "t5":
        encoder = t5_config_from_hf(backbone, backbone_where)
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
        raise RankgenError(f"{where}: {first_line(e)}") from None


def read_files(files: list[str]) -> dict[str, bytes]:
    """{file name: contents}; read before an overwrite clears the folder they may sit in."""
    out = {}
    for f in files:
        if not os.path.isfile(f):
            raise RankgenError(f"{f}: tokenizer file not found")
        with open(f, "rb") as fh:
            out[os.path.basename(f)] = fh.read()
    return out


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
    T5's tokenizer, as save_hf_folder does); a BERT-family backbone takes its
    tokenizer files, copied as they are.
    """
    from safetensors.numpy import save_file

    from rankgen_jax.checkpoints.hf import bert as hf_bert

    out_dir = os.fspath(out_dir)
    if model_config.kind != "cross_encoder":
        raise RankgenError(f"save_ranker_folder needs a cross encoder, got kind={model_config.kind!r}")
    # Check and gather everything first, so bad input fails before anything is written.
    hf = ranker_config_to_hf(model_config)
    state_dict = state_dict_from_tensor_table(_ranker_tensor_table(model_config), params)
    files = [os.fspath(f) for f in tokenizer_files or []]
    spiece_bytes, extra_ids, copies = None, None, {}
    if isinstance(model_config.encoder, T5Config):
        if len(files) > 1:
            raise RankgenError(f"a T5 ranker's tokenizer is one SentencePiece model, got {len(files)} files: {files}")
        if files:
            extra_ids = _tokenizer_extra_ids(model_config.encoder, files[0])
            spiece_bytes = read_files(files)[os.path.basename(files[0])]
    else:
        copies = _with_tokenizer_class(read_files(files), hf_bert.TOKENIZER_CLASSES[model_config.encoder.variant])

    prepare_out_dir(out_dir, overwrite, stale_files=(*STALE_FILES, *hf_bert.STALE_FILES),
                     stale_dir=hf_bert.ST_MODULE_DIR)
    # HF's loader requires the "format" metadata.
    save_file(state_dict, os.path.join(out_dir, SAFETENSORS_FILE), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), hf)
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), RANKER_MODELING_FILE),
                    os.path.join(out_dir, RANKER_MODELING_FILE))
    if spiece_bytes is not None:
        _write_tokenizer(spiece_bytes, extra_ids, out_dir)
    for name, data in copies.items():
        with open(os.path.join(out_dir, name), "wb") as fh:
            fh.write(data)


def load_ranker_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """Read a ranker folder -> (cross-encoder model config, canonical params, tokenizer).

    The tokenizer is what the backbone's own loader gives: a T5 backbone's
    spiece.model path (or None), a BERT-family backbone's tokenizer files.
    """
    from rankgen_jax.checkpoints.hf import bert as hf_bert

    path = os.fspath(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{path}: no config.json (not an HF model folder)")
    model_config = ranker_config_from_hf(read_json(config_path), config_path)
    state_dict: dict[str, np.ndarray] = {}
    for f in safetensors_files(path):
        state_dict.update(read_safetensors(f))
    tensors = _ranker_tensor_table(model_config)
    params = params_from_tensor_table(tensors, state_dict, path)
    known, is_t5 = {t.hf_key for t in tensors}, isinstance(model_config.encoder, T5Config)
    for key in state_dict:
        if key in known or (is_t5 and _is_tied_copy(state_dict, key, RANKER_PREFIX, path)):
            continue
        if not is_t5 and key.startswith(RANKER_PREFIX) and key.endswith(hf_bert.BUFFER_SUFFIXES):
            continue  # position_ids / token_type_ids buffers an older transformers may have saved
        raise RankgenError(f"{path}: unexpected tensor {key} (not part of the ranker config.json describes)")
    if is_t5:
        spiece = os.path.join(path, "spiece.model")
        return model_config, params, spiece if os.path.isfile(spiece) else None
    tokenizer = [os.path.join(path, name) for name in hf_bert.TOKENIZER_FILES]
    return model_config, params, [f for f in tokenizer if os.path.isfile(f)]
