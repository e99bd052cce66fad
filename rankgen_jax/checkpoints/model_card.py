"""Model cards: the README.md of an export, with the model hub's metadata front matter.

A card says what the model is (architecture, head, score), how it reads text
(its input conventions, and what sentence-transformers cannot express of
them), how to load it, where it comes from (license and base model from the
checkpoint's provenance.json) and, for a training workdir, the run: the
operative gin config (data, loss, steps) and the held-out results a job wrote
next to it (results.json).

Front matter is the YAML block between two `---` lines at the top of a
model card; huggingface_hub reads and writes it, as the hub does.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import huggingface_hub
import yaml

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import JOB_RESULTS_FILE, RETRIEVAL_METRIC_PREFIX, RunFolder, resolve
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.jsonl import collect_jsonl
from rankgen_jax.data.source_configs import MOVED_DATA_FIELDS
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.resources import BUNDLED_CORPUS, DEMO_VOCAB, GIN_CONFIGS_DIR


def read_front_matter(card: Path) -> dict:
    """The metadata front matter of a model card file, as the hub reads it ({} when it has none or it does not
    parse: a source's card is informative, never a reason to refuse an import)."""
    try:
        meta = huggingface_hub.metadata_load(card)
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


# ---------------------------------------------------------------------------
# Writing

CARD_FILE = "README.md"


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What a model card says: the model, how it is stored and read, where it comes from, how it was trained.

    layout: the export's layout in words; library: "sentence-transformers" or
    "transformers"; st_limits: what the sentence-transformers files cannot
    say about the conventions; step: the exported step; provenance: the
    checkpoint's provenance.json; operative_gin / results: a training
    workdir's operative gin config and the job's held-out results (None when
    absent); retrieval: the retrieval measures taken during training
    (retrieval_facts); truncate_dim: the dimensions the export keeps; trained_dims:
    the run's Matryoshka dimensions (trained_dims); export_check: what the export's check compared, in words.
    """

    model_config: ModelConfig
    conventions: InputConventions | None
    layout: str
    library: str
    st_limits: tuple[str, ...]
    step: int | None
    provenance: dict
    operative_gin: str | None = None
    results: dict | None = None
    results_path: str = ""
    retrieval: dict | None = None
    truncate_dim: int | None = None
    trained_dims: tuple[int, ...] = ()
    export_check: str = ""


def training_facts(checkpoint: str, step: int | None = None) -> tuple[str | None, dict | None, str]:
    """(operative gin, held-out results, results path) of a training workdir: the operative config of the start
    that trained `step` (the latest start's when None), and the results.json a job wrote next to it (None where
    absent)."""
    folder = Path(checkpoint)
    gin_file = native.operative_config_for_step(folder, step)
    operative = gin_file.read_text(encoding="utf-8") if gin_file is not None else None
    results, results_path = None, ""
    for candidate in (folder / JOB_RESULTS_FILE, folder.parent / JOB_RESULTS_FILE):
        if operative is not None and candidate.is_file():
            try:
                results = json.loads(candidate.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                results = None  # a results file being rewritten: the card goes without it
            results_path = str(candidate)
            break
    return operative, (results if isinstance(results, dict) else None), results_path


def _training_run(checkpoint: str) -> RunFolder:
    """The training run a checkpoint folder is: itself, or the run around it when it is that run's best/ folder."""
    folder = RunFolder.at(checkpoint)
    parent = RunFolder.at(Path(checkpoint).resolve().parent)
    return parent if resolve(parent.best) == resolve(folder) else folder


def trained_dims(checkpoint: str) -> tuple[int, ...]:
    """The Matryoshka dimensions a training run's loss trained (run_config.json; () for none or no run)."""
    run = _training_run(checkpoint)
    if not run.run_config.is_file():
        return ()
    try:
        loss = json.loads(run.run_config.read_text(encoding="utf-8")).get("loss", {})
    except json.JSONDecodeError:
        return ()
    return tuple(int(d) for d in loss.get("matryoshka_dims") or ())


def retrieval_facts(checkpoint: str, step: int | None) -> dict | None:
    """The retrieval measures a run took during training (train/retrieval_eval.py), for a training workdir or its
    best/ folder: {"exported": the exported step's row or None, "last": the last row, "best": best.json or None,
    "best_row": the best step's row or None}, each row {"step", "values": {"set/measure": value}}; None when the
    run measured none."""
    run = _training_run(checkpoint)
    if not run.metrics.is_file():
        return None
    rows = []
    records, _ = collect_jsonl(run.metrics)  # a line being written, or one a killed run left, is skipped
    for record in records:
        values = {k[len(RETRIEVAL_METRIC_PREFIX):]: v for k, v in record.items()
                  if k.startswith(RETRIEVAL_METRIC_PREFIX) and k.count("/") == 2}
        if values:
            rows.append({"step": int(record["step"]), "values": values})
    if not rows:
        return None
    best = json.loads(run.best_record.read_text(encoding="utf-8")) if run.best_record.is_file() else None
    exported = next((r for r in reversed(rows) if r["step"] == step), None)
    best_row = next((r for r in reversed(rows) if best and r["step"] == best["step"]), None)
    return {"exported": exported, "last": rows[-1], "best": best, "best_row": best_row}


def _eval_results(facts: CardFacts) -> list:
    """The exported step's retrieval measures as the hub's model-index results."""
    row = (facts.retrieval or {}).get("exported")
    if not row:
        return []
    out = []
    for name, value in row["values"].items():
        dataset, measure = name.rsplit("/", 1)
        split = dataset.rsplit("@", 1)[-1]
        out.append(huggingface_hub.EvalResult(task_type="text-retrieval", dataset_type=dataset, dataset_name=dataset,
                                              dataset_split=split, metric_type=measure, metric_value=float(value),
                                              metric_name=f"{measure} ({dataset}, step {row['step']})"))
    return out


def front_matter(facts: CardFacts, model_name: str = "") -> dict:
    """The hub metadata: library, pipeline tag, license and base model when known, tags."""
    config = facts.model_config
    if config.kind == "cross_encoder":
        pipeline = "text-ranking"
    elif facts.library == "sentence-transformers":
        pipeline = "sentence-similarity"
    else:
        pipeline = "feature-extraction"
    tags = ["rankgen-jax", config.encoder_type, config.kind.replace("_", "-")]
    if facts.library == "sentence-transformers":
        tags.append("sentence-transformers")
    if config.kind == "dual_encoder" and config.head.pooling == "first" and config.encoder_type == "t5":
        tags.append("rankgen")
    meta = {"library_name": facts.library, "pipeline_tag": pipeline}
    if facts.provenance.get("license"):
        meta["license"] = facts.provenance["license"]
    # A trained model's base is what it started from; an exported import is a conversion of its source.
    base = facts.provenance.get("base_model") if facts.provenance.get("trained_from") else \
        facts.provenance.get("model_id")
    if base:
        meta["base_model"] = base
    meta["tags"] = tags
    results = _eval_results(facts)
    if results and model_name:
        meta["model_name"], meta["eval_results"] = model_name, results
    return meta


def _render_front_matter(meta: dict) -> str:
    return "---\n" + huggingface_hub.ModelCardData(**meta).to_yaml() + "\n---\n"


def _dimensions(facts: CardFacts) -> list[str]:
    """The Matryoshka dimensions the run trained (its operative gin) and the export's truncate_dim."""
    lines = []
    if facts.trained_dims:
        lines.append(f"Trained with a Matryoshka loss on the first {', '.join(map(str, facts.trained_dims))} "
                     "dimensions (each cut trained to work alone; `LossConfig.matryoshka_dims`).")
    if facts.truncate_dim:
        lines.append(f"This export keeps each vector's first {facts.truncate_dim} dimensions (`truncate_dim` in "
                     "config_sentence_transformers.json).")
    return lines


def _retrieval_section(facts: CardFacts) -> list[str]:
    retrieval = facts.retrieval
    if not retrieval:
        return []
    columns = [("this export", retrieval["exported"]), ("last measured", retrieval["last"])]
    best = retrieval["best"]
    lines = ["## Retrieval measured during training", "",
             "Measured by the training run itself (`RetrievalEvalConfig`; trec_eval's definitions, the whole "
             "set's corpus ranked by the training state on the training mesh):", "",
             "| set | measure | " + " | ".join(f"{label} (step {row['step']})" for label, row in columns if row)
             + (f" | best {best['metric'].rsplit('/', 1)[-1]} (step {best['step']})" if best else "") + " |",
             "| --- | --- |" + " ---: |" * (sum(1 for _, row in columns if row) + bool(best))]
    best_row = retrieval["best_row"] or {}
    for name in retrieval["last"]["values"]:
        dataset, measure = name.rsplit("/", 1)
        cells = [f"{row['values'][name]:.4f}" if name in row["values"] else "" for _, row in columns if row]
        if best:
            value = best["value"] if name == best["metric"] else best_row.get("values", {}).get(name)
            cells.append("" if value is None else f"{value:.4f}")
        lines.append(f"| {dataset} | {measure} | " + " | ".join(cells) + " |")
    return lines + [""]


def _architecture(config: ModelConfig) -> list[str]:
    encoder = config.encoder
    kind = {"encoder": "a bare encoder (no head)", "dual_encoder": "a dual encoder",
            "cross_encoder": "a cross encoder (ranker)"}[config.kind]
    if config.encoder_type == "t5":
        backbone = (f"T5 encoder ({'T5 1.1, gated GELU' if encoder.mlp_activation == 'gated-gelu' else 'T5 1.0, ReLU'}"
                    f"): {encoder.num_layers} layers, d_model {encoder.d_model}, {encoder.num_heads} heads, "
                    f"d_ff {encoder.d_ff}, vocabulary {encoder.vocab_size}")
    else:
        backbone = (f"{encoder.variant} encoder: {encoder.num_layers} layers, d_model {encoder.d_model}, "
                    f"{encoder.num_heads} heads, d_ff {encoder.d_ff}, vocabulary {encoder.vocab_size}, "
                    f"{encoder.max_position_embeddings} positions")
    lines = [f"- Model: {kind} on a {backbone}."]
    if config.kind == "dual_encoder" and not config.shared_towers:
        lines.append("- Towers: separate query (prefix) and document (continuation) encoders, each with its head.")
    head = config.head
    if head is not None:
        width = head.output_dim(encoder.d_model)
        projection = "no projection" if head.projection_dim == 0 else f"a bias-free projection to {width} dims"
        pooling = {"first": "the first token's hidden state", "mean": "the mean over non-padding tokens"}.get(
            head.pooling, f"{head.pooling} pooling")
        lines.append(f"- Head: {pooling}, {projection}" + (", L2-normalised" if head.l2_normalize else "") + ".")
        if config.kind == "dual_encoder":
            per = f", {config.num_scores} perspective heads (one vector each)" if config.num_scores > 1 else ""
            lines.append(f"- Score: the dot product of the prefix and the continuation vectors{per}.")
        else:
            lines.append(f"- Scores: {config.num_scores} per (query, candidate) pair, read together.")
    return lines


def _conventions(facts: CardFacts) -> list[str]:
    c = facts.conventions
    if c is None:
        return ["A bare encoder reads no text by itself: train it with a head first."]
    eos = ("released: the batch is padded, then cut at the limit, so an over-long text loses its final special "
           "token" if c.truncation == "released" else "clean: an over-long text is cut and keeps its final special "
           "token (EOS / [SEP])")
    lines = ["How this model reads text (also in `input_conventions.json`; rankgen-jax reads it by default):", "",
             "| | prefix / query | continuation / document |", "| --- | --- | --- |",
             f"| marker (text put before it) | {c.prefix_marker!r} | {c.suffix_marker!r} |",
             f"| maximum length (tokens) | {c.prefix_length} | {c.suffix_length} |",
             f"| an over-long text keeps its | {c.prefix_keep} | {c.suffix_keep} |", "",
             f"Truncation: {eos}."]
    if facts.st_limits:
        lines += ["", "What the sentence-transformers files cannot express (encode with rankgen-jax for exactly "
                  "these conventions):", ""] + [f"- {limit}" for limit in facts.st_limits]
    return lines


def _usage(facts: CardFacts) -> list[str]:
    config = facts.model_config
    c = facts.conventions
    if facts.library == "sentence-transformers":
        lines = ["```python", "from sentence_transformers import SentenceTransformer", "",
                 'model = SentenceTransformer("path/to/this/folder")',
                 "prefixes = model.encode_query([\"...\"])      # the query prompt"
                 + (f" {c.prefix_marker!r}" if c and c.prefix_marker else ""),
                 "continuations = model.encode_document([\"...\"])" + (
                     f"  # the document prompt {c.suffix_marker!r}" if c and c.suffix_marker else ""),
                 "scores = model.similarity(prefixes, continuations)  # dot products", "```"]
        if c and c.suffix_marker:
            lines += ["", f"A plain `model.encode(texts)` reads the texts as documents: it puts the document prompt "
                      f"{c.suffix_marker!r} before them (the export's `default_prompt_name`). Encode queries with "
                      "`encode_query` (or `prompt_name=\"query\"`)."]
        return lines
    if config.kind == "cross_encoder" and "no remote code" in facts.layout:
        length = f", max_length={c.prefix_length + c.suffix_length}" if c else ""
        return ["```python", "from sentence_transformers import CrossEncoder", "",
                f'model = CrossEncoder("path/to/this/folder"{length})',
                'scores = model.predict([("a query", "a passage"), ("a query", "another passage")])  # raw scores',
                "```", "", "Or with transformers alone: "
                "`AutoModelForSequenceClassification.from_pretrained(\"path/to/this/folder\")`, whose logits "
                "are the scores."]
    if config.kind == "cross_encoder":
        return ["```python", "from transformers import AutoModel", "",
                'model = AutoModel.from_pretrained("path/to/this/folder", trust_remote_code=True)  # raw scores',
                "```"]
    if "RankGen format" in facts.layout:
        prefix_marker = c.prefix_marker if c else ""
        return ["```python", "from transformers import AutoModel, AutoTokenizer", "",
                'model = AutoModel.from_pretrained("path/to/this/folder", trust_remote_code=True)',
                'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
                f"batch = tokenizer([{prefix_marker!r} + prefix], return_tensors=\"pt\")  # cut as in the table above",
                "prefix_vectors = model(**batch)", "```"]
    return ["```python", "from transformers import AutoModel", "",
            'encoder = AutoModel.from_pretrained("path/to/this/folder")', "```"]


def _bindings(operative: str) -> list[tuple[str, str]]:
    """(`Name.param`, its whole text) of each binding of an operative gin config, continuation lines included;
    comments, blank lines and imports are left out."""
    bindings: list[tuple[str, str]] = []
    for line in operative.splitlines():
        if line[:1].isspace() and bindings:  # gin indents a long value's continuation lines
            bindings[-1] = (bindings[-1][0], bindings[-1][1] + "\n" + line)
            continue
        match = re.match(r"^([\w./]+)\s*=", line)
        if match:
            bindings.append((match[1], line))
    return bindings


def _data_source(operative: str) -> str:
    """The run's data source: its config class (`@ListsData()` -> "ListsData"), or for a run of an earlier version,
    whose DataConfig held every source's fields, the source's name ("lists")."""
    source = dict(_bindings(operative)).get("DataConfig.source", "")
    value = source.split("=", 1)[1].strip() if source else ""
    return value.lstrip("@").removesuffix("()") if value.startswith("@") else value.strip("'\"")


def _mattered(name: str, source: str) -> bool:
    """Whether an operative binding is one the run used: an earlier version's DataConfig fields only when the run's
    source read them."""
    configurable, _, field = name.rpartition(".")
    if configurable.split("/")[-1] != "DataConfig" or not source:
        return True
    return source in MOVED_DATA_FIELDS.get(field, (source,))


def _gin_bindings(operative: str, configurables: tuple[str, ...]) -> list[str]:
    """The operative bindings (whole, local paths replaced) of the configurables (or `Name.param`s) named, leaving out
    an earlier version's DataConfig fields that the run's source did not read."""
    source = _data_source(operative)
    wanted = [(name, text) for name, text in _bindings(operative)
              if any(name == c or name.startswith(c + ".") for c in configurables) and _mattered(name, source)]
    return [_without_local_paths(text) for _, text in wanted]


# A quoted absolute path in a gin value.
_ABSOLUTE_PATH = re.compile(r"""(['"])((?:/|~/|[A-Za-z]:[\\/])[^'"]*)\1""")


def _without_local_paths(text: str) -> str:
    """Gin text with each quoted absolute path replaced by a name: the package's own files by their path in the
    repository (data/corpus), others by their last two path parts, under `<local>/`: a card says what the run read,
    not where it lay on the machine that ran it."""
    def name(match: re.Match) -> str:
        path = Path(match[2]).expanduser()
        for root, shown in ((BUNDLED_CORPUS, "data/corpus"), (DEMO_VOCAB.parent, "data/vocab"),
                            (GIN_CONFIGS_DIR, "gin_configs")):
            try:
                inside = path.relative_to(root)
            except ValueError:
                continue
            return f"{match[1]}{shown}{'' if inside == Path('.') else '/' + inside.as_posix()}{match[1]}"
        return f"{match[1]}<local>/{'/'.join(path.parts[-2:])}{match[1]}"

    return _ABSOLUTE_PATH.sub(name, text)


def _operative_shown(operative: str) -> str:
    """The operative gin config as a card shows it: the bindings that mattered, without local paths."""
    source = _data_source(operative)
    return "\n".join(_without_local_paths(text) for name, text in _bindings(operative) if _mattered(name, source))


def _local_free(path: str) -> str:
    """A path shown in a card: its last two parts for an absolute one."""
    return path if not Path(path).is_absolute() else f"<local>/{'/'.join(Path(path).parts[-2:])}"


def _results_table(results: dict) -> list[str]:
    """Every evaluation in a job's results: flat tables of numbers with a count `n` (one row per evaluated model)."""
    rows = {name: value for name, value in results.items() if isinstance(value, dict) and "n" in value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())}
    if not rows:
        return []
    columns = list(dict.fromkeys(k for value in rows.values() for k in value))
    lines = ["| model | " + " | ".join(columns) + " |", "| --- " * (len(columns) + 1) + "|"]
    for name, value in rows.items():
        cells = [("" if k not in value else f"{value[k]:.4g}" if isinstance(value[k], float) else str(value[k]))
                 for k in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _training(facts: CardFacts) -> list[str]:
    provenance = facts.provenance
    lines = []
    if provenance.get("imported_from"):
        lines.append(f"Imported with `rankgen-jax import --from {provenance.get('source_format', 'hf')}` from "
                     f"`{_local_free(provenance['imported_from'])}`"
                     + (f" ({provenance['model_id']})" if provenance.get("model_id") else "") + ".")
    if provenance.get("trained_from"):
        lines.append(f"Fine-tuned from `{_local_free(provenance['trained_from'])}`"
                     + (f" ({provenance['base_model']})" if provenance.get("base_model") else "") + ".")
    if facts.operative_gin is None:
        if not lines:
            lines.append("No training record: the checkpoint was written without a training run.")
        return lines
    lines.append("Trained with `rankgen-jax train`" + (f"; this export is step {facts.step}." if facts.step is not None
                                                       else "."))
    data = _gin_bindings(facts.operative_gin, ("DataConfig", _data_source(facts.operative_gin)))
    if data:
        lines += ["", "Data (from the run's operative gin config):", "", "```", *data, "```"]
    setup = _gin_bindings(facts.operative_gin, ("LossConfig.name", "OptimizerConfig.name",
                                                "OptimizerConfig.learning_rate", "TrainerConfig.num_steps",
                                                "TrainerConfig.max_minutes", "DataConfig.batch_size"))
    if setup:
        lines += ["", "Loss and schedule: " + "; ".join(f"`{line.strip()}`" for line in setup) + "."]
    trained = (facts.results or {}).get("train")
    if isinstance(trained, dict) and isinstance(trained.get("loss"), (int, float)):
        lines += ["", f"Last logged training loss: {trained['loss']:.4g}"
                  + (f" ({int(trained['steps'])} steps)." if isinstance(trained.get("steps"), (int, float)) else ".")]
    lines += ["", "<details><summary>The operative gin config of the run (the settings it used)</summary>", "",
              "```", _operative_shown(facts.operative_gin), "```", "", "</details>"]
    if facts.results:
        table = _results_table(facts.results)
        if table:
            lines += ["", f"Held-out results of the job this run belongs to (`{Path(facts.results_path).name}`; for the "
                      "main job: suffix identification on held-out books, the gold continuation against InBook "
                      "negatives, `n` items):", "", *table]
        # results.json of earlier versions calls the table by_kind_table.
        by_genre = facts.results.get("by_genre_table", facts.results.get("by_kind_table"))
        if isinstance(by_genre, str) and by_genre.strip():
            lines += ["", "Per genre of held-out text, against the starting model read at each prefix length and the "
                      "best of those (accuracy ± standard error; gain ± paired standard error):", "",
                      by_genre.rstrip()]
    return lines


def render_card(facts: CardFacts, title: str) -> str:
    """The whole README.md of an export."""
    sections = [_render_front_matter(front_matter(facts, title)), f"# {title}", "",
                "Exported by rankgen-jax (`rankgen-jax export-hf`): " + facts.layout + ".", "",
                "## Model", "", *_architecture(facts.model_config), *_dimensions(facts), "",
                "## Inputs", "", *_conventions(facts), "",
                "## Usage", "", *_usage(facts), *([
                    "", facts.export_check] if facts.export_check else []), "",
                *_retrieval_section(facts),
                "## Provenance and training", "", *_training(facts), ""]
    return "\n".join(sections)


def write_model_card(out: str, facts: CardFacts) -> Path:
    """Write out/README.md; returns its path."""
    path = Path(out) / CARD_FILE
    path.write_text(render_card(facts, Path(out).resolve().name), encoding="utf-8")
    return path
