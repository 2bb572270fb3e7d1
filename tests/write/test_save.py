"""Saving from training: every rank saves its local slices; the store is the global tensors.

Rank slices are MindSpore's own: each rank process reads the rank file ``mindspore.save_checkpoint``
wrote for it in the ``saved_layout`` fixtures (cut by MindSpore's slicing code), and the ranks
of a job save concurrently, as separate processes (tests/save_worker.py). Expected values are
the fixtures' global tensors and, for other layouts, MindSpore's ``transform_checkpoints``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.dtypes import BFLOAT16
from ckptstore.errors import IncompleteStoreError, InvalidOptionError, StoreExistsError
from conftest import SavedLayout
from convert_fixtures import assert_same_array, data_files, expected_values
from repo_paths import REPO, TESTS

WORKER = TESTS / "save_worker.py"


def run_ranks(layout: SavedLayout, root: Path, *, step: int = 1, ranks: list[int] | None = None,
              kill_after: dict[int, int] | None = None, chunk_mb: int | None = None) -> dict[int, Any]:
    """Start one process per rank at once; each saves its slices. Returns each rank's summary
    (a dict) or, for a process that did not exit cleanly, its return code."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    procs = {}
    for r in (range(layout.world) if ranks is None else ranks):
        cmd = [sys.executable, str(WORKER), "--rank-file", str(layout.rank_file(r)), "--root", str(root),
               "--step", str(step), "--rank", str(r)]
        for f in layout.strategy_files:
            cmd += ["--strategy", str(f)]
        if chunk_mb:
            cmd += ["--chunk-mb", str(chunk_mb)]
        if kill_after and r in kill_after:
            cmd += ["--kill-after", str(kill_after[r])]
        procs[r] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: dict[int, Any] = {}
    for r, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[r] = json.loads(stdout) if p.returncode == 0 else p.returncode
        if p.returncode not in (0, -9):
            raise AssertionError(f"rank {r} failed:\n{stderr}")
    return out


def distinct_bytes(layout: SavedLayout) -> int:
    return sum(np.asarray(v).nbytes for v in expected_values(layout).values())


def assert_store_holds(root: Path | str, expected: dict[str, np.ndarray]) -> None:
    store = ckptstore.open(root)
    assert sorted(store.names()) == sorted(expected)
    for name, value in expected.items():
        assert_same_array(store.read(name), value, name)


@pytest.fixture(scope="session")
def saved_by_ranks(saved_layout, tmp_path_factory):
    """``saved_by_ranks(kind)``: the layout's ranks, each in its own process, saved step 1 at once."""
    cache: dict[str, tuple[SavedLayout, Path, dict[int, Any]]] = {}

    def get(kind: str):
        if kind not in cache:
            layout = saved_layout(kind)
            root = tmp_path_factory.mktemp(f"saved_{kind}")
            cache[kind] = (layout, root, run_ranks(layout, root))
        return cache[kind]

    return get


# ---- one process, whole tensors --------------------------------------------------------------


def test_one_process_saves_whole_tensors_and_values_as_a_ckpt_holds_them(tmp_path):
    values = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "bf": np.arange(6, dtype=BFLOAT16) / 3,
              "mask": np.array([True, False]), "global_step": np.array([7], np.int32),
              "epoch_num": 2, "learning_rate": 0.5, "network": "llama"}
    summary = ckptstore.save_rank(values, tmp_path, step=7)
    assert (summary.step, summary.rank, summary.world, summary.committed) == (7, 0, 1, True)
    store = ckptstore.open(tmp_path)
    assert store.root == tmp_path / "step_7"
    assert store.source["step"] == 7
    for name in ("w", "bf", "mask", "global_step"):
        assert_same_array(store.read(name), values[name], name)
    assert_same_array(store.read("epoch_num"), np.array(2, np.int64), "int scalar")  # as append_dict saves it
    assert_same_array(store.read("learning_rate"), np.array(0.5, np.float32), "float scalar")
    assert store.read("network") == "llama"


