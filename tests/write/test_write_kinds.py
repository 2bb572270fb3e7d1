"""The kind writers (ckptstore.write.kinds): one function writes every Zarr data file, and each
writer module's names resolve (issue 34)."""
from __future__ import annotations

import ast
import typing
from pathlib import Path

import ckptstore
from ckptstore.write.kinds.index import IndexWriter
from ckptstore.write.kinds.safetensors import SafetensorsWriter
from ckptstore.write.kinds.zarr import ZarrWriter

PACKAGE = Path(ckptstore.__file__).parent


def _callers_of(name: str) -> set[str]:
    """The package modules that call a function named ``name`` (as ``f(...)`` or ``m.f(...)``)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == name:
                    found.add(str(path.relative_to(PACKAGE)))
    return found


def test_one_module_writes_shard_indexes():
    assert _callers_of("shard_index") == {"write/kinds/zarr.py"}


def test_conversion_and_save_write_zarr_data_through_the_one_writer():
    assert _callers_of("write_zarr_data") == {"write/kinds/zarr.py", "write/save.py"}


def test_every_annotation_of_the_kind_writers_names_something_that_exists():
    # SafetensorsWriter.finish_store was annotated with ByteSink, never imported (a NameError for
    # any tool that resolves annotations: typing.get_type_hints, pydantic, sphinx)
    for cls in (ZarrWriter, SafetensorsWriter, IndexWriter):
        for name in ("commit", "finish_store", "manifest_file", "_write"):
            typing.get_type_hints(getattr(cls, name))
