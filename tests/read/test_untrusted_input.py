"""Hostile input and races: each finding of the review of untrusted input, as a specification.

1. concurrent conversions into one folder commit one correct store (one writer at a time);
2. a kill between the last data rename and the manifest resumes to the same store, both formats;
3. a strategy that does not describe the rank files (cut short, another layout) is refused;
4. file names in a manifest cannot leave the store (``..``, absolute, symlinks);
5. numbers in a strategy are bounded before they size anything;
6. ``dtype=`` converts only to floating-point types;
7. ``--overwrite`` deletes only what ckptstore wrote, and never the source;
8. every error a user can cause is one line at the CLI (that each is a CkptStoreError: test_errors.py);
9. a rank file edited in place (modification time restored) is not mixed into a resumed store.

Fixtures are the session layouts (conftest.saved_layout: byte-identical to MindSpore's save);
damage is done to copies. Tests that run MindSpore itself are marked ``mindspore``.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import (
    CheckpointFileError,
    IncompleteStoreError,
    InvalidOptionError,
    LayoutMismatchError,
    ReplicaMismatchError,
    StoreCorruptError,
    StoreExistsError,
    StrategyError,
    UnsafePathError,
)
from ckptstore.formats import protowire
from ckptstore.formats.ckpt_reader import scan_checkpoint
from ckptstore.io.local_sink import LocalSink
from ckptstore.read.loader import rank_view
from ckptstore.store.kinds import WORK_DIR
from conftest import copy_layout
from convert_fixtures import (
    assert_same_array,
    cli_command,
    convert_layout,
    expected_values,
    run_cli,
    store_files,
    strategy_args,
)


def _convert_cmd(layout, out: Path, *extra: str) -> list[str]:
    return [*cli_command(), "convert", str(layout.root), *map(str, strategy_args(layout)), "--out", str(out), *extra]


def _assert_store_holds(out: Path, layout) -> None:
    with ckptstore.open(out) as store:
        for name, value in expected_values(layout).items():
            assert_same_array(store.read(name), value, name)
        assert ckptstore.verify(store).ok
    leftovers = [p for p in out.rglob("*") if p.name.endswith((".partial", ".journal")) or p.name == WORK_DIR]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------
# 1. one writer per output folder


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_concurrent_conversions_into_one_folder_commit_one_correct_store(saved_layout, tmp_path, fmt):
    layout = saved_layout("dp2_mp4")
    env = {**os.environ, "GLOG_v": "3"}
    for trial in range(3):
        out = tmp_path / f"trial{trial}"
        procs = [subprocess.Popen(_convert_cmd(layout, out, "--format", fmt), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
        results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
        assert all(code == 0 for code, _, _ in results), results
        wrote = [o for _, o, _ in results if o.startswith("wrote ")]
        nothing = [o for _, o, _ in results if "already holds this conversion" in o]
        assert (len(wrote), len(nothing)) == (1, 2), results
        _assert_store_holds(out, layout)


def test_a_conversion_waits_for_the_holder_of_the_folder_and_says_who_it_is(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    lock = LocalSink(out).lock("lock")
    proc = subprocess.Popen(_convert_cmd(layout, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GLOG_v": "3"})
    try:
        line = proc.stderr.readline()
        assert "is being written by another process (pid " in line and f"{os.getpid()}" in line, line
        time.sleep(0.3)
        assert proc.poll() is None  # still waiting
    finally:
        lock.release()
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    _assert_store_holds(out, layout)


@pytest.mark.slow
def test_the_lock_dies_with_a_killed_holder(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--workers", "1",
                kill_at="chunks:3")
    assert r.returncode == -signal.SIGKILL
    fd = os.open(out / WORK_DIR / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise BlockingIOError if still held
    finally:
        os.close(fd)
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    _assert_store_holds(out, layout)


# ---------------------------------------------------------------------------------------------
# 2. the commit window


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_a_kill_between_the_data_files_and_the_manifest_resumes_to_the_same_store(saved_layout, tmp_path, fmt):
    layout = saved_layout("dp2_mp4")
    reference, out = tmp_path / "one_go", tmp_path / "s"
    assert run_cli("convert", layout.root, *strategy_args(layout), "--out", reference, "-q", "--format",
                   fmt).returncode == 0
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--format", fmt,
                kill_at="commit")
    assert r.returncode == -signal.SIGKILL
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(out)
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--format", fmt)
    assert r.returncode == 0, r.stderr
    _assert_store_holds(out, layout)
    manifest = "zarr.json" if fmt == "zarr" else "ckptstore.json"
    assert {k: v for k, v in store_files(out).items() if k != manifest} == \
        {k: v for k, v in store_files(reference).items() if k != manifest}


# ---------------------------------------------------------------------------------------------
# 3. a strategy that does not describe the files


def _layout_item_offsets(data: bytes) -> list[int]:
    return [at for num, _, _, at in protowire.iter_fields(data) if num == 3]


def test_a_strategy_cut_at_any_item_boundary_gives_a_typed_error_or_the_true_tensors(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    data = layout.strategy_files[0].read_bytes()
    refused = 0
    for i, at in enumerate(_layout_item_offsets(data)[1:], start=1):
        cut = tmp_path / f"cut{i}.ckpt"
        cut.write_bytes(data[:at])
        out = tmp_path / f"s{i}"
        try:
            ckptstore.convert(layout.root, out, strategy=[cut])
        except LayoutMismatchError as e:
            assert "does not describe these rank files" in str(e) or "should hold the whole tensor" in str(e)
            refused += 1
            continue
        _assert_store_holds(out, layout)  # only replicated parameters were cut off: still right
    assert refused >= 5


@pytest.mark.parametrize("files,strategy_dev", [("dp2_mp4", (8,)), ("mp_rows", (2, 4))],
                         ids=["dp2xmp4-files-mp8-strategy", "mp8-files-dp2xmp4-strategy"])
def test_a_strategy_of_another_layout_with_the_same_world_size_is_refused(saved_layout, tmp_path, files,
                                                                         strategy_dev):
    layout = saved_layout(files)
    def remap(tmap):  # device axes the other matrix lacks leave the tensor axis whole
        return tuple(m if m < len(strategy_dev) else -1 for m in tmap)

    other = [s if not s.in_strategy else
             T.ParamSpec(s.name, s.shape, s.dtype, strategy_dev, remap(s.tensor_map), 0, 0) for s in layout.specs]
    strategy = T.write_strategy(tmp_path / "other.ckpt", other, writer="ckptstore")
    with pytest.raises((LayoutMismatchError, ReplicaMismatchError), match="does not describe these rank files"):
        ckptstore.convert(layout.root, tmp_path / "s", strategy=[strategy])
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# 4. file names in the manifest stay inside the store


def _edit_manifest(store: Path, edit) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"]["ckptstore"])
    (store / "zarr.json").write_text(json.dumps(doc))


@pytest.fixture
def converted(saved_layout, tmp_path) -> Path:
    out = tmp_path / "store"
    convert_layout(saved_layout("dp2_mp4"), out)
    return out


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "layer0.w/../../outside.bin", "a//b", ".",
                                  "a\\..\\b", "x\x00y"])
def test_a_manifest_file_name_that_leaves_the_store_is_refused_at_open(converted, name):
    (converted.parent / "outside.bin").write_bytes(b"\xab" * 4096)
    _edit_manifest(converted, lambda m: m["params"]["layer0.w"]["chunks"].__setitem__("files", [name]))
    with pytest.raises(StoreCorruptError, match="parameter 'layer0.w'"):
        ckptstore.open(converted)


def test_a_data_file_that_is_a_symlink_is_not_followed(converted):
    outside = converted.parent / "outside.bin"
    with ckptstore.open(converted) as store:
        key = store.info("layer0.w").chunks.files[0]
        size = (converted / key).stat().st_size
    outside.write_bytes(b"\xab" * size)
    (converted / key).unlink()
    (converted / key).symlink_to(outside)
    with ckptstore.open(converted) as store, pytest.raises(UnsafePathError, match="is a symbolic link"):
        store.read("layer0.w")


def test_a_folder_on_the_way_to_a_data_file_that_is_a_symlink_is_not_followed(converted, tmp_path):
    with ckptstore.open(converted) as store:
        key = store.info("layer0.w").chunks.files[0]
    folder = converted / key.split("/")[0]
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    folder.symlink_to(moved)
    with ckptstore.open(converted) as store, pytest.raises(UnsafePathError):
        store.read("layer0.w")


# ---------------------------------------------------------------------------------------------
# 5. bounded numbers


def _strategy_bytes(dev_matrix: list[int], tensor_map: list[int], *, opt_size: int = 0) -> bytes:
    ms = pytest.importorskip("mindspore")

    smap = ms.train.node_strategy_pb2.ParallelStrategyMap()
    smap.current_stage = 1
    item = smap.parallel_layout_item.add()
    item.param_name = "w"
    lay = item.parallel_layouts
    lay.dev_matrix.add().dim.extend(dev_matrix)
    lay.tensor_map.add().dim.extend(tensor_map)
    lay.param_split_shape.add()
    lay.indices_offset.add()
    lay.field = 0
    lay.opt_weight_shard_step = 1 if opt_size else 0
    lay.opt_weight_shard_size = opt_size
    return smap.SerializeToString()


@pytest.mark.parametrize("dev,tmap,opt,message", [
    ([1 << 20, 1 << 20], [0, -1], 0, "spans more than 1048576 devices"),
    ([2] * 70, [0], 0, "more than 64 entries"),
    ([8], [0], 1 << 30, "optimizer shard size"),
], ids=["2^40-devices", "70-axes", "huge-opt-shard"])
@pytest.mark.mindspore
def test_a_strategy_claiming_too_many_devices_is_refused_before_anything_is_sized(tmp_path, dev, tmap, opt, message):
    path = tmp_path / "huge.ckpt"
    path.write_bytes(_strategy_bytes(dev, tmap, opt_size=opt))
    with pytest.raises(StrategyError, match=message):
        load_strategy(path)
    r = run_cli("info", path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[StrategyError]" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# 6. dtype= only converts to floating-point types


@pytest.mark.mindspore
@pytest.mark.parametrize("dtype", ["int8", "int32", "bool", "uint16"])
def test_an_integer_or_bool_dtype_is_refused(converted, tmp_path, dtype):
    mindspore = pytest.importorskip("mindspore")

    with ckptstore.open(converted) as store:
        with pytest.raises(InvalidOptionError, match=f"{dtype} is not a floating-point type"):
            rank_view(store, dtype=np.dtype(dtype))
        with pytest.raises(InvalidOptionError, match="not a floating-point type"):
            ckptstore.load_rank(store, dtype=getattr(mindspore, "bool_" if dtype == "bool" else dtype))
        with pytest.raises(InvalidOptionError, match="not a floating-point type"):
            ckptstore.export(store, tmp_path / "out", dtype=np.dtype(dtype))
    assert not (tmp_path / "out").exists()
    r = run_cli("export", converted, tmp_path / "cli", "--dtype", dtype)
    assert r.returncode == 2 and "[InvalidOptionError]" in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ---------------------------------------------------------------------------------------------
# 7. --overwrite deletes only ckptstore's files


def test_overwrite_never_writes_into_a_folder_that_holds_the_source(saved_layout, tmp_path):
    layout = copy_layout(saved_layout("dp2_mp4"), tmp_path / "ckpt")
    before = store_files(layout.root)
    for extra in ([], ["--overwrite"]):
        r = run_cli("convert", layout.root, *strategy_args(layout), "--out", layout.root, *extra)
        assert r.returncode == 2 and "contains the source checkpoint" in r.stderr, r.stderr
    assert store_files(layout.root) == before


def test_overwrite_of_a_store_that_holds_the_source_deletes_nothing(saved_layout, converted):
    layout = copy_layout(saved_layout("dp2_mp4"), converted / "ckpt")  # the checkpoint kept inside the store
    before = store_files(converted)
    with pytest.raises(StoreExistsError, match="contains the source checkpoint"):
        convert_layout(layout, converted, overwrite=True)
    assert store_files(converted) == before


def test_overwrite_keeps_files_ckptstore_did_not_write(saved_layout, converted):
    (converted / "notes.txt").write_text("mine")
    (converted / "mine").mkdir()
    (converted / "mine" / "data.bin").write_bytes(b"x")
    convert_layout(saved_layout("dp2_mp4"), converted, overwrite=True, include=["layer0.*"])
    assert (converted / "notes.txt").read_text() == "mine" and (converted / "mine" / "data.bin").exists()
    with ckptstore.open(converted) as store:
        assert store.names() == ["layer0.w", "layer0.b"]


# ---------------------------------------------------------------------------------------------
# 8. typed errors, one line at the CLI


def test_every_single_byte_flip_in_the_record_headers_gives_a_typed_error_or_a_scan(saved_layout):
    path = saved_layout("mixed_dtypes").rank_file(0)
    data = path.read_bytes()
    index = scan_checkpoint(path)
    payload = np.zeros(len(data), dtype=bool)
    for entry in index.entries.values():
        for offset, length in entry.pieces:
            payload[offset:offset + length] = True
    headers = np.flatnonzero(~payload)
    assert 200 < len(headers) < 5000
    damaged = path.parent / "damaged.ckpt"
    for at in headers.tolist():
        for flip in (0x01, 0x80, 0xFF):
            blob = bytearray(data)
            blob[at] ^= flip
            damaged.write_bytes(bytes(blob))
            try:
                scan_checkpoint(damaged)
            except CheckpointFileError as e:
                assert str(damaged) in str(e)
    damaged.unlink()


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.__setitem__("params", None), "'params' and 'source' must be JSON objects"),
    (lambda m: m["params"].__setitem__("layer0.w", None), "its entry is not a JSON object"),
    (lambda m: m["params"]["layer0.w"].__setitem__("shape", [2 ** 62, 2 ** 62]),
     r"shape holds an entry that is not an integer in 0\.\.1125899906842624"),
    (lambda m: m["params"]["layer0.w"]["chunks"]["offset"].__setitem__(0, -1), "not an integer in 0"),
    (lambda m: m["params"]["layer0.w"].__setitem__("codec", {"id": "pickle"}), "codec"),
    (lambda m: m["params"]["layer0.w"].__setitem__("dtype", "object"), "not an element type"),
], ids=["params-null", "param-null", "huge-shape", "negative-offset", "pickle-codec", "object-dtype"])
def test_a_malformed_manifest_is_a_store_corrupt_error_at_open_and_one_line_at_the_cli(converted, edit, message):
    _edit_manifest(converted, edit)
    with pytest.raises(StoreCorruptError, match=message):
        ckptstore.open(converted)
    for args in (["info", converted], ["verify", converted]):
        r = run_cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "[StoreCorruptError]" in r.stderr, r.stderr


def test_a_data_file_replaced_by_a_folder_is_a_typed_error_naming_it(converted):
    with ckptstore.open(converted) as store:
        key = store.info("layer0.w").chunks.files[0]
    (converted / key).unlink()
    (converted / key).mkdir()
    with ckptstore.open(converted) as store, pytest.raises(StoreCorruptError, match=f"{key} is not a regular file"):
        store.read("layer0.w")


def test_a_truncated_data_file_read_by_columns_is_a_typed_error(converted):
    with ckptstore.open(converted) as store:
        key = store.info("layer1.w").chunks.files[0]
        os.truncate(converted / key, 100)
        with pytest.raises(StoreCorruptError, match="parameter 'layer1.w'.*truncated"):
            store.read("layer1.w", (slice(None), slice(1, 3)))


def test_a_malformed_source_strategy_record_is_a_store_corrupt_error(converted):
    _edit_manifest(converted, lambda m: m["source"]["strategy"].__setitem__("params", [1, 2]))
    with ckptstore.open(converted) as store, pytest.raises(StoreCorruptError, match="source strategy is malformed"):
        rank_view(store, None, 0)


@pytest.mark.parametrize("rank", [1.5, True, "0"])
def test_a_rank_that_is_not_an_integer_is_refused(converted, rank):
    with ckptstore.open(converted) as store, pytest.raises(InvalidOptionError, match="rank must be an integer"):
        rank_view(store, None, rank)


def test_names_given_as_one_string_are_one_pattern(converted):
    with ckptstore.open(converted) as store:
        assert rank_view(store, None, 0, names="layer0.w").names() == ["layer0.w"]
        assert rank_view(store, None, 0, names="layer0.*").names() == ["layer0.w", "layer0.b"]


@pytest.mark.parametrize("ranks", ["3-1", "-1", "a", "1,,2"])
def test_export_refuses_a_rank_list_that_selects_nothing(converted, tmp_path, ranks):
    r = run_cli("export", converted, tmp_path / "out", "--ranks", ranks)
    assert r.returncode == 2 and "--ranks" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 9. a rank file edited in place is not mixed into a resumed store


@pytest.mark.slow
def test_an_in_place_edit_with_the_modification_time_restored_is_not_resumed(saved_layout, tmp_path):
    layout = copy_layout(saved_layout("dp2_mp4"), tmp_path / "ckpt")
    out = tmp_path / "s.zarr"
    args = ["convert", layout.root, *strategy_args(layout), "--out", out, "-q", "--workers", "1"]
    assert run_cli(*args, kill_at="chunks:3").returncode == -signal.SIGKILL
    for rank in (1, 5):  # both replicas of rows 8..16 of layer0.w: same size, new bytes, old mtime
        path = layout.rank_file(rank)
        st = path.stat()
        entry = scan_checkpoint(path)["layer0.w"]
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            f.seek(entry.pieces[0][0])
            f.write(np.full(4, 7.0, np.float32).tobytes())
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    r = run_cli(*args)
    assert r.returncode == 2 and "unfinished conversion of other files or options" in r.stderr, r.stderr
    assert run_cli(*args, "--overwrite").returncode == 0
    with ckptstore.open(out) as store:
        assert np.all(store.read("layer0.w")[8:9, :4] == 7.0)  # ranks 1 and 5 hold rows 8..16 of layer0.w

