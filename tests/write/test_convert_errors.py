"""``ckptstore.convert`` refuses bad input with the right exception, naming the culprit.

Each broken source is a copy of a session fixture (byte-identical to MindSpore's save), damaged on
disk or re-saved as ``mindspore.save_checkpoint`` would (``rewrite_rank_file``). Every test checks
the exception type, that the message names the file / rank / parameter at fault, and that nothing
was written to ``--out``.
"""
from __future__ import annotations

import errno
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    IncompleteStoreError,
    InvalidOptionError,
    LayoutMismatchError,
    MissingRankError,
    StoreNotFoundError,
    StoreWriteError,
    TruncatedCheckpointError,
)
from ckptstore.formats.ckpt_reader import scan_checkpoint
from conftest import SavedLayout
from convert_fixtures import (
    assert_same_array,
    convert_layout,
    copy_saved,
    expected_values,
    rewrite_rank_file,
    run_cli,
    store_files,
    strategy_args,
)


@pytest.fixture
def dp2_mp4(saved_layout, tmp_path) -> SavedLayout:
    """A private, writable copy of the dp2_mp4 fixture (8 ranks, dev_matrix (2, 4))."""
    return copy_saved(saved_layout("dp2_mp4"), tmp_path / "src")


def _convert_fails(layout: SavedLayout, tmp_path: Path, exc: type[BaseException], **kwargs) -> BaseException:
    out = tmp_path / "out.zarr"
    with pytest.raises(exc) as info:
        convert_layout(layout, out, **kwargs)
    assert isinstance(info.value, CkptStoreError)
    assert not out.exists(), "a refused source must not leave an output folder behind"
    return info.value


def test_include_globs_that_match_no_parameter_are_refused(dp2_mp4, tmp_path):
    # a glob matches whole names: "layer0" alone would have made an empty store, exit 0
    err = _convert_fails(dp2_mp4, tmp_path, InvalidOptionError, include=["layer0", "moe"])
    assert str(err).startswith("--include 'layer0' 'moe' matches none of the checkpoint's 15 parameters (")
    assert str(err).endswith("); a glob matches whole names: 'layer0.*', not 'layer0'")


def _has_rank(msg: str, rank: int) -> bool:
    return re.search(rf"\brank {rank}\b", msg) is not None


# ---------------------------------------------------------------------------------------------
# ranks


def test_missing_rank_folder_is_named(dp2_mp4, tmp_path):
    shutil.rmtree(dp2_mp4.root / "rank_3")
    e = _convert_fails(dp2_mp4, tmp_path, MissingRankError)
    assert "rank_3" in str(e) and str(dp2_mp4.root) in str(e)


def test_missing_last_rank_folder_is_named(dp2_mp4, tmp_path):
    """No gap in rank_<i>/ folders: only the strategy can tell that rank 7 is missing."""
    shutil.rmtree(dp2_mp4.root / "rank_7")
    e = _convert_fails(dp2_mp4, tmp_path, MissingRankError)
    assert "rank_7" in str(e), str(e)
    assert str(dp2_mp4.strategy_files[0]) in str(e)


def test_extra_ranks_beyond_the_strategy_are_named(saved_layout, dp2_mp4, tmp_path):
    """Strategy for 4 ranks (dp2_mp2), rank files for 8."""
    shutil.copyfile(saved_layout("dp2_mp2").strategy_files[0], dp2_mp4.strategy_files[0])
    e = _convert_fails(dp2_mp4, tmp_path, MissingRankError)
    msg = str(e)
    assert "describes 4 ranks but 8 rank files" in msg
    assert "rank(s) 4..7" in msg and str(dp2_mp4.rank_file(4)) in msg, msg


# ---------------------------------------------------------------------------------------------
# rank files disagreeing with the strategy or each other


def test_rank_file_missing_a_parameter_is_named(dp2_mp4, tmp_path):
    rewrite_rank_file(dp2_mp4.rank_file(5), lambda a: {k: v for k, v in a.items() if k != "layer1.w"})
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'layer1.w'" in msg and str(dp2_mp4.rank_file(5)) in msg and _has_rank(msg, 5), msg


