"""Conversion split across processes: ``convert --part I/N`` and ``ckptstore commit``.

Parts run as real ``ckptstore`` processes at the same time (as on several hosts of a shared
filesystem, or against one bucket). Whatever the split, and whichever part is killed and rerun,
the store must be the one a single process writes, byte for byte.
"""
from __future__ import annotations

import signal
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptstore.errors import InvalidOptionError
from ckptstore.write.parts import Part, assign, parse_part

# ---- which part does what (no MindSpore needed) ------------------------------------------------


@pytest.mark.parametrize("spec,env,want", [
    ("0/1", {}, Part(0, 1)),
    ("2/3", {}, Part(2, 3)),
    (" 1 / 4 ", {}, Part(1, 4)),
    ("auto", {"RANK_ID": "5", "RANK_SIZE": "8"}, Part(5, 8)),
    ("auto", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, Part(1, 2)),
    ("AUTO", {"RANK_ID": "1", "RANK_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, Part(1, 2)),
    (None, {}, Part(0, 1)),
])
def test_a_part_is_read_from_the_option_or_the_launcher(spec, env, want):
    assert parse_part(spec, env) == want


@pytest.mark.parametrize("spec,env,message", [
    ("3/3", {}, "parts are numbered 0..N-1"),
    ("1/0", {}, "parts are numbered 0..N-1"),
    ("-1/2", {}, "must be I/N"),
    ("half", {}, "must be I/N"),
    ("auto", {}, "needs RANK_ID and RANK_SIZE"),
    ("auto", {"RANK_ID": "x", "RANK_SIZE": "2"},
     r"RANK_ID='x' in the environment is not a rank \(a whole number from 0\)"),
    ("auto", {"RANK_ID": "0", "RANK_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
     r"disagree about this process's rank: RANK_ID=0 \(msrun\) but OMPI_COMM_WORLD_RANK=1 \(mpirun\)"),
])
def test_a_bad_part_is_refused(spec, env, message):
    with pytest.raises(InvalidOptionError, match=message):
        parse_part(spec, env)


@given(st.lists(st.integers(0, 1 << 40), max_size=60), st.integers(1, 9))
def test_every_unit_goes_to_one_part_and_no_part_carries_more_than_its_share_plus_one_unit(sizes, count):
    owner = assign(sizes, count)
    assert len(owner) == len(sizes) and all(0 <= o < count for o in owner)
    loads = [sum(s for s, o in zip(sizes, owner, strict=True) if o == p) for p in range(count)]
    assert max(loads) <= sum(sizes) / count + max(sizes, default=0)
    assert assign(sizes, count) == owner  # deterministic: every part computes the same split


# ---- real conversions in parts -----------------------------------------------------------------

def _convert_args(layout, out, *extra):
    from convert_fixtures import strategy_args

    return ["convert", str(layout.root), *strategy_args(layout), "--out", str(out), "-q", *map(str, extra)]


def _start(args, env=None, kill_at=None):
    import os

    from convert_fixtures import REPO, cli_command

    full = {**os.environ, "GLOG_v": "3", **(env or {})}
    return subprocess.Popen([*cli_command(kill_at), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, cwd=REPO)


def _run_parts(layout, out, count, env=None, extra=(), kills=None):
    procs = [_start(_convert_args(layout, out, "--part", f"{i}/{count}", *extra), env, (kills or {}).get(i))
             for i in range(count)]
    return [(p.wait(120), p.stdout.read(), p.stderr.read()) for p in procs]


@pytest.fixture(scope="module")
def one_process_store(tmp_path_factory, saved_layout):
    """The dp2_mp4 store written by one process: what every split must reproduce."""
    import ckptstore

    layout = saved_layout("dp2_mp4")
    out = tmp_path_factory.mktemp("one") / "store"
    ckptstore.convert(layout.root, out, strategy=layout.strategy_files)
    return layout, out


@pytest.mark.slow
def test_three_parts_at_once_write_the_store_one_process_writes(one_process_store, tmp_path):
    from convert_fixtures import store_files

    layout, reference = one_process_store
    results = _run_parts(layout, tmp_path / "s", 3)
    assert [rc for rc, _, _ in results] == [0, 0, 0], [e for _, _, e in results]
    assert sum("the last to finish" in out for _, out, _ in results) == 1  # exactly one part committed
    assert store_files(tmp_path / "s") == store_files(reference)


@pytest.mark.slow
def test_a_killed_part_rerun_completes_the_store(one_process_store, tmp_path):
    import ckptstore
    from ckptstore.errors import IncompleteStoreError
    from convert_fixtures import run_cli, store_files

    layout, reference = one_process_store
    results = _run_parts(layout, tmp_path / "s", 3, kills={1: "chunks:1"})
    assert [rc for rc, _, _ in results] == [0, -signal.SIGKILL, 0]
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(tmp_path / "s")
    r = run_cli(*_convert_args(layout, tmp_path / "s", "--part", "1/3"))
    assert r.returncode == 0 and "the last to finish" in r.stdout, r.stderr
    assert store_files(tmp_path / "s") == store_files(reference)


@pytest.mark.slow
def test_parts_racing_to_commit_leave_one_complete_store(one_process_store, tmp_path):
    """Every part finishes, the last is killed just before its manifest; two commits then race."""
    from convert_fixtures import run_cli, store_files

    layout, reference = one_process_store
    for i in range(2):
        assert run_cli(*_convert_args(layout, tmp_path / "s", "--part", f"{i}/3")).returncode == 0
    r = run_cli(*_convert_args(layout, tmp_path / "s", "--part", "2/3"), kill_at="commit")
    assert r.returncode == -signal.SIGKILL
    racers = [_start(["commit", str(tmp_path / "s")]) for _ in range(2)]
    outs = [(p.wait(60), p.stdout.read()) for p in racers]
    assert [rc for rc, _ in outs] == [0, 0]
    assert sorted("committed" in o for _, o in outs) == [False, True]  # one commits, one finds it done
    assert store_files(tmp_path / "s") == store_files(reference)


@pytest.mark.slow
def test_commit_names_what_has_not_finished(one_process_store, tmp_path):
    from convert_fixtures import run_cli

    layout, _ = one_process_store
    assert run_cli(*_convert_args(layout, tmp_path / "s", "--part", "0/2")).returncode == 0
    r = run_cli("commit", tmp_path / "s")
    assert r.returncode == 2 and "is not finished" in r.stderr, r.stderr
    assert "part(s) 1 of 2 have not finished; run (or rerun) them (convert --part I/2), then commit" in r.stderr


@pytest.mark.slow
def test_part_auto_reads_msrun_environment(one_process_store, tmp_path):
    from convert_fixtures import store_files

    layout, reference = one_process_store
    procs = [_start(_convert_args(layout, tmp_path / "s", "--part", "auto"), {"RANK_ID": str(i), "RANK_SIZE": "2"})
             for i in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    assert store_files(tmp_path / "s") == store_files(reference)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "index"])
def test_other_store_kinds_split_into_parts_the_same(saved_layout, tmp_path, fmt):
    import ckptstore
    from convert_fixtures import run_cli, store_files, strategy_args

    layout = saved_layout("mixed_dtypes")
    command = ["index"] if fmt == "index" else ["convert", "--format", "safetensors"]
    one = [*command, str(layout.root), *strategy_args(layout), "-q"]
    assert run_cli(*one, "--out", tmp_path / "one").returncode == 0
    procs = [_start([*one, "--out", str(tmp_path / "parts"), "--part", f"{i}/2"]) for i in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    # (an index names the rank files relative to itself: the two folders are side by side)
    assert store_files(tmp_path / "parts") == store_files(tmp_path / "one")
    with ckptstore.open(tmp_path / "parts") as a, ckptstore.open(tmp_path / "one") as b:
        for name in a.names():
            assert a.read(name).tobytes() == b.read(name).tobytes()


@pytest.mark.slow
def test_three_parts_into_a_bucket_one_killed_and_rerun(one_process_store, bucket):
    import ckptstore
    from ckptstore.errors import IncompleteStoreError
    from ckptstore.testing import s3_server as S
    from convert_fixtures import run_cli, store_files

    layout, reference = one_process_store
    url = bucket.url("model.zarr")
    results = _run_parts(layout, url, 3, env=bucket.env, kills={0: "chunks:1"})
    assert [rc for rc, _, _ in results] == [-signal.SIGKILL, 0, 0], [e for _, _, e in results]
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(url)
    r = run_cli(*_convert_args(layout, url, "--part", "0/3"), env=bucket.env)
    assert r.returncode == 0, r.stderr
    assert S.comparable(S.objects(url)) == S.comparable(store_files(reference))


#: The fields of a stat result beyond its ten sequence fields, copied into a changed one.
_STAT_EXTRA = ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blksize",
               "st_blocks", "st_rdev")


def test_a_part_that_sees_the_rank_files_under_another_device_number_joins_the_conversion(
        saved_layout, tmp_path, monkeypatch):
    # NFS gives the same files another device number on each host that mounts them (inode, size
    # and times are the files' own): part 1 runs as if on a second host
    import os

    import numpy as np

    import ckptstore

    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    assert not ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2").committed
    real_stat = os.stat

    def another_host(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        if not os.fspath(path).startswith(str(layout.root)):
            return st
        fields = [st[i] for i in range(os.stat_result.n_sequence_fields)]
        fields[2] += 1  # st_dev
        return os.stat_result(fields, {k: getattr(st, k) for k in _STAT_EXTRA})

    monkeypatch.setattr(os, "stat", another_host)
    assert os.stat(layout.rank_file(0)).st_dev != real_stat(layout.rank_file(0)).st_dev
    second = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="1/2")
    assert second.committed
    with ckptstore.open(out) as store:
        for name in ("layer0.w", "moe.w"):
            assert np.array_equal(store.read(name), layout.tensors[name])
