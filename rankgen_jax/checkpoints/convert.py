"""`import` and `export-hf`: move parameters between T5X / HF folders and our checkpoint format.

This module is where a format is chosen: which reader an HF folder needs
(`read_hf_folder`) and which layout a model is exported in (`hf_layout`).
The readers and writers themselves (`hf.t5`, `hf.bert`, `hf.ranker`, `t5x`)
each handle one format.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from rankgen_jax.checkpoints import export_check, model_card, native
from rankgen_jax.checkpoints.hf import bert as hf_bert
from rankgen_jax.checkpoints.hf import common
from rankgen_jax.checkpoints.hf import ranker as hf_ranker
from rankgen_jax.checkpoints.hf import st_layout
from rankgen_jax.checkpoints.hf import t5 as hf_t5
from rankgen_jax.checkpoints.hf.common import is_ranker_config, read_json
from rankgen_jax.checkpoints.t5x import load_t5x_checkpoint
from rankgen_jax.data.conventions import CONVENTIONS_FILE, InputConventions, default_conventions
from rankgen_jax.data.text import load_text_encoder
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.models.factory import check_params_match, to_canonical_layout

SOURCES = ("hf", "t5x")
EXPORT_FORMATS = ("rankgen", "t5-encoder")


def _note(message: str) -> None:
    print(message, file=sys.stderr)


def _refuse_non_empty(out: str, overwrite: bool) -> None:
    """Fail before any work when the output folder would be clobbered."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise RankgenError(f"{out}: exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise RankgenError(f"{out}: folder is not empty (pass `overwrite` to replace its contents)",
                           names=("overwrite",))


def read_source(
    source: str, path: str, head: HeadConfig | None = None, relpos_max_distance: int = 128
) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """(model config, canonical params, tokenizer: spiece.model path, tokenizer files, or None).

    HF folders may hold a T5 (plain or RankGen format) or a BERT-family model
    (BERT, MiniLM, DistilBERT, RoBERTa; a sentence-transformers folder imports
    as a dual encoder), or a ranker (cross encoder) that export-hf wrote.

    head / relpos_max_distance apply to T5X only: its checkpoints store no model
    config, so what shapes cannot tell is taken from the caller and announced.
    """
    if not Path(path).exists() and not str(path).startswith("gs://"):
        raise RankgenError(f"{path}: no such file or folder")
    if source == "hf":
        return read_hf_folder(path)
    if source == "t5x":
        head = head if head is not None else HeadConfig()
        model_config, params = load_t5x_checkpoint(path, head=head, relpos_max_distance=relpos_max_distance)
        head_note = (
            "no head"
            if model_config.head is None
            else ", ".join(f"{f.name}={getattr(model_config.head, f.name)}" for f in dataclasses.fields(HeadConfig))
        )
        _note(
            f"note: T5X checkpoints store no model config; inferred from shapes: {model_config.encoder}; "
            f"assumed relpos_max_distance={relpos_max_distance} and head ({head_note}) "
            "(change with --relpos_max_distance / --pooling / --l2_normalize)"
        )
        return model_config, params, None
    raise RankgenError(f"unknown import source {source!r}: expected one of {SOURCES}")


def read_hf_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """An HF folder with the reader its format needs: ranker or Bert/RobertaForSequenceClassification (cross
    encoders), BERT family (plain or sentence-transformers), T5, or a sentence-transformers Router of two towers.

    The tokenizer is a T5 folder's spiece.model path (or None), or the tokenizer
    files of a BERT-family backbone.
    """
    config_path = os.path.join(path, "config.json")
    if os.path.isfile(config_path) and is_ranker_config(read_json(config_path)):
        return hf_ranker.load_ranker_folder(path)
    if hf_ranker.is_sequence_classification_folder(path):
        return hf_ranker.load_sequence_classification_folder(path)
    if st_layout.is_router_folder(path):
        return _read_router_folder(path)
    if hf_bert.is_bert_folder(path):
        return hf_bert.load_bert_folder(path)
    return hf_t5.load_hf_folder(path)


