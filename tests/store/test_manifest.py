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


def _big_table_json(n: int, files: int) -> dict:
    return {"format": "ckptstore", "format_version": 1, "kind": "index", "source": {}, "params": {
        f"p{k}": {"path": f"p{k}", "dtype": "float32", "shape": [n, 256], "chunk_shape": [1, 256], "codec": None,
                  "chunks": {"files": [f"rank_{i}/net.ckpt" for i in range(files)],
                             "file": [i % files for i in range(n)], "offset": [(1 << 33) + 1024 * i for i in range(n)],
                             "nbytes": [1024] * n, "crc32c": [(1 << 31) + i for i in range(n)],
                             "rank": [i % files for i in range(n)], "replicas": [16] * n}} for k in range(2)}}


def test_an_opened_chunk_table_holds_8_bytes_per_entry_of_each_integer_column():
    import json
    import tracemalloc

    text = json.dumps(_big_table_json(20_000, 128))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        manifest = StoreManifest.from_json(json.loads(text), where="m")
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 2 parameters × 20,000 chunks × (5 integer columns of 8 bytes + a file column of 8-byte references);
    # a tuple of parsed ints held about 40 bytes per entry (136 per chunk: 5.4 MiB here)
    assert held < 2 * 20_000 * (5 * 8 + 8) + (256 << 10)
    t = manifest.params["p1"].chunks
    assert (t.offsets[3], t.nbytes[3], t.crc32c[3], t.ranks[3], t.replicas[3]) == ((1 << 33) + 3072, 1024,
                                                                                   (1 << 31) + 3, 3, 16)
    assert type(t.offsets[3]) is int and t.nbytes == (1024,) * 20_000 and t.offsets == list(t.offsets)


def test_the_file_names_of_all_parameters_are_one_string_each():
    import json

    manifest = StoreManifest.from_json(json.loads(json.dumps(_big_table_json(4, 2))), where="m")
    a, b = manifest.params["p0"].chunks, manifest.params["p1"].chunks
    assert a.files[1] == b.files[1] == "rank_1/net.ckpt" and a.files[1] is b.files[1]


def test_a_compact_chunk_table_writes_the_json_it_was_read_from():
    import json

    d = _big_table_json(3, 2)
    manifest = StoreManifest.from_json(json.loads(json.dumps(d)), where="m")
    assert json.loads(manifest.dumps())["params"] == d["params"]
    assert dataclasses.replace(manifest.params["p0"].chunks) == manifest.params["p0"].chunks


def test_a_manifest_opened_as_a_store_parses_its_chunk_tables_compactly(tmp_path):
    import json

    from ckptstore.store.manifest import IntColumn
    from ckptstore.store.store import open as open_store

    d = _big_table_json(3, 2)
    d["params"] = {"p0": d["params"]["p0"]}
    d["params"]["p0"]["chunks"]["offset"] = [0, 1024, 2048]
    (tmp_path / "ckptstore.json").write_text(json.dumps({**d, "complete": True, "kind": "safetensors"}))
    t = open_store(str(tmp_path)).info("p0").chunks
    assert type(t.offsets) is IntColumn and t.offsets == (0, 1024, 2048) and type(t.crc32c) is IntColumn


@pytest.mark.parametrize("offset, message", [
    (-1, r"offset column holds an entry that is not an integer in 0\.\.4611686018427387904"),
    ((1 << 62) + 1, r"offset column holds an entry that is not an integer in 0\.\.4611686018427387904"),
    (1 << 64, r"offset column holds an entry that is not an integer in 0\.\.4611686018427387904"),
    (1.5, r"offset column holds an entry that is not an integer in 0\.\.4611686018427387904"),
], ids=["negative", "beyond-the-limit", "beyond-int64", "float"])
def test_a_compactly_parsed_chunk_table_is_refused_as_before(offset, message):
    import json

    from ckptstore.store.manifest import compact_columns

    d = _big_table_json(3, 2)
    d["params"]["p0"]["chunks"]["offset"][1] = offset
    with pytest.raises(StoreCorruptError, match=message):
        StoreManifest.from_json(json.loads(json.dumps(d), object_hook=compact_columns), where="m")
