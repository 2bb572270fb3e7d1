"""Every store kind passes :class:`ckptstore.testing.store_kind_tests.StoreKindTests`: Zarr,
safetensors and an index of the original rank files; plus what only one kind does (a damaged
Zarr chunk, a flipped safetensors byte, an index's rank files changed, moved or linked)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import SourceChangedError, StoreCorruptError, UnsafePathError
from ckptstore.store.kinds import MANIFEST, ROOT_METADATA
from ckptstore.testing.layouts import copy_layout
from ckptstore.testing.store_kind_tests import StoreKindTests, copy_store
from convert_fixtures import run_cli


class TestZarrStore(StoreKindTests):
    kind = "zarr"
    manifest_file = ROOT_METADATA

    def write(self, layout, out, **kwargs):
        ckptstore.convert(layout.root, out, strategy=layout.strategy_files, **kwargs)

    def cli_args(self):
        return ["convert"]

    def test_a_damaged_chunk_is_found(self, sample_layouts, tmp_path):
        store = copy_store(self.make(sample_layouts, "dp2_mp4"), tmp_path / "s")
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

    def test_a_damaged_byte_is_found_by_verify(self, sample_layouts, tmp_path):
        store = copy_store(self.make(sample_layouts, "dp2_mp4"), tmp_path / "s")
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

    def test_the_index_copies_no_payload(self, sample_layouts):
        store = self.make(sample_layouts, "dp2_mp4")
        assert sorted(p.name for p in store.iterdir()) == [MANIFEST]
        layout = sample_layouts.saved_layout("dp2_mp4")
        rank_bytes = sum(p.stat().st_size for p in layout.root.rglob("*.ckpt") if "rank_" in str(p))
        assert (store / MANIFEST).stat().st_size < rank_bytes

    def test_a_rank_file_changed_since_is_refused(self, sample_layouts, tmp_path):
        layout = copy_layout(sample_layouts.saved_layout("dp2_mp4"), tmp_path / "ckpt")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        path = layout.rank_file(3)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
        with pytest.raises(SourceChangedError, match=r"rank_3/net-1_1.ckpt changed since the index was made"):
            ckptstore.open(tmp_path / "s")

    def test_a_rank_file_changed_after_open_is_refused_at_read(self, sample_layouts, tmp_path):
        layout = copy_layout(sample_layouts.saved_layout("dp2_mp4"), tmp_path / "ckpt")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        store = ckptstore.open(tmp_path / "s")
        path = layout.rank_file(0)
        path.chmod(0o644)
        with open(path, "ab") as f:
            f.write(b"\0")
        with pytest.raises(SourceChangedError, match="changed since the index was made"):
            store.read("embedding.table")

    def test_store_and_rank_files_can_move_together(self, sample_layouts, tmp_path):
        layout = copy_layout(sample_layouts.saved_layout("dp2_mp4"), tmp_path / "job" / "ckpt")
        ckptstore.index(layout.root, tmp_path / "job" / "index", strategy=layout.strategy_files)
        shutil.move(tmp_path / "job", tmp_path / "moved")
        with ckptstore.open(tmp_path / "moved" / "index") as s:
            assert np.array_equal(s.read("layer0.w"), layout.tensors["layer0.w"])

    def test_a_rank_folder_reached_through_a_symlink_is_not_followed(self, sample_layouts, tmp_path):
        original = self.make(sample_layouts, "dp2_mp4")
        store = copy_store(original, tmp_path / "s")
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

    def test_without_checksum_verify_says_there_is_nothing_to_check(self, sample_layouts, tmp_path):
        layout = sample_layouts.saved_layout("dp2_mp4")
        ckptstore.index(layout.root, tmp_path / "s", strategy=layout.strategy_files)
        r = run_cli("verify", tmp_path / "s")
        assert r.returncode == 0 and "no checksums" in r.stdout, r.stdout + r.stderr
