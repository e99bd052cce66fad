"""Load a trained or imported dual encoder and turn texts into vectors and scores.

`load_model` accepts a rankgen_jax checkpoint folder (or a training workdir:
the latest step), or an HF folder in any format `convert.read_source("hf", ...)`
reads (T5, the released RankGen format, BERT / MiniLM / sentence-transformers),
including the `query_encoder/` + `document_encoder/` pair a two-tower export
writes. Nothing is written to disk.

Prefixes go through the query tower, continuations through the document
tower, and the score is the raw dot product of the two vectors. How texts
become ids (markers, each side's length, which end of an over-long text stays,
EOS handling) are the model's input conventions (data/conventions.py): the
ones recorded with it (input_conventions.json, written by training and
exports), a sentence-transformers folder's own (prompts, max_seq_length), or
for a folder without either the released RankGen ones ("pre " / "suffi ",
512 / 128 tokens, and "released" truncation: the batch is padded and then
sliced to the limit, so an over-long input loses its EOS, as in the released
code). Arguments given to encode / score override them; `conventions_note`
says which were used.

Batches: `batch_size=None` picks the rows of each batch from a memory budget
(see rows_for_memory); with a `mesh` of several devices the rows of every
batch are split over its data axis and the parameters are replicated.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import folder_conventions, no_record_origin, read_source
from rankgen_jax.data.conventions import (CONVENTIONS_FILE, CONVENTIONS_SIDE, InputConventions, check_encode_side,
                                          default_conventions)
from rankgen_jax.models.configs import BertConfig, ModelConfig
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.factory import build_model, check_params_match, to_model_layout
from rankgen_jax.models.precision import resolve_activation_dtype
from rankgen_jax.runtime.partitioning import batch_sharding, replicated
from rankgen_jax.data.text import TextEncoder, encode_pair_truncated, encode_truncated, load_text_encoder, pad_batch

# The tower each encoding side runs; its markers and lengths are the model's input conventions
# (data.conventions.CONVENTIONS_SIDE: which side's).
SIDE_TOWERS = {"prefix": "query", "suffix": "document", "raw": "query"}
# Smallest padded length; shorter batches share this one compiled shape.
MIN_BUCKET = 16
# Up to this length buckets are powers of two, beyond it multiples of it: few
# shapes for short texts, at most ~50% padding waste for long ones.
POW2_LIMIT = 128
TRUNCATIONS = ("clean", "released")

# Memory-based batch size (rows_for_memory). Bytes per row are estimated as
#   ACTIVATION_FACTOR x num_layers x length x d_model x activation bytes.
# A T5 / BERT layer holds about 8 [L, d_model]-sized activations at once
# (residual, q, k, v, attention output, the gated FFN's ~2.5 d_model wide
# hidden pair) plus the [heads, L, L] attention scores, which at L = 512 are
# another ~8 [L, d_model] worth for T5 sizes; 16 covers both. Multiplying by
# every layer over-counts for inference (XLA frees a layer's buffers before
# the next), which leaves room for compiler temporaries and fragmentation.
ACTIVATION_FACTOR = 16
MAX_AUTO_BATCH = 1024
# Shares of free memory one batch may use: on CPU the host also runs the
# tokenizer and holds the results; on accelerators the parameters are already
# counted in bytes_in_use.
CPU_MEMORY_FRACTION = 0.25
ACCELERATOR_MEMORY_FRACTION = 0.5
# When a device reports no memory statistics nor the host its free memory.
FALLBACK_MEMORY_BYTES = 4 << 30
# Encoded batches still running on the device while the host reads back older ones.
IN_FLIGHT_BATCHES = 4


def bucket_length(length: int, max_length: int, step: int | None = None) -> int:
    """The padded length for a batch whose longest row has `length` tokens (never above max_length).

    Up to POW2_LIMIT: the next power of two (step None), or the next multiple
    of `step` (more compiled shapes, less padding); beyond: multiples of POW2_LIMIT.
    """
    if length <= POW2_LIMIT:
        if step is None:
            bucket = max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())
        else:
            bucket = max(MIN_BUCKET, -(-length // step) * step)
    else:
        bucket = -(-length // POW2_LIMIT) * POW2_LIMIT
    return min(bucket, max_length)


def bucket_rows(rows: int, batch_size: int) -> int:
    """The padded number of rows of a batch: the next power of two, capped at batch_size."""
    return min(batch_size, 1 << max(0, rows - 1).bit_length())


def max_positions(config: ModelConfig) -> int | None:
    """The longest input the encoder can take (BERT family: absolute positions), or None (T5: unlimited)."""
    encoder = config.encoder
    if isinstance(encoder, BertConfig):
        return encoder.max_position_embeddings - encoder.position_offset
    return None


def _activation_bytes(config: ModelConfig) -> int:
    return resolve_activation_dtype(config.encoder.dtype, jax.default_backend()).itemsize


def bytes_per_row(config: ModelConfig, length: int) -> int:
    """Estimated activation bytes of one encoded row of `length` tokens (see ACTIVATION_FACTOR)."""
    encoder = config.encoder
    return ACTIVATION_FACTOR * encoder.num_layers * int(length) * encoder.d_model * _activation_bytes(config)


def rows_for_memory(config: ModelConfig, length: int, budget_bytes: int, cap: int = MAX_AUTO_BATCH) -> int:
    """Rows per batch of `length` tokens that fit budget_bytes: a power of two in [1, cap]."""
    rows = max(1, min(int(cap), int(budget_bytes) // max(1, bytes_per_row(config, length))))
    # Powers of two keep the number of compiled shapes small (see bucket_rows).
    return 1 << (rows.bit_length() - 1)


def host_available_bytes() -> int:
    """Free host memory in bytes (psutil when installed, else sysconf; a fixed guess if neither works)."""
    try:
        import psutil  # optional: the sysconf fallback below serves without it

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MEMORY_BYTES


def default_memory_budget(devices: Sequence[jax.Device] | None = None) -> int:
    """Bytes one encode batch may use across `devices` (default: the local devices' first).

    Accelerators: ACCELERATOR_MEMORY_FRACTION of each device's free memory
    (bytes_limit - bytes_in_use), times the number of devices, as the rows are
    split over them. CPU: CPU_MEMORY_FRACTION of the host's free memory, which
    all (possibly fake) CPU devices share.
    """
    devices = list(devices) if devices else jax.local_devices()[:1]
    if devices[0].platform == "cpu":
        return int(CPU_MEMORY_FRACTION * host_available_bytes())
    try:
        stats = devices[0].memory_stats() or {}
    except Exception:  # some runtimes raise instead of returning None
        stats = {}
    if "bytes_limit" in stats:
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return int(ACCELERATOR_MEMORY_FRACTION * max(free, 0)) * len(devices)
    return FALLBACK_MEMORY_BYTES * len(devices)


def _check_truncation(truncation: str, keep: str) -> None:
    if truncation not in TRUNCATIONS:
        raise RankgenError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    if keep not in ("start", "end"):
        raise RankgenError(f"keep must be 'start' or 'end', got {keep!r}")
    if truncation == "released" and keep == "end":
        raise RankgenError("keep='end' needs truncation='clean' (the released encoder always cuts the end)")


@functools.lru_cache(maxsize=32)
def _tower_fn(config: ModelConfig, tower: str, mesh: Mesh | None = None) -> Callable:
    """The jitted vectors function of one tower; cached on the (hashable) config, so models with
    the same config (a checkpoint and its HF export, a model loaded twice) share compiled code.

    With a mesh, the rows come split over its data axes (encode places them) and the parameters keep the sharding
    they have on it (replicated by place_on, or a training state's own), which jit reads off the arrays; every
    host reads the vectors back whole.
    """
    model = build_model(config)

    def apply(params, ids_BxL, mask_BxL):
        return model.apply({"params": params}, ids_BxL, mask_BxL, tower=tower)

    if mesh is None:
        return jax.jit(apply)
    return jax.jit(apply, out_shardings=replicated(mesh))


def _rows_on(mesh: Mesh, rows_BxL: np.ndarray) -> jax.Array:
    """A host batch (the same on every host) split over the mesh's data axes."""
    sharding = batch_sharding(mesh)
    return jax.make_array_from_callback(rows_BxL.shape, sharding, lambda index: rows_BxL[index])


def truncate_vectors(vectors_NxD: np.ndarray, dim: int | None, normalize: bool) -> np.ndarray:
    """Each vector's first `dim` components (None: all), normalised again when `normalize` (a head that normalises
    its vectors: the cut then ranks by cosine by inner product, as a Matryoshka loss trained it)."""
    if dim is None:
        return vectors_NxD
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= vectors_NxD.shape[-1]:
        raise RankgenError(f"`truncate_dim` must be in 1..{vectors_NxD.shape[-1]} (the model's dimension), got {dim!r}",
                           names=("truncate_dim",))
    cut = vectors_NxD[..., :dim]
    if not normalize:
        return cut
    return (cut / np.maximum(np.linalg.norm(cut, axis=-1, keepdims=True), 1e-12)).astype(cut.dtype)


@dataclasses.dataclass
class LoadedModel:
    """A dual encoder ready for inference: its config, parameters (on device) and tokenizer.

    One jitted function per tower is kept (per config, see _tower_fn); jax
    compiles it once per padded (rows, length) shape, and `compiled_shapes`
    records the (tower, rows, length) shapes this model has run.
    conventions: how texts become ids when a call does not say (module
    docstring); conventions_origin: where they come from, in words.
    """

    config: ModelConfig
    params: dict
    text: TextEncoder
    source: str = ""
    compiled_shapes: set = dataclasses.field(default_factory=set)
    conventions: InputConventions | None = None
    conventions_origin: str = ""

    def __post_init__(self):
        if self.conventions is None:
            self.conventions = default_conventions(self.config.kind)
            self.conventions_origin = self.conventions_origin or "no record: defaults for the model kind"

    @classmethod
    def from_params(cls, config: ModelConfig, params: dict, text: TextEncoder, source: str = "",
                    conventions: InputConventions | None = None, conventions_origin: str = "") -> LoadedModel:
        """A model of parameters in memory, in the layout checkpoints store (e.g. a run's initial
        parameters), checked against config and the tokenizer; source names them in errors.
        conventions default to those of a folder without a record (data.conventions.default_conventions)."""
        where = source or "parameters"
        check_params_match(params, config, where=where)
        if text.size > config.encoder.vocab_size:
            # Out-of-range ids would be clamped silently by the embedding lookup.
            raise RankgenError(f"{where}: the tokenizer has {text.size} ids "
                               f"but the model's vocab_size is {config.encoder.vocab_size}")
        return cls(config=config, params=jax.device_put(to_model_layout(params, config)), text=text, source=source,
                   conventions=conventions, conventions_origin=conventions_origin)

    def override_conventions(self, **overrides) -> None:
        """Replace some input conventions (InputConventions field names; None values are ignored)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if given:
            self.conventions = self.conventions.replace(**given)
            self.conventions_origin += f"; given: {', '.join(sorted(given))}"

    def conventions_note(self) -> str:
        """One line for stderr: the input conventions this model reads text with, and where they come from."""
        return f"input conventions: {self.conventions.describe()} ({self.conventions_origin})"

    @property
    def dim(self) -> int:
        """Length of the vectors `encode` returns."""
        return self.config.head.output_dim(self.config.encoder.d_model)

    @property
    def normalizes(self) -> bool:
        """Whether the head L2-normalises the vectors (then cut vectors are normalised again)."""
        return bool(self.config.head is not None and self.config.head.l2_normalize)

    @property
    def vector_shape(self) -> tuple[int, ...]:
        """Shape of one text's vectors: (D,), or (P, D) for a model with P perspective heads."""
        return (self.config.num_scores, self.dim) if self.config.num_scores > 1 else (self.dim,)

    def _reading(self, side: str, max_length: int | None = None, truncation: str | None = None,
              keep: str | None = None) -> tuple[str, int, str, str]:
        """(marker, length limit, kept end, truncation) a side reads with: the arguments given, else the conventions."""
        check_encode_side(side)
        side_keep = self.conventions.side(CONVENTIONS_SIDE[side])[2]
        truncation = self.conventions.truncation if truncation is None else truncation
        keep = side_keep if keep is None else keep
        _check_truncation(truncation, keep)
        return self._marker(side), self._max_length(side, max_length), keep, truncation

    def _marker(self, side: str) -> str:
        check_encode_side(side)
        return "" if side == "raw" else self.conventions.side(CONVENTIONS_SIDE[side])[0]

    def _max_length(self, side: str, max_length: int | None) -> int:
        check_encode_side(side)
        limit = self.conventions.side(CONVENTIONS_SIDE[side])[1] if max_length is None else int(max_length)
        if limit < 1 + self.text.num_special:
            raise RankgenError(f"max_length={limit} leaves no room for text "
                               f"(the tokenizer adds {self.text.num_special} special tokens)")
        cap = max_positions(self.config)
        return limit if cap is None else min(limit, cap)

    def tokenize(self, texts: Sequence[str], side: str = "raw", keep_end_over: int | None = None) -> list[list[int]]:
        """Token ids (with the side's marker and the special tokens) of each text.

        Not truncated, unless keep_end_over is set: then texts longer than that
        many ids lose their beginning instead of their end.
        """
        marker = self._marker(side)
        if keep_end_over is not None:
            return [encode_truncated(self.text, marker, text, keep_end_over, keep="end") for text in texts]
        return [self.text.add_special(self.text.tokenize(marker + text)) for text in texts]

    def input_ids(
        self, texts: Sequence[str], side: str = "raw", max_length: int | None = None, truncation: str | None = None,
        keep: str | None = None,
    ) -> list[list[int]]:
        """The token ids `encode` feeds the model for each text (marker, text, special tokens, cut to the limit).

        max_length, truncation and keep default to the model's input conventions.
        """
        _, limit, keep, truncation = self._reading(side, max_length, truncation, keep)
        if truncation == "clean" and keep == "end":
            return self.tokenize(texts, side, keep_end_over=limit)
        sequences = self.tokenize(texts, side)
        if truncation == "released":
            # Padding then slicing the batch, as the released encoder does, cuts each row alone.
            return [ids[:limit] for ids in sequences]
        return [ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:] for ids in sequences]

    def place_on(self, mesh: Mesh) -> None:
        """Replicate the parameters over `mesh` (once; the single-device copy is then released). Parameters
        already on the mesh's devices (a training state's, sharded as training holds them) stay as they are.

        Later calls without a mesh still give the same vectors, computed on every device of the mesh.
        """
        devices = set(mesh.devices.flat)
        leaves = jax.tree_util.tree_leaves(self.params)
        if not all(isinstance(leaf, jax.Array) and leaf.sharding.device_set == devices for leaf in leaves):
            self.params = jax.device_put(self.params, replicated(mesh))

    def encode(
        self, texts: Sequence[str], side: str | None = None, max_length: int | None = None, batch_size: int | None = 64,
        keep: str | None = None, truncation: str | None = None, mesh: Mesh | None = None,
        memory_budget_bytes: int | None = None, on_batch: Callable[[int], None] | None = None,
        bucket_step: int | None = None,
    ) -> np.ndarray:
        """Vectors [N, D] (float32) of `texts`, in input order ([N, P, D] with P perspective heads).

        side: "prefix" (the prefix side's marker, query tower), "suffix" (the
          suffix side's, document tower) or "raw" (the default: the prefix side
          without a marker). max_length, truncation and keep default to the model's
          input conventions (released RankGen: "pre " / "suffi ", 512 / 128
          tokens); max_length is capped by a BERT-family encoder's position table.
        truncation: "clean" cuts long texts but keeps their final special token;
          "released" cuts them at the limit like the released RankGen code
          (their EOS is lost). See input_ids.
        keep (clean only): "start" truncates long texts at the end; "end" drops
          their beginning instead (for prefixes: the text nearest the
          continuation stays).
        batch_size: rows per batch, or None to choose them per padded length
          from memory_budget_bytes (default: default_memory_budget).
        mesh: split every batch's rows over this mesh's data axes (rows padded
          to a multiple of its size); the parameters are replicated onto it.
        on_batch: called with the number of texts of each batch once its
          vectors are back on the host (progress bars).
        bucket_step: None pads batches of up to POW2_LIMIT tokens to powers of
          two; k to multiples of k (see bucket_length): less padding for more
          compiled shapes, which pays off when many texts are encoded.
        Texts are sorted by length and batched so that each batch pads only to
        its own bucket length (see bucket_length), which keeps padding and the
        number of compiled shapes small.
        """
        if isinstance(texts, str):
            raise RankgenError("encode takes a list of texts, not a single string")
        side = side or "raw"
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise RankgenError(f"batch_size must be >= 1 or None (from memory), got {batch_size}")
        check_encode_side(side)
        if bucket_step is not None and (isinstance(bucket_step, bool) or not isinstance(bucket_step, int)
                                        or bucket_step < 1):
            raise RankgenError(f"bucket_step must be a positive integer or None, got {bucket_step!r}")
        limit = self._max_length(side, max_length)
        sequences = self.input_ids(texts, side, limit, truncation, keep)
        # Shared towers are one encoder: both sides then use (and compile) one function.
        tower = SIDE_TOWERS[side] if not self.config.shared_towers else "query"
        if mesh is not None and mesh.size == 1:
            mesh = None
        if mesh is not None:
            self.place_on(mesh)
        fn = _tower_fn(self.config, tower, mesh)
        num_devices = 1 if mesh is None else mesh.size
        if batch_size is None and memory_budget_bytes is None:
            devices = None if mesh is None else list(mesh.devices.flat)
            memory_budget_bytes = default_memory_budget(devices)
        vectors_NxD = np.zeros((len(sequences), *self.vector_shape), np.float32)
        lengths_N = np.array([len(s) for s in sequences], np.int64)
        # Stable sort, longest first: the first (largest) shape is compiled first.
        order = np.argsort(-lengths_N, kind="stable")
        pending = []  # (rows, device vectors): dispatched, not yet read back

        def read_back(rows, out_BxD):
            vectors_NxD[rows] = np.asarray(out_BxD, np.float32)[: len(rows)]
            if on_batch is not None:
                on_batch(len(rows))

        start = 0
        while start < len(order):
            # Sorted longest first: this batch's first row sets its padded length.
            length = bucket_length(int(lengths_N[order[start]]), limit, bucket_step)
            size = batch_size or rows_for_memory(self.config, length, memory_budget_bytes)
            rows = order[start : start + size]
            start += len(rows)
            num_rows = bucket_rows(len(rows), size)
            # Each device gets the same number of rows.
            num_rows = -(-num_rows // num_devices) * num_devices
            # Filler rows are all padding; their vectors are computed and dropped.
            ids_BxL = pad_batch([sequences[i] for i in rows], length, self.text.pad_id)
            ids_BxL = np.concatenate([ids_BxL, np.full((num_rows - len(rows), length), self.text.pad_id, np.int32)])
            # The mask comes from the lengths, not from `ids != pad_id`, so a real
            # token that happens to share the pad id is still attended to.
            mask_BxL = np.arange(length)[None, :] < np.concatenate(
                [lengths_N[rows], np.zeros(num_rows - len(rows), np.int64)])[:, None]
            self.compiled_shapes.add((tower, num_rows, length))
            if mesh is not None:
                ids_BxL, mask_BxL = _rows_on(mesh, ids_BxL), _rows_on(mesh, mask_BxL)
            pending.append((rows, fn(self.params, ids_BxL, mask_BxL)))
            # Reading back the oldest batch overlaps with the device running the newer ones.
            if len(pending) > IN_FLIGHT_BATCHES:
                read_back(*pending.pop(0))
        for rows, out_BxD in pending:
            read_back(rows, out_BxD)
        return vectors_NxD

    def score(
        self,
        prefixes: Sequence[str],
        candidates: Sequence[Sequence[str]],
        batch_size: int | None = 64,
        prefix_length: int | None = None,
        suffix_length: int | None = None,
        prefix_keep: str | None = None,
        truncation: str | None = None,
        mesh: Mesh | None = None,
        memory_budget_bytes: int | None = None,
    ) -> list[np.ndarray]:
        """For each prefix, the dot products [C_i] of its vector with each of its candidates' vectors.

        With P perspective heads: [C_i, P], one dot product per perspective.

        Lengths, prefix_keep and truncation default to the input conventions;
        prefix_keep "end" truncates long prefixes from the left (clean truncation only, see encode).
        """
        if len(prefixes) != len(candidates):
            raise RankgenError(f"score: {len(prefixes)} prefixes but {len(candidates)} candidate lists")
        candidates = [[c] if isinstance(c, str) else list(c) for c in candidates]
        options = dict(truncation=truncation, mesh=mesh, memory_budget_bytes=memory_budget_bytes)
        prefix_NxD = self.encode(prefixes, "prefix", prefix_length, batch_size, keep=prefix_keep, **options)
        # All candidates in one call, so length bucketing works across lists.
        flat = [c for cands in candidates for c in cands]
        cand_MxD = self.encode(flat, "suffix", suffix_length, batch_size, **options)
        bounds = np.cumsum([0] + [len(c) for c in candidates])
        # Summed over the last axis, so [C, D] x [D] and [C, P, D] x [P, D] (per perspective) alike.
        return [(cand_MxD[bounds[i] : bounds[i + 1]] * prefix_NxD[i]).sum(-1) for i in range(len(candidates))]

    def score_pairs(
        self, queries: Sequence[str], candidates: Sequence[Sequence[str]], query_length: int | None = None,
        candidate_length: int | None = None, batch_size: int = 64, query_keep: str | None = None,
    ) -> list[np.ndarray]:
        """Cross encoder: for each query, the scores [C_i] (or [C_i, N]) of `query + candidate` read together.

        Lengths and query_keep default to the input conventions' prefix and
        suffix sides (without a record: the query keeps its last 128 tokens,
        each candidate its first 128, the layout the list trainer uses).
        """
        _require_kind(self.config, self.source, "cross_encoder")
        query_length = self.conventions.prefix_length if query_length is None else query_length
        candidate_length = self.conventions.suffix_length if candidate_length is None else candidate_length
        query_keep = self.conventions.prefix_keep if query_keep is None else query_keep
        # A string is a sequence too: score_pairs("q", ["a", "b"]) would score characters.
        if isinstance(queries, str) or isinstance(candidates, str) or any(isinstance(c, str) for c in candidates):
            raise RankgenError("score_pairs takes a list of queries and, for each query, a list of candidate strings, "
                               "e.g. score_pairs(['a query'], [['passage 1', 'passage 2']])")
        if len(queries) != len(candidates):
            raise RankgenError(f"score_pairs: {len(queries)} queries but {len(candidates)} candidate lists")
        if query_keep not in ("start", "end"):
            raise RankgenError(f"query_keep must be 'start' or 'end', got {query_keep!r}")
        pairs = [encode_pair_truncated(self.text, q, c, query_length, candidate_length, query_keep)
                 for q, cands in zip(queries, candidates) for c in cands]
        limit = query_length + candidate_length
        cap = max_positions(self.config)
        if cap is not None and limit > cap:
            raise RankgenError(f"query_length + candidate_length = {limit} exceeds the encoder's {cap} positions")
        fn = _ranker_fn(self.config)
        lengths_N = np.array([len(ids) for ids, _ in pairs], np.int64)
        order = np.argsort(-lengths_N, kind="stable")
        pending = []
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            length = bucket_length(int(lengths_N[rows].max()), limit)
            num_rows = bucket_rows(len(rows), batch_size)
            fill = num_rows - len(rows)
            ids_BxL = np.concatenate([pad_batch([pairs[i][0] for i in rows], length, self.text.pad_id),
                                      np.full((fill, length), self.text.pad_id, np.int32)])
            types_BxL = np.concatenate([pad_batch([pairs[i][1] for i in rows], length, 0),
                                        np.zeros((fill, length), np.int32)])
            mask_BxL = np.arange(length)[None, :] < np.concatenate([lengths_N[rows], np.zeros(fill, np.int64)])[:, None]
            self.compiled_shapes.add(("pairs", num_rows, length))
            pending.append((rows, fn(self.params, ids_BxL, mask_BxL, types_BxL)))
        flat = [None] * len(pairs)
        for rows, scores in pending:
            scores = np.asarray(scores, np.float32)[: len(rows)]
            for row, value in zip(rows, scores):
                flat[row] = value
        bounds = np.cumsum([0] + [len(c) for c in candidates])
        return [np.asarray(flat[bounds[i] : bounds[i + 1]], np.float32) for i in range(len(candidates))]


@functools.lru_cache(maxsize=32)
def _ranker_fn(config: ModelConfig) -> Callable:
    """The jitted cross-encoder scores function (cached on the config, like _tower_fn)."""
    model = build_model(config)
    return jax.jit(lambda params, ids, mask, types: model.apply({"params": params}, ids, mask, types))


def _describe_kind(config: ModelConfig) -> str:
    if config.kind == "dual_encoder":
        return "a dual encoder (prefix and candidate vectors)"
    if config.kind == "cross_encoder":
        return "a cross encoder (it scores a prefix and a candidate read together, not vectors)"
    return "a bare encoder without a vector head"


def _require_kind(config: ModelConfig, path: str, kind: str = "dual_encoder") -> None:
    if config.kind != kind:
        what = "a dual encoder" if kind == "dual_encoder" else "a cross encoder"
        raise RankgenError(f"{path}: holds {_describe_kind(config)}; this needs {what} (kind {kind!r})")


def _text_encoder_from_files(tokenizer, path: str) -> TextEncoder:
    """A TextEncoder from what read_source returns: a spiece.model path, tokenizer files, or None."""
    files = [tokenizer] if isinstance(tokenizer, (str, Path)) else list(tokenizer or [])
    for name in ("tokenizer.json", "spiece.model"):
        for f in files:
            if Path(f).name == name:
                return load_text_encoder(f)
    raise RankgenError(f"{path}: no tokenizer in this folder (expected spiece.model or tokenizer.json)")


def _read_hf(path: str, kind: str = "dual_encoder") -> tuple[ModelConfig, dict, TextEncoder]:
    config, params, tokenizer = read_source("hf", path)
    _require_kind(config, path, kind)
    return config, params, _text_encoder_from_files(tokenizer, path)


def _read_two_tower_hf(path: Path) -> tuple[ModelConfig, dict, TextEncoder]:
    """The query_encoder/ + document_encoder/ folders a two-tower export writes, as one model."""
    query_config, query_params, text = _read_hf(str(path / "query_encoder"))
    document_config, document_params, _ = _read_hf(str(path / "document_encoder"))
    if document_config != query_config:
        raise RankgenError(f"{path}: query_encoder/ and document_encoder/ have different model configs")
    config = dataclasses.replace(query_config, shared_towers=False)
    return config, {"query_tower": query_params, "document_tower": document_params}, text


def as_loaded_model(model: str | os.PathLike | LoadedModel, conventions: dict | None = None) -> LoadedModel:
    """A dual encoder: loaded from its folder when given a path (load_model), or the loaded one, its parameters
    shared, with `conventions` on top of its own (on a copy: the caller's model keeps its conventions)."""
    if isinstance(model, LoadedModel):
        copy = dataclasses.replace(model)
        copy.override_conventions(**(conventions or {}))
        return copy
    return load_model(str(model), conventions=conventions)


def load_model(path: str, kind: str = "dual_encoder", conventions: dict | None = None,
               step: int | None = None) -> LoadedModel:
    """A dual encoder (or, with kind="cross_encoder", a ranker) from a checkpoint folder /
    training workdir (its latest step, or `step`) or an HF folder.

    Its input conventions are the folder's (see the module docstring), with
    `conventions` ({InputConventions field: value}; None values ignored) given on top.
    """
    folder = Path(path)
    if not folder.exists():
        raise RankgenError(f"{path}: no such model folder")
    if not folder.is_dir():
        raise RankgenError(f"{path}: not a folder (expected a rankgen_jax checkpoint or an HF model folder)")
    if step is not None and not native.is_checkpoint_dir(folder):
        raise RankgenError(f"{path}: step {step} asked for, but only a rankgen_jax checkpoint folder has steps")
    if native.is_checkpoint_dir(folder):
        # Check the kind and the tokenizer before reading possibly large parameters.
        config = native.load_model_config(folder)
        _require_kind(config, str(path), kind)
        vocab = native.vocab_path(folder)
        if vocab is None:
            raise RankgenError(f"{path}: checkpoint has no tokenizer (no files under {native.VOCAB_DIR}/)")
        text = load_text_encoder(vocab)
        config, params = native.restore_params(folder, step)
        recorded = native.load_input_conventions(folder)
        origin = f"recorded in {folder / CONVENTIONS_FILE}"
        if recorded is None:
            recorded, origin = default_conventions(config.kind), no_record_origin(config)
    elif (folder / "config.json").is_file() or (folder / "modules.json").is_file():
        config, params, text = _read_hf(str(folder), kind)
        recorded, origin = folder_conventions(str(folder), config)
    elif (folder / "query_encoder").is_dir() and (folder / "document_encoder").is_dir():
        config, params, text = _read_two_tower_hf(folder)
        recorded, origin = folder_conventions(str(folder), config)
    else:
        raise RankgenError(
            f"{path}: neither a rankgen_jax checkpoint ({native.MODEL_CONFIG_FILE}) "
            "nor an HF model folder (config.json)")
    model = LoadedModel.from_params(config, params, text, source=str(path), conventions=recorded,
                                    conventions_origin=origin)
    model.override_conventions(**(conventions or {}))
    return model
