"""Loading never runs code from the data: no pickle on any load path, no code from model folders,
no shell for paths and strings from gin.

- the package source (AST, not text: docstrings may mention what the code must not do) has no
  pickle-family import, torch.load, allow_pickle=True, eval/exec/__import__, shell=True, os.system,
  unsafe yaml, and trust_remote_code=True only where the code loads a folder it has just exported;
- an exported HF folder whose modeling_rankgen.py, __init__.py and pytorch_model.bin would each
  write a marker file when imported / unpickled loads through our loaders without writing it;
- a workdir and a gin file whose names hold `$(...)`, backticks and `;` train and resume without
  running any of it, and sweep's printed launch lines keep such values quoted.
"""

import ast
import json
import os
import pickle
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rankgen_jax
from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.hf import t5 as hf
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.cli.main import main
from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, T5Config
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.testing import random_params

from test_trainer import TINY

PACKAGE = Path(rankgen_jax.__file__).parent
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
# Files that load, on purpose, a folder the same code has just exported (to check it works in
# transformers; export_check.py only once each modeling file is the package's own, tests/test_export_check.py);
# nothing else may pass trust_remote_code=True.
REMOTE_CODE_ALLOWED = {"smoke.py", "bench_encode.py", "export_check.py"}


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_uses(path: Path) -> list[str]:
    """`file:line what` for each use of a code-running loader or a shell in one source file."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if a.name.split(".")[0] in PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLE_MODULES:
            found.append(f"{where} from {node.module} import")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if name in ("eval", "exec", "__import__", "compile", "execfile"):
                found.append(f"{where} {name}()")
            if name in ("torch.load", "os.system", "os.popen", "yaml.load", "yaml.unsafe_load", "yaml.full_load"):
                found.append(f"{where} {name}()")
            if name.split(".")[0] in PICKLE_MODULES:
                found.append(f"{where} {name}()")
            if _is_true(keywords.get("allow_pickle")):
                found.append(f"{where} {name}(allow_pickle=True)")
            if _is_true(keywords.get("shell")):
                found.append(f"{where} {name}(shell=True)")
            if _is_true(keywords.get("trust_remote_code")) and path.name not in REMOTE_CODE_ALLOWED:
                found.append(f"{where} {name}(trust_remote_code=True)")
    return found


def test_no_load_path_runs_code_from_data():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30
    found = [use for path in files for use in unsafe_uses(path)]
    assert found == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    probe = tmp_path / "probe.py"
    source = ("import pickle\nimport torch\nimport subprocess\nimport numpy as np\n"
              "torch.load('x')\nnp.load('x', allow_pickle=True)\neval('1')\nsubprocess.run('ls', shell=True)\n"
              "pickle.loads(b'')\nAutoModel.from_pretrained('x', trust_remote_code=True)\n")
    probe.write_text(source)
    assert len(unsafe_uses(probe)) == 7


# --- exported folders --------------------------------------------------------------------------


class _WritesMarker:
    """Unpickling this writes a file: a stand-in for any code a pickle can run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def _plant(folder: Path, marker: Path) -> None:
    """Code that would write `marker` if anything imported or unpickled it."""
    payload = f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
    assert (folder / "modeling_rankgen.py").is_file()  # the file transformers' remote code would import
    (folder / "modeling_rankgen.py").write_text(payload + (folder / "modeling_rankgen.py").read_text())
    (folder / "__init__.py").write_text(payload)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_WritesMarker(marker)))
    config = json.loads((folder / "config.json").read_text())
    assert "auto_map" in config  # transformers would follow it to modeling_rankgen.py with trust_remote_code


@pytest.fixture(scope="module")
def exported(tmp_path_factory, spiece_model) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("security")
    config = ModelConfig(encoder=T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16),
                         head=RANKGEN_HEAD)
    params = random_params(config, 4)
    native.save_params(root / "ckpt", config, params, vocab=spiece_model)
    export_hf(str(root / "ckpt"), str(root / "hf $(touch pwned) `touch pwned`"))
    return root, params


