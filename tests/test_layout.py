"""The package's shape: no import cycles, data flowing downward, one CLI, references only to the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rankgen_jax", "rankgen_jax_cpu", "tasks", "benchmarks")
# Entry-point rooms: they may import the library, the library never imports them.
ENTRY_POINTS = ("rankgen_jax.experiments", "rankgen_jax.cli", "benchmarks", "tasks")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _is_library(name: str) -> bool:
    return not any(name == room or name.startswith(room + ".") for room in ENTRY_POINTS)


def _imported_modules(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module of this repository, line, inside a function) for every import in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package[: len(package) - child.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in child.names]
            for target in targets:
                if target in MODULES and target != name:
                    found.append((target, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


GRAPH = {name: _imported_modules(name, path) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in {t for t, _, _ in GRAPH[v]}:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in MODULES:
        if v not in index:
            connect(v)
    return components


def test_the_checker_sees_the_package():
    """The checks below mean something only if the graph has the edges everyone knows are there."""
    assert len(MODULES) > 60
    assert "rankgen_jax.train.step" in {t for t, _, _ in GRAPH["rankgen_jax.train.loop"]}
    assert any(t.startswith("rankgen_jax.experiments") for name, imports in GRAPH.items()
               if name.startswith("rankgen_jax.cli") for t, _, _ in imports)


def test_no_import_cycles():
    assert _cycles() == []


def _room(name: str) -> str:
    """The folder (or top-level module) of the package a module lives in: `rankgen_jax.train.step` -> `train`."""
    parts = name.split(".")
    return parts[1] if parts[0] == "rankgen_jax" and len(parts) > 1 else parts[0]


def test_rooms_depend_on_each_other_one_way():
    """Data flows downward: the folders' own import graph has no cycle (e.g. eval may use lm, never both ways)."""
    rooms: dict[str, set[str]] = {}
    for name, imports in GRAPH.items():
        rooms.setdefault(_room(name), set()).update(_room(t) for t, _, _ in imports if _room(t) != _room(name))
    order, visiting = [], set()

    def visit(room, path):
        if room in order:
            return
        assert room not in visiting, f"rooms import each other: {' -> '.join(path + [room])}"
        visiting.add(room)
        for below in sorted(rooms.get(room, ())):
            visit(below, path + [room])
        visiting.discard(room)
        order.append(room)

    for room in sorted(rooms):
        visit(room, [])
    assert {"models", "data", "train", "losses", "cli", "experiments"} <= set(order)


def test_the_library_never_imports_entry_points():
    offending = [f"{MODULES[name].relative_to(REPO)}:{line} imports {target}"
                 for name, imports in GRAPH.items() if _is_library(name)
                 for target, line, _ in imports if not _is_library(target)]
    assert offending == []


def test_no_core_module_imports_the_cpu_plugin():
    """The CPU kernels are a plug-in: the core reaches them only through the dispatcher's registry, by name."""
    offending = [f"{MODULES[name].relative_to(REPO)}:{line} imports {target}"
                 for name, imports in GRAPH.items() if name.startswith("rankgen_jax.")
                 for target, line, _ in imports if target.split(".")[0] == "rankgen_jax_cpu"]
    assert offending == []
    # Not vacuous: the plug-in is in the graph, and it registers through the core's dispatcher.
    assert "rankgen_jax.ops.dispatch" in {t for t, _, _ in GRAPH["rankgen_jax_cpu.registration"]}