def test_a_saved_step_is_a_zarr_store_zarr_python_reads(tmp_path):
    zarr = pytest.importorskip("zarr")
    w = np.arange(64, dtype=np.float32).reshape(16, 4)
    ckptstore.save_rank({"w": w, "b": np.ones(3, BFLOAT16)}, tmp_path, step=1, chunk_mb=1)
    group = zarr.open_group(str(tmp_path / "step_1"), mode="r")
    np.testing.assert_array_equal(group["w"][...], w)
    assert group["b"].dtype == BFLOAT16 or str(group["b"].dtype) == "bfloat16"


def _two_column_ranks() -> Any:
    """A job of 2 ranks, each holding half the columns of ``w``."""
    from ckptstore.checkpoint.layout import Layout
    from ckptstore.checkpoint.strategy import Strategy

    return Strategy({"w": {0: Layout((2,), ((), (0,)))}}, stage_devices=2)


def test_a_slice_cut_into_many_chunks_is_written_as_one_shard_file_zarr_python_reads(tmp_path):
    zarr = pytest.importorskip("zarr")
    w = np.arange(1031 * 512, dtype=np.float32).reshape(1031, 512)  # 1031 rows (a prime): cut row by row
    for rank in (0, 1):
        local = np.ascontiguousarray(w[:, rank * 256:(rank + 1) * 256])  # 1 MiB and a bit: over chunk_mb=1
        ckptstore.save_rank({"w": local}, tmp_path, step=1, strategy=_two_column_ranks(), rank=rank, chunk_mb=1)
    step = tmp_path / "step_1"
    shard = 1031 * 256 * 4 + 1031 * 16 + 4  # the slice's 1031 one-row chunks, then the shard index
    assert data_files(step) == {"w/c.0.0": shard, "w/c.0.1": shard}  # not one file per row
    np.testing.assert_array_equal(zarr.open_group(str(step), mode="r")["w"][...], w)
    store = ckptstore.open(tmp_path)
    assert len(store.info("w").chunks) == 2 * 1031
    assert_same_array(store.read("w"), w, "w")


def test_a_saved_array_keeps_its_slice_files_beside_its_zarr_json_which_zarr_python_reads(tmp_path):
    zarr = pytest.importorskip("zarr")
    w = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for rank in (0, 1):  # each rank's half of the columns is one chunk
        local = {"w": np.ascontiguousarray(w[:, rank * 3:(rank + 1) * 3]), "global_step": np.array([5], np.int32)}
        ckptstore.save_rank(local, tmp_path, step=1, strategy=_two_column_ranks(), rank=rank)
    step = tmp_path / "step_1"
    meta = json.loads((step / "w" / "zarr.json").read_text())
    assert meta["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "."}}
    assert data_files(step) == {"w/c.0.0": 8 * 3 * 4, "w/c.0.1": 8 * 3 * 4, "global_step/c.0": 4}
    assert sorted(p.name for p in (step / "w").iterdir()) == ["c.0.0", "c.0.1", "zarr.json"]  # no c/ folders
    group = zarr.open_group(str(step), mode="r")
    np.testing.assert_array_equal(group["w"][...], w)
    np.testing.assert_array_equal(group["global_step"][...], [5])


def test_a_background_save_hands_a_sharded_slice_over_in_pieces_within_its_budget(tmp_path):
    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.save import prepare_save

    w = np.arange(1031 * 1024, dtype=np.float32).reshape(1031, 1024)  # 4 MiB of one-row chunks
    expected = w.copy()
    saver = AsyncSaver(memory_budget=2 << 20)
    job = prepare_save({"w": w}, tmp_path, step=1, chunk_mb=1)
    sizes: list[int] = []
    pieces = job.pieces

    def recording() -> Any:
        for piece in pieces():
            sizes.append(len(piece[2]))
            yield piece

    job.pieces = recording
    saver.save(job)
    w += 1  # training goes on
    saver.wait()
    assert saver.last.committed and saver.last.bytes_written == expected.nbytes
    assert sizes == [1 << 20] * 4 + [expected.nbytes - (4 << 20)]  # pieces of chunk_mb, not 4 KiB rows
    assert saver.peak_staged == 2 << 20  # two pieces staged at once: the budget, not all of it
    assert list(data_files(tmp_path / "step_1")) == ["w/c.0.0"]
    assert_store_holds(tmp_path, {"w": expected})


def test_a_chunk_larger_than_the_budget_is_copied_in_pieces_and_checksummed_whole(tmp_path):
    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.save import prepare_save

    values = {"w": np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024), "b": np.ones(5, np.float32)}
    expected = {n: v.copy() for n, v in values.items()}
    saver = AsyncSaver(memory_budget=1 << 20)
    saver.save(prepare_save(values, tmp_path, step=1, chunk_mb=4))  # w: one 4 MiB chunk, four 1 MiB pieces
    saver.wait()
    assert saver.peak_staged == 1 << 20
    assert data_files(tmp_path / "step_1") == {"w/c.0.0": 4 << 20, "b/c.0": 20}
    assert len(ckptstore.open(tmp_path).info("w").chunks) == 1
    report = ckptstore.verify(tmp_path)
    assert report.ok and report.chunks == 2, report.problems  # the CRC-32C is of the whole chunk
    assert_store_holds(tmp_path, expected)


