"""An interrupted ``ckptstore convert`` resumes where it stopped, and the output folder is guarded.

The conversion runs as ``python -m ckptstore.testing.kill_at chunks:N -- convert ...`` in a subprocess:
the process SIGKILLs itself after writing N chunks (no cleanup, no ``finally``), exactly like an
OOM kill or a preempted job. Running the same command again must finish the store without
rewriting any of those N chunks, and the result must be byte-identical to an uninterrupted run.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

import ckptstore
from ckptstore.errors import IncompleteStoreError, StoreExistsError
from conftest import SavedLayout
from convert_fixtures import (
    assert_same_array,
    convert_layout,
    expected_values,
    run_cli,
    store_files,
    strategy_args,
)

OPTIONS = ["--chunk-mb", "1", "--workers", "1", "-q"]
#: big_layout at --chunk-mb 1, written in this order with one worker: big.rows (8 chunks: 4 slices
#: of 2 MiB cut in two), big.cols (8 chunks), then the 43 chunks of the dp2_mp4 parameters.
TOTAL_CHUNKS = 59
KILL_POINTS = [
    pytest.param(1, id="after-first-chunk"),
    pytest.param(3, id="inside-first-param"),
    pytest.param(8, id="first-param-all-chunks-not-renamed"),
    pytest.param(11, id="inside-second-param"),
    pytest.param(30, id="among-small-params"),
    pytest.param(TOTAL_CHUNKS, id="all-chunks-before-commit"),
]


def _convert_args(layout: SavedLayout, out: Path, *extra: str) -> list:
    return ["convert", layout.root, *strategy_args(layout), "--out", out, *OPTIONS, *extra]


def _killed_run(layout: SavedLayout, out: Path, n: int, *extra: str):
    r = run_cli(*_convert_args(layout, out, *extra), kill_at=f"chunks:{n}")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    return r


@pytest.fixture(scope="module")
def one_go(big_layout, tmp_path_factory) -> tuple[Path, dict]:
    """The same conversion, uninterrupted: (store, its --json summary)."""
    out = tmp_path_factory.mktemp("one_go") / "s.zarr"
    r = run_cli(*_convert_args(big_layout, out, "--json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    # Preconditions of KILL_POINTS (which chunk each kill lands in), not a test of their own.
    assert summary["chunks"] == TOTAL_CHUNKS
    assert (summary["chunks_written"], summary["chunks_resumed"]) == (TOTAL_CHUNKS, 0)
    with ckptstore.open(out) as store:
        assert [len(store.info(n).chunks) for n in ("big.rows", "big.cols")] == [8, 8]
        assert store.info("big.rows").chunk_shape == (512, 512)  # 1 MiB: half of a 2 MiB slice
    return out, summary


@pytest.mark.slow
@pytest.mark.parametrize("n", KILL_POINTS)
def test_killed_conversion_resumes_without_rewriting_a_chunk(big_layout, one_go, tmp_path, n):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, n)
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(out)
    r = run_cli(*_convert_args(big_layout, out, "--json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["chunks"] == TOTAL_CHUNKS
    assert summary["chunks_written"] == TOTAL_CHUNKS - n
    assert summary["chunks_resumed"] == n
    reference, ref_summary = one_go
    for key in ("params", "source_bytes", "unique_bytes", "stored_bytes", "dedup_saved_bytes"):
        assert summary[key] == ref_summary[key], key
    assert store_files(out) == store_files(reference)  # every data file and zarr.json, byte for byte
    with ckptstore.open(out) as store, ckptstore.open(reference) as ref:
        assert store.manifest.to_json() == ref.manifest.to_json()


def _partial_and_journal(out: Path) -> tuple[Path, Path]:
    """The data file being written when the process died, and its journal of finished chunks."""
    (partial,) = out.rglob("*.partial")
    (journal,) = out.rglob("*.journal")
    return partial, journal


@pytest.mark.slow
def test_a_torn_journal_line_and_unjournalled_bytes_are_dropped(big_layout, one_go, tmp_path):
    """A kill in the middle of a chunk leaves bytes past the last journalled chunk and possibly a
    half-written journal line; the rerun must ignore both."""
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 3)
    partial, journal = _partial_and_journal(out)
    with open(partial, "ab") as f:
        f.write(b"\x5a" * 300_000)
    with open(journal, "a") as f:
        f.write('{"i": 3, "o": 3145728, "n": 10')
    r = run_cli(*_convert_args(big_layout, out, "--json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["chunks_written"], summary["chunks_resumed"]) == (TOTAL_CHUNKS - 3, 3)
    assert store_files(out) == store_files(one_go[0])


@pytest.mark.slow
def test_a_damaged_journalled_chunk_is_rewritten_with_those_after_it(big_layout, one_go, tmp_path):
    """Chunk 1 of the partial file no longer matches its journalled CRC: chunks 1 and 2 are
    written again, chunk 0 is kept."""
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 3)
    partial, journal = _partial_and_journal(out)
    second = json.loads(journal.read_text().splitlines()[1])
    with open(partial, "r+b") as f:
        f.seek(second["o"] + 17)
        byte = f.read(1)
        f.seek(second["o"] + 17)
        f.write(bytes([byte[0] ^ 0xFF]))
    r = run_cli(*_convert_args(big_layout, out, "--json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["chunks_written"], summary["chunks_resumed"]) == (TOTAL_CHUNKS - 1, 1)
    assert store_files(out) == store_files(one_go[0])


@pytest.mark.slow
def test_resumed_store_reads_the_global_tensors(big_layout, tmp_path):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 11)
    assert run_cli(*_convert_args(big_layout, out)).returncode == 0
    with ckptstore.open(out) as store:
        for name, want in expected_values(big_layout).items():
            assert_same_array(store.read(name, verify=True), want, name)


@pytest.mark.slow
def test_info_on_an_unfinished_store_says_to_rerun(big_layout, tmp_path):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 3)
    r = run_cli("info", out)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "[IncompleteStoreError]" in r.stderr
    assert "run the same 'ckptstore convert' command again" in r.stderr.lower()
    assert run_cli("verify", out).returncode == 2


@pytest.mark.slow
def test_a_different_command_on_an_unfinished_store_is_refused(big_layout, tmp_path):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 3)
    before = store_files(out)
    r = run_cli(*_convert_args(big_layout, out, "--compress", "zstd"))
    assert r.returncode == 2
    assert "[StoreExistsError]" in r.stderr and "--overwrite" in r.stderr and str(out) in r.stderr
    with pytest.raises(StoreExistsError, match="--overwrite"):
        convert_layout(big_layout, out, chunk_mb=1, workers=1, exclude=["adam_*"])
    # refused without touching the unfinished store (the lock file says who last held it)
    assert _without_lock(store_files(out)) == _without_lock(before)


def _without_lock(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k != ".ckptstore-work/lock"}


@pytest.mark.slow
def test_overwrite_starts_an_unfinished_store_over(big_layout, one_go, tmp_path):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 11)
    r = run_cli(*_convert_args(big_layout, out, "--overwrite", "--json"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["chunks_written"], summary["chunks_resumed"], summary["params_resumed"]) == (TOTAL_CHUNKS, 0, 0)
    assert store_files(out) == store_files(one_go[0])


@pytest.mark.slow
def test_overwrite_with_other_options_replaces_an_unfinished_store(big_layout, tmp_path):
    out = tmp_path / "s.zarr"
    _killed_run(big_layout, out, 11)
    r = run_cli(*_convert_args(big_layout, out, "--overwrite", "--json", "--drop-optimizer"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chunks_resumed"] == 0
    with ckptstore.open(out) as store:
        assert not [n for n in store.names() if n.startswith("adam_")]


# ---------------------------------------------------------------------------------------------
# guarding --out


@pytest.mark.slow
def test_rerunning_a_finished_conversion_does_nothing(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    convert_layout(layout, out)
    before = store_files(out)
    summary = convert_layout(layout, out)
    assert summary.already_complete and summary.chunks_written == 0
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out)
    assert r.returncode == 0 and "already holds this conversion" in r.stdout, r.stdout + r.stderr
    assert store_files(out) == before


@pytest.mark.slow
def test_converting_other_options_into_a_complete_store_needs_overwrite(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    convert_layout(layout, out)
    before = store_files(out)
    with pytest.raises(StoreExistsError, match="already holds a complete store of other files or options; pass "
                                               "--overwrite"):
        convert_layout(layout, out, compress="zstd")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--drop-optimizer")
    assert r.returncode == 2 and "[StoreExistsError]" in r.stderr and "--overwrite" in r.stderr
    assert store_files(out) == before
    summary = convert_layout(layout, out, overwrite=True, include=["layer0.*"])
    assert summary.params == 2
    with ckptstore.open(out) as store:
        assert store.names() == ["layer0.w", "layer0.b"]
    assert sorted(p.name for p in out.iterdir()) == ["layer0.b", "layer0.w", "zarr.json"]


def test_out_that_is_a_file_is_refused(saved_layout, tmp_path):
    out = tmp_path / "model.zarr"
    out.write_bytes(b"precious")
    for overwrite in (False, True):
        with pytest.raises(StoreExistsError, match="is a file"):
            convert_layout(saved_layout("dp2_mp4"), out, overwrite=overwrite)
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize("content", [
    pytest.param({"notes.txt": b"precious"}, id="a-file"),
    pytest.param({"zarr.json": b'{"zarr_format": 3, "node_type": "group", "attributes": {}}'}, id="a-zarr-group"),
    pytest.param({"zarr.json": b"not json at all"}, id="an-unreadable-zarr-json"),
    pytest.param({"zarr.json": b"[1, 2]"}, id="a-zarr-json-that-is-not-an-object"),
])
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_non_empty_folder_that_is_not_a_store_is_refused_even_with_overwrite(saved_layout, tmp_path, content,
                                                                             overwrite):
    out = tmp_path / "dir"
    out.mkdir()
    for name, data in content.items():
        (out / name).write_bytes(data)
    with pytest.raises(StoreExistsError, match="is not empty and is not a ckptstore store"):
        convert_layout(saved_layout("dp2_mp4"), out, overwrite=overwrite)
    assert store_files(out) == content  # nothing deleted, nothing added


def test_an_empty_existing_folder_is_used(saved_layout, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    convert_layout(saved_layout("dp2_mp4"), out)
    with ckptstore.open(out) as store:
        assert "layer0.w" in store
