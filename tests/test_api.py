"""The public API as a user meets it: store arguments, ``rank=None``, one vocabulary, ``read_rank``,
``commit`` and ``plan_rank`` (issue 16 item 4; issue 19 item 5).

Expected values are MindSpore's (``transform_checkpoints`` + ``load_checkpoint``, through
``load_fixtures``; those tests are marked ``mindspore``); the plan's figures are checked against what
the executor then counts.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.errors import IncompleteStoreError, InvalidOptionError, StoreNotFoundError
from ckptstore.store.executor import IO_STATS
from convert_fixtures import REPO
from load_fixtures import assert_same_dict, run_cli

CASE = "dp2_mp4->dp2_mp2"  # 8 source ranks -> 4 target ranks
LAUNCHER_VARIABLES = ("RANK_ID", "RANK_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MS_ROLE")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A process that no launcher started: nothing in the environment names its rank."""
    for var in LAUNCHER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# ---------------------------------------------------------------------------------------------
# 1. every function that takes a store takes a path, a URL or a Store


@pytest.mark.mindspore
def test_export_takes_the_store_by_path(load_env, tmp_path):
    t = load_env.target(CASE)
    summary = ckptstore.export(t.store_path, tmp_path / "out", strategy=t.strategy, ranks=[1])
    assert summary.files == (str(tmp_path / "out" / "rank_1" / "checkpoint_1.ckpt"),)
    assert_same_dict(T.load_oracle(tmp_path / "out" / "rank_1" / "checkpoint_1.ckpt"), t.oracle(1), "export(path)")


def test_verify_takes_the_store_by_path(load_env):
    t = load_env.target(CASE)
    report = ckptstore.verify(t.store_path)
    assert report.ok and report.params == len(t.store.names())
    assert report.chunks == sum(len(t.store.info(n).chunks) for n in t.store.names())


def test_a_store_passed_in_stays_open_and_a_path_is_closed_after_the_call(load_env, tmp_path):
    t = load_env.target(CASE)
    with ckptstore.open(t.store_path) as store:
        ckptstore.read_rank(store, t.strategy, 0)
        assert np.array_equal(store.read("layer0.b"), t.layout.tensors["layer0.b"])  # still usable


# ---------------------------------------------------------------------------------------------
# 2. rank=None is this process's rank


@pytest.mark.mindspore
def test_rank_none_is_the_rank_the_launcher_names(load_env, no_launcher):
    t = load_env.target(CASE)
    no_launcher.setenv("RANK_ID", "2")
    assert_same_dict(ckptstore.read_rank(t.store_path, t.strategy), t.oracle(2), "read_rank with RANK_ID=2")
    assert ckptstore.load_rank(t.store_path, t.strategy).view.rank == 2
    assert ckptstore.plan_rank(t.store_path, t.strategy).rank == 2


@pytest.mark.mindspore
def test_rank_none_reads_mpiruns_rank_when_msrun_says_nothing(load_env, no_launcher):
    t = load_env.target(CASE)
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert_same_dict(ckptstore.read_rank(t.store_path, t.strategy), t.oracle(3), "OMPI_COMM_WORLD_RANK=3")


@pytest.mark.parametrize("call", ["read_rank", "load_rank", "plan_rank"])
def test_rank_none_with_nothing_saying_is_an_error_not_rank_0(load_env, no_launcher, call):
    t = load_env.target(CASE)
    with pytest.raises(InvalidOptionError, match="which rank of the 4-rank target layout is this process"):
        getattr(ckptstore, call)(t.store_path, t.strategy)


@pytest.mark.mindspore
def test_mindspore_communication_not_initialised_does_not_make_every_process_rank_0(load_env, no_launcher):
    from mindspore.communication import get_rank

    assert get_rank() == 0  # what MindSpore answers before init(), in every process
    t = load_env.target(CASE)
    no_launcher.setenv("RANK_ID", "1")
    assert ckptstore.plan_rank(t.store_path, t.strategy).rank == 1


def test_msruns_scheduler_process_is_no_rank(load_env, no_launcher):
    t = load_env.target(CASE)
    no_launcher.setenv("MS_ROLE", "MS_SCHED")
    no_launcher.setenv("RANK_ID", "0")
    with pytest.raises(InvalidOptionError, match=r"msrun's scheduler \(MS_ROLE=MS_SCHED\), which is no rank"):
        ckptstore.read_rank(t.store_path, t.strategy)


