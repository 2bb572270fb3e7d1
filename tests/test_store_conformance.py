"""One conformance suite for every kind of store (in the spirit of zarr-python's ``StoreTests``).

A Zarr store, a safetensors store and an index of the original rank files must behave the same
through the public API: every target rank equals MindSpore's ``transform_checkpoints``, exactly
the planned bytes are read and only when a parameter is touched, a damaged or changed file is
refused, an interrupted write resumes to the same store, and file names in the metadata cannot
reach outside the store (or, for an index, outside its rank files' folder). Each kind is a
subclass that says how to make a store of it.
"""
from __future__ import annotations

import json
import os
import signal
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import ckptstore  # noqa: E402
from ckptstore.store.kinds import MANIFEST, ROOT_METADATA  # noqa: E402
from ckptstore.errors import (  # noqa: E402
    IncompleteStoreError,
    SourceChangedError,
    StoreCorruptError,
    UnsafePathError,
)
from ckptstore.store.executor import IO_STATS  # noqa: E402
from conftest import copy_layout  # noqa: E402
from convert_fixtures import run_cli, store_files, strategy_args  # noqa: E402
from load_fixtures import CASES, assert_same_dict, load_env, to_numpy  # noqa: E402,F401

#: Source -> target pairs every kind is checked on (all layouts, dtypes, pipeline, opt sharding).
CONFORMANCE_CASES = ["mp_cols->mp2", "dp2_mp4->dp2_mp2", "dp2_mp4->dp4_mp2", "opt_shard->dp2_mp2_optshard",
                     "pipeline2->1stage", "pipeline2->same-none", "mixed_dtypes->dp2_mp2_optshard",
                     "mixed_dtypes->1rank"]


