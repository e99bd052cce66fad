"""The sentence-transformers files of a folder: module chains, heads, input conventions; read and written.

A sentence-transformers folder lists its modules in modules.json. Supported
here: Transformer -> Pooling [-> Dense] [-> Normalize] (one encoder for every
input), and Router -> [Normalize] (sentence-transformers 5+: asymmetric models,
one route of Transformer -> Pooling [-> Dense] for "query" inputs and one for
"document" inputs; router_config.json names each route's module folders).
Module types are read by class name, so both the `sentence_transformers.models.X`
names (what we write: every version from 3 to 6 resolves them) and the
module paths sentence-transformers 6 saves are accepted; Pooling configs in
both the `pooling_mode_*` flags and the newer `pooling_mode` string.

What we call input conventions sentence-transformers keeps in three places:
config_sentence_transformers.json (`prompts`: text put before each input, by
name, and `default_prompt_name`), each Transformer module's max_seq_length
(sentence_bert_config.json, or the tokenizer's model_max_length in the layout
sentence-transformers 5+ saves) and the tokenizer's truncation side. It cannot
express everything: see st_limits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from rankgen_jax.checkpoints.hf import common
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import HeadConfig, ModelConfig

ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_DENSE = "sentence_transformers.models.Dense"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
ST_ROUTER = "sentence_transformers.models.Router"
ST_IDENTITY = "torch.nn.modules.linear.Identity"
ROUTER_CONFIG = "router_config.json"
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", ROUTER_CONFIG)
# Module folders an export writes: N_Pooling / N_Dense / N_Normalize, and a Router's {route}_N_Module.
ST_MODULE_DIR = re.compile(r"^(\d+|query_\d+|document_\d+)_(Pooling|Dense|Normalize|Transformer)$")
# Pooling modes sentence-transformers knows; we support cls and mean only.
ST_POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                    "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
ST_MODE_OF_POOLING = {"first": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
POOLING_OF_MODE = {"cls": "first", "mean": "mean"}
ROUTES = ("query", "document")
# The version whose layout a file follows: prompts need 2.4+, a Router 5.0+.
ST_VERSION, ST_ROUTER_VERSION = "3.0.0", "5.0.0"
# Prompt names that stand for each side, in order of preference.
PROMPT_NAMES = {"prefix": ("query",), "suffix": ("document", "passage", "corpus")}
# Tokenizers without a length limit report a huge model_max_length.
NO_LIMIT = 10**6


def module_class(module_type: str) -> str:
    """"Transformer", "Pooling", ... of a modules.json type, whichever path sentence-transformers wrote."""
    return module_type.rsplit(".", 1)[-1] if module_type.startswith("sentence_transformers.") else module_type


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


def _write_list(path: str, data: list) -> None:
    with open(path, "w", encoding="utf-8") as f:
        # A list, which common.write_json (objects only) does not take.
        json.dump(data, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------
# Reading


def st_modules(path: str) -> list[dict]:
    """modules.json in idx order, checked to be Transformer -> Pooling [-> Dense] [-> Normalize] or Router [-> Normalize].

    Each module's "path" is made absolute.
    """
    modules_path = os.path.join(path, "modules.json")
    modules = _json_list(modules_path)
    if not all(isinstance(m, dict) and isinstance(m.get("type"), str) and isinstance(m.get("idx", 0), int)
               for m in modules):
        raise RankgenError(f"{modules_path}: expected a list of modules, each with a 'type' and an integer 'idx'")
    modules = [{**m, "path": os.path.join(path, m.get("path") or "")}
               for m in sorted(modules, key=lambda m: m.get("idx", 0))]
    kinds = [module_class(m["type"]) for m in modules]
    chains = ([["Transformer", "Pooling", *tail] for tail in ([], ["Dense"], ["Normalize"], ["Dense", "Normalize"])]
              + [["Router"], ["Router", "Normalize"]])
    if kinds not in chains:
        chain = " -> ".join(kinds) or "empty"
        raise RankgenError(f"{modules_path}: unsupported module chain {chain} (expected Transformer -> Pooling "
                           "[-> Dense] [-> Normalize], or Router [-> Normalize])")
    return modules


def is_router_folder(path: str) -> bool:
    """Whether a folder is a sentence-transformers model with a Router (never raises)."""
    try:
        return os.path.isfile(os.path.join(path, "modules.json")) and module_class(st_modules(path)[0]["type"]) == "Router"
    except RankgenError:
        return False


def router_routes(path: str) -> dict[str, list[dict]]:
    """{"query": modules, "document": modules} of a Router folder, each route Transformer -> Pooling [-> Dense]
    (absolute paths), with the Normalize after the Router appended to both."""
    modules = st_modules(path)
    router_dir = modules[0]["path"]
    config_path = os.path.join(router_dir, ROUTER_CONFIG)
    if not os.path.isfile(config_path):
        raise RankgenError(f"{config_path}: missing (the Router module's config)")
    config = common.read_json(config_path)
    types, structure = config.get("types"), config.get("structure")
    if not isinstance(types, dict) or not isinstance(structure, dict):
        raise RankgenError(f"{config_path}: expected `types` and `structure` objects")
    missing = [r for r in ROUTES if r not in structure]
    if missing:
        raise RankgenError(f"{config_path}: no {' or '.join(missing)} route (routes: {sorted(structure)}); "
                           "only query / document routers are supported")
    routes = {}
    for route in ROUTES:
        names = structure[route]
        if not isinstance(names, list) or not all(isinstance(n, str) and n in types for n in names):
            raise RankgenError(f"{config_path}: route {route!r} should list module folders named in `types`")
        chain = [{"type": types[n], "path": os.path.join(router_dir, n)} for n in names]
        kinds = [module_class(m["type"]) for m in chain]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Dense"]):
            raise RankgenError(f"{config_path}: route {route!r} is {' -> '.join(kinds) or 'empty'} "
                               "(expected Transformer -> Pooling [-> Dense])")
        routes[route] = chain + modules[1:]
    return routes


def transformer_dir(modules: list[dict]) -> str:
    """The folder of the HF model a checked module chain reads with."""
    return modules[0]["path"]


def _pooling(pooling_path: str, pooling_cfg: dict) -> str:
    if isinstance(pooling_cfg.get("pooling_mode"), str):
        modes = [pooling_cfg["pooling_mode"]]
        pooling = POOLING_OF_MODE.get(modes[0])
    else:
        modes = [m for m in ST_POOLING_MODES if pooling_cfg.get(m)]
        pooling = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "first"}.get(modes[0]) \
            if len(modes) == 1 else None
    if pooling is None:
        raise RankgenError(f"{pooling_path}: pooling modes {modes or 'none'} are not supported"
                           " (exactly one of mean or cls: pooling_mode_mean_tokens or pooling_mode_cls_token)")
    return pooling


def read_st_head(modules: list[dict], d_model: int) -> tuple[HeadConfig, np.ndarray | None]:
    """The head a checked chain describes (Pooling [-> Dense] [-> Normalize] after the Transformer)
    -> (head config, projection kernel [d, P] or None)."""
    kinds = [module_class(m["type"]) for m in modules]
    pooling_path = os.path.join(modules[kinds.index("Pooling")]["path"], "config.json")
    if not os.path.isfile(pooling_path):
        raise RankgenError(f"{pooling_path}: missing (the Pooling module's config)")
    pooling_cfg = common.read_json(pooling_path)
    width = pooling_cfg.get("word_embedding_dimension", pooling_cfg.get("embedding_dimension", d_model))
    if width != d_model:
        raise RankgenError(f"{pooling_path}: word_embedding_dimension={width}, but the encoder has d_model={d_model}")
    pooling = _pooling(pooling_path, pooling_cfg)
    kernel = None
    if "Dense" in kinds:
        kernel = read_st_dense(modules[kinds.index("Dense")]["path"], d_model)
    head = HeadConfig(pooling=pooling, projection_dim=0 if kernel is None else int(kernel.shape[1]),
                      l2_normalize="Normalize" in kinds)
    return head, kernel


def read_st_dense(dense_dir: str, d_model: int) -> np.ndarray:
    """A bias-free, identity-activation sentence-transformers Dense module -> kernel [d, P]."""
    config_path = os.path.join(dense_dir, "config.json")
    if not os.path.isfile(config_path):
        raise RankgenError(f"{config_path}: missing (the Dense module's config)")
    dense_cfg = common.read_json(config_path)
    if dense_cfg.get("bias", True):
        raise RankgenError(f"{config_path}: a Dense module with a bias is not supported (only bias-free projections)")
    activation = dense_cfg.get("activation_function", ST_IDENTITY)
    if str(activation).rsplit(".", 1)[-1] != "Identity":
        raise RankgenError(f"{config_path}: Dense activation {activation} is not supported (only Identity)")
    in_features, out_features = dense_cfg.get("in_features"), dense_cfg.get("out_features")
    if in_features != d_model or not isinstance(out_features, int) or out_features <= 0:
        raise RankgenError(f"{config_path}: in_features={in_features}, out_features={out_features}"
                           f" do not fit the encoder (d_model={d_model})")
    state_dict = common.read_state_dict(dense_dir)
    if "linear.weight" not in state_dict:
        raise RankgenError(f"{dense_dir}: missing tensor linear.weight")
    extra = sorted(set(state_dict) - {"linear.weight"})
    if extra:
        raise RankgenError(f"{dense_dir}: unexpected tensor {extra[0]} (a bias-free Dense has linear.weight only)")
    weight = np.asarray(state_dict["linear.weight"], dtype=np.float32)
    if weight.shape != (out_features, in_features):
        raise RankgenError(f"{dense_dir}: tensor linear.weight has shape {weight.shape},"
                           f" but config.json implies {(out_features, in_features)}")
    return np.ascontiguousarray(weight.T)


def _side_dirs(path: str) -> dict[str, str]:
    """{"prefix": folder, "suffix": folder} of the Transformer module(s) each side is read with."""
    modules = st_modules(path)
    if module_class(modules[0]["type"]) != "Router":
        return {"prefix": modules[0]["path"], "suffix": modules[0]["path"]}
    routes = router_routes(path)
    return {"prefix": transformer_dir(routes["query"]), "suffix": transformer_dir(routes["document"])}


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


def _truncation_side(folder: str) -> str:
    """The tokenizer's truncation side: the module config's tokenizer arguments, else tokenizer_config.json."""
    module = _read_optional(os.path.join(folder, "sentence_bert_config.json"))
    for key in ("processor_kwargs", "tokenizer_args"):
        if isinstance(module.get(key), dict) and module[key].get("truncation_side"):
            return module[key]["truncation_side"]
    return _read_optional(os.path.join(folder, "tokenizer_config.json")).get("truncation_side") or "right"


def st_conventions(path: str, cap: int | None = None, default_length: int = 512) -> InputConventions:
    """The input conventions a sentence-transformers folder's files state (cap: the encoder's positions).

    Markers are the prompts named "query" and "document" (or "passage"); lengths each
    side's max_seq_length (default_length when none is set); the kept end
    the tokenizer's truncation side. Tokenizers cut the text and keep their
    special tokens: clean truncation.
    """
    prompts = _read_optional(os.path.join(path, "config_sentence_transformers.json")).get("prompts") or {}
    if not isinstance(prompts, dict):
        raise RankgenError(f"{path}/config_sentence_transformers.json: prompts should be an object, got {prompts!r}")
    fields = {"truncation": "clean"}
    for side, folder in _side_dirs(path).items():
        marker = next((prompts[n] for n in PROMPT_NAMES[side] if isinstance(prompts.get(n), str)), "")
        keep = "end" if _truncation_side(folder) == "left" else "start"
        fields.update({f"{side}_marker": marker, f"{side}_length": _max_seq_length(folder, cap) or default_length,
                       f"{side}_keep": keep})
    try:
        return InputConventions(**fields)
    except RankgenError as e:
        raise RankgenError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------
# Writing


@dataclasses.dataclass(frozen=True)
class Route:
    """One encoder as sentence-transformers modules: its HF model's folder, head and how it cuts text.

    model_dir: relative to the export ("" = the root); dense_weight: the
    projection as a torch Linear weight [P, d], or None; sides: the
    conventions' sides ("prefix", "suffix") this encoder reads.
    """

    model_dir: str
    d_model: int
    head: HeadConfig
    dense_weight: np.ndarray | None
    sides: tuple[str, ...]


def st_route(model_config: ModelConfig, params, sides: tuple[str, ...] = ("prefix", "suffix")) -> Route | None:
    """The sentence-transformers route of one encoder with its head (its HF model in the root), or None
    (with a note) when the head has no sentence-transformers equivalent."""
    head = model_config.head
    if head is None or model_config.kind != "dual_encoder":
        return None
    if head.pooling not in ST_MODE_OF_POOLING or model_config.num_scores != 1:
        what = (f"pooling {head.pooling!r}" if head.pooling not in ST_MODE_OF_POOLING
                else f"{model_config.num_scores} perspective heads")
        print(f"note: {what} has no sentence-transformers equivalent; wrote the HF encoder only (head not exported)")
        return None
    d_model, dense_weight = model_config.encoder.d_model, None
    if head.projection_dim != 0:
        out_features = head.output_dim(d_model)
        kernel = np.asarray(common.get_path(params, ("projection_layer", "kernel")), dtype=np.float32)
        if kernel.shape != (d_model, out_features):
            raise RankgenError(f"parameter projection_layer/kernel has shape {kernel.shape},"
                               f" but the model config needs {(d_model, out_features)}")
        dense_weight = np.ascontiguousarray(kernel.T)
    return Route("", d_model, head, dense_weight, sides)


def st_max_seq_length(conventions: InputConventions, sides: tuple[str, ...], cap: int | None) -> int:
    """One Transformer module has one limit: the longest of the sides it reads (capped by its positions)."""
    length = max(conventions.side(s)[1] for s in sides)
    return length if cap is None else min(length, cap)


def _left_truncation(conventions: InputConventions, sides: tuple[str, ...]) -> bool:
    """Whether the tokenizer can keep the end of every text it reads exactly: all its sides keep the end, none
    has a marker (sentence-transformers cuts the prompt together with the text, so it would go first)."""
    return all(conventions.side(s)[2] == "end" and not conventions.side(s)[0] for s in sides)


def st_limits(conventions: InputConventions, routes: list[Route], cap: int | None) -> list[str]:
    """What the sentence-transformers files cannot say about how the model reads text (for notes and cards)."""
    notes = []
    if conventions.truncation == "released":
        notes.append("over-long texts keep their final special token (EOS / [SEP]), where the released RankGen "
                     "code drops it (released truncation)")
    for route in routes:
        length = st_max_seq_length(conventions, route.sides, cap)
        for side in route.sides:
            marker, side_length, keep = conventions.side(side)
            name = "prefixes / queries" if side == "prefix" else "continuations / documents"
            if (side_length if cap is None else min(side_length, cap)) < length:
                notes.append(f"{name} are cut at {length} tokens (one limit for both sides), not {side_length}")
            if keep == "end" and not _left_truncation(conventions, route.sides):
                notes.append(f"over-long {name} keep their start, not their end as the model was trained "
                             f"(the tokenizer's truncation side is one for "
                             f"{'the prompt and the text' if marker else 'both sides'}); cut them to their last "
                             f"{side_length} tokens before encoding, or encode with rankgen-jax")
    return notes


def _pooling_config(route: Route) -> dict:
    pooling = {"word_embedding_dimension": route.d_model, **{m: False for m in ST_POOLING_MODES},
               "include_prompt": True}
    pooling[ST_MODE_OF_POOLING[route.head.pooling]] = True
    return pooling


def _write_route_modules(out_dir: str, route: Route, prefix: str, first_idx: int) -> list[tuple[str, str]]:
    """Pooling [and Dense] folders of a route, named `{prefix}{idx}_{Class}`; returns [(folder, type)]."""
    written = []
    pooling_dir = f"{prefix}{first_idx}_Pooling"
    os.makedirs(os.path.join(out_dir, pooling_dir), exist_ok=True)
    common.write_json(os.path.join(out_dir, pooling_dir, "config.json"), _pooling_config(route))
    written.append((pooling_dir, ST_POOLING))
    if route.dense_weight is not None:
        dense_dir = f"{prefix}{first_idx + 1}_Dense"
        os.makedirs(os.path.join(out_dir, dense_dir), exist_ok=True)
        common.write_json(os.path.join(out_dir, dense_dir, "config.json"), {
            "in_features": route.d_model, "out_features": int(route.dense_weight.shape[0]), "bias": False,
            "activation_function": ST_IDENTITY})
        common.write_safetensors(os.path.join(out_dir, dense_dir, common.SAFETENSORS_FILE),
                                 {"linear.weight": np.ascontiguousarray(route.dense_weight, dtype=np.float32)})
        written.append((dense_dir, ST_DENSE))
    return written


def _write_transformer_config(folder: str, conventions: InputConventions, route: Route, cap: int | None) -> None:
    module = {"max_seq_length": st_max_seq_length(conventions, route.sides, cap), "do_lower_case": False}
    if _left_truncation(conventions, route.sides):
        module["tokenizer_args"] = {"truncation_side": "left"}
    common.write_json(os.path.join(folder, "sentence_bert_config.json"), module)


def prompts_of(conventions: InputConventions) -> tuple[dict, str | None]:
    """(prompts, default_prompt_name): the markers as the "query" / "document" prompts, documents by default."""
    if not conventions.prefix_marker and not conventions.suffix_marker:
        return {}, None
    return {"query": conventions.prefix_marker, "document": conventions.suffix_marker}, "document"


def _write_model_config(out_dir: str, conventions: InputConventions, version: str) -> None:
    prompts, default = prompts_of(conventions)
    # Our score is a raw dot product (equal to cosine when the vectors are L2-normalised).
    common.write_json(os.path.join(out_dir, "config_sentence_transformers.json"),
                      {"__version__": {"sentence_transformers": version}, "model_type": "SentenceTransformer",
                       "prompts": prompts, "default_prompt_name": default, "similarity_fn_name": "dot"})


def write_st_modules(out_dir: str, route: Route, conventions: InputConventions, cap: int | None) -> None:
    """The files of Transformer (the HF model in the root) -> Pooling [-> Dense] [-> Normalize]."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER}]
    for folder, module_type in _write_route_modules(out_dir, route, "", 1):
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": folder, "type": module_type})
    if route.head.l2_normalize:
        modules.append(_normalize_module(out_dir, len(modules)))
    _write_list(os.path.join(out_dir, "modules.json"), modules)
    _write_transformer_config(out_dir, conventions, route, cap)
    _write_model_config(out_dir, conventions, ST_VERSION)


