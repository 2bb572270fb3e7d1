"""Hostile input, continued: sizes, depths and file kinds that must give a typed error, not hang or exhaust.

Findings of issue 17, one section each:

3. an index notices a rank file edited in place with its modification time restored, or a
   same-size file renamed over it (it records inode and ctime); old indexes still open;
10. a safetensors ``crc_num`` that ``isdigit()`` accepts and ``int()`` does not (``"²"``, 5000
    digits) is a typed error naming the file;
11. a manifest that declares more bytes than its data file holds fails before the destination
    is allocated (read, load_rank, export);
12. a JSON strategy nested 5000 deep is a StrategyError, not a RecursionError;
13. a FIFO in place of a data file is refused at once, not waited on;
14. ``export --ranks`` with a huge range is checked against the layout before it is listed;
15. ``load_into_net`` checks every shape and dtype before it loads anything.

Checkpoints are the bytes ``mindspore.save_checkpoint`` writes (plain .ckpt files by ckptstore's
byte-identical CheckpointWriter, safetensors by MindSpore: those tests are marked ``mindspore``);
damage is done to private copies.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.checkpoint.rank_files import scan_rank_file
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import (
    CorruptCheckpointError,
    InvalidOptionError,
    LayoutMismatchError,
    SourceChangedError,
    StoreCorruptError,
    StrategyError,
)
from ckptstore.formats.ckpt_writer import CheckpointWriter
from convert_fixtures import REPO, run_cli

VALUES = {"w": np.arange(1024, dtype=np.float32), "b": np.arange(6, dtype=np.float32) - 2.5}


def _save(path: Path, arrays: dict[str, np.ndarray], **options) -> Path:
    """``arrays`` as ``mindspore.save_checkpoint`` saves them: a plain .ckpt by ckptstore's
    byte-identical CheckpointWriter, by MindSpore itself with ``options`` (format, crc_check)."""
    if not options:
        with CheckpointWriter(path) as w:
            for n, a in arrays.items():
                w.add(n, a)
        return path
    mindspore = pytest.importorskip("mindspore")
    mindspore.save_checkpoint([{"name": n, "data": mindspore.Tensor(a)} for n, a in arrays.items()], str(path),
                              **options)
    return path


def _one_line_error(r: subprocess.CompletedProcess[str], kind: str) -> None:
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"[{kind}]" in r.stderr, r.stderr


@pytest.fixture
def small_store(tmp_path) -> Path:
    """A Zarr store converted from one MindSpore .ckpt holding ``VALUES`` (``w`` is a 4 KiB data file)."""
    ckpt = _save(tmp_path / "net.ckpt", VALUES)
    ckptstore.convert(ckpt, tmp_path / "store")
    return tmp_path / "store"


def _edit_manifest(store: Path, edit) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"]["ckptstore"])
    (store / "zarr.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------------------------------------
# 3. an index notices edits that keep size and modification time


@pytest.fixture
def indexed(tmp_path) -> tuple[Path, Path]:
    """``(rank file, index)``: one MindSpore .ckpt and an index of it."""
    (tmp_path / "ckpt").mkdir()
    ckpt = _save(tmp_path / "ckpt" / "net.ckpt", VALUES)
    ckptstore.index(ckpt, tmp_path / "index")
    time.sleep(0.05)  # ctime is kept at the kernel's tick: let the edit below fall in a later one
    return ckpt, tmp_path / "index"


def _flip_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    offset = scan_rank_file(path)["w"].pieces[0][0] + 4 * 3  # element 3 of w
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.float32(-7.0).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_an_index_refuses_at_open_a_rank_file_edited_in_place_with_its_mtime_restored(indexed):
    ckpt, index = indexed
    _flip_keeping_size_and_mtime(ckpt)
    with pytest.raises(SourceChangedError, match=f"rank file {ckpt} changed since the index was made "
                                                 r"\(ctime_ns \d+, was \d+\)"):
        ckptstore.open(index)
    r = run_cli("info", index)
    _one_line_error(r, "SourceChangedError")


def test_an_index_refuses_at_read_a_rank_file_edited_in_place_after_it_was_opened(indexed):
    ckpt, index = indexed
    with ckptstore.open(index) as store:
        _flip_keeping_size_and_mtime(ckpt)
        with pytest.raises(SourceChangedError, match="ctime_ns"):
            store.read("w")


def test_an_index_refuses_a_same_size_file_renamed_over_a_rank_file_with_the_old_mtime(indexed, tmp_path):
    ckpt, index = indexed
    other = _save(tmp_path / "other.ckpt", {n: a + 1 for n, a in VALUES.items()})
    st = ckpt.stat()
    assert other.stat().st_size == st.st_size
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, ckpt)
    with pytest.raises(SourceChangedError, match=r"\(ino \d+, was \d+; ctime_ns \d+, was \d+\)"):
        ckptstore.open(index)


def test_an_index_records_inode_and_ctime_of_each_rank_file(indexed):
    ckpt, index = indexed
    st = ckpt.stat()
    records = json.loads((index / "ckptstore.json").read_text())["source_files"]
    assert records == {"net.ckpt": {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                                    "ctime_ns": st.st_ctime_ns}}


def test_an_index_made_before_inodes_were_recorded_opens_and_still_checks_size_and_mtime(indexed):
    ckpt, index = indexed
    doc = json.loads((index / "ckptstore.json").read_text())
    for rec in doc["source_files"].values():
        del rec["ino"], rec["ctime_ns"]
    (index / "ckptstore.json").write_text(json.dumps(doc))
    with ckptstore.open(index) as store:
        assert np.array_equal(store.read("w"), VALUES["w"])
    os.utime(ckpt, ns=(0, 10**9))
    with pytest.raises(SourceChangedError, match=r"\(mtime_ns 1000000000, was \d+\)"):
        ckptstore.open(index)


# ---------------------------------------------------------------------------------------------
# 10. a safetensors crc_num that is not a CRC-32


def _with_crc_num(path: Path, crc: str) -> Path:
    """The MindSpore safetensors file ``path`` with its metadata's crc_num replaced (data unchanged)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"]["crc_num"] = crc
    raw = json.dumps(header).encode()
    out = path.with_name(f"damaged{len(crc)}.safetensors")
    out.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    return out


