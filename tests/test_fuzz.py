"""Fuzz tier: hypothesis mutates rank files, strategy files and store metadata.

Whatever the mutation, ckptstore either gives a result of the shape and dtype its (validated)
metadata states or raises a CkptStoreError (never another exception), allocates a bounded amount
of memory, and opens no file outside the store. A mutation that points a chunk at other bytes
of the store's own files passes validation; ``verify=True`` catches it by checksum, so a read
with ``verify=True`` that returns a parameter's original shape and dtype returns its original
values. The seeds are real MindSpore files (conftest.saved_layout) and a store converted from them.
"""
from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.fuzz

import ckptstore
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import CkptStoreError
from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint
from ckptstore.io import local as local_source
from convert_fixtures import convert_layout

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: Memory any single mutated input may cost (the seeds are a few KiB; real bounds are far lower).
MEMORY_BOUND = 64 << 20


@st.composite
def mutations(draw, size: int):
    """A list of byte edits: flip, set, cut, insert, or overwrite with a large varint."""
    ops = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "varint"]))
        at = draw(st.integers(min_value=0, max_value=max(size - 1, 0)))
        ops.append((kind, at, draw(st.integers(min_value=0, max_value=255))))
    return ops


def mutate(data: bytes, ops) -> bytes:
    blob = bytearray(data)
    for kind, at, value in ops:
        at = min(at, max(len(blob) - 1, 0))
        if kind == "flip" and blob:
            blob[at] ^= 1 << (value % 8)
        elif kind == "set" and blob:
            blob[at] = value
        elif kind == "truncate":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = bytes([value]) * (1 + value % 7)
        elif kind == "varint":
            blob[at:at + 1] = b"\xff\xff\xff\xff\xff\xff\xff\x7f"  # a huge length or dimension
    return bytes(blob)


def bounded(fn):
    """Run ``fn``; return its result or the CkptStoreError it raised; assert the memory it took."""
    tracemalloc.start()
    try:
        try:
            return fn()
        except CkptStoreError as e:
            return e
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"{peak} bytes allocated"


@pytest.fixture(scope="module")
def seeds(saved_layout, tmp_path_factory):
    layout = saved_layout("mixed_dtypes")
    store = tmp_path_factory.mktemp("fuzz") / "store"
    convert_layout(layout, store)
    return layout, store


@pytest.fixture(scope="module")
def seed_values(seeds) -> dict[str, object]:
    """Every parameter of the seed store as read before any mutation."""
    with ckptstore.open(seeds[1]) as s:
        return {name: s.read(name) for name in s.names()}


@FUZZ
@given(data=st.data())
def test_a_mutated_rank_file_scans_and_reads_or_raises_a_typed_error(seeds, tmp_path_factory, data):
    layout, _ = seeds
    original = layout.rank_file(1).read_bytes()
    path = tmp_path_factory.mktemp("rank") / "m.ckpt"
    path.write_bytes(mutate(original, data.draw(mutations(len(original)))))

    def scan_and_read():
        index = scan_checkpoint(path)
        for entry in index.entries.values():
            value = read_entry(path, entry)
            assert isinstance(value, str) or value.shape == entry.shape
        return index

    bounded(scan_and_read)


@FUZZ
@given(data=st.data(), as_json=st.booleans())
def test_a_mutated_strategy_file_loads_or_raises_a_typed_error(seeds, tmp_path_factory, data, as_json):
    layout, _ = seeds
    import mindspore_fixtures as T

    folder = tmp_path_factory.mktemp("strategy")
    original = (T.write_strategy_json(folder / "s.json", layout.specs) if as_json else layout.strategy_files[0])
    raw = Path(original).read_bytes()
    path = folder / ("m.json" if as_json else "m.ckpt")
    path.write_bytes(mutate(raw, data.draw(mutations(len(raw)))))
    result = bounded(lambda: load_strategy(path))
    if not isinstance(result, CkptStoreError):
        assert 1 <= result.world_size <= 1 << 20


# ---- store metadata -------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.sampled_from(["", "..", "../outside.bin", "/etc/passwd", "a/b", "zstd", "pickle", "bfloat16", "str"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


#: In a mutated manifest's ``touched`` set: a change outside any one parameter's entry.
EVERY = object()


def _paths(doc, prefix=()):
    """Every path to a value in a JSON document."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            yield from _paths(v, (*prefix, i))


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


@pytest.fixture
def confined(monkeypatch):
    """Fail the test if a store source opens a file outside its root."""
    opened = []
    original = local_source.LocalSource._walk

    def walk(self, key, flags):
        fd = original(self, key, flags)
        real = os.readlink(f"/proc/self/fd/{fd}")
        root = os.path.realpath(self.root)
        assert os.path.commonpath([root, real]) == root, f"{real} is outside {root}"
        opened.append(real)
        return fd

    monkeypatch.setattr(local_source.LocalSource, "_walk", walk)
    return opened


@FUZZ
@given(data=st.data())
def test_a_mutated_manifest_opens_and_reads_correctly_or_raises_a_typed_error(seeds, seed_values, tmp_path_factory,
                                                                              confined, data):
    layout, store = seeds
    copy = tmp_path_factory.mktemp("store") / "s"
    shutil.copytree(store, copy)
    (copy.parent / "outside.bin").write_bytes(b"\xab" * 4096)
    doc = json.loads((copy / "zarr.json").read_text())
    manifest = doc["attributes"]["ckptstore"]
    touched: set[object] = set()  # parameters whose manifest entry changed; EVERY: a header or the table itself
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = list(_paths(manifest))[1:]
        lists = [p for p in paths if isinstance(_get(manifest, p), list) and len(_get(manifest, p)) > 1]
        if lists and data.draw(st.integers(0, 2)) == 0:
            # two entries of a list swapped (two chunks' offsets, say): metadata that stays valid
            # and points at the store's own bytes, which only the checksums tell apart
            path = data.draw(st.sampled_from(lists))
            value = list(_get(manifest, path))
            i, j = data.draw(st.lists(st.integers(0, len(value) - 1), min_size=2, max_size=2, unique=True))
            value[i], value[j] = value[j], value[i]
        else:
            path, value = data.draw(st.sampled_from(paths)), data.draw(JSON_VALUES)
        manifest = _set(manifest, path, value)
        touched.add(path[1] if len(path) >= 2 and path[0] == "params" else EVERY)
    doc["attributes"]["ckptstore"] = manifest
    (copy / "zarr.json").write_text(json.dumps(doc))

    verify = data.draw(st.booleans())

    def open_and_read():
        with ckptstore.open(copy) as s:
            for name in s.names():
                value = s.read(name, verify=verify)
                info = s.info(name)
                assert isinstance(value, str) or (value.shape, value.dtype) == (info.shape, info.np_dtype)
                want = seed_values.get(name)
                if EVERY not in touched and name not in touched:  # its metadata is the seed's: its values too
                    assert type(value) is type(want), name
                    assert value == want if isinstance(want, str) else (
                        (value.shape, value.dtype, value.tobytes()) == (want.shape, want.dtype, want.tobytes())), name
                elif verify and isinstance(want, np.ndarray) and isinstance(value, np.ndarray) \
                        and (value.shape, value.dtype) == (want.shape, want.dtype):
                    assert value.tobytes() == want.tobytes(), f"{name}: checksums verified, values wrong"

    bounded(open_and_read)
