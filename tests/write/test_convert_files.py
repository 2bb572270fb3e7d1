"""Conversions of checkpoint files that exist without MindSpore at test time: files MindSpore
saved earlier, committed under tests/data, and files written by ckptstore's CheckpointWriter
(byte-identical to ``mindspore.save_checkpoint``'s, as test_export.py checks). Runs in ``make
test-pure``; conversions of fixtures MindSpore writes during the run are in test_convert.py and
test_sources.py."""
from __future__ import annotations

import numpy as np

import ckptstore
from ckptstore.dtypes import BFLOAT16
from ckptstore.formats.ckpt_writer import CheckpointWriter
from convert_fixtures import assert_same_array
from repo_paths import DATA


def test_bfloat16_safetensors_rank_files_made_by_mindspore_under_numpy_1(tmp_path):
    """Committed files: MindSpore's safetensors writer fails for bfloat16 under numpy 2, so
    tests/data/make_bf16_safetensors.py saved them with MindSpore in a numpy<2 environment."""
    data = DATA / "bf16_safetensors"
    expected = dict(np.load(data / "global.npz"))
    ckptstore.convert(data, tmp_path / "s", strategy=[data / "strategy.ckpt"])
    with ckptstore.open(tmp_path / "s") as store:
        for name, raw in expected.items():
            value = store.read(name)
            want = raw.view(BFLOAT16) if value.dtype == BFLOAT16 else raw
            assert_same_array(value, want, name)


def test_a_zero_size_dimension_converts_and_reads_as_an_empty_tensor(tmp_path):
    with CheckpointWriter(tmp_path / "z.ckpt") as w:
        w.add("empty", np.zeros((4, 0), dtype=np.float32))
        w.add("w", np.arange(6, dtype=np.float32))
    ckptstore.convert(tmp_path / "z.ckpt", tmp_path / "s")
    with ckptstore.open(tmp_path / "s") as store:
        assert store.read("empty").shape == (4, 0)
        assert list(ckptstore.load_rank(store)) == ["empty", "w"]