def test_a_rank_variable_that_is_not_a_rank_is_refused(load_env, no_launcher):
    t = load_env.target(CASE)
    no_launcher.setenv("RANK_ID", "two")
    with pytest.raises(InvalidOptionError, match="RANK_ID='two' in the environment is not a rank"):
        ckptstore.read_rank(t.store_path, t.strategy)


@pytest.mark.mindspore
@pytest.mark.parametrize("rank_id", ["3", None])
def test_a_one_rank_layout_is_the_same_for_every_process(load_env, no_launcher, rank_id):
    t = load_env.target("dp2_mp4->1rank")  # whole tensors: a pure data-parallel job
    if rank_id is not None:
        no_launcher.setenv("RANK_ID", rank_id)
    assert_same_dict(ckptstore.read_rank(t.store_path, t.strategy), t.oracle(0), f"RANK_ID={rank_id}")


@pytest.mark.mindspore
def test_an_explicit_rank_of_a_one_rank_layout_reads_the_whole_tensors(load_env):
    t = load_env.target("dp2_mp4->1rank")
    assert_same_dict(ckptstore.read_rank(t.store_path, t.strategy, 5), t.oracle(0), "rank=5 of one rank")


# ---------------------------------------------------------------------------------------------
# 3. read_rank: numpy, no MindSpore


@pytest.mark.mindspore
def test_read_rank_equals_transform_checkpoints_for_every_rank(load_env):
    t = load_env.target(CASE)
    for j in range(t.world):
        assert_same_dict(ckptstore.read_rank(t.store_path, t.strategy, j), t.oracle(j), f"rank {j}")


@pytest.mark.mindspore
def test_read_rank_selects_names_and_converts_floats(load_env):
    t = load_env.target(CASE)
    arrays = ckptstore.read_rank(t.store_path, t.strategy, 1, include=["layer0.*"], dtype="float16")
    assert list(arrays) == ["layer0.w", "layer0.b"]
    for name, a in arrays.items():
        assert a.dtype == np.float16 and np.array_equal(a, t.oracle(1)[name].astype(np.float16)), name