def test_rank_file_cut_at_a_record_boundary_reports_the_missing_parameters(dp2_mp4, tmp_path):
    """A file cut exactly between records is valid protobuf (MindSpore loads it silently);
    the strategy says what is missing."""
    path = dp2_mp4.rank_file(6)
    cut = scan_checkpoint(path)["layer1.w"].record_offset
    with open(path, "r+b") as f:
        f.truncate(cut)
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'layer1.w'" in msg and str(path) in msg and _has_rank(msg, 6) and "truncated" in msg, msg


def test_local_shape_disagreeing_with_the_other_ranks_is_named(dp2_mp4, tmp_path):
    """rank 2 holds 4 rows of layer0.w where the strategy's split of the others gives 8."""
    rewrite_rank_file(dp2_mp4.rank_file(2), lambda a: {**a, "layer0.w": a["layer0.w"][:4]})
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'layer0.w'" in msg and str(dp2_mp4.rank_file(2)) in msg and _has_rank(msg, 2), msg
    assert "[4, 16]" in msg and "[8, 16]" in msg, msg


def test_local_rank_count_disagreeing_with_the_tensor_map_is_named(dp2_mp4, tmp_path):
    """The strategy's tensor map has 2 axes; rank 2's layer0.w is flat."""
    rewrite_rank_file(dp2_mp4.rank_file(2), lambda a: {**a, "layer0.w": a["layer0.w"].reshape(-1)})
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'layer0.w'" in msg and str(dp2_mp4.rank_file(2)) in msg and _has_rank(msg, 2), msg
    assert "[128]" in msg, msg


def test_dtype_disagreeing_across_ranks_is_named(dp2_mp4, tmp_path):
    rewrite_rank_file(dp2_mp4.rank_file(3), lambda a: {**a, "layer0.w": a["layer0.w"].astype(np.float16)})
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'layer0.w'" in msg and str(dp2_mp4.rank_file(3)) in msg and _has_rank(msg, 3), msg
    assert "Float32" in msg and "Float16" in msg, msg


def test_unsplit_parameter_with_different_shapes_across_ranks_is_named(dp2_mp4, tmp_path):
    """global_step is not in the strategy, so every rank must hold it whole."""
    rewrite_rank_file(dp2_mp4.rank_file(6), lambda a: {**a, "global_step": np.zeros((2,), np.int32)})
    e = _convert_fails(dp2_mp4, tmp_path, LayoutMismatchError)
    msg = str(e)
    assert "'global_step'" in msg and str(dp2_mp4.rank_file(6)) in msg and _has_rank(msg, 6), msg
    assert "not in the strategy" in msg


def test_single_file_with_a_multi_rank_strategy_is_refused(dp2_mp4, tmp_path):
    with pytest.raises(LayoutMismatchError) as e:
        ckptstore.convert(dp2_mp4.rank_file(0), tmp_path / "out.zarr", strategy=dp2_mp4.strategy_files)
    assert str(dp2_mp4.rank_file(0)) in str(e.value) and "8 ranks" in str(e.value)


# ---------------------------------------------------------------------------------------------
# damaged files