def folder_conventions(path: str, config: ModelConfig) -> tuple[InputConventions, str]:
    """(input conventions, where they come from) of an HF folder holding a model of `config`.

    A record (input_conventions.json, which exports write) wins; else a
    sentence-transformers folder's own files (prompts, max_seq_length,
    truncation side); else the released RankGen conventions (cross encoders:
    data.conventions.PAIR_DEFAULTS).
    """
    folder = Path(path)
    record = folder / CONVENTIONS_FILE
    if record.is_file():
        return InputConventions.from_json(record.read_text(encoding="utf-8"), str(record)), f"recorded in {record}"
    if (folder / "modules.json").is_file():
        cap = None
        if config.encoder_type == "bert":
            cap = config.encoder.max_position_embeddings - config.encoder.position_offset
        return st_layout.st_conventions(str(folder), cap), f"from the sentence-transformers files of {folder}"
    return default_conventions(config.kind), no_record_origin(config)


def no_record_origin(config: ModelConfig) -> str:
    """Where the conventions of a model without a record come from, in words."""
    what = "cross-encoder defaults" if config.kind == "cross_encoder" else "the released RankGen conventions"
    return f"no record: {what}"


def source_provenance(source: str, path: str, model_id: str | None = None) -> dict:
    """Where an imported model comes from: the folder, and the license / base model its model card states."""
    provenance = {"imported_from": str(path), "source_format": source}
    if model_id:
        provenance["model_id"] = model_id
    card = Path(path) / "README.md"
    if source == "hf" and card.is_file():
        front = model_card.read_front_matter(card)
        for key in ("license", "base_model"):
            if isinstance(front.get(key), str) and front[key]:
                provenance[key] = front[key]
    return provenance


def _read_router_folder(path: str) -> tuple[ModelConfig, dict, str | list[str] | None]:
    """A sentence-transformers Router folder as a two-tower dual encoder (query route -> query tower)."""
    configs, params, tokenizer = [], {}, None
    for tower, modules in st_layout.router_routes(path).items():
        model_dir = st_layout.transformer_dir(modules)
        config, tower_params, tower_tokenizer = read_hf_folder(model_dir)
        if config.kind != "encoder":
            raise RankgenError(f"{model_dir}: a Router route's Transformer should be a plain encoder, "
                               f"got {describe_model(config)}")
        head, kernel = st_layout.read_st_head(modules, config.encoder.d_model)
        if kernel is not None:
            tower_params["projection_layer"] = {"kernel": kernel}
        configs.append(ModelConfig(encoder=config.encoder, head=head))
        params[f"{tower}_tower"] = tower_params
        tokenizer = tokenizer or tower_tokenizer
    if configs[0] != configs[1]:
        raise RankgenError(f"{path}: the query and document routes hold different models ({configs[0]} and "
                           f"{configs[1]}); only towers of one architecture and head are supported")
    return dataclasses.replace(configs[0], shared_towers=False), params, tokenizer


def import_checkpoint(
    source: str,
    path: str,
    out: str,
    overwrite: bool = False,
    vocab: str | None = None,
    head: HeadConfig | None = None,
    relpos_max_distance: int = 128,
    model_id: str | None = None,
) -> ModelConfig:
    """Convert a checkpoint into a new rankgen_jax checkpoint folder; returns its model config.

    The folder records the model's input conventions (see folder_conventions;
    T5X: the released RankGen ones) and its provenance (model_id: the
    source's hub id, when known, becomes a trained model's base_model).
    """
    _refuse_non_empty(out, overwrite)
    model_config, params, tokenizer = read_source(source, path, head, relpos_max_distance)
    if vocab is not None:
        if not Path(vocab).exists():
            raise RankgenError(f"{vocab}: no such vocabulary file or folder")
        tokenizer = vocab
    check_params_match(params, model_config, where=path)
    conventions = None
    if model_config.kind != "encoder":  # a bare encoder reads no text until it is trained with a head
        conventions = (folder_conventions(path, model_config)[0] if source == "hf"
                       else default_conventions(model_config.kind))
    native.save_params(out, model_config, params, vocab=tokenizer, overwrite=overwrite, conventions=conventions,
                       provenance=source_provenance(source, path, model_id))
    return model_config


def describe_model(config: ModelConfig) -> str:
    """The model in a few words, for messages: kind, backbone, layers and width."""
    kind = {"encoder": "encoder", "dual_encoder": "dual encoder", "cross_encoder": "cross encoder (ranker)"}[config.kind]
    towers = ", separate query and document towers" if config.kind == "dual_encoder" and not config.shared_towers else ""
    backbone = "T5" if config.encoder_type == "t5" else "BERT-family"
    return f"{backbone} {kind} ({config.encoder.num_layers} layers, d_model {config.encoder.d_model}{towers})"


