"""What every HF folder format shares: tensor tables, safetensors and JSON files, output folders, tokenizer files.

A tensor table lists, for one model config, each tensor's canonical parameter
path, its HF key and shape, and whether HF stores it transposed (a torch
nn.Linear weight is [out, in], our kernel [in, out]). The same table turns
canonical parameters into an HF state dict and back, checking every name and
shape on the way.

Weights are read and written as safetensors only; pickled `pytorch_model.bin`
files are refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Mapping

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import ModelConfig

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weight files of any HF folder; a previous export's would shadow or confuse the new one.
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json")
# The modeling files exported folders carry for `trust_remote_code` (they sit beside this module).
RANKGEN_MODELING_FILE = "modeling_rankgen.py"
RANKER_MODELING_FILE = "modeling_ranker.py"
# config.json's model_type in a ranker folder (modeling_ranker.RankerConfig).
RANKER_MODEL_TYPE = "rankgen_ranker"


def is_ranker_config(hf: Mapping[str, Any]) -> bool:
    """Whether an HF config.json describes a ranker exported by rankgen_jax."""
    return hf.get("model_type") == RANKER_MODEL_TYPE


def first_line(error: Exception) -> str:
    """The first line of an error's message (its type name if the message is empty)."""
    # gin appends "In call to configurable ..." on a second line; errors here stay one line.
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# ---------------------------------------------------------------------------
# Tensor tables


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """One tensor: its canonical path, HF key, HF shape, and whether HF stores it transposed."""

    path: tuple[str, ...]
    hf_key: str
    hf_shape: tuple[int, ...]
    transpose: bool


def prefixed(tensors: list[HFTensor], prefix: str) -> list[HFTensor]:
    """The same tensors with `prefix` before each HF key (a wrapped model's attribute name)."""
    return [dataclasses.replace(t, hf_key=prefix + t.hf_key) for t in tensors]


def projection_tensors(model_config: ModelConfig) -> list[HFTensor]:
    """The head's bias-free projection as a torch nn.Linear weight [P, d] (none when projection_dim is 0)."""
    if model_config.head is None or model_config.head.projection_dim == 0:
        return []
    d = model_config.encoder.d_model
    return [HFTensor(("projection_layer", "kernel"), "projection.weight", (model_config.head.output_dim(d), d), True)]


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


def state_dict_from_tensor_table(tensors: list[HFTensor], params: Mapping) -> dict[str, np.ndarray]:
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


def params_from_tensor_table(tensors: list[HFTensor], state_dict: Mapping[str, Any], where: str) -> dict:
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


# ---------------------------------------------------------------------------
# Files


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


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """A dict as indented JSON with sorted keys and a final newline, as HF folders have it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def check_folder(path: str) -> None:
    """RankgenError unless `path` is an existing folder."""
    if not os.path.exists(path):
        raise RankgenError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise RankgenError(f"{path}: not a folder (expected an HF model folder with config.json)")


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
    out = {}
    try:
        with safe_open(path, framework="numpy") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
        return out
    except (SafetensorError, TypeError, ValueError) as numpy_error:
        # numpy has no bfloat16; torch reads every dtype safetensors can hold. Optional: only such files need it.
        try:
            import torch
        except ImportError:
            raise RankgenError(f"{path}: cannot read ({numpy_error})") from None
    try:
        with safe_open(path, framework="pt") as f:
            return {key: f.get_tensor(key).to(torch.float32).numpy() for key in f.keys()}
    except Exception as e:  # noqa: BLE001 - any read failure is a bad file for the user
        raise RankgenError(f"{path}: cannot read safetensors ({e})") from None


def read_state_dict(folder: str) -> dict[str, np.ndarray]:
    """Every tensor of a folder's weights (one safetensors file or the shards of an index)."""
    state_dict: dict[str, np.ndarray] = {}
    for f in safetensors_files(folder):
        state_dict.update(read_safetensors(f))
    return state_dict


def write_safetensors(path: str, state_dict: dict[str, np.ndarray]) -> None:
    """A state dict as one safetensors file, with the "format" metadata HF's loader requires."""
    save_file(state_dict, path, metadata={"format": "pt"})


def prepare_out_dir(out_dir: str, overwrite: bool, stale_files: tuple[str, ...], stale_dir=None) -> None:
    """Create out_dir; refuse a non-empty one unless overwrite, then clear only files we would write.

    Stale weights / tokenizer files (those named in stale_files, weight shards,
    and folders whose name matches the stale_dir pattern, e.g. sentence-transformers
    modules) would shadow or contradict the new export; anything else the user keeps there stays.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RankgenError(f"{out_dir}: exists and is not a folder")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not overwrite:
            raise RankgenError(f"{out_dir}: exists and is not empty (pass `overwrite` to replace its contents)",
                               names=("overwrite",))
        for name in os.listdir(out_dir):
            full = os.path.join(out_dir, name)
            if name in stale_files or (name.startswith("model-") and name.endswith(".safetensors")):
                os.remove(full)
            elif stale_dir is not None and stale_dir.match(name) and os.path.isdir(full):
                shutil.rmtree(full)
    os.makedirs(out_dir, exist_ok=True)


def copy_modeling_file(name: str, out_dir: str) -> None:
    """Copy one of the modeling files beside this module (RANKGEN_MODELING_FILE, RANKER_MODELING_FILE) into out_dir."""
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), os.path.join(out_dir, name))


def read_files(files: list[str]) -> dict[str, bytes]:
    """{file name: contents}; read before an overwrite clears the folder they may sit in."""
    out = {}
    for f in files:
        if not os.path.isfile(f):
            raise RankgenError(f"{f}: tokenizer file not found")
        with open(f, "rb") as fh:
            out[os.path.basename(f)] = fh.read()
    return out


def write_files(out_dir: str, files: Mapping[str, bytes]) -> None:
    """Write {file name: contents} (from read_files) into out_dir as they are."""
    for name, data in files.items():
        with open(os.path.join(out_dir, name), "wb") as fh:
            fh.write(data)
