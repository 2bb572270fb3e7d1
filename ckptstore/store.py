"""``ckptstore.open(path)``: a converted store, read by parameter and by slice.

Opening reads one file, the root ``zarr.json`` whose attributes hold the manifest, and
validates it; nothing else is touched until a read. :meth:`Store.read` plans the chunks that
overlap the requested index and reads only their bytes into one array.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .backends import read_manifest
from .backends import safetensors_backend as sb
from .boxes import Box
from .convert import WORK_DIR
from .errors import IncompleteStoreError, StoreCorruptError, StoreNotFoundError
from .manifest import ParamManifest, StoreManifest
from .planner import ParamReadPlan, plan_param
from .reader import StoreFiles, execute

Index = Any  # an int, a slice, or a tuple of them


class Store:
    """A complete ckptstore store. Thread-safe for reading; many processes may read one store."""

    def __init__(self, root: Path, manifest: StoreManifest) -> None:
        self.root = root
        self.manifest = manifest
        self._files = StoreFiles(root)

    def __repr__(self) -> str:
        return f"<ckptstore.Store {self.root} ({len(self.manifest.params)} parameters)>"

    def names(self) -> list[str]:
        """Parameter names, in the order of the source checkpoint."""
        return list(self.manifest.params)

    def __contains__(self, name: object) -> bool:
        return name in self.manifest.params

    def __iter__(self) -> Iterator[str]:
        return iter(self.manifest.params)

    def info(self, name: str) -> ParamManifest:
        """Shape, dtype, chunk grid and chunk table of one parameter."""
        try:
            return self.manifest.params[name]
        except KeyError:
            raise KeyError(f"parameter {name!r} is not in the store {self.root}") from None

    @property
    def source(self) -> dict[str, Any]:
        """What the store was converted from: world size, files, step, strategy summary."""
        return dict(self.manifest.source)

    def plan(self, name: str, box: Box | None = None) -> ParamReadPlan:
        """The reads :meth:`read` would do for global ``box`` of ``name`` (whole tensor if ``None``)."""
        return plan_param(self.info(name), box)

    def read(self, name: str, index: Index = None, *, out: np.ndarray | None = None,
             verify: bool = False, workers: int = 1) -> np.ndarray | str:
        """Read ``name`` (or ``index`` of it: ints and step-1 slices) as a numpy array.

        Only bytes of the chunks overlapping the index are read (whole chunks when compressed
        or when ``verify=True`` checks their CRC-32C). ``out`` receives the data when given (its
        dtype may differ: values are cast chunk by chunk). String parameters return ``str``.
        """
        info = self.info(name)
        if info.is_str:
            return info.value or ""
        box, squeeze = _index_to_box(index, info.shape, name)
        result = execute(plan_param(info, box), self._files, out=out, verify=verify, workers=workers)
        return result.reshape([n for n, s in zip(result.shape, squeeze) if not s]) if any(squeeze) else result

    def close(self) -> None:
        self._files.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _index_to_box(index: Index, shape: Sequence[int], name: str) -> tuple[Box, list[bool]]:
    if index is None or index is Ellipsis:
        return Box.full(shape), [False] * len(shape)
    items = index if isinstance(index, tuple) else (index,)
    if len(items) > len(shape):
        raise IndexError(f"too many indices for parameter {name!r} of shape {list(shape)}")
    start, stop, squeeze = [], [], []
    for axis, n in enumerate(shape):
        item = items[axis] if axis < len(items) else slice(None)
        if isinstance(item, (int, np.integer)):
            i = int(item) + n if item < 0 else int(item)
            if not 0 <= i < n:
                raise IndexError(f"index {item} is out of bounds for axis {axis} of {name!r} with size {n}")
            start.append(i), stop.append(i + 1), squeeze.append(True)
        elif isinstance(item, slice):
            lo, hi, step = item.indices(n)
            if step != 1:
                raise IndexError(f"only step-1 slices are supported (axis {axis} of {name!r})")
            start.append(lo), stop.append(max(lo, hi)), squeeze.append(False)
        else:
            raise IndexError(f"unsupported index {item!r} for {name!r}: use ints and slices")
    return Box(tuple(start), tuple(stop)), squeeze


def open(path: str | os.PathLike[str]) -> Store:  # noqa: A001 - the public name is ckptstore.open
    """Open a store written by ``ckptstore convert``, reading only its metadata.

    Raises :class:`~ckptstore.errors.StoreNotFoundError` when there is no store at ``path``,
    :class:`~ckptstore.errors.IncompleteStoreError` for an interrupted conversion, and
    :class:`~ckptstore.errors.StoreCorruptError` when the manifest fails validation.
    """
    root = Path(path)
    if not root.is_dir():
        raise StoreNotFoundError(f"no ckptstore store at {root} (expected a folder made by 'ckptstore convert')")
    try:
        doc = read_manifest(root)
    except ValueError as e:  # not JSON, not UTF-8, not an object
        raise StoreCorruptError(f"the metadata of the store at {root} is not valid JSON: {e}") from None
    if doc is None:
        if (root / WORK_DIR).is_dir():
            raise IncompleteStoreError(f"the store at {root} is incomplete: its conversion was interrupted. "
                                       "Run the same 'ckptstore convert' command again to finish it")
        raise StoreNotFoundError(f"no ckptstore store at {root} (no zarr.json or {sb.MANIFEST})")
    if not isinstance(doc, dict):
        raise StoreNotFoundError(f"{root} is a Zarr group but not a ckptstore store (no 'ckptstore' attributes)")
    if not doc.get("complete"):
        raise IncompleteStoreError(f"the store at {root} is marked incomplete; rerun the conversion")
    return Store(root, StoreManifest.from_json(doc, where=str(root)))