def test_a_rank_makes_its_array_metadata_durable_with_its_slice_files(tmp_path, monkeypatch):
    # a committed step whose arrays' zarr.json was never fsynced could lose them in a power loss
    from ckptstore.io.local_sink import LocalSink

    synced: list[str] = []
    make_durable = LocalSink.make_durable

    def recording(sink: LocalSink, keys: list[str]) -> None:
        synced.extend(keys)
        make_durable(sink, keys)

    monkeypatch.setattr(LocalSink, "make_durable", recording)
    ckptstore.save_rank({"w": np.ones((4, 2), np.float32), "b": np.zeros(3, np.float32)}, tmp_path, step=1)
    assert sorted(synced) == ["b/c.0", "b/zarr.json", "w/c.0.0", "w/zarr.json"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int64", "uint8"])
@pytest.mark.parametrize("shape,chunks", [((4, 6), (2, 6)), ((), ()), ((2, 3, 4), (1, 3, 4))])
def test_saved_array_metadata_is_what_zarr_python_writes(dtype, shape, chunks):
    from ckptstore.store import zarr as zb

    assert json.loads(zb.raw_array_metadata(shape, dtype, chunks)) == json.loads(
        zb.array_metadata(shape, dtype, chunks, None, sharded=False))


def test_an_unknown_format_or_step_is_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match="zarr stores only"):
        ckptstore.save_rank({"w": np.ones(2)}, tmp_path, step=1, format="safetensors")
    with pytest.raises(InvalidOptionError, match="step must be a non-negative integer"):
        ckptstore.save_rank({"w": np.ones(2)}, tmp_path, step=-1)


def test_include_and_exclude_choose_what_is_saved(tmp_path):
    values = {"w1": np.ones(2), "w2": np.ones(2), "adam_m.w1": np.zeros(2), "global_step": np.array([1], np.int32)}
    ckptstore.save_rank(values, tmp_path, step=1, include=["w*", "adam_m.*"], exclude=["w2"])
    assert ckptstore.open(tmp_path).names() == ["w1", "adam_m.w1"]


def test_a_committed_step_is_not_saved_again(tmp_path):
    ckptstore.save_rank({"w": np.ones(2)}, tmp_path, step=3)
    with pytest.raises(StoreExistsError, match="step 3 is already committed"):
        ckptstore.save_rank({"w": np.zeros(2)}, tmp_path, step=3)
    assert_same_array(ckptstore.open(tmp_path).read("w"), np.ones(2), "the first save")


def test_the_newest_committed_step_opens_and_each_step_opens_by_its_folder(tmp_path):
    for step in (2, 10, 9):
        ckptstore.save_rank({"w": np.full(2, step, np.int32)}, tmp_path, step=step)
    assert ckptstore.open(tmp_path).source["step"] == 10  # by number, not by name or by age
    assert_same_array(ckptstore.open(tmp_path / "step_9").read("w"), np.full(2, 9, np.int32), "step 9")


