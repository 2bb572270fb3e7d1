"""The package's modules import each other without a circle and only downwards, floor by floor
(issue 34: with no exception), and the runtime leaves test machinery (``ckptstore.testing``)
and MindSpore alone (issue 16).

Read from the source with :mod:`ast`, so no module is imported: every ``import`` at a module's
top level counts, including those under ``if TYPE_CHECKING:`` (a circle hidden from the
interpreter is still one for a reader); the floors and the second circle check count imports
inside functions (MindSpore and zarr on first use) too.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ckptstore

PACKAGE = Path(ckptstore.__file__).parent


def _module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _top_level_imports(source: str, modules: dict[str, Path]) -> set[str]:
    """The package modules ``source`` imports at its top level (``if``/``try`` blocks included)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptstore"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("ckptstore"))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(source).body)
    return {m for m in found if m in modules}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return circles


def test_no_module_of_the_package_imports_itself_through_others():
    modules = _module_names()
    graph = {name: _top_level_imports(path.read_text(encoding="utf-8"), modules) - {name}
             for name, path in modules.items()}
    assert _circles(graph) == []


def test_an_import_under_type_checking_counts():
    # the check above would pass vacuously if TYPE_CHECKING blocks were not read
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ckptstore.boxes import Box\n"
    assert _top_level_imports(source, _module_names()) == {"ckptstore.boxes"}


def test_an_import_inside_a_function_does_not_count():
    source = "def f():\n    from ckptstore.boxes import Box\n"
    assert _top_level_imports(source, _module_names()) == set()


def _all_imports(source: str) -> set[str]:
    """Every ``ckptstore`` module ``source`` names in an import, at any depth (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptstore"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ckptstore"))
    return found


def _graph_at_any_depth() -> dict[str, set[str]]:
    modules = _module_names()
    return {name: {m for m in _all_imports(path.read_text(encoding="utf-8")) if m in modules} - {name}
            for name, path in modules.items()}


#: The floors of the package, bottom first: a module imports (at any depth, inside functions too)
#: only modules of its own room or of a lower floor. Rooms on one floor do not import each other.
#: Issue 34: no exception. (The write side reaches MindSpore's adapter of Cells through the hook
#: the package installs, ckptstore.adapters; store/chunking.py's chunk plan went to write/.)
FLOORS: tuple[frozenset[str], ...] = tuple(frozenset(f.split()) for f in (
    "errors limits version dtypes boxes registry progress adapters collector",
    "io launcher",
    "formats",
    "store",
    "checkpoint",
    "write",
    "read",  # verify re-plans a conversion's chunks (write.chunk_plan) to compare with the source
    "mindspore",
    "counters",  # the public I/O snapshot reads the counters of io and store
    "ckptstore",  # the package: the public names
    "cli",
    "__main__",
    "testing",  # the fixtures, the oracle and the conformance classes drive the public API and the CLI
    "demo",  # 'make demo' saves its sample with ckptstore.testing
))


def _room(module: str) -> str:
    """The room of a module: its sub-package (``ckptstore.store.kinds.zarr`` -> ``store``), or
    the top-level module's own name; ``ckptstore`` for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ckptstore"


def _floor(module: str) -> int:
    room = _room(module)
    found = [i for i, rooms in enumerate(FLOORS) if room in rooms]
    assert found, f"room {room!r} ({module}) is on no floor: add it to FLOORS"
    return found[0]


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if _room(a) != _room(b) and _floor(b) >= _floor(a))


def test_every_room_of_the_package_is_on_a_floor():
    for module in _module_names():
        _floor(module)


def test_no_module_imports_from_its_own_floor_or_a_higher_one_even_inside_a_function():
    assert _upward(_graph_at_any_depth()) == []


def test_an_upward_import_inside_a_function_is_seen():
    # the check above would pass vacuously if imports inside functions were not read
    graph = {"ckptstore.write.values": {"ckptstore.mindspore.values"}}
    assert _upward(graph) == [("ckptstore.write.values", "ckptstore.mindspore.values")]


