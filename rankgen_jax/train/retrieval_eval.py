"""Retrieval evaluation inside training: nDCG@10, RR@10, R@100 of the training state, on the training mesh.

Every TrainerConfig.eval_every steps (and at step 0 of a fresh run) the
trainer hands the current parameters, still sharded as training holds them,
to a RetrievalEvaluator. It encodes each set's corpus (the suffix side) and
its queries (the prefix side) with them, reading text as training does (the
run's input conventions), rows split over the mesh's data axes; no export, no
second process. Texts are batched as `index` and `search` batch them, every
query's passages ranked by an exact (flat) FAISS index as `search` ranks them
(the top `depth`), and the runs measured with trec_eval's definitions
(eval/retrieval_metrics.py): the numbers are those `evaluate` gives on the run
of the saved model encoded on the same devices. (Another device layout, or
FSDP-sharded parameters, changes the vectors' last bits, about 1e-5 here,
which can swap passages whose scores are that close.)

A set is a BEIR folder at a split ("PATH@SPLIT": the queries that split
judges, the whole corpus), or "nano:PATH@SPLIT": the nano set cut from it once
(retrieval/nano.py), kept in the run folder.

keep_best names a measure ("nDCG@10", or "SET/nDCG@10" for another set than
the first): whenever it improves, the parameters are saved to the run's best/
folder, a checkpoint `export-hf`, `encode` and `search` read like any other,
and best.json records the measure, value and step. A resumed run reads
best.json and goes on comparing with it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RETRIEVAL_METRIC_PREFIX, RunFolder
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.retrieval_files import DEFAULT_TITLE_JOIN, read_beir
from rankgen_jax.data.text import load_text_encoder
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.retrieval_metrics import check_run_depth, evaluate_run
from rankgen_jax.inference.encoder import LoadedModel, truncate_vectors
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.retrieval.dense_index import encode_all, rank_flat
from rankgen_jax.retrieval.nano import NanoSpec, build_nano_set
from rankgen_jax.train.metric_writers import read_metrics

NANO_PREFIX = "nano:"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RetrievalEvalConfig:
    """Retrieval sets measured during training (see the module docstring).

    sets: "PATH@SPLIT" (a BEIR folder at a split) or "nano:PATH@SPLIT" (its nano set: nano_queries queries, each
      with nano_distractors BM25 distractors); () evaluates none.
    measures: trec_eval measures, as ir-measures names them.
    depth: passages ranked per query (at least the measures' deepest cut-off).
    keep_best: "" (keep none), a measure of the first set, or "SET/MEASURE" with SET a set's name (metric names).
    encode_batch_size: texts per encoded batch (a multiple of the mesh's data-parallel size is best).
    dims: also measure the vectors cut to each of these first dimensions ("SET/dim<d>/MEASURE"; a Matryoshka
      model's, inference.encoder.truncate_vectors).
    nano_queries: queries sampled for each nano set (all the split's when fewer).
    nano_distractors: BM25 passages kept per sampled query in a nano set.
    seed: the nano sets' query sample.
    """

    sets: tuple[str, ...] = ()
    measures: tuple[str, ...] = ("nDCG@10", "RR@10", "R@100")
    depth: int = 100
    keep_best: str = ""
    encode_batch_size: int = 64
    dims: tuple[int, ...] = ()
    nano_queries: int = 50
    nano_distractors: int = 50
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sets", tuple(self.sets))
        object.__setattr__(self, "measures", tuple(self.measures))
        object.__setattr__(self, "dims", tuple(self.dims))
        if any(d < 1 for d in self.dims):
            raise RankgenError(f"RetrievalEvalConfig.dims must be positive, got {self.dims}")
        for spec in self.sets:
            parse_set(spec)
        if len(set(map(set_name, self.sets))) != len(self.sets):
            raise RankgenError(f"RetrievalEvalConfig.sets names a set twice: {self.sets}")
        if self.depth < 1 or self.encode_batch_size < 1:
            raise RankgenError("RetrievalEvalConfig.depth and encode_batch_size must be >= 1")
        check_run_depth(self.depth, self.measures, "RetrievalEvalConfig.depth")
        if self.keep_best:
            if not self.sets:
                raise RankgenError("RetrievalEvalConfig.keep_best needs a set to measure (RetrievalEvalConfig.sets)")
            self.best_metric()

    def best_metric(self) -> tuple[str, str]:
        """(set name, measure) keep_best names."""
        name, _, measure = self.keep_best.rpartition("/")
        name = name or set_name(self.sets[0])
        names = [set_name(s) for s in self.sets]
        if name not in names or measure not in self.measures:
            raise RankgenError(f"RetrievalEvalConfig.keep_best={self.keep_best!r} names no measured metric: a "
                               f"measure of {list(self.measures)}, optionally after a set name of {names} and '/'")
        return name, measure


def parse_set(spec: str) -> tuple[bool, str, str]:
    """(nano, folder, split) of a set spec; RankgenError for a malformed one."""
    nano = spec.startswith(NANO_PREFIX)
    body = spec[len(NANO_PREFIX):] if nano else spec
    folder, at, split = body.rpartition("@")
    if not at or not folder or not split:
        raise RankgenError(f"RetrievalEvalConfig.sets: {spec!r} is not PATH@SPLIT or nano:PATH@SPLIT")
    return nano, folder, split


def set_name(spec: str) -> str:
    """A set's name in metric names: the folder's name and the split ("scifact@test", "nano-scifact@test")."""
    nano, folder, split = parse_set(spec)
    return f"{'nano-' if nano else ''}{Path(folder).name}@{split}"


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """One retrieval set read whole: its passages and queries (titles joined as `index` and `search` join them)
    and the qrels of its split."""

    name: str
    passage_ids: list[str]
    passages: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]

    @classmethod
    def from_beir(cls, folder: str | Path, split: str, name: str) -> EvalSet:
        beir = read_beir(folder, split=split)
        qrels = {q: dict(labels) for q, labels in beir.qrels.labels.items()}
        return cls(name, list(beir.passages.ids), beir.passages.joined(DEFAULT_TITLE_JOIN), list(beir.queries.ids),
                   beir.queries.joined(DEFAULT_TITLE_JOIN), qrels)

    def runs(self, model: LoadedModel, config: RetrievalEvalConfig, mesh=None) -> dict[int | None, dict]:
        """The model's run of the set (None) and of its vectors cut to each of config.dims, its texts batched as
        `index` and `search` batch them (the same texts, the same vectors)."""
        size = config.encode_batch_size
        passages_PxD = encode_all(model, self.passages, "suffix", None, size, False, "passages", mesh)
        queries_QxD = encode_all(model, self.queries, "prefix", None, size, False, "queries", mesh)
        runs = {}
        for dim in (None, *config.dims):
            cut = [truncate_vectors(v, dim, model.normalizes) for v in (queries_QxD, passages_PxD)]
            runs[dim] = ranked_run(self.query_ids, self.passage_ids, *cut, config.depth)
        return runs

    def measure(self, model: LoadedModel, config: RetrievalEvalConfig, mesh=None) -> dict[str, float]:
        """{"NAME/MEASURE": mean, and "NAME/dim<d>/MEASURE" for each of config.dims} of the model's runs."""
        out = {}
        for dim, run in self.runs(model, config, mesh).items():
            prefix = self.name if dim is None else f"{self.name}/dim{dim}"
            measured = evaluate_run(run, self.qrels, list(config.measures))
            out.update({f"{prefix}/{m}": float(measured[m]) for m in config.measures})
        return out


def _load_set(spec: str, folder: RunFolder, config: RetrievalEvalConfig) -> EvalSet:
    nano, source, split = parse_set(spec)
    name = set_name(spec)
    if nano:
        out = folder.retrieval_set(name)
        if jax.process_index() == 0:
            build_nano_set(source, split, out, NanoSpec(config.nano_queries, config.nano_distractors, config.seed))
        _wait_for_nano(out)
        source = out
    return EvalSet.from_beir(source, split, name)


def _wait_for_nano(out: Path) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        # Host 0 writes the set on the run folder's (shared) storage; the others read it after.
        multihost_utils.sync_global_devices(f"rankgen_jax: nano set {out}")


def ranked_run(query_ids: list[str], passage_ids: list[str], queries_QxD: np.ndarray, passages_PxD: np.ndarray,
               depth: int) -> dict[str, dict[str, float]]:
    """Each query's `depth` best passages by inner product, as `search` ranks them (dense_index.rank_flat):
    qid -> {passage id: score}."""
    return {qid: {passage_ids[r]: float(score) for r, score in zip(rows, scores)}
            for qid, (rows, scores) in zip(query_ids, rank_flat(passages_PxD, queries_QxD, depth))}


class RetrievalEvaluator:
    """The run's retrieval sets, measured with the parameters it is given (see the module docstring)."""

    def __init__(self, config: RetrievalEvalConfig, folder: RunFolder, model_config: ModelConfig, vocab: str | None,
                 conventions: InputConventions, mesh):
        if model_config.kind != "dual_encoder":
            raise RankgenError(f"RetrievalEvalConfig.sets measure a dual encoder's retrieval; this run trains a "
                               f"{model_config.kind}")
        if not vocab:
            raise RankgenError("RetrievalEvalConfig.sets are read as text, and this run has no tokenizer")
        dim = model_config.head.output_dim(model_config.encoder.d_model)
        if config.dims and max(config.dims) > dim:
            raise RankgenError(f"RetrievalEvalConfig.dims {list(config.dims)}: the model's vectors have {dim}")
        self.config, self.mesh = config, mesh
        self.model_config, self.conventions = model_config, conventions
        self.text = load_text_encoder(vocab)
        self.sets = [_load_set(spec, folder, config) for spec in config.sets]
        self.seconds = 0.0
        self.evaluations = 0
        self.best = _BestKeeper(config, folder, self._save_best(vocab)) if config.keep_best else None

    def _save_best(self, vocab: str):
        def save(best: RunFolder, step: int, params) -> None:
            if jax.process_index() == 0:
                native.save_model_config(best, self.model_config, vocab)
                native.save_input_conventions(best, self.conventions)
            manager = native.step_manager(best, max_to_keep=1, writer=True)
            manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)), force=True)
            manager.wait_until_finished()
            manager.close()

        return save

    def describe(self) -> str:
        return "; ".join(f"{s.name}: {len(s.queries)} queries, {len(s.passages)} passages" for s in self.sets)

    def measure(self, params) -> dict[str, float]:
        """{"SET/MEASURE": mean, ..., "seconds": time taken} of these parameters."""
        # Training steps are dispatched ahead of the device: the clock starts once they are done, or their time
        # would be counted as the evaluation's (as much as log_every steps' worth).
        jax.block_until_ready(params)
        started = time.time()
        model = LoadedModel(config=self.model_config, params=params, text=self.text, source="the training state",
                            conventions=self.conventions, conventions_origin="the run's data")
        out: dict[str, float] = {}
        for s in self.sets:
            out.update(s.measure(model, self.config, self.mesh))
        out["seconds"] = time.time() - started
        self.seconds += out["seconds"]
        self.evaluations += 1
        return out

    def keep_if_best(self, step: int, measured: dict[str, float], params) -> None:
        """Keep the parameters as the best when keep_best's metric improved."""
        if self.best is not None:
            self.best.offer(step, measured, params)


class _BestKeeper:
    """best/ (a params-only checkpoint of the best step) and best.json (its metric, value and step)."""

    def __init__(self, config: RetrievalEvalConfig, folder: RunFolder, save):
        set_name, measure = config.best_metric()
        self.metric = f"{set_name}/{measure}"
        self.folder, self.save = folder, save
        self.record = self._read()

    def _read(self) -> dict | None:
        path = self.folder.best_record
        if not path.exists():
            return None
        record = json.loads(path.read_text())
        if record.get("metric") != self.metric:
            raise RankgenError(f"{path}: this run kept its best by {record.get('metric')!r}; keep_best now names "
                               f"{self.metric!r} (keep the same, or train in a new workdir)")
        saved = native.latest_step(self.folder.best)
        if saved is not None and saved != record["step"]:
            # Killed between saving the parameters and recording them: the metrics log has the value.
            rows = [r for r in read_metrics(self.folder.metrics) if r["step"] == saved
                    and f"{RETRIEVAL_METRIC_PREFIX}{self.metric}" in r]
            if rows:
                record = {**record, "step": saved, "value": rows[-1][f"{RETRIEVAL_METRIC_PREFIX}{self.metric}"]}
        return record

    def offer(self, step: int, measured: dict[str, float], params) -> None:
        value = measured[self.metric]
        if self.record is not None and not value > self.record["value"]:
            return
        self.save(self.folder.best, step, params)
        self.record = {"metric": self.metric, "value": value, "step": step}
        if jax.process_index() == 0:
            self.folder.best_record.write_text(json.dumps(self.record, indent=2) + "\n")
        print(f"best {self.metric} {value:.4f} at step {step}: saved to {self.folder.best}", file=sys.stderr)