@pytest.fixture
def crc_safetensors(tmp_path) -> Path:
    path = _save(tmp_path / "net.safetensors", VALUES, format="safetensors", crc_check=True)
    assert scan_rank_file(path).stored_crc is not None
    return path


@pytest.mark.mindspore
@pytest.mark.parametrize("crc", ["²", "9" * 5000, "12a4", "-1", "4294967296", ""],
                         ids=["superscript-two", "5000-digits", "letters", "negative", "2^32", "empty"])
def test_a_crc_num_that_is_not_a_crc32_is_a_corrupt_checkpoint_error_naming_the_file(crc_safetensors, crc):
    damaged = _with_crc_num(crc_safetensors, crc)
    with pytest.raises(CorruptCheckpointError, match=f"crc_num .* is not a CRC-32 .*file {damaged}"):
        scan_rank_file(damaged)


@pytest.mark.mindspore
@pytest.mark.parametrize("crc", ["²", "9" * 5000], ids=["superscript-two", "5000-digits"])
def test_convert_index_and_info_give_one_line_for_a_crc_num_that_is_not_a_crc32(crc_safetensors, tmp_path, crc):
    damaged = _with_crc_num(crc_safetensors, crc)
    for args in (["info", damaged], ["convert", damaged, "--out", tmp_path / "s"],
                 ["index", damaged, "--out", tmp_path / "i"]):
        r = run_cli(*args)
        _one_line_error(r, "CorruptCheckpointError")
        assert str(damaged) in r.stderr and len(r.stderr) < 500, r.stderr


@pytest.mark.mindspore
def test_a_valid_crc_num_is_read_as_its_number(crc_safetensors):
    assert scan_rank_file(_with_crc_num(crc_safetensors, "4294967295")).stored_crc == 4294967295


# ---------------------------------------------------------------------------------------------
# 11. a manifest that claims more bytes than its data file holds


def _claim_8_tib(store: Path) -> None:
    def edit(m):
        w = m["params"]["w"]
        w["shape"] = w["chunk_shape"] = [1 << 20, 1 << 21]  # float32: 8 TiB
        w["chunks"]["nbytes"] = [1 << 43]

    _edit_manifest(store, edit)


@pytest.mark.parametrize("how", ["read", "read_box", "read_verified_row", "load_rank", "export"])
def test_an_8_tib_parameter_over_a_4_kib_file_is_refused_before_allocating(small_store, tmp_path, how):
    _claim_8_tib(small_store)
    message = (r"parameter 'w' \(shape \[\d+, \d+\] of float32\) needs bytes up to byte offset \d+ of file "
               rf"{small_store / 'w' / 'c.0'}, which is only 4096 bytes")
    if how == "read_verified_row":  # a verified read first holds the manifest's shape against the array's zarr.json
        message = (rf"parameter 'w': {small_store / 'w' / 'zarr.json'} describes shape \[1024\] in chunks of "
                   r"\[1024\], the manifest \[1048576, 2097152\] in chunks of \[1048576, 2097152\]")
    with ckptstore.open(small_store) as store, pytest.raises(StoreCorruptError, match=message):
        if how == "read":
            store.read("w")
        elif how == "read_box":
            store.read("w", (slice(0, 16),))  # 128 MiB
        elif how == "read_verified_row":
            store.read("w", (0, slice(0, 4)), verify=True)  # 16 bytes, but the whole chunk is checked
        elif how == "load_rank":
            ckptstore.load_rank(store)["w"]
        else:
            ckptstore.export(store, tmp_path / "out")