def hf_layout(config: ModelConfig, fmt: str) -> str:
    """The HF layout export_hf writes for this model and `fmt`: 'ranker', 'bert', 't5-encoder' or 'rankgen',
    or 'sequence-classification' (a cross encoder that is exactly Bert/RobertaForSequenceClassification).

    Other cross encoders are rankers, except that `t5-encoder` writes a T5 ranker's
    encoder alone; BERT-family models have one layout whatever `fmt` says.
    """
    if hf_ranker.fits_sequence_classification(config):
        return "sequence-classification"
    if config.kind == "cross_encoder" and not (fmt == "t5-encoder" and config.encoder_type == "t5"):
        return "ranker"
    if config.encoder_type == "bert":
        return "bert"
    return fmt


def uses_router(config: ModelConfig, fmt: str) -> bool:
    """Whether a two-tower export is a sentence-transformers Router (BERT family, or T5 in `t5-encoder`, with
    a head sentence-transformers has); else it writes one folder per tower."""
    return (config.kind == "dual_encoder" and not config.shared_towers and hf_layout(config, fmt) != "rankgen"
            and config.head.pooling in st_layout.ST_MODE_OF_POOLING and config.num_scores == 1)


def _st_head(config: ModelConfig) -> bool:
    """A dual encoder's head that sentence-transformers' modules express."""
    return config.kind == "dual_encoder" and config.head.pooling in st_layout.ST_MODE_OF_POOLING and \
        config.num_scores == 1


def writes_sentence_transformers(config: ModelConfig, fmt: str) -> bool:
    """Whether export_hf writes sentence-transformers files for this model and `fmt`."""
    return _st_head(config) and hf_layout(config, fmt) in ("bert", "t5-encoder")


def export_layout(config: ModelConfig, fmt: str) -> str:
    """What export_hf writes for this model and `fmt`, in words (the CLI prints it)."""
    hf_format = hf_layout(config, fmt)
    st_head = _st_head(config)
    if hf_format == "sequence-classification":
        layout = f"{hf_ranker.SEQUENCE_CLASSIFICATION_ARCHITECTURES[config.encoder.variant]}, no remote code"
    elif hf_format == "ranker":
        layout = "ranker format, modeling_ranker.py"
    elif hf_format == "bert":
        layout = "BERT-family model" + (" with sentence-transformers files" if st_head else "")
    elif hf_format == "t5-encoder":
        layout = "T5EncoderModel" + (" with sentence-transformers files" if st_head else
                                     ", the encoder alone" if config.head is not None else "")
    else:
        layout = "RankGen format, modeling_rankgen.py"
    if uses_router(config, fmt):
        layout += "; a sentence-transformers Router, one route per tower (query_0_Transformer/, document_0_Transformer/)"
    elif config.kind == "dual_encoder" and not config.shared_towers:
        layout += "; one folder per tower, query_encoder/ and document_encoder/"
    return layout


