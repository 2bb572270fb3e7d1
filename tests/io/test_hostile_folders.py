"""Output folders someone else can write into, power losses, and readers racing a replacement (issue 17).

* 17.1: a symbolic link planted where ckptstore writes or locks never makes it write outside the
  folder: the file it points to is untouched, and the run is refused (one line, exit 2) or safe;
* 17.2: a work folder's ``plan.json`` torn by a power loss is written again, not a traceback;
* 17.4: a reader of a store that ``convert --overwrite`` replaces gets the old bytes or a
  :class:`StoreChangedError`, never the new store's bytes;
* 17.5: ``export`` into a folder holding a file the store reads is refused.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import ckptstore
from ckptstore.errors import StoreChangedError
from ckptstore.store.kinds import ROOT_METADATA, WORK_DIR
from conftest import copy_layout
from convert_fixtures import (
    assert_same_array,
    convert_layout,
    expected_values,
    run_cli,
    store_files,
    strategy_args,
)

SECRET = b"a file of the victim that the attacker wants overwritten\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir()
    victim.write_bytes(SECRET)
    return victim


def _convert(layout, out: Path, *extra: str, **kw):
    return run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", *extra, **kw)


def _one_line_error(r, kind: str) -> None:
    assert r.returncode == 2 and f"[{kind}]" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def _assert_store_holds(out: Path, layout) -> None:
    with ckptstore.open(out) as store:
        for name, value in expected_values(layout).items():
            assert_same_array(store.read(name), value)


# ---------------------------------------------------------------------------------------------
# 17.1 planted symbolic links


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(saved_layout, tmp_path):
    layout, victim, out = saved_layout("dp2_mp4"), _victim(tmp_path), tmp_path / "shared" / "s.zarr"
    (out / WORK_DIR).mkdir(parents=True)
    (out / WORK_DIR / "lock").symlink_to(victim)
    r = _convert(layout, out)
    _one_line_error(r, "UnsafePathError")
    assert str(out / WORK_DIR / "lock") in r.stderr
    assert victim.read_bytes() == SECRET


def test_a_work_folder_planted_as_a_link_is_refused_before_anything_is_written_through_it(saved_layout, tmp_path):
    layout, victim, out = saved_layout("dp2_mp4"), _victim(tmp_path), tmp_path / "shared" / "s.zarr"
    out.mkdir(parents=True)
    (out / WORK_DIR).symlink_to(victim.parent, target_is_directory=True)
    r = _convert(layout, out)
    _one_line_error(r, "UnsafePathError")
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]
    assert victim.read_bytes() == SECRET


@pytest.mark.parametrize("fmt,name", [("zarr", ROOT_METADATA), ("safetensors", "ckptstore.json"),
                                      ("safetensors", "model-00001-of-00001.safetensors")])
def test_a_partial_file_planted_as_a_link_is_not_written_through(saved_layout, tmp_path, fmt, name):
    layout, victim, out = saved_layout("dp2_mp4"), _victim(tmp_path), tmp_path / "shared" / "s"
    out.mkdir(parents=True)
    (out / f"{name}.partial").symlink_to(victim)
    r = _convert(layout, out, "--format", fmt)
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        _one_line_error(r, "UnsafePathError")
    else:
        _assert_store_holds(out, layout)
    assert victim.read_bytes() == SECRET


def test_a_partial_file_of_a_resumed_conversion_planted_as_a_link_is_refused(saved_layout, tmp_path):
    layout, victim, out = saved_layout("dp2_mp4"), _victim(tmp_path), tmp_path / "s.zarr"
    assert _convert(layout, out, "--workers", "1", kill_at="chunks:3").returncode == -9
    (partial,) = [p for p in out.rglob("*.partial")]
    partial.unlink()
    partial.symlink_to(victim)
    r = _convert(layout, out, "--workers", "1")
    _one_line_error(r, "UnsafePathError")
    assert victim.read_bytes() == SECRET


def test_an_exported_partial_file_planted_as_a_link_is_not_written_through(saved_layout, tmp_path):
    layout, victim = saved_layout("dp2_mp4"), _victim(tmp_path)
    store, out = tmp_path / "s.zarr", tmp_path / "export"
    convert_layout(layout, store)
    (out / "rank_1").mkdir(parents=True)
    (out / "rank_1" / "checkpoint_1.ckpt.partial").symlink_to(victim)
    r = run_cli("export", store, out, "--ranks", "1", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert victim.read_bytes() == SECRET
    assert not (out / "rank_1" / "checkpoint_1.ckpt").is_symlink()
    assert run_cli("export", store, tmp_path / "clean", "--ranks", "1").returncode == 0
    clean = tmp_path / "clean/rank_1/checkpoint_1.ckpt"
    assert (out / "rank_1" / "checkpoint_1.ckpt").read_bytes() == clean.read_bytes()


# ---------------------------------------------------------------------------------------------
# 17.2 a work folder's plan torn by a power loss


@pytest.mark.parametrize("torn", [b"", b'{"format": "zarr", "names": ["lay'], ids=["emptied", "cut"])
def test_a_torn_plan_is_written_again_by_the_rerun(saved_layout, tmp_path, torn):
    layout, out, reference = saved_layout("dp2_mp4"), tmp_path / "s.zarr", tmp_path / "reference.zarr"
    convert_layout(layout, reference)
    assert _convert(layout, out, kill_at="commit").returncode == -9
    (out / WORK_DIR / "plan.json").write_bytes(torn)
    r = _convert(layout, out)
    assert r.returncode == 0, r.stderr
    assert store_files(out) == store_files(reference)


def test_commit_of_a_torn_plan_says_to_rerun_the_conversion_and_a_part_rewrites_it(saved_layout, tmp_path):
    layout, out, reference = saved_layout("dp2_mp4"), tmp_path / "s.zarr", tmp_path / "reference.zarr"
    convert_layout(layout, reference)
    assert _convert(layout, out, "--part", "0/2").returncode == 0
    (out / WORK_DIR / "plan.json").write_bytes(b"")
    r = run_cli("commit", out)
    _one_line_error(r, "IncompleteStoreError")
    assert "plan.json" in r.stderr and "convert" in r.stderr
    r = _convert(layout, out, "--part", "1/2")
    assert r.returncode == 0, r.stderr
    assert store_files(out) == store_files(reference)


# ---------------------------------------------------------------------------------------------
# 17.4 a reader racing convert --overwrite


def test_a_reader_of_a_replaced_store_gets_an_error_not_the_new_bytes(saved_layout, tmp_path):
    a = saved_layout("dp2_mp4")
    b = saved_layout("mp_rows")
    out = tmp_path / "s.zarr"
    convert_layout(a, out)
    store = ckptstore.open(out)
    first, *others = store.names()
    assert_same_array(store.read(first), expected_values(a)[first])
    convert_layout(b, out, overwrite=True)
    shared = [n for n in others if n in expected_values(a)]
    with pytest.raises(StoreChangedError, match="was replaced while it was read .*; open it again"):
        for name in shared:
            got = store.read(name)
            assert_same_array(got, expected_values(a)[name])  # an old file still open: the old bytes
    store.close()
    with ckptstore.open(out) as fresh:
        for name, value in expected_values(b).items():
            assert_same_array(fresh.read(name), value)


def test_a_store_moved_away_while_read_is_read_on_from_its_own_folder(saved_layout, tmp_path):
    a, b = saved_layout("dp2_mp4"), saved_layout("mp_rows")
    out = tmp_path / "s.zarr"
    convert_layout(a, out)
    store = ckptstore.open(out)
    first, *others = store.names()
    assert_same_array(store.read(first), expected_values(a)[first])
    out.rename(tmp_path / "moved.zarr")  # another store now at the path: the reader keeps to its folder
    convert_layout(b, out)
    for name in others:
        assert_same_array(store.read(name), expected_values(a)[name])
    store.close()


def test_reading_a_store_that_was_not_replaced_is_not_refused(saved_layout, tmp_path):
    layout, out = saved_layout("dp2_mp4"), tmp_path / "s.zarr"
    convert_layout(layout, out)
    with ckptstore.open(out) as store:
        assert _convert(layout, out).returncode == 0  # a rerun of the same conversion changes nothing
        for name, value in expected_values(layout).items():
            assert_same_array(store.read(name), value)


# ---------------------------------------------------------------------------------------------
# 17.5 export over the files a store reads


def test_export_into_the_rank_file_folder_of_an_index_is_refused(saved_layout, tmp_path):
    layout = copy_layout(saved_layout("dp2_mp4"), tmp_path / "ckpt")
    index = tmp_path / "s.index"
    ckptstore.index(layout.root, index, strategy=layout.strategy_files)
    before = store_files(layout.root)
    r = run_cli("export", index, layout.root, *strategy_args(layout))
    _one_line_error(r, "StoreExistsError")
    assert store_files(layout.root) == before
    with ckptstore.open(index) as store:
        assert_same_array(store.read("layer0.w"), expected_values(layout)["layer0.w"])


def test_export_into_the_folder_of_the_store_itself_is_refused(saved_layout, tmp_path):
    layout, out = saved_layout("dp2_mp4"), tmp_path / "s.zarr"
    convert_layout(layout, out)
    before = store_files(out)
    _one_line_error(run_cli("export", out, tmp_path), "StoreExistsError")
    assert store_files(out) == before


def test_a_parent_of_the_output_swapped_for_a_link_is_refused_and_nothing_lands_in_its_target(saved_layout, tmp_path):
    layout, victim = saved_layout("dp2_mp4"), _victim(tmp_path)
    tmp_path.chmod(0o777)  # a folder others can write into: one of them swapped 'shared' for a link
    (tmp_path / "shared").symlink_to(victim.parent, target_is_directory=True)
    r = _convert(layout, tmp_path / "shared" / "s.zarr")
    _one_line_error(r, "UnsafePathError")
    assert f"{tmp_path / 'shared'} on the way to the output" in r.stderr
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]
