"""An export checked as it is written: probe texts through the JAX model, and through the exported folder loaded
the way its users load it; a difference beyond the tolerance fails the export and leaves the folder unusable.

The loader is the layout's: sentence-transformers' `SentenceTransformer(folder)` where the export has its files
(the folder's own tokenizer, prompts and truncate_dim then take part), `AutoModel.from_pretrained(folder,
trust_remote_code=True)` for the RankGen and ranker formats and `AutoModelForSequenceClassification` for a
sequence-classification ranker, these fed the token ids rankgen-jax reads the probes as. A dual encoder's
probes go through both sides (query and document), a ranker's as pairs. An export of the encoder alone (a
bare encoder, a T5 ranker's encoder, a head sentence-transformers cannot express) is compared by its last
hidden states, loaded as `T5EncoderModel` or the BERT family's `AutoModel`. The difference is the largest
absolute one, divided by the largest JAX entry where that is over 1 (unnormalised vectors reach ~10 and fp32
rounding grows with them).

The JAX side runs in float32 at full matmul precision whatever the model's activation dtype: the export holds
the weights, which its loaders run in float32, and a bfloat16 forward differs from that by ~1e-2.

A failed export has every weight file renamed `*.safetensors.unverified`, so no loader picks it up silently,
and EXPORT_CHECK_FAILED.txt saying what differed. Without torch and transformers nothing is compared, and the
model card says so.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import jax
import numpy as np

from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.data.text import TextEncoder, encode_pair_truncated, pad_batch
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.models.factory import build_model, to_model_layout
from rankgen_jax.models.heads import build_backbone

# Short enough that no input convention or sentence-transformers length cuts them.
PROBES = ("The river rose after three days of rain.", "She read the letter again by candle light.",
          "Numbers 1234 and 56, and punctuation: yes!", "Ünïcode café, naïve façade.",
          "He would come back from the sea", "a", "The old house stood silent on the moor while the wind blew.")
TOLERANCE = 1e-4
FAILED_MARKER = "EXPORT_CHECK_FAILED.txt"
UNVERIFIED_SUFFIX = ".unverified"


@dataclasses.dataclass(frozen=True)
class ExportedModel:
    """The exported parameters as the JAX model reads them: config, parameters (canonical layout), tokenizer and
    input conventions. Probes are short: read whole on both sides, with the side's marker."""

    config: ModelConfig
    params: dict
    text: TextEncoder
    conventions: InputConventions

    def _float32(self) -> ModelConfig:
        return dataclasses.replace(self.config, encoder=dataclasses.replace(self.config.encoder, dtype="float32"))

    def _apply(self, module, params: dict, *args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return module.apply({"params": to_model_layout(params, self.config)}, *args, **kwargs)

    def _padded(self, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids [B, L] padded, their mask, each row's length)."""
        lengths = np.array([len(row) for row in ids])
        ids_BxL = pad_batch(ids, int(lengths.max()), self.text.pad_id)
        return ids_BxL, np.arange(ids_BxL.shape[1])[None, :] < lengths[:, None], lengths

    def input_ids(self, side: str) -> list[list[int]]:
        marker = self.conventions.prefix_marker if side == "prefix" else self.conventions.suffix_marker
        return [self.text.add_special(self.text.tokenize(marker + probe)) for probe in self.probes()]

    def probes(self) -> list[str]:
        """The probes that no side's length limit cuts (the shortest always)."""
        limit = min(self.conventions.prefix_length, self.conventions.suffix_length)
        markers = (self.conventions.prefix_marker, self.conventions.suffix_marker)
        fits = [p for p in PROBES if all(len(self.text.add_special(self.text.tokenize(m + p))) <= limit
                                         for m in markers)]
        return fits or [min(PROBES, key=len)]

    def vectors(self, side: str) -> np.ndarray:
        ids_BxL, mask_BxL, _ = self._padded(self.input_ids(side))
        tower = "query" if self.config.shared_towers or side == "prefix" else "document"
        return np.asarray(self._apply(build_model(self._float32()), self.params, ids_BxL, mask_BxL, tower=tower),
                          np.float32)

    def probe_ids(self) -> list[list[int]]:
        """Each probe as the encoder alone reads it: no side's marker, special tokens added."""
        return [self.text.add_special(self.text.tokenize(probe)) for probe in PROBES]

    def hidden_states(self, params: dict) -> np.ndarray:
        """The encoder's last hidden states of every probe's tokens, rows concatenated [T, D]; `params` hold the
        encoder (a head's parameters beside it are not read)."""
        ids_BxL, mask_BxL, lengths = self._padded(self.probe_ids())
        output = self._apply(build_backbone(self._float32().encoder), params, ids_BxL, mask_BxL)
        states_BxLxD = np.asarray(output.last_hidden_state, np.float32)
        return np.concatenate([states_BxLxD[row, :length] for row, length in enumerate(lengths)])

    def pairs(self) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) of each probe paired with the next, cut as the ranker reads pairs (within the
        encoder's positions)."""
        first, second = self.conventions.prefix_length, self.conventions.suffix_length
        positions = getattr(self.config.encoder, "max_position_embeddings", None)
        if positions is not None and first + second > positions - self.config.encoder.position_offset:
            room = positions - self.config.encoder.position_offset
            first = min(first, room // 2)
            second = room - first
        probes = list(PROBES)
        return [encode_pair_truncated(self.text, q, c, first, second, self.conventions.prefix_keep)
                for q, c in zip(probes, probes[1:] + probes[:1])]

    def pair_scores(self) -> np.ndarray:
        model = build_model(self._float32())
        scores = []
        for ids, types in self.pairs():
            mask = np.ones((1, len(ids)), bool)
            scores.append(np.asarray(self._apply(model, self.params, np.array([ids], np.int32), mask,
                                                 np.array([types], np.int32)), np.float32)[0])
        return np.asarray(scores, np.float32)


@dataclasses.dataclass(frozen=True)
class ExportCheck:
    """loader: how the folder was loaded ("" when not compared, with `note` saying why); difference: the largest
    (relative) difference found."""

    loader: str
    difference: float = math.nan
    tolerance: float = TOLERANCE
    note: str = ""

    def describe(self) -> str:
        if not self.loader:
            return f"Not checked when exported: {self.note}."
        return (f"Checked when exported: probe texts through rankgen-jax (JAX) and through "
                f"`{self.loader}`: largest difference {self.difference:.1e} (tolerance {self.tolerance:.0e}).")


def _relative_difference(jax_values: np.ndarray, torch_values: np.ndarray) -> float:
    jax_values, torch_values = np.asarray(jax_values, np.float64), np.asarray(torch_values, np.float64)
    if jax_values.shape != torch_values.shape or not np.all(np.isfinite(torch_values)):
        return math.inf
    return float(np.abs(jax_values - torch_values).max()) / max(1.0, float(np.abs(jax_values).max()))


def _sentence_transformers(out: Path, model: ExportedModel) -> tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    import sentence_transformers

    st_model = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    compared = []
    for side, prompt in (("prefix", "query"), ("suffix", "document")):
        named = {"prompt_name": prompt} if prompt in (st_model.prompts or {}) else {}
        got = st_model.encode(model.probes(), convert_to_numpy=True, task=prompt, **named)
        compared.append((f"{side} vectors", model.vectors(side)[:, : st_model.truncate_dim], got))
    return "SentenceTransformer(folder)", compared


# The modeling files an export carries: the package's own, which remote code must be before it runs.
PACKAGED_MODELING = Path(__file__).resolve().parent / "hf"


def _require_own_modeling_code(folder: Path) -> None:
    """trust_remote_code runs the folder's modeling_*.py: only when each is byte for byte the package's own (as
    export_hf writes them), so that checking a folder never runs code that came with it."""
    for modeling in folder.glob("modeling_*.py"):
        own = PACKAGED_MODELING / modeling.name
        if not own.is_file() or own.read_bytes() != modeling.read_bytes():
            raise RankgenError(f"{modeling}: not rankgen-jax's own {modeling.name}; the check does not load a folder "
                               "whose remote code it did not write")


def _remote_code_model(folder: Path, auto_class: str = "AutoModel"):
    import transformers

    _require_own_modeling_code(folder)
    return getattr(transformers, auto_class).from_pretrained(str(folder), trust_remote_code=True).eval()


def _remote_code_vectors(torch_model, ids: list[list[int]]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return np.stack([torch_model(input_ids=torch.tensor([row])).numpy()[0] for row in ids])


def _rankgen_format(out: Path, model: ExportedModel) -> tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    compared, loaded = [], {}
    for side, tower in (("prefix", "query"), ("suffix", "document")):
        folder = out if model.config.shared_towers else out / f"{tower}_encoder"
        if folder not in loaded:  # shared towers: one folder, loaded once
            loaded[folder] = _remote_code_model(folder)
        compared.append((f"{side} vectors", model.vectors(side), _remote_code_vectors(loaded[folder],
                                                                                      model.input_ids(side))))
    return "AutoModel.from_pretrained(folder, trust_remote_code=True)", compared


def _ranker(out: Path, model: ExportedModel,
            sequence_classification: bool) -> tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    import torch
    import transformers

    want = model.pair_scores()
    if sequence_classification:
        loader = "AutoModelForSequenceClassification.from_pretrained(folder)"
        torch_model = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    else:
        loader = "AutoModel.from_pretrained(folder, trust_remote_code=True)"
        torch_model = _remote_code_model(out)
    got = []
    with torch.no_grad():
        for ids, types in model.pairs():
            inputs = {"input_ids": torch.tensor([ids])}
            if model.config.encoder_type == "bert" and model.config.encoder.variant != "distilbert":
                inputs["token_type_ids"] = torch.tensor([types])
            output = torch_model(**inputs)
            scores = output.logits if sequence_classification else output
            scores = scores.numpy()[0]
            got.append(scores[0] if sequence_classification and model.config.num_scores == 1 else scores)
    return loader, [("pair scores", want, np.asarray(got, np.float32))]


def _encoder_alone(out: Path, model: ExportedModel,
                   layout: str) -> tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    """The encoder's last hidden states, for an export that holds the encoder alone (each tower's folder for a
    two-tower model)."""
    import torch
    import transformers

    loader = "T5EncoderModel" if layout == "t5-encoder" else "AutoModel"
    if model.config.kind == "dual_encoder" and not model.config.shared_towers:
        folders = [(f"{tower} encoder", out / f"{tower}_encoder", model.params[f"{tower}_tower"])
                   for tower in ("query", "document")]
    else:
        folders = [("encoder", out, model.params)]
    compared = []
    for what, folder, params in folders:
        torch_model = getattr(transformers, loader).from_pretrained(str(folder)).eval()
        with torch.no_grad():
            got = np.concatenate([torch_model(input_ids=torch.tensor([row])).last_hidden_state.numpy()[0]
                                  for row in model.probe_ids()])
        compared.append((f"{what} last hidden states", model.hidden_states(params), got))
    return f"{loader}.from_pretrained(folder), the encoder's last hidden states", compared


def verify_export(out: str | Path, model: ExportedModel, layout: str, sentence_transformers_files: bool) -> ExportCheck:
    """Compare the export in `out` with `model` (what was exported); layout: convert.hf_layout's.

    Returns what was compared; a difference over TOLERANCE marks the folder (see the module docstring) and
    raises a RankgenError naming it.
    """
    out = Path(out)
    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        return ExportCheck("", note="torch and transformers are not installed (`pip install rankgen-jax[torch]`)")
    if layout in ("t5-encoder", "bert") and not sentence_transformers_files:
        loader, compared = _encoder_alone(out, model, layout)
    elif model.config.kind == "cross_encoder":
        loader, compared = _ranker(out, model, layout == "sequence-classification")
    elif sentence_transformers_files:
        loader, compared = _sentence_transformers(out, model)
    else:
        loader, compared = _rankgen_format(out, model)
    differences = {what: _relative_difference(want, got) for what, want, got in compared}
    worst = max(differences.values())
    if worst > TOLERANCE:
        report = "; ".join(f"{what}: {diff:.2e}" for what, diff in differences.items())
        _mark_failed(out, f"{loader} gives other values than the JAX model for the probe texts ({report}; tolerance "
                          f"{TOLERANCE:.0e}).\n")
        raise RankgenError(f"{out}: the export, loaded with {loader}, differs from the JAX model by {worst:.2e} "
                           f"(tolerance {TOLERANCE:.0e}; {report}); its weights are renamed *{UNVERIFIED_SUFFIX} "
                           f"and {FAILED_MARKER} says why")
    return ExportCheck(loader, worst)


def _mark_failed(out: Path, why: str) -> None:
    for weights in out.rglob("*.safetensors"):
        weights.rename(weights.with_name(weights.name + UNVERIFIED_SUFFIX))
    (out / FAILED_MARKER).write_text("This export failed its check and is not to be used: " + why, encoding="utf-8")


def clear_failed(out: str | Path) -> None:
    """Remove an earlier failed export's marker and unverified weights (an export over it starts clean)."""
    out = Path(out)
    (out / FAILED_MARKER).unlink(missing_ok=True)
    for stale in out.rglob(f"*.safetensors{UNVERIFIED_SUFFIX}"):
        stale.unlink()