class StoreKindTests:
    """The behaviour every store kind shares. Subclasses set ``kind`` and :meth:`write`."""

    kind = ""
    manifest_file = MANIFEST

    def write(self, layout, out: Path, **kwargs) -> None:
        raise NotImplementedError

    def cli_args(self) -> list[str]:
        raise NotImplementedError

    def make(self, load_env, layout_kind: str) -> Path:
        cache = _STORES.setdefault((self.kind, layout_kind), [])
        if not cache:
            out = load_env.base / f"conformance_{self.kind}_{layout_kind}"
            self.write(load_env.saved_layout(layout_kind), out)
            cache.append(out)
        return cache[0]

    # ---- values ------------------------------------------------------------------------------

    @pytest.mark.parametrize("case_id", CONFORMANCE_CASES)
    def test_every_target_rank_equals_transform_checkpoints(self, load_env, case_id):
        t = load_env.target(case_id)
        store = ckptstore.open(self.make(load_env, CASES[case_id].kind))
        assert store.kind == self.kind
        for rank in range(t.world):
            params = ckptstore.load_rank(store, t.strategy, rank)
            assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank),
                             f"{self.kind} {case_id} rank {rank}")

    def test_global_tensors_read_back_exactly(self, load_env):
        layout = load_env.saved_layout("mixed_dtypes")
        with ckptstore.open(self.make(load_env, "mixed_dtypes")) as store:
            for name, value in layout.tensors.items():
                got = store.read(name)
                assert got.dtype == np.asarray(value).dtype and got.tobytes() == np.asarray(value).tobytes(), name

    def test_export_writes_what_transform_checkpoints_writes(self, load_env, tmp_path):
        t = load_env.target("dp2_mp4->dp2_mp2")
        with ckptstore.open(self.make(load_env, "dp2_mp4")) as store:
            ckptstore.export(store, tmp_path / "out", strategy=t.strategy)
        import mindspore_fixtures as T

        for rank in range(t.world):
            assert_same_dict(T.load_oracle(tmp_path / "out" / f"rank_{rank}" / f"checkpoint_{rank}.ckpt"),
                             t.oracle(rank), f"export rank {rank}")

    # ---- reads -------------------------------------------------------------------------------

    def test_exactly_the_planned_bytes_are_read_and_only_on_access(self, load_env):
        t = load_env.target("dp2_mp4->dp2_mp2")
        store = ckptstore.open(self.make(load_env, "dp2_mp4"))
        IO_STATS.reset()
        params = ckptstore.load_rank(store, t.strategy, 1)
        assert IO_STATS.bytes_read == 0
        params["layer1.w"]
        assert IO_STATS.bytes_read == params.plan.params["layer1.w"].nbytes == t.oracle(1)["layer1.w"].nbytes
        params.materialize()
        assert IO_STATS.bytes_read == params.plan.nbytes

    def test_info_names_the_kind(self, load_env):
        r = run_cli("info", self.make(load_env, "dp2_mp4"), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["backend"] == self.kind

    def test_verify_passes_and_compares_with_the_source(self, load_env):
        layout = load_env.saved_layout("opt_shard")
        with ckptstore.open(self.make(load_env, "opt_shard")) as store:
            report = ckptstore.verify(store, against=layout.root, strategy=layout.strategy_files)
        assert report.ok, report.problems

    # ---- damage ------------------------------------------------------------------------------

    def test_metadata_file_names_outside_the_folder_are_refused(self, load_env, tmp_path):
        store = _copy(self.make(load_env, "dp2_mp4"), tmp_path / "s")
        doc = json.loads((store / self.manifest_file).read_text())
        manifest = doc["attributes"]["ckptstore"] if self.manifest_file == ROOT_METADATA else doc
        manifest["params"]["layer0.w"]["chunks"]["files"] = ["../../etc/passwd"]
        (store / self.manifest_file).write_text(json.dumps(doc))
        with pytest.raises(StoreCorruptError, match="'..' component"):
            ckptstore.open(store)

    @pytest.mark.slow
    def test_an_interrupted_write_is_refused_then_resumed_to_the_same_store(self, load_env, tmp_path):
        layout = load_env.saved_layout("dp2_mp4")
        reference, out = tmp_path / "one_go", tmp_path / "s"
        assert run_cli(*self.cli_args(), layout.root, *strategy_args(layout), "--out", reference, "-q").returncode == 0
        r = run_cli(*self.cli_args(), layout.root, *strategy_args(layout), "--out", out, "-q", "--workers", "1",
                    kill_at="commit")
        assert r.returncode == -signal.SIGKILL
        with pytest.raises(IncompleteStoreError):
            ckptstore.open(out)
        assert run_cli(*self.cli_args(), layout.root, *strategy_args(layout), "--out", out, "-q").returncode == 0
        same = {k: v for k, v in store_files(out).items() if k != self.manifest_file}
        assert same == {k: v for k, v in store_files(reference).items() if k != self.manifest_file}
        with ckptstore.open(out) as a, ckptstore.open(reference) as b:
            for name in a.names():
                assert np.array_equal(np.asarray(a.read(name)), np.asarray(b.read(name))), name


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


_STORES: dict[tuple[str, str], list[Path]] = {}


class TestZarrStore(StoreKindTests):
    kind = "zarr"
    manifest_file = ROOT_METADATA

    def write(self, layout, out, **kwargs):
        ckptstore.convert(layout.root, out, strategy=layout.strategy_files, **kwargs)

    def cli_args(self):
        return ["convert"]

    def test_a_damaged_chunk_is_found(self, load_env, tmp_path):
        store = _copy(self.make(load_env, "dp2_mp4"), tmp_path / "s")
        key = ckptstore.open(store).info("layer0.w").chunks.files[0]
        os.truncate(store / key, 10)
        with ckptstore.open(store) as s, pytest.raises(StoreCorruptError, match="parameter 'layer0.w'"):
            s.read("layer0.w")


class TestSafetensorsStore(StoreKindTests):
    kind = "safetensors"

    def write(self, layout, out, **kwargs):
        ckptstore.convert(layout.root, out, strategy=layout.strategy_files, format="safetensors", **kwargs)

    def cli_args(self):
        return ["convert", "--format", "safetensors"]

    def test_a_damaged_byte_is_found_by_verify(self, load_env, tmp_path):
        store = _copy(self.make(load_env, "dp2_mp4"), tmp_path / "s")
        data_file = next(store.glob("model-*.safetensors"))
        raw = bytearray(data_file.read_bytes())
        raw[-3] ^= 0xFF
        data_file.write_bytes(bytes(raw))
        with ckptstore.open(store) as s:
            assert not ckptstore.verify(s).ok


class TestIndexStore(StoreKindTests):
    kind = "index"

    def write(self, layout, out, **kwargs):
        ckptstore.index(layout.root, out, strategy=layout.strategy_files, checksum=True, **kwargs)

    def cli_args(self):
        return ["index", "--checksum"]

    def test_the_index_copies_no_payload(self, load_env):
        store = self.make(load_env, "dp2_mp4")
        assert sorted(p.name for p in store.iterdir()) == [MANIFEST]
        layout = load_env.saved_layout("dp2_mp4")
        rank_bytes = sum(p.stat().st_size for p in layout.root.rglob("*.ckpt") if "rank_" in str(p))
        assert (store / MANIFEST).stat().st_size < rank_bytes

    def test_a_rank_file_changed_since_is_refused(self, load_env, tmp_path):
        layout = copy_layout(load_env.saved_layout("dp2_mp4"), tmp_path / "ckpt")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        path = layout.rank_file(3)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
        with pytest.raises(SourceChangedError, match=r"rank_3/net-1_1.ckpt changed since the index was made"):
            ckptstore.open(tmp_path / "s")

    def test_a_rank_file_changed_after_open_is_refused_at_read(self, load_env, tmp_path):
        layout = copy_layout(load_env.saved_layout("dp2_mp4"), tmp_path / "ckpt")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        store = ckptstore.open(tmp_path / "s")
        path = layout.rank_file(0)
        path.chmod(0o644)
        with open(path, "ab") as f:
            f.write(b"\0")
        with pytest.raises(SourceChangedError, match="changed since the index was made"):
            store.read("embedding.table")

    def test_store_and_rank_files_can_move_together(self, load_env, tmp_path):
        layout = copy_layout(load_env.saved_layout("dp2_mp4"), tmp_path / "job" / "ckpt")
        ckptstore.index(layout.root, tmp_path / "job" / "index", strategy=layout.strategy_files)
        shutil.move(tmp_path / "job", tmp_path / "moved")
        with ckptstore.open(tmp_path / "moved" / "index") as s:
            assert np.array_equal(s.read("layer0.w"), layout.tensors["layer0.w"])

    def test_a_rank_folder_reached_through_a_symlink_is_not_followed(self, load_env, tmp_path):
        original = self.make(load_env, "dp2_mp4")
        store = _copy(original, tmp_path / "s")
        doc = json.loads((store / MANIFEST).read_text())
        real = Path(os.path.normpath(original / doc["source_root"]))
        link = tmp_path / "link"
        link.mkdir()
        for rank_dir in real.glob("rank_*"):  # the same files, each rank folder a symlink to the real one
            (link / rank_dir.name).symlink_to(rank_dir)
        doc["source_root"] = os.path.relpath(link, store)
        (store / MANIFEST).write_text(json.dumps(doc))
        with pytest.raises(UnsafePathError, match="symbolic link"):
            ckptstore.open(store)

    def test_without_checksum_verify_says_there_is_nothing_to_check(self, load_env, tmp_path):
        layout = load_env.saved_layout("dp2_mp4")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        r = run_cli("verify", tmp_path / "s")
        assert r.returncode == 0 and "no checksums" in r.stdout, r.stdout + r.stderr