def _below(module: str) -> set[str]:
    """Every module `module` imports, directly or through others."""
    seen, todo = set(), [module]
    while todo:
        for target, _, _ in GRAPH[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_ground_floor_is_the_model_code():
    """Under the models lie only their op implementations (ops/, XLA only) and the error type: no platform tuning."""
    below = {m for name in MODULES if name.startswith("rankgen_jax.models.") for m in _below(name)}
    rooms = {_room(m) for m in below} - {"models"}
    assert rooms == {"ops", "errors"}, rooms


def test_the_train_step_does_not_know_model_kinds():
    source = (REPO / "rankgen_jax" / "train" / "step.py").read_text(encoding="utf-8")
    assert not re.search(r"dual_encoder|cross_encoder|model_kind", source)


@pytest.mark.parametrize("folder", ["rankgen_jax", "tasks", "benchmarks", "tests", "gin_configs", "tpu_scripts", "docs"])
def test_references_stay_inside_the_repository(folder):
    offending = []
    for path in sorted((REPO / folder).rglob("*")):
        if path.suffix not in (".py", ".gin", ".md", ".sh", ".json", ".txt") or path == Path(__file__):
            continue
        text = path.read_text(encoding="utf-8")
        # The team's shared folder beside the checkout is not part of a clone: no path may lead there.
        for pattern in (r"\bDESIGN\.md", r"\.\./shared\b", r"parents\[2\]\s*/\s*[\"']shared",
                        r"[\"']\.\.[\"'],\s*[\"']\.\.[\"'],\s*[\"']shared"):
            offending += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert offending == []


def _layout_entries(page: str) -> list[tuple[Path, list[str]]]:
    """(folder or file of each entry of a page's layout tree, the file names its description mentions)."""
    text = (REPO / page).read_text(encoding="utf-8")
    block = text.split("## Layout\n", 1)[1].split("\n##", 1)[0]
    entries: list[tuple[Path, list[str]]] = []
    for line in block.splitlines():
        if not line.startswith("    ") or not line.strip():
            continue
        match = re.match(r"^    (\s*)(\S+)\s*(.*)$", line)
        indent, head, rest = match.groups()
        if len(indent) <= 2 and head.endswith(("/", ".py")):
            base = REPO / "rankgen_jax" if len(indent) == 2 else REPO
            entries.append((base / head, []))
            text = rest
        else:
            text = line
        entries[-1][1].extend(re.findall(r"[\w/]+\.(?:py|cc|md)\b", text))
    return entries


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_every_path_in_a_layout_tree_is_real(page):
    entries = _layout_entries(page)
    assert len(entries) > 20
    missing = [str(path) for path, _ in entries if not path.exists()]
    missing += [f"{path.name}: {name}" for path, names in entries if path.is_dir() for name in names
                if not list(path.rglob(Path(name).name)) and not (REPO / name).exists()]
    assert missing == []


def test_importing_a_module_sets_no_process_flags():
    """XLA flags and the environment are set by entry points' main(), never as a side effect of an import."""
    offending = []
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            text = ast.unparse(node)
            if isinstance(node, ast.Expr) and re.search(r"configure_xla_flags\(|os\.environ\.(setdefault|update)\(", text):
                offending.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
            if isinstance(node, ast.Assign) and re.search(r"os\.environ\[", text):
                offending.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
    assert offending == []


def test_only_the_cli_parses_arguments():
    """Every entry point of the package is a `rankgen-jax` subcommand: argparse lives in rankgen_jax/cli/ alone."""
    parsing = [name for name, path in MODULES.items() if name.startswith("rankgen_jax.")
               and not name.startswith("rankgen_jax.cli") and re.search(r"^\s*(import argparse|from argparse )",
                                                                        path.read_text(encoding="utf-8"), re.M)]
    assert parsing == []


def test_setup_py_defers_to_pyproject():
    """The promised top-level setup.py exists for older tools and holds no metadata of its own."""
    import subprocess
    import sys

    text = (REPO / "setup.py").read_text(encoding="utf-8")
    assert "setup()" in text and "name=" not in text and "install_requires" not in text
    done = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["rankgen-jax", "0.1.0"]


def _library_trees():
    for name, path in MODULES.items():
        if name.startswith("rankgen_jax.") and _is_library(name):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _wide_functions(tree: ast.AST, limit: int = 10) -> list[tuple[int, str, int]]:
    """(line, name, parameters) of each function taking more than `limit` (self / cls and *args / **kw count)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            count = len(names) - (names[:1] in (["self"], ["cls"])) + (a.vararg is not None) + (a.kwarg is not None)
            if count > limit:
                found.append((node.lineno, node.name, count))
    return found


def test_no_library_function_takes_more_than_ten_parameters():
    """Library calls take option objects, not command lines' worth of parameters."""
    wide = [f"{path.relative_to(REPO)}:{line} {name} ({count})" for path, tree in _library_trees()
            for line, name, count in _wide_functions(tree)]
    assert wide == []
    control = ast.parse("def f(a, b, c, d, e, f, g, h, i, j, *, k): pass\ndef g(self, a, b, c, d, e, f, g, h, i, j): pass")
    assert [name for _, name, _ in _wide_functions(control)] == ["f"]


# A flag may appear inside a whole command the message suggests running (`rankgen-jax cache-tasks --tasks T`).
_COMMAND = re.compile(r"`(rankgen-jax|pip install)[^`]*`|pip install [^)]*")


def _flag_errors(tree: ast.AST) -> list[int]:
    """Lines of RankgenError(...) calls whose message names a --flag outside a suggested command."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RankgenError":
            parts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if re.search(r"(^|[\s(`'\"])--[a-z]", _COMMAND.sub("", "".join(parts))):
                found.append(node.lineno)
    return found


def test_no_library_error_names_a_flag():
    """The library's errors name its own arguments (in backticks, with RankgenError.names); the CLI shows its flags."""
    flagged = [f"{path.relative_to(REPO)}:{line}" for path, tree in _library_trees() for line in _flag_errors(tree)]
    assert flagged == []
    control = ast.parse('RankgenError(f"--top_p must be in (0, 1]")\n'
                        'RankgenError("build it with `rankgen-jax cache-tasks --tasks T`")\n'
                        'RankgenError(f"`top_p` must be in (0, 1]", names=("top_p",))')
    assert _flag_errors(control) == [1]


# The jobs, and the modules that once spread the run folder's layout over their functions.
_FOLDER_USERS = ("rankgen_jax.experiments", "rankgen_jax.train.checkpointing", "rankgen_jax.train.run_record",
                 "rankgen_jax.train.loop", "rankgen_jax.checkpoints.native")


def _path_joins(tree: ast.AST) -> list[int]:
    """Lines that join a name onto a path (`x / "name"`, `x / f"..."`) outside a folder object: a class named
    ...Folder or built on one. A bundled resource (`BUNDLED_CORPUS / "austen"`) is not a folder a job writes."""
    found = []

    def visit(node: ast.AST, in_folder: bool) -> None:
        if isinstance(node, ast.ClassDef):
            in_folder = any(n.endswith("Folder") for n in [node.name, *(getattr(b, "id", "") for b in node.bases)])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and not in_folder:
            named = isinstance(node.right, ast.JoinedStr) or (isinstance(node.right, ast.Constant)
                                                              and isinstance(node.right.value, str))
            base = node.left
            while isinstance(base, ast.BinOp) and isinstance(base.op, ast.Div):
                base = base.left
            resource = isinstance(base, ast.Name) and base.id.isupper()
            if named and not resource:
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_folder)

    visit(tree, False)
    return found


def test_jobs_ask_their_folder_for_every_path():
    """A job's functions name no file of its workdir: its folder object (JobFolder, RunFolder) does."""
    joins = [f"{path.relative_to(REPO)}:{line}" for name, path in MODULES.items()
             if name.startswith(_FOLDER_USERS) for line in _path_joins(ast.parse(path.read_text(encoding="utf-8")))]
    assert joins == []
    control = ast.parse('def f(root):\n    return root / "data"\n'
                        'class PipelineFolder(JobFolder):\n    def data(self):\n        return self.root / f"{1}"\n'
                        'class Job(JobFolder):\n    def d(self):\n        return self.root / "data"\n'
                        'BOOK = BUNDLED_CORPUS / "austen" / "persuasion.txt"\n')
    assert _path_joins(control) == [2]