def export_hf(checkpoint: str, out: str, fmt: str = "rankgen", overwrite: bool = False,
              step: int | None = None, truncate_dim: int | None = None) -> ModelConfig:
    """Write a checkpoint's parameters as a HuggingFace folder (safetensors); returns the model's config.

    T5: `fmt` picks the RankGen or the plain T5EncoderModel layout (with the
    head as sentence-transformers modules where they have its pooling). BERT
    family: the base model's layout, plus sentence-transformers files for dual
    encoders. Those files carry the model's input conventions as prompts and
    max_seq_length, and a note says what they cannot express. Two-tower dual
    encoders write a sentence-transformers Router (see uses_router), else
    `query_encoder/` and `document_encoder/`. Cross encoders whose head is HF's
    Bert/RobertaForSequenceClassification head write that class; other cross
    encoders (either backbone) write the ranker format (modeling_ranker.py, raw scores from AutoModel);
    `t5-encoder` writes a T5 ranker's encoder alone. Every export records the
    input conventions (input_conventions.json). truncate_dim (sentence-transformers
    exports): the vectors' first dimensions the library keeps (a Matryoshka-trained model's cut).
    """
    if fmt not in EXPORT_FORMATS:
        raise RankgenError(f"unknown export format {fmt!r}: expected one of {EXPORT_FORMATS}")
    _refuse_non_empty(out, overwrite)
    export_check.clear_failed(out)
    model_config, params = native.restore_params(checkpoint, step)
    params = to_canonical_layout(params)
    check_params_match(params, model_config, where=checkpoint)
    if native.vocab_path(checkpoint) is None:
        _note(f"note: {checkpoint} has no vocabulary; the exported folder will have no tokenizer files")
    conventions = native.load_input_conventions(checkpoint) or default_conventions(model_config.kind)
    if truncate_dim is not None:
        _check_truncate_dim(model_config, fmt, truncate_dim, out)
    # A cross encoder has one encoder whatever shared_towers says.
    if uses_router(model_config, fmt):
        limits = _export_router(checkpoint, model_config, params, out, fmt, overwrite, conventions)
    elif model_config.kind == "dual_encoder" and not model_config.shared_towers:
        single = dataclasses.replace(model_config, shared_towers=True)
        limits = []
        for tower in ("query", "document"):
            limits = _export_one(checkpoint, single, params[f"{tower}_tower"], str(Path(out) / f"{tower}_encoder"),
                                 fmt, True, conventions)
    else:
        limits = _export_one(checkpoint, model_config, params, out, fmt, overwrite, conventions)
    for limit in limits:
        _note(f"note: sentence-transformers cannot express how this model reads text: {limit}")
    if model_config.kind == "cross_encoder":
        _record_pair_length(Path(out), conventions.prefix_length + conventions.suffix_length)
    record = Path(out) / CONVENTIONS_FILE
    if model_config.kind == "encoder":
        record.unlink(missing_ok=True)  # a bare encoder reads no text by itself; an older export's record is stale
    else:
        record.write_text(conventions.to_json(), encoding="utf-8")
    if truncate_dim is not None:
        _write_truncate_dim(Path(out), model_config, truncate_dim)
    check = _check_export(checkpoint, out, model_config, params, conventions, fmt)
    exported_step = native.latest_step(checkpoint) if step is None else step
    operative, results, results_path = (model_card.training_facts(checkpoint, exported_step)
                                        if not native.is_remote(checkpoint) else (None, None, ""))
    model_card.write_model_card(out, model_card.CardFacts(
        model_config=model_config, conventions=None if model_config.kind == "encoder" else conventions,
        layout=export_layout(model_config, fmt),
        library="sentence-transformers" if (Path(out) / "modules.json").is_file() else "transformers",
        st_limits=tuple(limits), step=exported_step,
        provenance=native.load_provenance(checkpoint), operative_gin=operative, results=results,
        results_path=results_path,
        retrieval=None if native.is_remote(checkpoint) else model_card.retrieval_facts(checkpoint, exported_step),
        truncate_dim=truncate_dim,
        trained_dims=() if native.is_remote(checkpoint) else model_card.trained_dims(checkpoint),
        export_check=check.describe()))
    return model_config


def check_export(checkpoint: str, out: str, fmt: str = "rankgen", step: int | None = None) -> export_check.ExportCheck:
    """Check an exported folder against the checkpoint step it was exported from, as export_hf does when it writes
    it (checkpoints/export_check.py): raises, and marks the folder, when they differ."""
    config, params = native.restore_params(checkpoint, step)
    conventions = native.load_input_conventions(checkpoint) or default_conventions(config.kind)
    return _check_export(checkpoint, out, config, to_canonical_layout(params), conventions, fmt)


def _check_export(checkpoint: str, out: str, config: ModelConfig, params: dict, conventions: InputConventions,
                  fmt: str) -> export_check.ExportCheck:
    """The written folder against the exported parameters (export_check.py); raises when they differ."""
    vocab = native.vocab_path(checkpoint)
    try:
        text = None if vocab is None else load_text_encoder(vocab)
    except RankgenError:
        text = None  # tokenizer files rankgen-jax does not read (a vocab.txt alone)
    if text is None:
        return export_check.ExportCheck("", note="the checkpoint has no tokenizer rankgen-jax reads the probe texts "
                                                 "with")
    model = export_check.ExportedModel(config, params, text, conventions)
    return export_check.verify_export(out, model, hf_layout(config, fmt),
                                      writes_sentence_transformers(config, fmt) or uses_router(config, fmt))


