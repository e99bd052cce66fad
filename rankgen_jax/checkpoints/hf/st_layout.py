"""The sentence-transformers side of a folder: the input conventions its files state.

sentence-transformers keeps what we call input conventions in three places:
config_sentence_transformers.json (`prompts`: text put before each input, by
name; `default_prompt_name`), the Transformer module's max_seq_length
(sentence_bert_config.json, or the tokenizer's model_max_length in the
layout sentence-transformers 5+ saves) and the tokenizer's truncation_side.
An asymmetric model (a Router module, sentence-transformers 5+) has one
Transformer module per route ("query", "document"), each with its own.
"""

from __future__ import annotations

import json
import os

from rankgen_jax.checkpoints.hf import common
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.errors import RankgenError

ST_ROUTER = "sentence_transformers.base.modules.router.Router"
ROUTER_CONFIG = "router_config.json"
# Prompt names that stand for each side, in order of preference.
PROMPT_NAMES = {"prefix": ("query",), "suffix": ("document", "passage", "corpus")}
# Tokenizers without a length limit report a huge model_max_length.
NO_LIMIT = 10**6


def _json_list(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise RankgenError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, list):
        raise RankgenError(f"{path}: expected a JSON list")
    return data


def _read_optional(path: str) -> dict:
    return common.read_json(path) if os.path.isfile(path) else {}


def transformer_dirs(path: str) -> dict[str, str]:
    """{"prefix": folder, "suffix": folder} of the Transformer module(s) a sentence-transformers folder reads with."""
    modules = sorted(_json_list(os.path.join(path, "modules.json")), key=lambda m: m.get("idx", 0))
    if not modules or not isinstance(modules[0], dict):
        raise RankgenError(f"{path}/modules.json: no modules")
    first = modules[0]
    if first.get("type") != ST_ROUTER:
        folder = os.path.join(path, first.get("path") or "")
        return {"prefix": folder, "suffix": folder}
    router_path = os.path.join(path, first.get("path") or "", ROUTER_CONFIG)
    structure = common.read_json(router_path).get("structure") if os.path.isfile(router_path) else None
    if not isinstance(structure, dict) or not all(isinstance(v, list) and v for v in structure.values()):
        raise RankgenError(f"{router_path}: expected a `structure` of routes, each a list of module folders")
    dirs = {}
    for side, names in (("prefix", ("query",)), ("suffix", ("document",))):
        route = next((structure[n] for n in names if n in structure), None)
        if route is None:
            raise RankgenError(f"{router_path}: no {' or '.join(names)} route (routes: {sorted(structure)})")
        dirs[side] = os.path.join(path, first.get("path") or "", route[0])
    return dirs


def _max_seq_length(folder: str, cap: int | None) -> int | None:
    """A Transformer module's length limit: sentence_bert_config.json, else the tokenizer's model_max_length."""
    length = _read_optional(os.path.join(folder, "sentence_bert_config.json")).get("max_seq_length")
    if not isinstance(length, int) or isinstance(length, bool):
        length = _read_optional(os.path.join(folder, "tokenizer_config.json")).get("model_max_length")
        if not isinstance(length, int) or isinstance(length, bool) or length >= NO_LIMIT:
            length = None
    if length is not None and cap is not None:
        length = min(length, cap)
    return length


def st_conventions(path: str, cap: int | None = None, default_length: int = 512) -> InputConventions:
    """The input conventions a sentence-transformers folder's files state (cap: the encoder's positions).

    Markers are the prompts named "query" and "document" (or "passage"); lengths each
    route's max_seq_length (default_length when none is set); the kept end
    the tokenizer's truncation_side. Tokenizers cut the text and keep their
    special tokens: clean truncation.
    """
    prompts = _read_optional(os.path.join(path, "config_sentence_transformers.json")).get("prompts") or {}
    if not isinstance(prompts, dict):
        raise RankgenError(f"{path}/config_sentence_transformers.json: prompts should be an object, got {prompts!r}")
    fields = {"truncation": "clean"}
    for side, folder in transformer_dirs(path).items():
        marker = next((prompts[n] for n in PROMPT_NAMES[side] if isinstance(prompts.get(n), str)), "")
        length = _max_seq_length(folder, cap)
        side_tokenizer = _read_optional(os.path.join(folder, "tokenizer_config.json"))
        keep = "end" if side_tokenizer.get("truncation_side") == "left" else "start"
        fields.update({f"{side}_marker": marker, f"{side}_length": length or default_length, f"{side}_keep": keep})
    try:
        return InputConventions(**fields)
    except RankgenError as e:
        raise RankgenError(f"{path}: {e}") from None
