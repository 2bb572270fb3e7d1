"""The MindSpore-free fixture writer (``save_distributed(..., writer="ckptstore")``) writes the same
bytes as MindSpore: every rank file and strategy file of every standard layout and of the other
spec sets tests write with it (the demo's PanGu layout with optimizer sharding, ``big_specs``), in
both strategy formats, with and without CRC trailers, and the target strategy files of every CASES
target.

This is what lets the session layouts (and the tests built on them) run without MindSpore.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GLOG_v", "3")

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

from ckptstore.testing.layouts import CASES, LAYOUT_KINDS, layout_specs
from ckptstore.testing.sample import pangu_specs
from ckptstore.testing.sample_checkpoint import make_global_tensors, save_distributed, write_strategy
from convert_fixtures import big_specs

#: Spec sets beyond layout_specs that tests save with writer="ckptstore": (specs, world, stages).
OTHER_SPECS = {
    "pangu-dp2-mp4": (pangu_specs(hidden=32, layers=1, vocab=64, seq=8, dp=2, mp=4), 8, 1),
    "big": big_specs(),
}


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_both_writers_write_identical_files_for_every_standard_layout(tmp_path: Path) -> None:
    differ = []
    for kind, (specs, world, stages) in {**{k: layout_specs(k) for k in LAYOUT_KINDS}, **OTHER_SPECS}.items():
        tensors = make_global_tensors(specs, seed=11)
        for strategy_format, crc in (("protobuf", False), ("json", True)):
            out = {}
            for writer in ("mindspore", "ckptstore"):
                root = tmp_path / f"{kind}-{strategy_format}-{writer}"
                save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True,
                                 strategy_format=strategy_format, crc_check=crc, writer=writer)
                out[writer] = _files(root)
            assert len(out["mindspore"]) == world + stages
            if out["mindspore"] != out["ckptstore"]:
                differ.append((kind, strategy_format))
    for case in CASES.values():  # the target strategy files too (relayouts, optimizer-sharded targets)
        specs = case.target(layout_specs(case.kind)[0]) if case.mode == "file" else None
        if specs is not None:
            a = write_strategy(tmp_path / "t" / f"{case.id}-ms.ckpt", specs).read_bytes()
            b = write_strategy(tmp_path / "t" / f"{case.id}-cs.ckpt", specs, writer="ckptstore").read_bytes()
            if a != b:
                differ.append((case.id, "target"))
    assert differ == []
