"""Issue 26.2 and 26.3: which checkpoint a folder of rank folders really holds.

2. A pipeline job killed while saving leaves the newest epoch in stage 0's rank folders only
   (MindFormers' network saves ``<prefix>-network-<epoch>_<step>.ckpt``): the newest checkpoint that
   every rank holds is taken and the summary says so, or the candidates are named.
3. A job rerun from scratch in the same folder: ModelCheckpoint names the second run's files
   ``<prefix>_1-<epoch>_<step>.ckpt`` (MindFormers' prefixes are ``<p>_rank_<r>``); the newest run
   is taken, as MindFormers' by-rank transform does (newest modification time), and ranks whose
   newest files are of different runs are refused.

Rank files are what ``mindspore.save_checkpoint`` writes, written by ckptstore's byte-identical writer
(:func:`~ckptstore.testing.sample_checkpoint.save_distributed` with ``writer="ckptstore"``).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import InvalidOptionError, LayoutMismatchError, MissingRankError
from ckptstore.testing.layouts import layout_specs
from ckptstore.testing.oracle import load_oracle
from ckptstore.testing.sample_checkpoint import make_global_tensors, save_distributed
from convert_fixtures import run_cli


def _save(root: Path, kind: str, seed: int, prefix: str, suffix: str, mtime: float, *,
          network_only: bool = False) -> dict[str, np.ndarray]:
    """``layout_specs(kind)`` saved as by MindSpore; ``network_only`` as MindFormers' ``save_network_params``
    saves: no optimizer state, no counters (nothing that tells two steps apart but the bytes)."""
    specs, world, stages = layout_specs(kind)
    if network_only:
        specs = [s for s in specs if not s.name.startswith("adam_") and s.name not in ("global_step", "learning_rate")]
    tensors = make_global_tensors(specs, seed=seed)
    for path in save_distributed(root, specs, tensors, world_size=world, stages=stages, prefix=prefix,
                                 step_suffix=suffix, writer="ckptstore"):
        os.utime(path, (mtime, mtime))
    return tensors


def _strategy(root: Path) -> list[Path]:
    return sorted(root.glob("strategy*.ckpt"))


def _values(store) -> dict[str, np.ndarray]:
    with ckptstore.open(store) as s:
        return {n: s.read(n) for n in s.names()}


def _assert_store_holds(store, tensors: dict[str, np.ndarray]) -> None:
    got = _values(store)
    for name, value in tensors.items():
        assert got[name].tobytes() == np.asarray(value).tobytes(), name


# ---- 2. a pipeline job killed while saving ----------------------------------------------------

@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, dict, dict]:
    root = tmp_path_factory.mktemp("killed")
    first = _save(root, "pipeline2", 1, "llama-network", "-1_100", 1_000_000, network_only=True)
    second = _save(root, "pipeline2", 2, "llama-network", "-2_100", 2_000_000, network_only=True)
    for r in range(4, 8):  # stage 1 was killed before it saved epoch 2
        (root / f"rank_{r}" / "llama-network-2_100.ckpt").unlink()
    return root, first, second


@pytest.mark.parametrize("kind", ["convert", "index"])
def test_the_newest_checkpoint_every_rank_holds_is_taken_and_named(killed, tmp_path, kind):
    root, first, _ = killed
    summary = getattr(ckptstore, kind)(root, tmp_path / "s", strategy=_strategy(root))
    _assert_store_holds(tmp_path / "s", first)
    assert summary.chosen == ("took epoch 1 step 100, the newest checkpoint every rank holds (rank_0..3 also hold "
                              "epoch 2 step 100, which the other ranks lack: a save cut short?); choose another "
                              "with --epoch and --step")


def test_the_cli_prints_which_checkpoint_it_took(killed, tmp_path):
    root, _, _ = killed
    r = run_cli("convert", root, *[a for f in _strategy(root) for a in ("-s", f)], "--out", tmp_path / "s", "-q")
    assert r.returncode == 0, r.stderr
    assert "note: took epoch 1 step 100, the newest checkpoint every rank holds" in r.stdout


def test_an_epoch_some_ranks_lack_is_refused_naming_the_rank_folder(killed, tmp_path):
    root, _, _ = killed
    with pytest.raises(MissingRankError, match=f"no .ckpt or .safetensors file with epoch 2 in {root}/rank_4"):
        ckptstore.convert(root, tmp_path / "s", strategy=_strategy(root), epoch=2)


@pytest.mark.parametrize("option", ["epoch", "step"])
def test_a_negative_epoch_or_step_is_refused_as_an_option_not_as_a_missing_file(killed, tmp_path, option):
    root, _, _ = killed
    with pytest.raises(InvalidOptionError, match=f"^{option} must be a non-negative integer, not -1$"):
        ckptstore.convert(root, tmp_path / "s", strategy=_strategy(root), **{option: -1})
    r = run_cli("convert", root, *[a for f in _strategy(root) for a in ("-s", f)], "--out", tmp_path / "s",
                f"--{option}", "-1")
    assert r.returncode == 2
    assert r.stderr == (f"ckptstore: error: Invalid value for '--{option}': -1 is not in the range x>=0. "
                        "(see 'ckptstore convert --help') [UsageError]\n")


def test_epoch_and_step_pick_an_older_checkpoint_every_rank_holds(killed, tmp_path):
    root, first, _ = killed
    summary = ckptstore.convert(root, tmp_path / "s", strategy=_strategy(root), epoch=1, step=100)
    assert summary.chosen is None
    _assert_store_holds(tmp_path / "s", first)


def test_ranks_with_no_checkpoint_in_common_are_refused_naming_the_candidates(killed, tmp_path):
    root, _, _ = killed
    for r in range(8):
        (tmp_path / f"rank_{r}").symlink_to(root / f"rank_{r}")
    (tmp_path / "rank_5").unlink()
    (tmp_path / "rank_5").mkdir()
    (tmp_path / "rank_5" / "llama-network-3_100.ckpt").symlink_to(root / "rank_5" / "llama-network-1_100.ckpt")
    with pytest.raises(LayoutMismatchError) as info:
        ckptstore.convert(tmp_path, tmp_path / "s", strategy=_strategy(root))
    assert (f"no checkpoint of {tmp_path} is held by every rank (rank_0: llama-network-1_100.ckpt, "
            "llama-network-2_100.ckpt;") in str(info.value)
    assert "rank_5: llama-network-3_100.ckpt;" in str(info.value)
    assert str(info.value).endswith("choose one with --epoch and --step, or --prefix")


# ---- 3. a job rerun from scratch in the same folder --------------------------------------------

def _rerun(root: Path, prefix_of) -> tuple[dict, dict]:
    """First run: -1_50 and -1_100; the second, started later from scratch: <prefix>_1-1_50."""
    for suffix, seed, mtime in (("-1_50", 3, 1_000_000), ("-1_100", 4, 1_000_100)):
        first = _save(root, "dp2_mp4", seed, "tmp", suffix, mtime)
        _rename(root, f"tmp{suffix}", lambda r, s=suffix: f"{prefix_of(r)}{s}")
    second = _save(root, "dp2_mp4", 5, "tmp", "-1_50", 2_000_000)
    _rename(root, "tmp-1_50", lambda r: f"{prefix_of(r)}_1-1_50")
    return first, second


def _rename(root: Path, stem: str, new) -> None:
    for r in range(8):
        (root / f"rank_{r}" / f"{stem}.ckpt").rename(root / f"rank_{r}" / f"{new(r)}.ckpt")


@pytest.mark.parametrize("prefix_of", [lambda r: "net", lambda r: f"llama_rank_{r}"],
                         ids=["ModelCheckpoint", "MindFormers"])
def test_the_newest_run_is_taken_and_named(tmp_path, prefix_of):
    _, second = _rerun(tmp_path / "ckpt", prefix_of)
    summary = ckptstore.convert(tmp_path / "ckpt", tmp_path / "s", strategy=_strategy(tmp_path / "ckpt"))
    _assert_store_holds(tmp_path / "s", second)
    assert summary.chosen == ("the rank folders hold 2 or more runs of the job (a rerun in the same folder); took "
                              f"the newest run's files, e.g. {prefix_of(0)}_1-1_50.ckpt (newest modification time, "
                              "as MindFormers' transform picks)")


def test_ranks_whose_newest_files_are_of_different_runs_are_refused(tmp_path):
    root = tmp_path / "ckpt"
    _rerun(root, lambda r: "net")
    os.utime(root / "rank_3" / "net_1-1_50.ckpt", (900_000, 900_000))  # rank 3's first run is newer there
    with pytest.raises(LayoutMismatchError, match="hold reruns of a job and their newest files are of different "
                                                  r"runs \(rank_0..2, rank_4..7: net_1-1_50.ckpt; rank_3: "
                                                  r"net-1_100.ckpt\); choose the files with --prefix"):
        ckptstore.convert(root, tmp_path / "s", strategy=_strategy(root))


def test_a_prefix_with_rank_picks_one_run_of_per_rank_prefixes(tmp_path):
    # MindFormers' prefixes differ per rank (llama_rank_<r>): no one prefix names the first run
    first, _ = _rerun(tmp_path / "ckpt", lambda r: f"llama_rank_{r}")
    ckptstore.convert(tmp_path / "ckpt", tmp_path / "s", strategy=_strategy(tmp_path / "ckpt"),
                      prefix="llama_rank_{rank}-")
    _assert_store_holds(tmp_path / "s", first)


@pytest.mark.mindspore  # the counters as mindspore.load_checkpoint reads them
def test_full_training_files_of_different_steps_are_refused_naming_the_counters(tmp_path):
    # one file per rank folder, so the names offer no choice; the counters the save appended tell
    root = tmp_path / "ckpt"
    _save(root, "pipeline2", 1, "llama", "-1_100", 1_000_000)
    _save(tmp_path / "later", "pipeline2", 2, "llama", "-2_100", 2_000_000)
    for r in range(4):
        (root / f"rank_{r}" / "llama-1_100.ckpt").unlink()
        (tmp_path / "later" / f"rank_{r}" / "llama-2_100.ckpt").rename(root / f"rank_{r}" / "llama-2_100.ckpt")
    late, early = (int(load_oracle(root / f"rank_{r}" / name)["global_step"][0])
                   for r, name in ((0, "llama-2_100.ckpt"), (4, "llama-1_100.ckpt")))
    assert late != early
    with pytest.raises(LayoutMismatchError) as info:
        ckptstore.convert(root, tmp_path / "s", strategy=_strategy(root))
    assert str(info.value) == (
        f"the rank files are of different training steps: global_step is {late} in rank(s) 0..3 "
        f"({root}/rank_0/llama-2_100.ckpt); {early} in rank(s) 4..7 ({root}/rank_4/llama-1_100.ckpt). The folder "
        "mixes checkpoints (a save cut short, or files of several runs); choose one with --epoch and --step, or "
        "--prefix")


def test_info_lists_each_ranks_checkpoints_and_marks_the_ones_taken(killed):
    root, _, _ = killed
    r = run_cli("info", root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{root}: 8 rank folders"
    assert lines[1] == "  rank_0: *llama-network-1_100.ckpt, llama-network-2_100.ckpt"
    assert lines[5] == "  rank_4: *llama-network-1_100.ckpt"
    assert lines[-1].startswith("* taken by convert/index: took epoch 1 step 100, the newest checkpoint every rank")