def test_loading_an_exported_folder_runs_no_code_from_it(tmp_path, capsys, exported):
    root, params = exported
    folder = tmp_path / "hf $(touch pwned)"
    shutil.copytree(root / "hf $(touch pwned) `touch pwned`", folder)
    marker = tmp_path / "marker"
    _plant(folder, marker)

    _, loaded, _ = hf.load_hf_folder(str(folder))
    np.testing.assert_array_equal(loaded["projection_layer"]["kernel"], params["projection_layer"]["kernel"])
    model = load_model(str(folder))
    assert model.encode(["a prefix"], side="prefix").shape == (1, 32)
    assert main(["import", "--from", "hf", "--path", str(folder), "--out", str(tmp_path / "imported")]) == 0
    assert main(["score", "--model", str(folder), "--input", str(_score_input(tmp_path)), "--no_progress"]) == 0
    capsys.readouterr()
    assert not marker.exists()
    assert not list(tmp_path.rglob("pwned")) and not list(Path.cwd().glob("pwned"))

    # Without safetensors the pickle is refused, not read.
    (folder / "model.safetensors").unlink()
    with pytest.raises(RankgenError, match="pickle"):
        hf.load_hf_folder(str(folder))
    with pytest.raises(RankgenError, match="pickle"):
        load_model(str(folder))
    assert not marker.exists()
    # Control: the planted code does write the marker when something runs it.
    runpy.run_path(str(folder / "__init__.py"))
    assert marker.read_text() == "imported"
    marker.unlink()
    pickle.loads((folder / "pytorch_model.bin").read_bytes())
    assert marker.read_text() == "unpickled"


def _score_input(tmp_path: Path) -> Path:
    path = tmp_path / "score.jsonl"
    path.write_text(json.dumps({"prefix": "the sea", "candidates": ["waves", "desk"], "label": 0}) + "\n")
    return path


# --- paths and strings from gin ----------------------------------------------------------------

SHELLY = "$(touch pwned_dollar) `touch pwned_tick`; touch pwned_semi"


def test_paths_from_gin_are_never_run_by_a_shell(tmp_path):
    gin_dir = tmp_path / f"gin {SHELLY}"
    gin_dir.mkdir()
    shutil.copyfile(PACKAGE.parent / "gin_configs" / "models" / "t5_1_1_tiny.gin", gin_dir / "model.gin")
    workdir = tmp_path / f"run {SHELLY}"
    args = [a for a in TINY if not a.startswith("--gin_file")]
    # One device and a compilation cache: a quicker compile, and the resume reads it back.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    cmd = [sys.executable, "-m", "rankgen_jax.cli.main", "train", f"--workdir={workdir}", f"--gin_file={gin_dir / 'model.gin'}",
           *args, "--gin.TrainerConfig.checkpoint_every=1"]
    for steps in (2, 3):  # a fresh run, then a resume
        done = subprocess.run([*cmd, f"--gin.TrainerConfig.num_steps={steps}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert f"resuming from {workdir}/checkpoints/2" in done.stderr
    assert (workdir / "checkpoints" / "3").is_dir()
    assert not [p for p in tmp_path.rglob("pwned*")]
    assert not list(Path.cwd().glob("pwned*"))


def test_sweep_launch_lines_keep_values_quoted(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"gin_files": [f"x {SHELLY}.gin"],
                                "axes": {"ExamplesData.corpus": [f"/data/{SHELLY}"]}}))
    assert main(["sweep", "--grid", str(grid), "--workdir", str(tmp_path / f"runs {SHELLY}"),
                 "--tpu_name", "slice"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("python3")]
    assert len(lines) == 1
    # Pasted into a shell, the line only assigns arguments: nothing in it runs.
    subprocess.run(["bash", "-c", f"set -- {lines[0]}"], cwd=tmp_path, check=True, timeout=30)
    assert not list(tmp_path.rglob("pwned*"))


# --- nothing is imported from the folder a command runs in ------------------------------------------------


@pytest.mark.parametrize("command", ["rankgen-jax", "rankgen-jax-cpu"])
def test_no_module_from_the_working_folder_runs(tmp_path, command):
    """A `tqdm.py` and a `numpy.py` planted where a user runs the command: it works, neither runs.

    `rankgen-jax-cpu` executes `python -P -m rankgen_jax.cli.main` (the CPU plug-in's malloc setting acts only
    at a process's start); that new process must not put the working folder on sys.path either.
    """
    script = Path(sys.executable).parent / command
    if not script.is_file():
        pytest.skip(f"no console script beside {sys.executable}")
    marker = tmp_path / "PWNED"
    for name in ("tqdm", "numpy"):
        (tmp_path / f"{name}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text({name!r})\n")
    (tmp_path / "v.jsonl").write_text(json.dumps({"prefix": "a b c", "candidates": ["a b", "x y"], "label": 0}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    proc = subprocess.run([str(script), "score", "--method", "unigram", "--input", "v.jsonl", "--output", "o.jsonl"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), f"{marker.read_text()}.py from the working folder ran"
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "o.jsonl").read_text())["scores"][0] > 0
    assert json.loads(proc.stdout.strip().splitlines()[-1])["accuracy"] == 1.0
