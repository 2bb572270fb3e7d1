"""``verify`` checks what a Zarr reader reads, not only what the manifest points at (issue 24.16)."""
from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import numpy as np
import pytest

import ckptstore
from ckptstore.testing.kill_at import run_cli

W = np.arange(600 * 1024, dtype=np.float32).reshape(600, 1024)  # 2.3 MiB: three chunks of 200 rows at chunk_mb=1


@pytest.fixture
def step(tmp_path) -> Path:
    ckptstore.save_rank({"w": W}, tmp_path, step=1, chunk_mb=1)
    return tmp_path / "step_1"


def _rewrite_index(shard: Path, change) -> None:
    """Rewrite the shard's index entries with ``change(entries)`` and a valid CRC-32C."""
    data = bytearray(shard.read_bytes())
    n = 3  # 600 rows in chunks of 200
    start = len(data) - (16 * n + 4)
    entries = list(struct.unpack(f"<{2 * n}Q", data[start:-4]))
    change(entries)
    index = struct.pack(f"<{2 * n}Q", *entries)
    data[start:] = index + struct.pack("<I", crc32c.crc32c(index))
    shard.write_bytes(bytes(data))


def test_the_fixture_is_one_shard_of_three_chunks_that_verifies(step) -> None:
    assert len(ckptstore.open(step).info("w").chunks) == 3
    assert ckptstore.verify(step).ok


def test_a_shard_index_that_points_past_its_file_is_a_problem(step) -> None:
    def past(entries):
        entries[2 * 2] = 10 << 20  # chunk 2 at 10 MiB, past the 2.3 MiB file

    _rewrite_index(step / "w" / "c.0.0", past)
    report = ckptstore.verify(step)
    assert report.problems == ["parameter 'w': chunk 2: the index of shard w/c.0.0 points past its data (bytes "
                               "10485760..11304960 of 2457600); a Zarr reader fails there"]


def test_a_shard_index_that_gives_other_bytes_than_the_manifest_is_a_problem(step) -> None:
    def swap(entries):
        entries[0:2], entries[2:4] = entries[2:4], entries[0:2]

    _rewrite_index(step / "w" / "c.0.0", swap)
    assert ckptstore.verify(step).problems == [
        "parameter 'w': chunk 0: the index of shard w/c.0.0 gives bytes 819200..1638400, the manifest w/c.0.0 bytes "
        "0..819200: a Zarr reader reads other bytes",
        "parameter 'w': chunk 1: the index of shard w/c.0.0 gives bytes 0..819200, the manifest w/c.0.0 bytes "
        "819200..1638400: a Zarr reader reads other bytes"]


def test_verify_exits_1_naming_a_shard_index_a_zarr_reader_fails_on(step) -> None:
    _rewrite_index(step / "w" / "c.0.0", lambda e: e.__setitem__(4, 10 << 20))
    r = run_cli("verify", step)
    assert r.returncode == 1
    assert "ckptstore: parameter 'w': chunk 2: the index of shard w/c.0.0 points past its data" in r.stderr
    assert r.stdout.startswith("FAILED: 1 parameters, 3 chunks")


def test_a_missing_array_metadata_file_is_named_missing(step) -> None:
    (step / "w" / "zarr.json").unlink()
    assert ckptstore.verify(step).problems == [
        f"parameter 'w': {step / 'w' / 'zarr.json'} is missing; a Zarr reader cannot open the array"]


@pytest.fixture
def square(tmp_path) -> Path:
    """A (4, 4) array saved by two ranks of two rows each: chunks of (2, 4), whose manifest is then
    changed to chunks of (4, 2), the same number of chunks of the same size."""
    import json

    from ckptstore.checkpoint.layout import Layout
    from ckptstore.checkpoint.strategy import Strategy

    rows = Strategy({"ids": {0: Layout((2,), ((0,), ()))}}, stage_devices=2)  # 2 ranks, two rows each
    value = np.arange(16, dtype=np.uint64).reshape(4, 4)
    for rank in (0, 1):
        ckptstore.save_rank({"ids": value[2 * rank:2 * rank + 2]}, tmp_path, step=1, strategy=rows, rank=rank)
    root = tmp_path / "step_1" / "zarr.json"
    doc = json.loads(root.read_text())
    assert doc["attributes"]["ckptstore"]["params"]["ids"]["chunk_shape"] == [2, 4]
    doc["attributes"]["ckptstore"]["params"]["ids"]["chunk_shape"] = [4, 2]
    root.write_text(json.dumps(doc))
    return tmp_path / "step_1"


def test_a_verified_read_refuses_a_manifest_whose_chunk_shape_was_changed(square) -> None:
    with pytest.raises(ckptstore.errors.StoreCorruptError,
                       match=r"parameter 'ids': .*ids/zarr.json describes shape \[4, 4\] in chunks of \[2, 4\], the "
                             r"manifest \[4, 4\] in chunks of \[4, 2\]"):
        ckptstore.open(square).read("ids", verify=True)


def test_a_verified_rank_read_refuses_a_manifest_whose_chunk_shape_was_changed(square) -> None:
    with pytest.raises(ckptstore.errors.StoreCorruptError, match=r"in chunks of \[4, 2\]"):
        ckptstore.read_rank(square, rank=0, verify=True)