def test_a_rank_cannot_be_guessed_in_a_job_of_several(tmp_path, saved_layout, monkeypatch):
    layout = saved_layout("mp_rows")
    for var in ("RANK_ID", "RANK_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MS_ROLE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(InvalidOptionError, match="which rank is this process"):
        ckptstore.save_rank({"layer0.b": np.ones(8, np.float32)}, tmp_path, step=1, strategy=layout.strategy_files)


@pytest.mark.mindspore
def test_each_save_of_the_same_parameters_reuses_their_plan_and_strategy(saved_layout, tmp_path):
    import mindspore as ms

    from ckptstore.write.save import prepare_save

    layout = saved_layout("mp_rows")
    local = ms.load_checkpoint(str(layout.rank_file(1)))  # mindspore.Parameter values
    first = prepare_save(local, tmp_path, step=1, strategy=layout.strategy_files, rank=1)
    again = prepare_save(local, tmp_path, step=2, strategy=layout.strategy_files, rank=1)
    assert again.plan is first.plan and again.strategy is first.strategy


def test_a_save_of_other_shapes_is_planned_again(tmp_path):
    from ckptstore.write.save import prepare_save

    first = prepare_save({"w": np.zeros((4, 2), np.float32)}, tmp_path, step=1)
    other = prepare_save({"w": np.zeros((6, 2), np.float32)}, tmp_path, step=2)
    assert other.plan is not first.plan and other.plan.params[0].shape == (6, 2)


@pytest.mark.mindspore
def test_a_strategy_file_rewritten_between_saves_is_read_again(saved_layout, tmp_path):
    import mindspore as ms

    from ckptstore.checkpoint.strategy import load_strategy
    from ckptstore.write.save import prepare_save

    rows, cols = saved_layout("mp_rows"), saved_layout("mp_cols")
    strategy = tmp_path / "strategy.ckpt"
    strategy.write_bytes(rows.strategy_files[0].read_bytes())
    local = ms.load_checkpoint(str(rows.rank_file(0)))
    first = prepare_save(local, tmp_path / "out", step=1, strategy=strategy, rank=0)
    strategy.write_bytes(cols.strategy_files[0].read_bytes())  # the job's layout changed
    again = prepare_save(local, tmp_path / "out", step=2, strategy=strategy, rank=0)
    assert again.strategy.layouts == load_strategy(cols.strategy_files).layouts != first.strategy.layouts


# ---- every layout, every rank its own process ------------------------------------------------


#: Every layout starts one process per rank (8 interpreters importing MindSpore, 6-20 s here): slow tier.
KINDS = [pytest.param(k, marks=pytest.mark.slow) for k in T.LAYOUT_KINDS]


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", KINDS)
def test_ranks_saving_at_once_make_a_store_of_the_global_tensors(saved_by_ranks, kind):
    layout, root, summaries = saved_by_ranks(kind)
    assert sum(s["committed"] for s in summaries.values()) == 1  # the last rank to finish
    assert_store_holds(root, expected_values(layout))


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", KINDS)
def test_each_distinct_byte_is_written_once(saved_by_ranks, kind):
    layout, root, summaries = saved_by_ranks(kind)
    # ranks write only chunks (scalars are 0-d chunks); str values go into the manifest
    assert sum(s["bytes_written"] for s in summaries.values()) == distinct_bytes(layout)
    assert sum(data_files(root / "step_1").values()) == distinct_bytes(layout)


@pytest.mark.mindspore
@pytest.mark.slow
def test_replicated_slices_are_shared_out_over_their_replica_group(saved_by_ranks):
    layout, root, summaries = saved_by_ranks("dp2_mp4")
    written = [summaries[r]["bytes_written"] for r in range(layout.world)]
    store = ckptstore.open(root)
    writers = {r for n in store.names() for r in store.info(n).chunks.ranks}
    assert writers == set(range(8))  # dp replicas split the work instead of rank 0..3 doing it all
    biggest = max(store.info(n).chunks.nbytes[i] for n in store.names() for i in range(len(store.info(n).chunks)))
    assert max(written) - min(written) <= biggest


def _save_replicated_prime_rows(root: Path) -> tuple[np.ndarray, list[Any]]:
    """A [47, 8192] float32 table (47 rows, a prime: one-row chunks at 1 MB) that all 4 ranks of
    a pure data-parallel job hold whole, saved by each rank in turn, the last committing."""
    from ckptstore.checkpoint.layout import Layout
    from ckptstore.checkpoint.strategy import Strategy

    table = np.arange(47 * 8192, dtype=np.float32).reshape(47, 8192)
    strategy = Strategy({"embedding": {0: Layout((4,), ((), ()))}}, 4, 1)
    return table, [ckptstore.save_rank({"embedding": table}, root, step=1, rank=r, strategy=strategy, chunk_mb=1,
                                       attempt="one-job") for r in range(4)]


def test_a_replicated_slice_is_written_in_pieces_by_every_replica(tmp_path):
    table, summaries = _save_replicated_prime_rows(tmp_path)
    assert [s.bytes_written for s in summaries] == [12 * 8192 * 4] * 3 + [11 * 8192 * 4]


def test_a_replicated_slice_written_in_pieces_is_a_zarr_array_zarr_python_reads(tmp_path):
    import zarr

    table, _ = _save_replicated_prime_rows(tmp_path)
    assert_same_array(zarr.open_group(str(tmp_path / "step_1"), mode="r")["embedding"][...], table, "embedding")
    assert_store_holds(tmp_path, {"embedding": table})
    assert ckptstore.verify(tmp_path / "step_1").ok


def test_a_replicated_single_chunk_slice_is_split_with_a_padded_edge_chunk_every_reader_reads(tmp_path, monkeypatch):
    import zarr

    from ckptstore.checkpoint.layout import Layout
    from ckptstore.checkpoint.strategy import Strategy
    from ckptstore.write import save_plan

    monkeypatch.setattr(save_plan, "MIN_PIECE_BYTES", 1)  # pieces of a few KiB split as 8 MiB ones do
    table = np.arange(401 * 16, dtype=np.float32).reshape(401, 16)  # 401 rows, a prime; one chunk
    strategy = Strategy({"embedding": {0: Layout((4,), ((), ()))}}, 4, 1)
    summaries = [ckptstore.save_rank({"embedding": table}, tmp_path, step=1, rank=r, strategy=strategy,
                                     attempt="one-job") for r in range(4)]
    assert [s.bytes_written for s in summaries] == [101 * 64] * 4  # the last: 98 rows and 3 rows of padding
    assert (tmp_path / "step_1" / "embedding" / "c.3.0").stat().st_size == 101 * 64  # as Zarr reads an edge chunk
    assert_same_array(zarr.open_group(str(tmp_path / "step_1"), mode="r")["embedding"][...], table, "embedding")
    assert_store_holds(tmp_path, {"embedding": table})
    assert ckptstore.verify(tmp_path / "step_1").problems == []


@pytest.mark.mindspore
@pytest.mark.slow
@pytest.mark.parametrize("case_id,ranks", [("dp2_mp4->dp2_mp2", [0, 3]), ("opt_shard->dp2_mp2", [1, 2]),
                                           ("pipeline2->1stage", [0, 3]), ("mixed_dtypes->dp2_mp2", [0, 2])])
def test_load_rank_of_a_saved_step_equals_transform_checkpoints(saved_by_ranks, load_env, case_id, ranks):
    from load_fixtures import assert_same_dict, to_numpy

    t = load_env.target(case_id)
    _, root, _ = saved_by_ranks(t.case.kind)
    for rank in ranks:
        loaded = {n: to_numpy(p) for n, p in ckptstore.load_rank(root, t.strategy, rank).items()}
        assert_same_dict(loaded, t.oracle(rank), f"{case_id} rank {rank}")


# ---- a rank dies mid-save --------------------------------------------------------------------


@pytest.mark.mindspore
@pytest.mark.slow
def test_a_rank_killed_mid_save_leaves_the_step_uncommitted_and_its_rerun_completes_it(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp2")
    run_ranks(layout, tmp_path, step=1)
    results = run_ranks(layout, tmp_path, step=2, kill_after={2: 1})
    assert results[2] == -9 and not any(results[r]["committed"] for r in (0, 1, 3))
    assert ckptstore.open(tmp_path).source["step"] == 1  # the unfinished step hides nothing
    assert_store_holds(tmp_path, expected_values(layout))
    with pytest.raises(IncompleteStoreError, match=r"step 2 .* is not committed: rank\(s\) 2 of 4 have not finished"):
        ckptstore.open(tmp_path / "step_2")
    rerun = run_ranks(layout, tmp_path, step=2, ranks=[2])
    assert rerun[2]["committed"] is True
    assert ckptstore.open(tmp_path).source["step"] == 2
    assert_store_holds(tmp_path, expected_values(layout))
    assert sum(data_files(tmp_path / "step_2").values()) == distinct_bytes(layout)  # no leftovers of the dead run


@pytest.mark.mindspore
def test_ckptstore_commit_commits_a_step_whose_ranks_all_finished(saved_layout, tmp_path):
    from ckptstore.write.save import prepare_save
    from convert_fixtures import run_cli
    from save_worker import local_slices

    layout = saved_layout("dp2_mp2")
    for r in range(4):  # the last rank finishes its share but does not commit (as if it died right then)
        job = prepare_save(local_slices(str(layout.rank_file(r))), tmp_path, step=1, strategy=layout.strategy_files,
                           rank=r)
        assert job.write(commit=r < 3).committed is False
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(tmp_path / "step_1")
    done = run_cli("commit", tmp_path / "step_1")
    assert done.returncode == 0, done.stderr
    assert_store_holds(tmp_path, expected_values(layout))


@pytest.mark.mindspore
@pytest.mark.parametrize("kind", ["dp2_mp4", pytest.param("opt_shard", marks=pytest.mark.slow)])
def test_a_compiled_cell_saves_with_its_own_parameter_layout_dict(saved_layout, tmp_path, kind):
    import mindspore as ms

    from ckptstore.checkpoint.strategy import load_strategy
    from mindspore_nets import TreeNet

    layout = saved_layout(kind)
    strategy = load_strategy(layout.strategy_files)
    for r in range(layout.world):
        local = ms.load_checkpoint(str(layout.rank_file(r)))
        net = TreeNet({n: (tuple(p.shape), np.dtype(str(p.dtype).lower())) for n, p in local.items()
                       if not isinstance(p, str)})
        assert ms.load_param_into_net(net, local)[0] == []
        compiled = {}
        for name, stages in strategy.layouts.items():  # what the parallel compiler gives rank r
            lay, full = stages[0], layout.tensors[name].shape
            box = lay.box(r, full)
            compiled[name] = [list(lay.dev_matrix), lay.pretty_map(), list(box.shape), 0, True,
                              "opt_group" if lay.opt_sharded else "", list(full), list(box.shape)]
        net.parameter_layout_dict = compiled
        ckptstore.save_rank(net, tmp_path, step=1, rank=r)  # no strategy: the cell's own layouts
    expected = {n: v for n, v in expected_values(layout).items() if n in local}
    assert_store_holds(tmp_path, expected)


# ---- a real msrun job ------------------------------------------------------------------------

MSRUN_JOB = '''
import os, sys
import mindspore as ms
from mindspore.communication import init

init()
if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler runs this script too: it holds no rank
    sys.exit(0)
import ckptstore
from mindspore.communication import get_rank

src, root = sys.argv[1], sys.argv[2]
params = ms.load_checkpoint(f"{src}/rank_{get_rank()}/net-1_1.ckpt")  # mindspore.Parameter values
summary = ckptstore.save_rank(params, root, step=5, strategy=f"{src}/strategy.ckpt")  # rank from MindSpore
print("SAVED", summary.rank, summary.committed, flush=True)
'''


@pytest.mark.mindspore
@pytest.mark.slow
def test_an_msrun_job_saves_each_rank_through_mindspore_parameters(tmp_path):
    specs = [T.ParamSpec("w", (8, 4), dev_matrix=(2,), tensor_map=(0, -1)),
             T.ParamSpec("emb", (6, 4), dev_matrix=(2,), tensor_map=(-1, -1)),
             T.ParamSpec("b16", (4, 2), "bfloat16", dev_matrix=(2,), tensor_map=(-1, 0))]
    tensors = T.make_global_tensors(specs, seed=3)
    T.save_distributed(tmp_path / "ckpt", specs, tensors, world_size=2, stages=1, extra_scalars=True)
    (tmp_path / "job.py").write_text(MSRUN_JOB)
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    for var in ("RANK_ID", "RANK_SIZE", "MS_ROLE"):
        env.pop(var, None)
    port = 20000 + os.getpid() % 20000
    done = subprocess.run([str(venv_bin / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={port}",
                           f"--log_dir={tmp_path / 'logs'}", "--join=True", str(tmp_path / "job.py"),
                           str(tmp_path / "ckpt"), str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))
    assert done.returncode == 0, logs[-3000:]
    saved = sorted(line.split()[1:] for line in logs.splitlines() if line.startswith("SAVED"))
    assert [s[0] for s in saved] == ["0", "1"] and sorted(s[1] for s in saved) == ["False", "True"]
    store = ckptstore.open(tmp_path / "out")
    assert store.source["step"] == 5
    for name, value in tensors.items():
        assert_same_array(store.read(name), value, name)


# ---- object storage --------------------------------------------------------------------------


@pytest.mark.mindspore
def test_ranks_save_into_a_bucket_and_an_unfinished_step_hides_nothing(saved_layout, bucket):
    from save_worker import local_slices

    layout = saved_layout("dp2_mp2")
    root = bucket.url("run")
    for step, ranks in ((1, range(4)), (2, range(3))):
        for r in ranks:
            ckptstore.save_rank(local_slices(str(layout.rank_file(r))), root, step=step,
                                strategy=layout.strategy_files, rank=r)
    assert ckptstore.open(root).source["step"] == 1
    assert_store_holds(root, expected_values(layout))
    with pytest.raises(IncompleteStoreError, match=r"rank\(s\) 3 of 4"):
        ckptstore.open(f"{root}/step_2")
    ckptstore.save_rank(local_slices(str(layout.rank_file(3))), root, step=2, strategy=layout.strategy_files, rank=3)
    assert ckptstore.open(root).source["step"] == 2
    assert_store_holds(root, expected_values(layout))


# ---- saving in the background ----------------------------------------------------------------


def test_a_background_save_snapshots_the_values_and_stays_under_its_memory_budget(tmp_path):
    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.save import prepare_save

    values = {f"w{i}": np.full((512, 512), i, np.float32) for i in range(4)}  # 1 MiB each
    expected = {n: v.copy() for n, v in values.items()}
    saver = AsyncSaver(memory_budget=2 << 20)
    saver.save(prepare_save(values, tmp_path, step=1, chunk_mb=1))
    for v in values.values():  # training goes on: the next step changes every parameter
        v += 100
    saver.wait()
    assert saver.last.committed and saver.last.bytes_written == 4 << 20
    assert 0 < saver.peak_staged <= 2 << 20
    assert_store_holds(tmp_path, expected)


def test_a_failed_background_save_is_raised_by_the_next_call_and_commits_nothing(tmp_path):
    from ckptstore.errors import StoreWriteError
    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.save import prepare_save

    (tmp_path / "root").write_text("a file where the step folders should go")
    saver = AsyncSaver()
    saver.save(prepare_save({"w": np.ones(4)}, tmp_path / "root", step=1))  # returns: the writer fails later
    with pytest.raises(StoreWriteError, match="Not a directory while writing .*root/step_1"):
        saver.wait()
    saver.check()  # raised once, not again
    assert saver.last is None


def test_a_failed_copy_is_raised_by_the_save_itself_once_and_commits_nothing(tmp_path):
    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.retention import saved_steps
    from ckptstore.write.save import prepare_save
    from ckptstore.write.values import LazyArray

    def fetch():
        raise MemoryError("no host memory for the copy")

    saver = AsyncSaver()
    job = prepare_save({"a": np.ones(4, np.float32), "w": LazyArray((4,), np.float32, fetch)}, tmp_path, step=1)
    with pytest.raises(MemoryError, match="no host memory"):
        saver.save(job)
    saver.wait()  # nothing more to raise
    assert saved_steps(tmp_path) == [(1, False)]


@pytest.mark.mindspore
def test_old_steps_go_only_after_a_newer_step_is_committed(tmp_path, saved_layout):
    from ckptstore.write.retention import prune_steps, saved_steps

    for step in (1, 2, 3):
        ckptstore.save_rank({"w": np.full(2, step)}, tmp_path, step=step)
    layout = saved_layout("dp2_mp2")
    from save_worker import local_slices

    ckptstore.save_rank(local_slices(str(layout.rank_file(0))), tmp_path, step=4, strategy=layout.strategy_files,
                        rank=0)  # step 4: rank 0 of 4 saved, not committed
    assert prune_steps(tmp_path, 2).steps == [1]
    assert saved_steps(tmp_path) == [(2, True), (3, True), (4, False)]
    assert ckptstore.open(tmp_path).source["step"] == 3


# ---- StoreCheckpoint: a real training loop ---------------------------------------------------


def _train(steps: int, *callbacks):
    """``steps`` steps of Model.train on test_resume_training's cell (one batch per epoch)."""
    import mindspore.dataset as ds
    from mindspore.train import Model

    from mindspore_nets import X, Y, train_cell

    cell = train_cell()
    data = ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(16)
    Model(cell).train(steps, data, callbacks=list(callbacks), dataset_sink_mode=False)
    return cell


@pytest.mark.mindspore
@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_training_resumed_from_store_checkpoint_takes_the_bit_identical_next_step(tmp_path, async_save):
    from mindspore import Tensor

    from load_fixtures import assert_same_dict
    from mindspore_nets import X, Y, train_cell, values

    saver = ckptstore.StoreCheckpoint(tmp_path / "run", save_checkpoint_steps=3, async_save=async_save)
    cell = _train(3, saver)
    assert [s.step for s in saver.summaries] == [3]
    resumed = train_cell(seed=99)
    assert ckptstore.load_into_net(resumed, tmp_path / "run") == ([], [])
    assert int(values(resumed)["global_step"][0]) == 3 and np.any(values(resumed)["moment1.fc1.weight"] != 0)
    for c in (cell, resumed):  # the uninterrupted run and the resumed one take one more step
        c(Tensor(X), Tensor(Y))
    assert_same_dict(values(resumed), values(cell), "the step after resuming")


@pytest.mark.mindspore
def test_store_checkpoint_keeps_the_newest_committed_steps(tmp_path):
    saver = ckptstore.StoreCheckpoint(tmp_path / "run", save_checkpoint_steps=2, keep_checkpoint_max=2,
                                      append_info=["epoch_num", "step_num"])
    _train(7, saver)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_4", "step_6"]
    store = ckptstore.open(tmp_path / "run")
    assert (int(store.read("step_num")), int(store.read("epoch_num"))) == (6, 6)


@pytest.mark.mindspore
def test_a_background_error_surfaces_at_the_next_step(tmp_path):
    from mindspore.train import Callback

    from ckptstore.errors import StoreWriteError

    class Steps(Callback):
        seen: list[int] = []

        def on_train_step_end(self, run_context):
            self.seen.append(run_context.original_args().cur_step_num)

    (tmp_path / "run").write_text("not a folder")
    steps = Steps()
    with pytest.raises(StoreWriteError, match="Not a directory"):
        _train(5, ckptstore.StoreCheckpoint(tmp_path / "run", save_checkpoint_steps=1), steps)
    assert steps.seen == [1]  # step 1's save failed in the background; step 2 stopped on it


@pytest.mark.mindspore
def test_a_background_error_of_the_last_save_surfaces_at_the_end_of_training(tmp_path):
    from ckptstore.errors import StoreWriteError

    (tmp_path / "run").write_text("not a folder")
    with pytest.raises(StoreWriteError, match="Not a directory"):
        _train(2, ckptstore.StoreCheckpoint(tmp_path / "run", save_checkpoint_steps=2))