def test_no_circle_even_counting_imports_inside_functions():
    assert _circles(_graph_at_any_depth()) == []


#: Modules outside ckptstore.testing that may use it: ``make demo`` saves its sample with the
#: sample writer and compares with MindSpore's oracle; nothing imports the demo (checked below).
_MAY_USE_TESTING = {"ckptstore.demo"}


def test_the_runtime_package_does_not_import_ckptstore_testing():
    users = {name for name, path in _module_names().items()
             if not (name == "ckptstore.testing" or name.startswith("ckptstore.testing."))
             and any(m == "ckptstore.testing" or m.startswith("ckptstore.testing.")
                     for m in _all_imports(path.read_text(encoding="utf-8")))}
    assert users == _MAY_USE_TESTING
    importers_of_demo = {name for name, path in _module_names().items()
                         if "ckptstore.demo" in _all_imports(path.read_text(encoding="utf-8"))}
    assert importers_of_demo == set()


def test_an_import_of_ckptstore_testing_inside_a_function_is_seen():
    source = "def f():\n    from ckptstore.testing import oracle\n"
    assert "ckptstore.testing" in _all_imports(source)


def test_importing_ckptstore_imports_neither_mindspore_nor_ckptstore_testing():
    code = "import ckptstore, sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore' " \
           "or m.startswith('ckptstore.testing') or m == 'ckptstore.mindspore'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


#: A fresh interpreter opens a store, reads one tensor and prints the write modules it imported.
_READ_A_STORE = """
import sys
import ckptstore
with ckptstore.open(sys.argv[1]) as store:
    store.read(store.names()[0])
print(sorted(m for m in sys.modules if m == "ckptstore.write" or m.startswith("ckptstore.write.")))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zarr", "safetensors", "index"])
def test_reading_a_store_imports_no_write_module(saved_layout, tmp_path, kind):
    # every store kind names its writer by a string (ckptstore.store.kinds.<kind>.KIND.writer) and
    # the package imports convert/index/commit/save_rank on first use, so that opening a store
    # (which imports every kind's declaration) and reading it import nothing of ckptstore.write
    layout = saved_layout("dp2_mp4")
    if kind == "index":
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
    else:
        ckptstore.convert(layout.root, tmp_path / "s", strategy=layout.strategy_files, format=kind)
    out = subprocess.run([sys.executable, "-c", _READ_A_STORE, str(tmp_path / "s")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_importing_ckptstore_and_looking_types_up_by_name_leave_ml_dtypes_unimported():
    # ml_dtypes costs more to import than the rest of ckptstore (0.6 s here): only bfloat16 needs it
    code = ("import ckptstore, sys, numpy as np\n"
            "from ckptstore.dtypes import lookup, is_float\n"
            "assert lookup(np.float32).name == 'float32' and is_float('bfloat16')\n"
            "assert lookup('BFloat16').name == 'bfloat16'\n"
            "print('ml_dtypes' in sys.modules)\n"
            "from ckptstore.dtypes import BFLOAT16\n"
            "print('ml_dtypes' in sys.modules, BFLOAT16.name, lookup(BFLOAT16).mindspore)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["False", "True bfloat16 BFloat16"]


def test_converting_a_checkpoint_without_bfloat16_into_zarr_leaves_ml_dtypes_unimported(saved_layout, tmp_path):
    # zarr's bfloat16 data type is registered (importing ml_dtypes, 0.6 s here) only for a bfloat16 array
    layout = saved_layout("dp2_mp4")
    code = ("import sys, ckptstore\n"
            "ckptstore.convert(sys.argv[1], sys.argv[2], strategy=sys.argv[3:], quiet=True)\n"
            "print('ml_dtypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(layout.root), str(tmp_path / "s"),
                          *map(str, layout.strategy_files)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