@pytest.mark.mindspore
def test_read_rank_needs_no_mindspore(load_env):
    t = load_env.target(CASE)
    script = textwrap.dedent(f"""
        import json, sys
        import ckptstore
        arrays = ckptstore.read_rank({str(t.store_path)!r}, {str(t.target_file)!r}, 3)
        print(json.dumps({{"mindspore": "mindspore" in sys.modules,
                          "sums": {{n: float(a.astype("float64").sum()) for n, a in arrays.items()}}}}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mindspore"] is False
    assert out["sums"] == {n: float(a.astype(np.float64).sum()) for n, a in t.oracle(3).items()}


@pytest.mark.mindspore
def test_load_rank_without_mindspore_says_what_needs_it_and_names_read_rank(load_env):
    t = load_env.target(CASE)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["mindspore"] = None  # a Python where MindSpore cannot be imported
        import ckptstore
        params = ckptstore.load_rank({str(t.store_path)!r}, {str(t.target_file)!r}, 3)
        try:
            params["layer0.w"]
        except ModuleNotFoundError as e:
            print(e.name, "|", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("mindspore | ckptstore's load_rank, load_into_net and StoreCheckpoint build "
                                "mindspore.Parameters and need MindSpore, which this Python cannot import (pip install "
                                "'ckptstore[mindspore]'); ckptstore.read_rank gives the same values as numpy arrays "
                                "without it")


# ---------------------------------------------------------------------------------------------
# 4. commit in the API, naming the parts that have not finished


def test_commit_of_a_complete_store_does_nothing(load_env):
    assert ckptstore.commit(load_env.target(CASE).store_path) is False
    assert ckptstore.commit(load_env.target(CASE).store) is False


def test_commit_of_a_folder_with_nothing_to_commit_leaves_it_as_it_was(load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    folder = tmp_path / "ckpt"
    shutil.copytree(layout.root, folder)
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    with pytest.raises(IncompleteStoreError, match="has no unfinished conversion to commit"):
        ckptstore.commit(folder)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # no .ckptstore-work/lock left
    with pytest.raises(StoreNotFoundError):  # not "an interrupted conversion"
        ckptstore.open(folder)


def test_commit_names_the_part_that_has_not_finished(load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    first = ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="0/2")
    assert not first.committed
    with pytest.raises(IncompleteStoreError, match=r"is not finished \(\d+ of 15 parameters written\): part\(s\) 1 "
                                                   r"of 2 have not finished; run \(or rerun\) them"):
        ckptstore.commit(out)
    r = run_cli("commit", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "part(s) 1 of 2 have not finished" in r.stderr
    assert ckptstore.convert(layout.root, out, strategy=layout.strategy_files, part="1/2").committed


# ---------------------------------------------------------------------------------------------
# 5. one vocabulary: format= and chunk_mb= as --format and --chunk-mb


def test_convert_takes_format_and_chunk_mb_like_the_command(load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    ckptstore.convert(layout.root, tmp_path / "new", strategy=layout.strategy_files, format="safetensors",
                      chunk_mb=1)
    assert ckptstore.open(tmp_path / "new").kind == "safetensors"


def test_export_takes_format(load_env, tmp_path):
    t = load_env.target(CASE)
    summary = ckptstore.export(t.store_path, tmp_path / "out", strategy=t.strategy, ranks=[0], format="safetensors")
    assert summary.files == (str(tmp_path / "out" / "rank_0" / "checkpoint_0.safetensors"),)


# The package is unreleased: each option has one spelling, and no earlier one is kept (issue 25).
OLD_SPELLINGS = [
    pytest.param(lambda t, out: ckptstore.convert(t.layout.root, out, strategy=t.layout.strategy_files,
                                                  fmt="safetensors"), "fmt", id="convert-fmt"),
    pytest.param(lambda t, out: ckptstore.convert(t.layout.root, out, strategy=t.layout.strategy_files,
                                                  max_chunk_mb=1), "max_chunk_mb", id="convert-max_chunk_mb"),
    pytest.param(lambda t, out: ckptstore.export(t.store_path, out, strategy=t.strategy, ranks=[0],
                                                 fmt="safetensors"), "fmt", id="export-fmt"),
    pytest.param(lambda t, out: ckptstore.load_into_net(object(), t.store_path, strict_load=True), "strict_load",
                 id="load_into_net-strict_load"),
]


@pytest.mark.parametrize("call,old", OLD_SPELLINGS)
def test_an_earlier_spelling_of_an_option_is_an_unknown_argument(load_env, tmp_path, call, old):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        call(load_env.target(CASE), tmp_path / "out")
    assert not (tmp_path / "out").exists()



def test_read_rank_plan_rank_and_export_take_include_like_the_command_and_names_as_published(load_env, tmp_path):
    t = load_env.target(CASE)
    new = ckptstore.read_rank(t.store_path, t.strategy, 1, include=["layer0.*"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # names= is the published spelling: no warning
        old = ckptstore.read_rank(t.store_path, t.strategy, 1, names=["layer0.*"])
        assert ckptstore.plan_rank(t.store_path, t.strategy, 1, names=["layer0.*"]) == \
            ckptstore.plan_rank(t.store_path, t.strategy, 1, include=["layer0.*"])
    assert sorted(new) == sorted(old) and new and all(n.startswith("layer0.") for n in new)
    assert all(np.array_equal(new[n], old[n]) for n in new)
    with pytest.raises(InvalidOptionError, match="include= and names= are the same option; pass only one"):
        ckptstore.export(t.store_path, tmp_path / "out", strategy=t.strategy, include=["a"], names=["a"])
    assert not (tmp_path / "out").exists()

@pytest.mark.mindspore  # imports every public name, ckptstore.mindspore's too
def test_the_public_names_are_all_there():
    assert sorted(ckptstore.__all__) == sorted([
        "CkptStoreError", "IOCounts", "Store", "StoreCheckpoint", "StoreSaver", "__version__", "commit", "convert",
        "export", "index", "io_counts", "load_into_net", "load_rank", "open", "plan_cooperative", "plan_rank",
        "read_rank", "save_rank", "verify"])
    for name in ckptstore.__all__:
        assert getattr(ckptstore, name) is not None, name


# ---------------------------------------------------------------------------------------------
# 6. plan_rank / ckptstore plan: the figures the load then reports


def _stores(load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    ckptstore.index(layout.root, tmp_path / "index", strategy=layout.strategy_files)
    return {"zarr": (load_env.store("dp2_mp4"), {}),
            "zstd": (load_env.store("dp2_mp4", compress="zstd"), {}),
            "index": (tmp_path / "index", {}),
            "float16": (load_env.store("dp2_mp4"), {"dtype": "float16"}),
            "verify": (load_env.store("dp2_mp4"), {"verify": True})}


@pytest.mark.parametrize("kind", ["zarr", "zstd", "index", "float16", "verify"])
def test_the_plan_is_what_a_load_then_reads(load_env, tmp_path, kind):
    t = load_env.target(CASE)
    store, kw = _stores(load_env, tmp_path)[kind]
    for j in range(t.world):
        IO_STATS.reset()
        plan = ckptstore.plan_rank(store, t.strategy, j, workers=1, **kw)
        assert (IO_STATS.bytes_read, IO_STATS.requests) == (0, 0), "planning read payload"
        arrays = ckptstore.read_rank(store, t.strategy, j, workers=1, **kw)
        assert plan.nbytes == IO_STATS.bytes_read, f"rank {j}"
        assert plan.requests == IO_STATS.requests, f"rank {j}"
        assert plan.files == len(IO_STATS.files), f"rank {j}"
        assert plan.scratch_bytes == IO_STATS.scratch_peak, f"rank {j}"
        assert plan.result_bytes == sum(a.nbytes for a in arrays.values()), f"rank {j}"
        assert plan.peak_bytes == plan.result_bytes + plan.scratch_bytes
        assert plan.params == len(arrays) and plan.world_size == t.world


def test_scratch_memory_of_a_threaded_load_stays_within_the_plan(load_env):
    t = load_env.target(CASE)
    store = load_env.store("dp2_mp4", compress="zstd")
    plan = ckptstore.plan_rank(store, t.strategy, 1, workers=4)
    assert plan.scratch_bytes > 0
    IO_STATS.reset()
    ckptstore.read_rank(store, t.strategy, 1, workers=4)
    assert 0 < IO_STATS.scratch_peak <= plan.scratch_bytes
    assert (IO_STATS.bytes_read, IO_STATS.requests) == (plan.nbytes, plan.requests)


@pytest.mark.mindspore  # load_rank builds mindspore.Parameters
def test_the_plan_of_load_rank_is_what_it_reads(load_env):
    t = load_env.target(CASE)
    plan = ckptstore.plan_rank(t.store_path, t.strategy, 2)
    IO_STATS.reset()
    ckptstore.load_rank(t.store_path, t.strategy, 2).materialize()
    assert (IO_STATS.bytes_read, IO_STATS.requests, len(IO_STATS.files)) == (plan.nbytes, plan.requests, plan.files)
    assert IO_STATS.bytes_fetched == plan.fetched_bytes == plan.nbytes + plan.over_read_bytes


def test_io_counts_between_two_snapshots_are_what_a_load_did(load_env):
    t = load_env.target(CASE)
    before = ckptstore.io_counts()
    plan = ckptstore.plan_rank(t.store_path, t.strategy, 2)
    planned = ckptstore.io_counts()
    ckptstore.read_rank(t.store_path, t.strategy, 2)
    did = ckptstore.io_counts() - planned
    assert planned - before == ckptstore.IOCounts(), "planning read or sent something"
    assert (did.requests, did.bytes_read, did.bytes_fetched) == (plan.requests, plan.nbytes, plan.fetched_bytes)
    assert did.object_requests == 0, "a local load sent object-store requests"


def test_the_plan_command_prints_the_plan(load_env):
    t = load_env.target(CASE)
    r = run_cli("plan", t.store_path, "--strategy", t.target_file, "--rank", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ckptstore.plan_rank(str(t.store_path), t.target_file, 2).to_json()
    r = run_cli("plan", t.store_path, "-s", t.target_file, "--rank", "2")
    plan = ckptstore.plan_rank(t.store_path, t.target_file, 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].endswith(f" ({plan.nbytes:,} bytes) in {plan.requests} requests from "
                                             f"{plan.files} files")
    assert f"({plan.over_read_bytes:,} bytes over-read between wanted ranges); modelled " \
           f"{plan.modelled_seconds:.3f} s at 0.005 ms per request, 8000 MB/s" in r.stdout.splitlines()[2]


def test_the_plan_command_takes_a_folder_of_strategy_files_as_export_does(load_env, tmp_path):
    t = load_env.target(CASE)
    folder = tmp_path / "strategy"
    folder.mkdir()
    (folder / "ckpt_strategy_rank_0.ckpt").write_bytes(Path(t.target_file).read_bytes())
    r = run_cli("plan", t.store_path, "-s", folder, "--rank", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ckptstore.plan_rank(str(t.store_path), t.target_file, 2).to_json()


def test_the_plan_command_without_a_rank_asks_which(load_env):
    t = load_env.target(CASE)
    env = {v: "" for v in LAUNCHER_VARIABLES}
    r = run_cli("plan", t.store_path, "-s", t.target_file, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "which rank of the 4-rank target layout is this process? Nothing says: pass the rank" in r.stderr


# ---------------------------------------------------------------------------------------------
# 7. Store.plan takes the box a user would write (README's example)


@pytest.mark.parametrize("box", [(slice(0, 8), slice(None)), ((0, 8), (0, 16)), [[0, 8], [0, 16]]],
                         ids=["index", "pairs", "lists"])
def test_store_plan_takes_an_index_or_start_stop_pairs(load_env, box):
    from ckptstore.boxes import Box

    with ckptstore.open(load_env.store("dp2_mp4")) as store:
        assert store.info("layer0.w").shape == (32, 16)
        want = store.plan("layer0.w", Box((0, 0), (8, 16)))
        plan = store.plan("layer0.w", box)
        assert plan.box == want.box and plan.nbytes == want.nbytes == 8 * 16 * 4
        IO_STATS.reset()
        assert np.array_equal(store.read("layer0.w", (slice(0, 8), slice(None))), load_env.saved_layout(
            "dp2_mp4").tensors["layer0.w"][:8])
        assert IO_STATS.bytes_read == plan.nbytes


def test_store_plan_refuses_a_box_that_mixes_pairs_and_slices(load_env):
    from ckptstore.errors import InvalidIndexError

    with ckptstore.open(load_env.store("dp2_mp4")) as store, pytest.raises(
            InvalidIndexError, match=r"mixes \(start, stop\) pairs with other indices"):
        store.plan("layer0.w", ((0, 8), slice(None)))


# ---------------------------------------------------------------------------------------------
# 8. a store in a bucket: its URL wherever a store is taken, and the plan counts its GETs


@pytest.mark.mindspore
@pytest.mark.slow  # a conversion, a verify, a load and an export through the counting proxy: 5-9 s here
def test_a_store_url_in_a_bucket_is_taken_and_planned_request_for_request(watched_bucket, load_env, tmp_path):
    bucket = watched_bucket  # behind the counting proxy: the requests the server saw
    pytest.importorskip("obstore")
    t = load_env.target(CASE)
    url = bucket.url("model.zarr")
    ckptstore.convert(t.layout.root, url, strategy=t.layout.strategy_files)
    assert ckptstore.verify(url).ok
    plan = ckptstore.plan_rank(url, t.strategy, 1)
    with ckptstore.open(url):  # the manifest's GETs, before counting the payload's
        pass
    bucket.proxy.reset()
    IO_STATS.reset()
    arrays = ckptstore.read_rank(url, t.strategy, 1)
    assert_same_dict(arrays, t.oracle(1), "read_rank(s3 URL)")
    payload = [s for s in bucket.proxy.requests("GET") if s.range is not None]
    assert len(payload) == plan.requests == IO_STATS.requests
    assert len({s.path for s in payload}) == plan.files
    assert sum(s.nbytes for s in payload) >= plan.nbytes == IO_STATS.bytes_read
    summary = ckptstore.export(url, tmp_path / "out", strategy=t.strategy, ranks=[1])
    assert_same_dict(T.load_oracle(summary.files[0]), t.oracle(1), "export(s3 URL)")
