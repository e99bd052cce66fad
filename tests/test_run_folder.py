"""The run folder's layout (checkpoints/run_folder.py): one object names every file of a run."""

import os
from pathlib import Path

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RunFolder


def test_every_file_of_a_run_is_a_path_of_its_folder(tmp_path):
    folder = RunFolder.at(tmp_path / "run")
    assert RunFolder.at(folder) is folder and os.fspath(folder) == str(tmp_path / "run") == str(folder)
    names = {
        folder.model_config: "model_config.json", folder.input_conventions: "input_conventions.json",
        folder.provenance: "provenance.json", folder.vocab: "vocab", folder.steps: "checkpoints",
        folder.step(20): "checkpoints/20", folder.damaged_step(20): "checkpoints/20.damaged",
        folder.damaged_step(20, 2): "checkpoints/20.damaged.2", folder.run_config: "run_config.json",
        folder.gin_config: "config.gin", folder.operative_config: "operative_config.gin",
        folder.operative_config_from(40): "operative_configs/from_step_40.gin", folder.metrics: "metrics.jsonl",
        folder.tensorboard: "tensorboard", folder.profile: "profile", folder.file("results.json"): "results.json",
    }
    for path, name in names.items():
        assert str(path) == str(tmp_path / "run" / name)


def test_a_bucket_folder_stays_a_url_and_a_local_one_resolves_as_the_os_opens_it(tmp_path, monkeypatch):
    assert str(RunFolder.at("gs://bucket/run").step(3)) == "gs://bucket/run/checkpoints/3"
    assert str(RunFolder.resolved("gs://bucket/run").metrics) == "gs://bucket/run/metrics.jsonl"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    assert str(RunFolder.resolved("link/../real")) == str((tmp_path / "real").resolve())  # the symlink first
    assert str(RunFolder.resolved(RunFolder.at("link"))) == str((tmp_path / "real").resolve())


def test_the_checkpoint_module_reads_and_writes_through_it(tmp_path):
    folder = RunFolder.at(tmp_path / "ckpt")
    folder.root.mkdir()
    native.save_provenance(folder, {"license": "apache-2.0"})
    assert native.load_provenance(tmp_path / "ckpt") == {"license": "apache-2.0"}
    assert Path(folder.provenance).is_file()
    for start in (0, 50):
        folder.operative_configs.mkdir(parents=True, exist_ok=True)
        folder.operative_config_from(start).write_text(f"# from {start}\n")
    assert folder.operative_config_starts() == {0: folder.operative_config_from(0), 50: folder.operative_config_from(50)}
    assert native.operative_config_for_step(folder, 80) == folder.operative_config_from(50)
    assert native.operative_config_for_step(folder, 50) == folder.operative_config_from(0)