def test_truncated_rank_file_names_file_parameter_and_offset(dp2_mp4, tmp_path):
    path = dp2_mp4.rank_file(4)
    entry = scan_checkpoint(path)["layer1.w"]
    offset, length = entry.pieces[0]
    with open(path, "r+b") as f:
        f.truncate(offset + length // 2)  # in the middle of layer1.w's payload
    e = _convert_fails(dp2_mp4, tmp_path, TruncatedCheckpointError)
    assert (e.path, e.param, e.offset) == (str(path), "layer1.w", entry.record_offset)
    msg = str(e)
    assert str(path) in msg and "'layer1.w'" in msg and f"byte offset {entry.record_offset}" in msg, msg


def test_rank_file_cut_after_its_scan_is_named_with_the_parameter_not_as_a_damaged_store(dp2_mp4):
    # the converter reads rank files through the load's executor, which calls a short file a damaged
    # store; a rank file that shrinks between the scan and the copy is the checkpoint's fault
    from ckptstore.checkpoint.source import resolve_source

    path = dp2_mp4.rank_file(4)
    source = resolve_source(dp2_mp4.root, dp2_mp4.strategy_files)
    try:
        entry = source.indexes[4].entries["layer1.w"]
        offset, _ = entry.pieces[0]
        with open(path, "r+b") as f:
            f.truncate(offset)
        with pytest.raises(TruncatedCheckpointError) as info:
            source.files.read(str(path), entry, 0, memoryview(bytearray(entry.nbytes)))
    finally:
        source.close()
    assert (info.value.path, info.value.param, info.value.offset) == (str(path), "layer1.w", offset)
    assert str(info.value).startswith("the file ends before this parameter's bytes")


def test_corrupt_rank_file_of_random_bytes_is_named(dp2_mp4, tmp_path):
    path = dp2_mp4.rank_file(1)
    path.write_bytes(np.random.default_rng(0).bytes(5000))
    e = _convert_fails(dp2_mp4, tmp_path, CorruptCheckpointError)
    assert e.path == str(path) and str(path) in str(e)


def test_corrupt_bytes_inside_a_record_are_named(dp2_mp4, tmp_path):
    """A record header damaged in the middle of the file: the offset points at it."""
    path = dp2_mp4.rank_file(1)
    at = scan_checkpoint(path)["layer0.b"].record_offset
    data = bytearray(path.read_bytes())
    data[at] = 0x55  # not a Checkpoint.value key
    path.write_bytes(bytes(data))
    e = _convert_fails(dp2_mp4, tmp_path, CorruptCheckpointError)
    assert (e.path, e.offset) == (str(path), at)


@pytest.mark.slow
def test_cli_reports_a_source_error_in_one_line_with_exit_status_2(dp2_mp4, tmp_path):
    path = dp2_mp4.rank_file(4)
    entry = scan_checkpoint(path)["layer1.w"]
    with open(path, "r+b") as f:
        f.truncate(entry.pieces[0][0] + 3)
    r = run_cli("convert", dp2_mp4.root, *strategy_args(dp2_mp4), "--out", tmp_path / "out.zarr", "-q")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("ckptstore: error: ") and line.endswith("[TruncatedCheckpointError]")
    assert str(path) in line and "'layer1.w'" in line
    assert r.stdout == ""


# ---------------------------------------------------------------------------------------------
# disk full


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs mount under tmp_path; ``remount(size)`` resizes it. Skips if mounting is not allowed."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def mount(size: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                              capture_output=True, text=True)

    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot create a small file system to fill")
    r = mount("64k")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")

    class Mount:
        path = mnt

        @staticmethod
        def resize(size: str) -> None:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)

    try:
        yield Mount
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: a test may still hold a file open


@pytest.fixture(scope="module")
def reference_store(saved_layout, tmp_path_factory) -> Path:
    """dp2_mp4 converted on a disk with room (workers=1), to compare resumed stores with."""
    out = tmp_path_factory.mktemp("reference") / "s.zarr"
    convert_layout(saved_layout("dp2_mp4"), out, workers=1)
    return out


@pytest.mark.parametrize("size", ["16k", "64k", "128k"])
def test_disk_full_is_a_store_write_error_and_a_rerun_finishes(saved_layout, small_tmpfs, reference_store, size):
    layout = saved_layout("dp2_mp4")
    small_tmpfs.resize(size)
    out = small_tmpfs.path / "s.zarr"
    with pytest.raises(StoreWriteError) as e:
        convert_layout(layout, out, workers=1)
    assert e.value.errno == errno.ENOSPC
    assert "no space left" in str(e.value) and str(out) in str(e.value)
    assert "rerun the same command" in str(e.value)
    with pytest.raises((IncompleteStoreError, StoreNotFoundError)):
        ckptstore.open(out)
    small_tmpfs.resize("8m")  # free space
    summary = convert_layout(layout, out, workers=1)
    assert summary.chunks_written + summary.chunks_resumed == summary.chunks
    with ckptstore.open(out) as store:
        for name, want in expected_values(layout).items():
            assert_same_array(store.read(name, verify=True), want, name)
    assert store_files(out) == store_files(reference_store)  # byte-identical to an uninterrupted run


@pytest.mark.slow
def test_cli_disk_full_exits_2_saying_no_space_left(saved_layout, small_tmpfs):
    layout = saved_layout("dp2_mp4")
    out = small_tmpfs.path / "s.zarr"
    args = ["convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--workers", "1"]
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "no space left" in line and line.endswith("[StoreWriteError]")
    info = run_cli("info", out)
    assert info.returncode == 2 and "IncompleteStoreError" in info.stderr
    small_tmpfs.resize("8m")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout
    assert run_cli("verify", out).returncode == 0
