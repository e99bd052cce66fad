"""RankGenEncoder and `rankgen-jax encode`: texts to RankGen vectors, as the released code computes them.

Any folder `inference.encoder.load_model` reads works: a rankgen_jax checkpoint or
training workdir, an exported folder, or any HF folder in the released RankGen
format (recognised by its config, whatever the folder is called). Inputs follow
the model's input conventions (data/conventions.py): the recorded ones (a
trained model reads text as its training data did), a sentence-transformers
folder's own, or for the released checkpoints the released code's
(docs/design/checkpoints.md, 'RankGen format'): "pre " / "suffi " markers, 512 / 128
tokens, and a too-long input is sliced after padding so it loses its EOS.
Arguments override them (truncation="clean" keeps the EOS). Batches are grouped
by length, sized from memory unless batch_size is given, and split over all
local devices.

This module imports jax only when a model is loaded, so `rankgen-jax --help`
stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from rankgen_jax.data.conventions import check_encode_side, renamed_side
from rankgen_jax.data.jsonl import parse_lines
from rankgen_jax.errors import RankgenError, require_input_file, require_output_file

TRUNCATION_MODES = ("released", "clean")
# JSONL fields holding the text of each encoding side, in order of preference.
JSON_FIELDS = {"prefix": ("prefix", "text"), "suffix": ("suffix", "text"), "raw": ("text",)}
# Inputs with at least this many texts get a progress bar on stderr.
PROGRESS_MIN_TEXTS = 1000
# Line numbers of skipped lines quoted in the CLI's summary line.
SHOWN_SKIPPED = 5
# The released RankGenEncoder's max_batch_size: its input_ids rows are padded per batch of this many texts.
RELEASED_BATCH_SIZE = 32
# The released model sizes' T5 d_model (the released class's model_size names).
RELEASED_D_MODEL = {"base": 768, "large": 1024, "xl": 2048}
# What the released-RankGen form of encode() returns its embeddings as: NumPy, or torch tensors.
RETURN_TENSORS = ("np", "pt")


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RankgenError(f"`{what}` must be a positive integer, got {value!r}", names=(what,))
    return int(value)


class RankGenEncoder:
    """A dual encoder read with its input conventions: `.encode` vectors, `.score` dot products."""

    def __init__(
        self,
        path: str | os.PathLike,
        truncation: str | None = None,
        batch_size: int | None = None,
        devices: Sequence[Any] | None = None,
        memory_budget_bytes: int | None = None,
        conventions: dict | None = None,
        max_batch_size: int | None = None,
        model_size: str | None = None,
    ):
        """Load `path`; batch_size None sizes batches from memory; devices default to all local devices.

        truncation and conventions ({InputConventions field: value}, e.g.
        {"prefix_length": 256, "prefix_keep": "end"}) override the model's
        input conventions; None keeps the recorded ones (`.conventions`).
        max_batch_size and model_size are the released RankGenEncoder's names:
        the first is batch_size, the second ("base", "large", "xl") is checked
        against the loaded model's d_model.
        """
        if max_batch_size is not None:
            if batch_size is not None and batch_size != max_batch_size:
                raise RankgenError(f"batch_size={batch_size!r} and max_batch_size={max_batch_size!r} disagree: "
                                   "they are the same setting; give one")
            batch_size = max_batch_size
        if model_size is not None and model_size not in RELEASED_D_MODEL:
            raise RankgenError(f"model_size must be one of {sorted(RELEASED_D_MODEL)}, got {model_size!r}")
        if truncation is not None and truncation not in TRUNCATION_MODES:
            raise RankgenError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
        self.batch_size = None if batch_size is None else _positive(batch_size, "batch_size")
        self.memory_budget_bytes = (None if memory_budget_bytes is None
                                    else _positive(memory_budget_bytes, "memory_budget_bytes"))
        overrides = {**(conventions or {}), **({"truncation": truncation} if truncation is not None else {})}

        # Here, not at the top: they start jax, and the CLI imports this module before it sets XLA's flags.
        import jax

        from rankgen_jax.inference.encoder import load_model
        from rankgen_jax.runtime.partitioning import make_mesh

        devices = list(jax.local_devices() if devices is None else devices)
        if not devices:
            raise RankgenError("RankGenEncoder: devices is empty")
        self.model = load_model(str(path), conventions=overrides)
        d_model = getattr(self.model.config.encoder, "d_model", None)
        if model_size is not None and d_model != RELEASED_D_MODEL[model_size]:
            raise RankgenError(f"{path}: model_size={model_size!r} means d_model {RELEASED_D_MODEL[model_size]}, "
                               f"but this model has d_model {d_model}")
        used = self.model.conventions
        self.truncation = used.truncation
        # "raw" inputs go through the query tower like prefixes, so they share its limit.
        self.max_lengths = {"prefix": used.prefix_length, "suffix": used.suffix_length, "raw": used.prefix_length}
        self.mesh = None
        if len(devices) > 1:
            # A data-only mesh: rows split over the devices, parameters replicated.
            self.mesh = make_mesh(data=-1, model=1, devices=devices)
            self.model.place_on(self.mesh)
        else:
            self.model.params = jax.device_put(self.model.params, devices[0])
        self.devices = devices

    @property
    def dim(self) -> int:
        """Length of the vectors."""
        return self.model.dim

    @property
    def config(self):
        """The model's ModelConfig."""
        return self.model.config

    @property
    def conventions(self):
        """The InputConventions texts are read with (recorded with the model, then the arguments)."""
        return self.model.conventions

    def __repr__(self) -> str:
        return (f"RankGenEncoder({self.model.source!r}, truncation={self.truncation!r}, dim={self.dim}, "
                f"devices={len(self.devices)})")

    def _check_texts(self, texts: Sequence[str], what: str) -> list[str]:
        if isinstance(texts, str):
            raise RankgenError(f"{what}: expected a list of texts, not a single string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise RankgenError(f"{what}[{i}]: expected a string, got {type(text).__name__}")
        return texts

    def _options(self) -> dict[str, Any]:
        return dict(truncation=self.truncation, mesh=self.mesh, memory_budget_bytes=self.memory_budget_bytes)

    def input_ids(self, texts: Sequence[str], side: str, max_length: int | None = None) -> list[list[int]]:
        """The token ids encode() feeds the model for each text (after marker, EOS and truncation)."""
        texts = self._check_texts(texts, "input_ids")
        limit = self._limit(side, max_length)
        return self.model.input_ids(texts, side, limit, truncation=self.truncation)

    def _limit(self, side: str, max_length: int | None) -> int:
        check_encode_side(side)
        return self.max_lengths[side] if max_length is None else _positive(max_length, "max_length")

    def encode(self, texts: str | Sequence[str], side: str | None = None, max_length: int | None = None,
               progress: bool = False, *, vectors_type: str | None = None, verbose: bool | None = None,
               return_input_ids: bool | None = None, return_tensors: str | None = None,
               kind: str | None = None) -> np.ndarray | dict:
        """Vectors [N, D] float32 ([N, P, D] with P perspective heads) of texts in input order; side is "prefix",
        "suffix" or "raw" (no marker).

        The released `rankgen` package's form, encode(inputs,
        vectors_type="prefix", verbose=False, return_input_ids=False), returns
        its dict instead (see released_encode). It is chosen when side is not
        given (e.g. `vectors_type=` is), or by any of its keywords or
        return_tensors; `encode(texts, "prefix")` keeps this form. `kind=` is
        side's old name (deprecated).
        """
        side = renamed_side(side, kind, "encode")
        released_form = (side is None or vectors_type is not None or verbose is not None
                         or return_input_ids is not None or return_tensors is not None)
        if released_form:
            if side is not None and vectors_type is not None:
                raise RankgenError("encode: give side (an array back) or vectors_type (the released dict), not both")
            if max_length is not None or progress:
                raise RankgenError("encode: max_length and progress belong to encode(texts, side); the released "
                                   "form takes vectors_type, verbose, return_input_ids and return_tensors")
            return self.released_encode(texts, vectors_type or side or "prefix", bool(verbose),
                                        bool(return_input_ids), return_tensors or "np")
        if isinstance(texts, str):
            raise RankgenError("encode: expected a list of texts, not a single string "
                               "(the released form, encode(text, vectors_type=...), takes one)")
        texts = self._check_texts(texts, "encode")
        limit = self._limit(side, max_length)
        if not progress:
            return self.model.encode(texts, side, limit, self.batch_size, **self._options())
        with tqdm(total=len(texts), unit="text", desc=f"encode {side}", file=sys.stderr, dynamic_ncols=True) as bar:
            return self.model.encode(texts, side, limit, self.batch_size, on_batch=bar.update, **self._options())

    def released_encode(self, inputs: str | Sequence[str], vectors_type: str = "prefix", verbose: bool = False,
                        return_input_ids: bool = False, return_tensors: str = "np") -> dict[str, Any]:
        """The released RankGenEncoder.encode: {"embeddings": [N, D], "input_ids": list of N id lists}.

        inputs: one string or a list; vectors_type "prefix" or "suffix".
        Embeddings are float32 NumPy, or a torch tensor (on the CPU) with
        return_tensors="pt". input_ids is [] unless return_input_ids; then
        row i holds the ids the model read for input i, padded with the pad id
        to the longest row of its batch of RELEASED_BATCH_SIZE inputs (or
        batch_size, when the encoder was given one), as the released code
        returns them. verbose shows a progress bar.
        """
        if vectors_type not in ("prefix", "suffix"):
            raise RankgenError(f"vectors_type must be 'prefix' or 'suffix', got {vectors_type!r}")
        if return_tensors not in RETURN_TENSORS:
            raise RankgenError(f"return_tensors must be one of {RETURN_TENSORS}, got {return_tensors!r}")
        texts = self._check_texts([inputs] if isinstance(inputs, str) else inputs, "encode inputs")
        embeddings = self.encode(texts, vectors_type, progress=verbose)
        input_ids = self._padded_input_ids(texts, vectors_type) if return_input_ids else []
        if return_tensors == "pt":
            import torch  # optional (the torch extra): only when torch tensors are asked for

            embeddings = torch.from_numpy(embeddings)
        return {"embeddings": embeddings, "input_ids": input_ids}

    def _padded_input_ids(self, texts: list[str], side: str) -> list[list[int]]:
        """input_ids of texts, each batch of the released size padded to its longest row."""
        ids = self.input_ids(texts, side)
        size = self.batch_size or RELEASED_BATCH_SIZE
        pad_id = self.model.text.pad_id
        padded = []
        for start in range(0, len(ids), size):
            batch = ids[start : start + size]
            length = max(len(row) for row in batch)
            padded.extend(row + [pad_id] * (length - len(row)) for row in batch)
        return padded

    def score(self, prefixes: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For each prefix, the raw dot products [C_i] of its vector with its candidates' vectors."""
        prefixes = self._check_texts(prefixes, "score prefixes")
        if isinstance(candidates, str):
            raise RankgenError("score candidates: expected one list of candidates per prefix, not a string")
        candidates = [[c] if isinstance(c, str) else self._check_texts(c, f"score candidates[{i}]")
                      for i, c in enumerate(candidates)]
        return self.model.score(prefixes, candidates, self.batch_size, self.max_lengths["prefix"],
                                self.max_lengths["suffix"], **self._options())


def _decode_line(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        return None


def _is_jsonl(path: Path, lines: list[bytes]) -> bool:
    """JSONL by extension, else when the first non-blank line looks like a JSON object."""
    if path.suffix.lower() in (".jsonl", ".json"):
        return True
    first = next((line for line in lines if line.strip()), b"")
    return first.lstrip().startswith(b"{")


def read_texts(path: str | os.PathLike, side: str) -> tuple[list[str], list[int], list[int]]:
    """(texts, their 1-based line numbers, skipped line numbers) of a JSONL or plain-text input file.

    JSONL lines are objects with the side's field ("prefix" / "suffix") or
    "text" (read by data.jsonl's rules); plain-text files hold one text per
    line. Blank lines, lines that are not valid UTF-8 and, in JSONL, lines
    without a string text field are skipped: every line is either a row or
    a skipped line, so rows can be traced back to their lines.
    """
    check_encode_side(side)
    require_input_file(path, "input")
    source = Path(path)
    # Split on "\n" only, so line numbers match what editors and `wc -l` show.
    lines = source.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if _is_jsonl(source, lines):
        rows = {number: _record_text(record, side) for number, record in parse_lines(lines)}
    else:
        rows = {number: line for number, line in enumerate(map(_decode_line, lines), start=1)
                if line is not None and line.strip()}
    kept = {number: text for number, text in rows.items() if text is not None}
    skipped = [number for number in range(1, len(lines) + 1) if number not in kept]
    return list(kept.values()), list(kept), skipped


def _record_text(record: dict, side: str) -> str | None:
    for field in JSON_FIELDS[side]:
        if field in record:
            return record[field] if isinstance(record[field], str) else None
    return None


def ids_sidecar_path(output: str | os.PathLike) -> Path:
    """FILE.ids.json next to FILE.npy (or OUTPUT.ids.json for another name)."""
    out = Path(output)
    stem = out.name[: -len(".npy")] if out.name.endswith(".npy") else out.name
    return out.with_name(stem + ".ids.json")


def _write_atomic(path: Path, write) -> None:
    """Write through a temporary file, so an interrupted run leaves no half-written output."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def encode_file(encoder: RankGenEncoder, input_path: str, side: str, output: str,
                max_length: int | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Encode an input file into OUTPUT (.npy [N, D] float32, input order); returns counts and paths.

    When lines were skipped, OUTPUT's `.ids.json` sidecar lists the 1-based
    input line number of each row; otherwise a stale sidecar is removed.
    """
    texts, line_ids, skipped = read_texts(input_path, side)
    if not texts:
        raise RankgenError(f"{input_path}: no texts to encode ({len(skipped)} blank or malformed line(s))")
    out = Path(output)
    if out.parent and not out.parent.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
    show = len(texts) >= PROGRESS_MIN_TEXTS if progress is None else progress
    vectors_NxD = encoder.encode(texts, side, max_length=max_length, progress=show).astype(np.float32, copy=False)
    _write_atomic(out, lambda f: np.save(f, vectors_NxD))
    sidecar = ids_sidecar_path(out)
    if skipped:
        _write_atomic(sidecar, lambda f: f.write(json.dumps(line_ids).encode("utf-8")))
    elif sidecar.exists():
        # A sidecar from an earlier run would describe other rows.
        sidecar.unlink()
    return {"rows": len(texts), "dim": int(vectors_NxD.shape[1]), "skipped": len(skipped),
            "skipped_lines": skipped, "output": str(out), "ids": str(sidecar) if skipped else None}


def run_encode(model_path: str | os.PathLike, input_path: str, side: str, output_path: str, *,
               truncation: str | None = None, batch_size: int | None = None, max_length: int | None = None,
               conventions: dict | None = None) -> dict:
    """What `rankgen-jax encode` does: encode_file with the model at model_path, and a summary on stdout.

    truncation and conventions override the model's input conventions, which
    one stderr line names. Returns encode_file's counts and paths.
    """
    # Cheap checks first, before the model is loaded.
    if batch_size is not None:
        _positive(batch_size, "batch_size")
    if max_length is not None:
        _positive(max_length, "max_length")
    require_input_file(input_path, "`input_path`")
    require_output_file(output_path, "`output_path`", create_folder=True)
    encoder = RankGenEncoder(model_path, truncation=truncation, batch_size=batch_size, conventions=conventions)
    print(encoder.model.conventions_note(), file=sys.stderr)
    result = encode_file(encoder, input_path, side, output_path, max_length=max_length)
    if result["skipped"]:
        shown = ", ".join(str(n) for n in result["skipped_lines"][:SHOWN_SKIPPED])
        more = ", ..." if result["skipped"] > SHOWN_SKIPPED else ""
        print(f"note: skipped {result['skipped']} blank or malformed line(s) of {input_path} (line {shown}{more}); "
              f"row line numbers in {result['ids']}", file=sys.stderr)
    print(f"wrote {result['rows']} vectors of dim {result['dim']} to {result['output']}")
    return result
