"""Which strategy describes which files, and what is done with one that does not (issues 17, 19).

* a part of a conversion with another strategy does not join a half-written store (17.16);
* MindFormers' filtered saves: parameters the strategy lists but no rank file holds (17.17);
* MindFormers' strategy folders: one strategy file per rank, several per stage (17.18);
* the wrong model's strategy as a load target (19.4);
* rank files of another layout with the same world size (19.8).

Every checkpoint here is written by ``mindspore.save_checkpoint`` and every strategy in the
compiler's (or MindFormers') format, through :mod:`mindspore_fixtures`.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore_fixtures as T  # noqa: E402
import ckptstore  # noqa: E402
from ckptstore.errors import StoreExistsError  # noqa: E402


# ---- 17.16: the conversion's fingerprint covers the strategy -----------------------------------

def _moe_permuted(specs: list[T.ParamSpec]) -> list[T.ParamSpec]:
    """dp2_mp4's specs with ``moe.w`` ([4, 8, 8], dev [2, 4], map [1, -1, 0]) on dev [4, 2], map [0, -1, 1]:
    the same slice shapes on the same ranks, but rank r holds another slice (axis 0 part r % 2
    instead of r // 4). No slice of ``moe.w`` is replicated, so the files cannot tell."""
    return [replace(s, dev_matrix=(4, 2), tensor_map=(0, -1, 1)) if s.name == "moe.w" else s for s in specs]


def test_a_part_with_another_strategy_is_refused_by_a_half_written_store(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    other = T.write_strategy(tmp_path / "other_strategy.ckpt", _moe_permuted(layout.specs))
    out = tmp_path / "s.zarr"
    first = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2")
    assert not first.committed
    with pytest.raises(StoreExistsError) as info:
        ckptstore.convert(layout.root, out, strategy=[other], part="1/2")
    assert str(info.value) == (f"{out} holds an unfinished conversion of other files or options; rerun that command "
                               "to finish it, or pass --overwrite to start again")


def test_the_other_strategy_alone_is_accepted_and_makes_another_tensor(saved_layout, tmp_path):
    # what the refusal above prevents: a store mixing two layouts' moe.w
    layout = saved_layout("dp2_mp4")
    other = T.write_strategy(tmp_path / "other_strategy.ckpt", _moe_permuted(layout.specs))
    ckptstore.convert(layout.root, tmp_path / "a.zarr", strategy=layout.strategy_files)
    ckptstore.convert(layout.root, tmp_path / "b.zarr", strategy=[other])
    with ckptstore.open(tmp_path / "a.zarr") as a, ckptstore.open(tmp_path / "b.zarr") as b:
        assert np.array_equal(a.read("moe.w"), layout.tensors["moe.w"])
        assert not np.array_equal(b.read("moe.w"), layout.tensors["moe.w"])
        assert np.array_equal(b.read("layer0.w"), layout.tensors["layer0.w"])


def test_the_same_strategy_resumes_the_other_part(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2")
    second = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="1/2")
    assert second.committed
    with ckptstore.open(out) as store:
        assert np.array_equal(store.read("moe.w"), layout.tensors["moe.w"])