def test_export_of_an_8_tib_parameter_is_one_line_at_the_cli(small_store, tmp_path):
    _claim_8_tib(small_store)
    r = run_cli("export", small_store, tmp_path / "out")
    _one_line_error(r, "StoreCorruptError")
    assert "which is only 4096 bytes" in r.stderr


# ---------------------------------------------------------------------------------------------
# 12. a strategy nested too deep


def test_a_json_strategy_nested_5000_deep_is_a_strategy_error(saved_layout, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"parallel_layout_item": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(StrategyError, match=f"strategy file {deep} is not a valid JSON strategy"):
        load_strategy(deep)
    _one_line_error(run_cli("info", deep), "StrategyError")
    _one_line_error(run_cli("convert", saved_layout("dp2_mp4").root, "-s", deep, "--out", tmp_path / "s"),
                    "StrategyError")


# ---------------------------------------------------------------------------------------------
# 13. a FIFO in place of a data file


@pytest.fixture
def fifo_store(small_store) -> Path:
    data = small_store / "w" / "c.0"
    data.unlink()
    os.mkfifo(data)
    return small_store


def test_read_refuses_a_fifo_in_place_of_a_data_file_without_waiting(fifo_store):
    # in a subprocess with a timeout: without the fix open() waits for a writer for ever
    code = (f"import ckptstore\ns = ckptstore.open({str(fifo_store)!r})\n"
            "try:\n    s.read('w')\nexcept ckptstore.CkptStoreError as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "GLOG_v": "3"})
    assert r.stdout.startswith("StoreCorruptError cannot read parameter 'w': ") and \
        f"{fifo_store / 'w' / 'c.0'} is not a regular file (a FIFO)" in r.stdout, (r.stdout, r.stderr)


def test_verify_reports_a_fifo_in_place_of_a_data_file_without_waiting(fifo_store):
    r = run_cli("verify", fifo_store, timeout=60)
    assert r.returncode == 1 and "is not a regular file (a FIFO)" in r.stderr, r.stderr
    assert "FAILED: 2 parameters, 2 chunks" in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------
# 14. export --ranks with a huge range


@pytest.fixture
def dp2_mp4_store(saved_layout, tmp_path) -> Path:
    layout = saved_layout("dp2_mp4")
    ckptstore.convert(layout.root, tmp_path / "store", strategy=layout.strategy_files)
    return tmp_path / "store"


def test_export_checks_each_rank_against_the_layout_before_listing_them(dp2_mp4_store, tmp_path):
    def ranks():  # a range of 10^11 ranks that fails the test if export lists it first
        for r in range(10**11):
            assert r < 100, "export listed the ranks before checking them against the layout"
            yield r

    with ckptstore.open(dp2_mp4_store) as store, \
            pytest.raises(StrategyError, match=r"rank 8 is outside the target layout's 8 ranks \(0\.\.7\)"):
        ckptstore.export(store, tmp_path / "out", ranks=ranks())
    assert not (tmp_path / "out").exists()


def test_export_ranks_0_to_99999999999_is_one_line(dp2_mp4_store, tmp_path):
    r = run_cli("export", dp2_mp4_store, tmp_path / "out", "--ranks", "0-99999999999", timeout=60)
    _one_line_error(r, "StrategyError")
    assert "rank 8 is outside the target layout's 8 ranks" in r.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 15. load_into_net checks everything before it loads anything


def _net(**params: np.ndarray):
    mindspore = pytest.importorskip("mindspore")

    class _Net(mindspore.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            for name, value in params.items():
                setattr(self, name, mindspore.Parameter(mindspore.Tensor(value), name=name))

    return _Net()


@pytest.mark.parametrize("last,error,message", [
    (np.zeros(5, np.float32), LayoutMismatchError, r"parameter 'z': the network expects shape \[5\]"),
    (np.zeros(3, np.int32), InvalidOptionError, "parameter 'z' is int32 in the network but float32 in the store"),
], ids=["shape", "dtype"])
@pytest.mark.mindspore
def test_a_failed_load_into_net_leaves_the_network_as_it_was(tmp_path, last, error, message):
    values = {"a": np.arange(4, dtype=np.float32), "b": np.arange(2, dtype=np.float16), "z": np.ones(3, np.float32)}
    ckptstore.convert(_save(tmp_path / "net.ckpt", values), tmp_path / "store")
    net = _net(a=np.full(4, 9, np.float32), b=np.full(2, 9, np.float16), z=last)
    before = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    with pytest.raises(error, match=message):
        ckptstore.load_into_net(net, tmp_path / "store", rank=0)
    after = {n: p.asnumpy() for n, p in net.parameters_and_names()}
    assert list(after) == ["a", "b", "z"]
    for name in before:
        assert np.array_equal(after[name], before[name]) and after[name].dtype == before[name].dtype, name