def _normalize_module(out_dir: str, idx: int) -> dict:
    # Normalize has no files; sentence-transformers still expects its folder to exist.
    os.makedirs(os.path.join(out_dir, f"{idx}_Normalize"), exist_ok=True)
    return {"idx": idx, "name": str(idx), "path": f"{idx}_Normalize", "type": ST_NORMALIZE}


def router_model_dir(route: str) -> str:
    """Where a Router export keeps a route's HF model (what sentence-transformers names it)."""
    return f"{route}_0_Transformer"


def write_router(out_dir: str, routes: dict[str, Route], conventions: InputConventions, cap: int | None) -> None:
    """The files of Router(query: Transformer -> Pooling [-> Dense], document: ...) [-> Normalize].

    Each route's HF model must already be in out_dir/{route}_0_Transformer.
    """
    if set(routes) != set(ROUTES):
        raise RankgenError(f"a router export needs the routes {ROUTES}, got {sorted(routes)}")
    normalize = {r.head.l2_normalize for r in routes.values()}
    if len(normalize) != 1:
        raise RankgenError("the towers disagree on L2 normalisation; a sentence-transformers Router applies one "
                           "Normalize after both")
    types, structure = {}, {}
    for name, route in routes.items():
        model_dir = router_model_dir(name)
        _write_transformer_config(os.path.join(out_dir, model_dir), conventions, route, cap)
        types[model_dir] = ST_TRANSFORMER
        structure[name] = [model_dir]
        for folder, module_type in _write_route_modules(out_dir, route, f"{name}_", 1):
            types[folder] = module_type
            structure[name].append(folder)
    common.write_json(os.path.join(out_dir, ROUTER_CONFIG), {
        "types": types, "structure": structure,
        "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}})
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_ROUTER}]
    if normalize.pop():
        modules.append(_normalize_module(out_dir, 1))
    _write_list(os.path.join(out_dir, "modules.json"), modules)
    _write_model_config(out_dir, conventions, ST_ROUTER_VERSION)
