"""Manifest validation: a store whose metadata does not describe its tensors exactly is refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ckptstore.boxes import Box
from ckptstore.errors import StoreCorruptError
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest


def _param(nbytes=(64, 64, 64, 32), offsets=(0, 64, 128, 192), shape=(7, 4), chunk=(2, 4)) -> ParamManifest:
    n = len(offsets)
    table = ChunkTable(("w/c/0/0",) * n, tuple(offsets), tuple(nbytes), (0,) * n, (0,) * n, (1,) * n)
    return ParamManifest("w", "w", "float64", shape, chunk, table)


def test_a_consistent_manifest_with_an_edge_chunk_validates():
    p = _param(nbytes=(64, 64, 64, 32))
    p.validate()
    assert p.grid == (4, 1)
    assert list(p.chunk_sizes()) == [8, 8, 8, 4]
    assert p.chunk_box(3) == Box((6, 0), (7, 4))


@pytest.mark.parametrize("nbytes, offsets, message", [
    ((64, 64, 64, 64), (0, 64, 128, 192), "chunk 3 has 64 bytes, its box needs 32"),
    ((64, 64, 64, 32), (0, 60, 128, 192), "chunks overlap in w/c/0/0"),
    ((64, 64, 64), (0, 64, 128), r"3 chunks listed but the grid \[4, 1\] has 4"),
    ((64, 64, 64, 32), (0, -64, 128, 192), "negative offset"),
], ids=["wrong-size", "overlap", "missing-chunk", "negative-offset"])
def test_an_inconsistent_chunk_table_is_refused(nbytes, offsets, message):
    with pytest.raises(StoreCorruptError, match=message):
        _param(nbytes=nbytes, offsets=offsets).validate()


def test_chunks_overlapping_a_box_are_listed_in_grid_order():
    p = _param(shape=(8, 8), chunk=(2, 4), offsets=tuple(range(0, 512, 64)), nbytes=(64,) * 8)
    assert p.chunks_overlapping(Box((1, 3), (5, 5))) == [0, 1, 2, 3, 4, 5]
    assert p.chunks_overlapping(Box((6, 4), (8, 8))) == [7]


def test_an_unknown_format_version_is_refused():
    doc = StoreManifest({"w": _param()}).to_json()
    doc["format_version"] = 99
    with pytest.raises(StoreCorruptError, match="format version 99"):
        StoreManifest.from_json(doc, where="STORE")


def test_manifest_round_trips_through_json():
    m = StoreManifest({"w": _param(), "d": dataclasses.replace(_param(), name="d", layout="dense", data_offset=88)})
    again = StoreManifest.from_json(m.to_json(), where="STORE")
    assert again.params == m.params
    assert np.array_equal(again.params["d"].chunk_sizes(), m.params["d"].chunk_sizes())


def test_the_store_kind_is_written_once_as_kind():
    doc = StoreManifest({"w": _param()}, kind="index").to_json()
    assert doc["kind"] == "index" and "backend" not in doc
    assert StoreManifest.from_json(doc, where="STORE").kind == "index"


@pytest.mark.parametrize("fields, message", [
    ({"kind": 3}, "store kind 3 is not a string"),
    ({"kind": None}, "the manifest names no store kind"),
], ids=["not-a-string", "missing"])
def test_a_store_kind_that_does_not_parse_is_refused(fields, message):
    doc = {**StoreManifest({"w": _param()}).to_json(), **fields}
    with pytest.raises(StoreCorruptError, match=f"STORE: .*{message}"):
        StoreManifest.from_json(doc, where="STORE")