def _check_truncate_dim(config: ModelConfig, fmt: str, dim: int, out: str) -> None:
    if not writes_sentence_transformers(config, fmt):
        raise RankgenError(f"`truncate_dim` is a sentence-transformers setting, and this export ({out}: "
                           f"{export_layout(config, fmt)}) has no sentence-transformers files", names=("truncate_dim",))
    full = config.head.output_dim(config.encoder.d_model)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= full:
        raise RankgenError(f"`truncate_dim` must be in 1..{full} (the model's dimension), got {dim!r}",
                           names=("truncate_dim",))


def _write_truncate_dim(out: Path, config: ModelConfig, dim: int) -> None:
    """sentence-transformers' truncate_dim in the export's config; cosine similarity for a normalising head, whose
    cut vectors are no longer unit length (then the library ranks as `search --truncate_dim` does)."""
    settings = out / "config_sentence_transformers.json"
    written = json.loads(settings.read_text(encoding="utf-8"))
    written["truncate_dim"] = dim
    if config.head.l2_normalize:
        written["similarity_fn_name"] = "cosine"
    settings.write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")


def _record_pair_length(out: Path, length: int) -> None:
    """A cross encoder reads a pair of at most `length` tokens: its tokenizer's model_max_length says so, which
    sentence-transformers' CrossEncoder and HF pipelines cut pairs to."""
    config_file = out / "tokenizer_config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["model_max_length"] = length
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _tokenizer(checkpoint: str, config: ModelConfig) -> list[str] | None:
    """What the HF writers take as a tokenizer: a T5 model's spiece.model, a BERT-family model's files."""
    if config.encoder_type == "t5":
        spiece = native.spiece_path(checkpoint)
        return [spiece] if spiece else None
    return native.tokenizer_files(native.vocab_path(checkpoint))


def _export_one(checkpoint: str, model_config: ModelConfig, params: dict, out: str, fmt: str, overwrite: bool,
                conventions: InputConventions) -> list[str]:
    """One HF folder; returns what its sentence-transformers files cannot say about the conventions."""
    layout = hf_layout(model_config, fmt)
    if layout == "sequence-classification":
        hf_ranker.save_sequence_classification_folder(model_config, params, out, _tokenizer(checkpoint, model_config),
                                                      overwrite)
        return []
    if layout == "ranker":
        hf_ranker.save_ranker_folder(model_config, params, out, _tokenizer(checkpoint, model_config), overwrite)
        return []
    if layout == "bert":
        return hf_bert.save_bert_folder(model_config, params, out, _tokenizer(checkpoint, model_config), overwrite,
                                        conventions)
    if fmt == "rankgen" and model_config.head is None:
        raise RankgenError(
            f"{checkpoint}: holds a bare encoder without a head; export it with `fmt` t5-encoder",
            names=("fmt",))
    return hf_t5.save_hf_folder(model_config, params, out, fmt=fmt, spiece_model=native.spiece_path(checkpoint),
                                overwrite=overwrite, conventions=conventions)


def _export_router(checkpoint: str, model_config: ModelConfig, params: dict, out: str, fmt: str, overwrite: bool,
                   conventions: InputConventions) -> list[str]:
    """A two-tower dual encoder as a sentence-transformers Router: each tower's HF model and head in its route."""
    single = dataclasses.replace(model_config, shared_towers=True)
    routes = {}
    for tower, sides in (("query", ("prefix",)), ("document", ("suffix",))):
        tower_params = params[f"{tower}_tower"]
        route = st_layout.st_route(single, tower_params, sides)
        routes[tower] = dataclasses.replace(route, model_dir=st_layout.router_model_dir(tower))
    common.prepare_out_dir(out, overwrite, (*hf_t5.STALE_FILES, *hf_bert.STALE_FILES, CONVENTIONS_FILE),
                           st_layout.ST_MODULE_DIR)
    bare = ModelConfig(encoder=model_config.encoder, head=None)
    for tower, route in routes.items():
        # The route's folder holds the tower's encoder alone; its head is the route's other modules.
        _export_one(checkpoint, bare, params[f"{tower}_tower"], str(Path(out) / route.model_dir), "t5-encoder", True,
                    conventions)
    cap = hf_bert.positions(model_config.encoder) if model_config.encoder_type == "bert" else None
    st_layout.write_router(out, routes, conventions, cap)
    return st_layout.st_limits(conventions, list(routes.values()), cap)
