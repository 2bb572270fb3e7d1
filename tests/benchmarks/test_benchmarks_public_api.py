"""The benchmarks drive ckptstore through its public API only (issue 27), so a refactor of the
library's internals cannot break them.

Every ``benchmarks/**/*.py`` is read with :mod:`ast` (nothing imported). Allowed of ckptstore: the
package itself and its public names (``ckptstore.__all__``), ``ckptstore.errors``, and the test
machinery ``ckptstore.testing.*`` (which may use internals: the test suite keeps it working).
Four modules are allow-listed explicitly, each saying why: ``benchmarks/compat.py`` (the public
route is missing for an old revision without ``StoreSaver`` raced by ``bench_versions``), and the
benchmark-only helpers moved out of the installed package (issue 34): ``benchmarks/fixtures.py``
(the benchmarks' inputs: a rank's tensors, rank files read for the peers, the sparse rank-file
writer), ``benchmarks/index_profile.py`` (``bench_index --profile`` times ckptstore's internals
by name) and ``benchmarks/load_profile.py`` (``bench_load``'s step-by-step row: ``materialize``
taken apart, which needs the ``to_parameter`` and ``collector_paused`` it calls).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import ckptstore
from repo_paths import REPO

BENCHMARKS = REPO / "benchmarks"
#: The modules allowed to reach below the public API (see their docstrings).
ALLOWED_FILES = {BENCHMARKS / "compat.py", BENCHMARKS / "fixtures.py", BENCHMARKS / "index_profile.py",
                 BENCHMARKS / "load_profile.py"}
#: Submodules of ckptstore a benchmark may import (with everything below them).
ALLOWED_MODULES = ("errors", "testing")
PUBLIC = set(ckptstore.__all__)
PACKAGE = Path(ckptstore.__file__).parent
#: A string that is exactly a dotted ckptstore path (optionally ``:name``), e.g. a worker's preimport;
#: it names a module when its second part is one of the package's (``ckptstore.json`` is a file name).
MODULE_STRING = re.compile(r"ckptstore(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")


def _files() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(BENCHMARKS.rglob("*.py")):
        if path in ALLOWED_FILES or "cache" in path.relative_to(BENCHMARKS).parts:
            continue
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{node.lineno}"


def _module_allowed(module: str) -> bool:
    parts = module.split(".")
    return parts[0] != "ckptstore" or len(parts) == 1 or parts[1] in ALLOWED_MODULES


def test_benchmarks_import_only_ckptstore_public_modules() -> None:
    bad = []
    for path, tree in _files():
        for node in ast.walk(tree):  # module level and inside functions alike
            if isinstance(node, ast.Import):
                bad += [f"{_where(path, node)}: import {a.name}" for a in node.names if not _module_allowed(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not _module_allowed(node.module):
                    bad.append(f"{_where(path, node)}: from {node.module} import ...")
                elif node.module == "ckptstore":
                    bad += [f"{_where(path, node)}: from ckptstore import {a.name}" for a in node.names
                            if a.name not in PUBLIC and a.name not in ALLOWED_MODULES]
    assert not bad, "benchmarks import ckptstore internals:\n" + "\n".join(bad)


def test_benchmarks_use_only_public_attributes_of_ckptstore() -> None:
    bad = []
    for path, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ckptstore":
                if node.attr not in PUBLIC and node.attr not in ALLOWED_MODULES and not node.attr.startswith("__"):
                    bad.append(f"{_where(path, node)}: ckptstore.{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "ckptstore" \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value not in PUBLIC:
                bad.append(f"{_where(path, node)}: getattr(ckptstore, {node.args[1].value!r})")
    assert not bad, "benchmarks reach ckptstore internals through attributes:\n" + "\n".join(bad)


def test_benchmarks_name_no_internal_ckptstore_module_to_import() -> None:
    """A module named in a string (a worker's ``preimport``, ``importlib.import_module``) is an import too."""
    bad = []
    for path, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
                module, _, name = node.value.partition(":")
                parts = module.split(".")
                names_module = (len(parts) == 1 or (PACKAGE / parts[1]).is_dir()
                                or (PACKAGE / f"{parts[1]}.py").is_file())
                if (names_module and not _module_allowed(module)) or (module == "ckptstore" and name
                                                                      and name not in PUBLIC):
                    bad.append(f"{_where(path, node)}: {node.value!r}")
    assert not bad, "benchmarks name ckptstore internals to import:\n" + "\n".join(bad)
