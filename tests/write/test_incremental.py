"""Incremental steps (``save_rank(..., incremental=True)``): a slice equal to the previous step's
is referenced, not written again; every step still loads exactly what was saved, retention
never deletes a chunk a kept step references, and a step whose reference was pruned while it
was saved never commits.

Multi-rank steps are MindSpore's own slices: each rank's values are read from its rank file
(as ``mindspore.save_checkpoint`` writes it) (the ``dp2_mp2`` fixture: 4 ranks, replicas), and every
incremental step is compared bit for bit with a full save of the same values.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import CkptStoreError, SourceChangedError
from ckptstore.write.retention import list_steps, prune_steps, remove_steps
from ckptstore.write.save import prepare_save


def frozen_base(step: int) -> dict[str, np.ndarray]:
    """A LoRA-like model at ``step``: 99% of the bytes (the base) never change, the adapter does."""
    rng = np.random.default_rng(0)
    values = {f"base.{i}": rng.standard_normal((128, 256)).astype(np.float32) for i in range(12)}
    values["base.bias"] = np.arange(256, dtype=np.int64)
    values["lora.a"] = np.full((4, 256), step, dtype=np.float32)  # 4 KiB of 1.6 MB: 0.25%
    values["lora.b"] = np.full((256, 4), -step, dtype=np.float32)
    return values


def changed_bytes(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> int:
    return sum(v.nbytes for k, v in b.items() if k not in a or a[k].tobytes() != v.tobytes())


def data_bytes(step_folder: Path) -> int:
    """The bytes of the chunk files in ``step_folder`` (what a save wrote of payload)."""
    return sum(f.stat().st_size for f in step_folder.rglob("*") if f.is_file() and re.fullmatch(r"c(\.\d+)*", f.name))


def assert_holds(store: ckptstore.Store, values: dict[str, np.ndarray]) -> None:
    assert sorted(store.names()) == sorted(values)
    for name, want in values.items():
        got = store.read(name)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), name


def save_steps(root: Path, steps: range, **kw) -> list:
    return [ckptstore.save_rank(frozen_base(s), root, step=s, incremental=True, attempt=f"a{s}", **kw) for s in steps]


def test_a_frozen_base_run_writes_only_the_changed_bytes_after_the_first_step(tmp_path):
    summaries = save_steps(tmp_path, range(1, 6))
    assert summaries[0].bytes_written == sum(v.nbytes for v in frozen_base(1).values())
    for s in summaries[1:]:
        changed = changed_bytes(frozen_base(s.step - 1), frozen_base(s.step))
        assert s.bytes_written <= 1.05 * changed
        assert data_bytes(tmp_path / f"step_{s.step}") <= 1.05 * changed  # on disk, not only as counted
        assert s.committed


def test_every_incremental_step_reads_what_was_saved(tmp_path):
    save_steps(tmp_path, range(1, 4))
    for s in range(1, 4):
        store = ckptstore.open(tmp_path / f"step_{s}")
        assert store.kind == "index"
        assert_holds(store, frozen_base(s))
    assert ckptstore.open(tmp_path).source["step"] == 3


def test_the_manifest_references_the_earlier_file_and_records_strong_hashes(tmp_path):
    save_steps(tmp_path, range(1, 3))
    m = ckptstore.open(tmp_path / "step_2").manifest
    assert m.extra["source_root"] == ".."
    assert m.params["base.0"].chunks.files == ("step_1/base.0/c.0.0",)
    assert m.params["lora.a"].chunks.files == ("step_2/lora.a/c.0.0",)
    assert set(m.extra["source_files"]) == {f for p in m.params.values() for f in p.chunks.files}
    import hashlib
    want = hashlib.sha256(frozen_base(2)["lora.a"].tobytes()).hexdigest()
    assert m.extra["chunk_hashes"]["lora.a"] == [want]


def test_a_changed_value_with_the_same_crc_is_still_written(tmp_path, monkeypatch):
    """The CRC-32C only selects candidates: the strong hash decides (a CRC collision simulated)."""
    import crc32c as real

    import ckptstore.write.incremental as inc

    save_steps(tmp_path, range(1, 2))
    values = frozen_base(1)
    old, values["base.3"] = values["base.3"].tobytes(), values["base.3"] + 1
    new = values["base.3"].tobytes()

    class Colliding:
        @staticmethod
        def crc32c(data) -> int:
            return real.crc32c(old if bytes(data) == new else data)

    monkeypatch.setattr(inc, "crc32c", Colliding)
    ckptstore.save_rank(values, tmp_path, step=2, incremental=True, attempt="a2")
    m = ckptstore.open(tmp_path / "step_2").manifest
    assert m.params["base.3"].chunks.files == ("step_2/base.3/c.0.0",)
    assert m.params["base.4"].chunks.files == ("step_1/base.4/c.0.0",)
    assert_holds(ckptstore.open(tmp_path / "step_2"), values)


def test_load_after_pruning_older_steps_is_bit_identical(tmp_path):
    save_steps(tmp_path, range(1, 5))
    removed = prune_steps(tmp_path, 1)
    assert removed.steps == [1, 2, 3] and sorted(removed.referenced) == [1]
    assert_holds(ckptstore.open(tmp_path), frozen_base(4))
    assert [(f.step, f.state) for f in list_steps(tmp_path)] == [(4, "committed"), (1, "held")]


def test_pruning_deletes_a_held_chunk_once_no_kept_step_references_it(tmp_path):
    save_steps(tmp_path, range(1, 3))
    values = frozen_base(3)
    values = {k: v + 1 if k.startswith("base.") else v for k, v in values.items()}  # the base changes once
    ckptstore.save_rank(values, tmp_path, step=3, incremental=True, attempt="a3")
    ckptstore.save_rank(values, tmp_path, step=4, incremental=True, attempt="a4")
    prune_steps(tmp_path, 2)  # keeps 3 and 4, which reference only step 3's files
    assert sorted(os.listdir(tmp_path)) == [".ckptstore-refs", "step_3", "step_4"]
    assert_holds(ckptstore.open(tmp_path / "step_3"), values)


def test_a_step_whose_reference_is_pruned_while_it_is_saved_never_commits(tmp_path):
    save_steps(tmp_path, range(1, 3))
    job = prepare_save(frozen_base(3), tmp_path, step=3, incremental=True, attempt="a3")
    pieces = list(job.pieces())  # decided now: the base is referenced from step_1's files
    assert "base.0" in job.reused
    remove_steps(tmp_path, [1, 2])  # nothing names step 3's references yet
    with pytest.raises(SourceChangedError, match="step not committed"):
        job.write(iter(pieces))
    assert [(f.step, f.state) for f in list_steps(tmp_path)] == [(3, "unfinished")]
    with pytest.raises(CkptStoreError):
        ckptstore.open(tmp_path)


def test_a_step_being_saved_holds_its_references_against_a_prune(tmp_path):
    save_steps(tmp_path, range(1, 3))
    job = prepare_save(frozen_base(3), tmp_path, step=3, incremental=True, attempt="a3")
    job.write(commit=False)  # its record names step_1's files
    remove_steps(tmp_path, [1, 2])
    ckptstore.commit(tmp_path / "step_3")
    assert_holds(ckptstore.open(tmp_path), frozen_base(3))


def test_fallback_skips_an_incremental_step_whose_referenced_chunk_is_damaged(tmp_path, caplog):
    ckptstore.save_rank(frozen_base(0), tmp_path, step=0, attempt="a0")  # a full step
    save_steps(tmp_path, range(1, 3))
    referenced = tmp_path / "step_1" / "base.5" / "c.0.0"
    with open(referenced, "r+b") as f:  # one flipped byte, the size kept
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    store = ckptstore.open(tmp_path, fallback=True)
    assert store.source["step"] == 0
    assert_holds(store, frozen_base(0))


def test_the_first_incremental_step_after_a_full_one_writes_everything(tmp_path):
    ckptstore.save_rank(frozen_base(1), tmp_path, step=1, attempt="a1")
    s = ckptstore.save_rank(frozen_base(2), tmp_path, step=2, incremental=True, attempt="a2")
    assert s.bytes_written == sum(v.nbytes for v in frozen_base(2).values())  # a full step records no hashes


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "bucket"])
def test_concurrent_saves_prunes_and_loads_lose_nothing(where, tmp_path, request):
    """Hostile: one thread saves steps, one prunes to the newest two, one loads the newest step
    again and again (a local folder, and a SeaweedFS bucket, which has no lock). Every load gives
    exactly its step's values; a load fails only when its step was pruned meanwhile; at the end
    the kept steps load whole."""
    from ckptstore.io.locations import open_location
    from ckptstore.store.steps import is_committed

    root = tmp_path if where == "local" else request.getfixturevalue("bucket").url("run")
    stop, errors, loads = threading.Event(), [], [0]

    def saver() -> None:
        try:
            for s in range(1, 13):
                ckptstore.save_rank(frozen_base(s), root, step=s, incremental=True, attempt=f"a{s}")
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()

    def pruner() -> None:
        while not stop.is_set():
            try:
                prune_steps(root, 2)
            except BaseException as e:
                errors.append(e)

    def loader() -> None:
        while not stop.is_set():
            try:
                store = ckptstore.open(root)
            except CkptStoreError:
                continue  # no step committed yet
            step = store.source["step"]
            try:
                assert_holds(store, frozen_base(step))
                loads[0] += 1
            except (CkptStoreError, FileNotFoundError):
                if is_committed(open_location(f"{root}/step_{step}")):
                    errors.append(AssertionError(f"step {step} is still committed but failed to load"))
            finally:
                store.close()

    threads = [threading.Thread(target=f) for f in (saver, pruner, loader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert loads[0] > 0
    prune_steps(root, 2)
    kept = [f.step for f in list_steps(root) if f.state == "committed"]
    assert kept == [12, 11]
    for s in kept:
        assert_holds(ckptstore.open(f"{root}/step_{s}"), frozen_base(s))


# --- a job of four ranks (MindSpore's dp2_mp2 slices) ----------------------------------------


def rank_values(layout, scale: dict[str, float] | None = None) -> list[dict[str, np.ndarray]]:
    """Each rank's local slices, as MindSpore saved them, with the parameters in ``scale`` multiplied
    (the same on every rank: what a training step changes)."""
    from save_worker import local_slices

    out = []
    for r in range(layout.world):
        local = local_slices(str(layout.rank_file(r)))
        out.append({k: (v * np.asarray(scale[k], dtype=v.dtype) if scale and k in scale else v)
                    for k, v in local.items()})
    return out


def save_job_steps(layout, root: Path, steps: dict[int, dict[str, float] | None], *, incremental: bool) -> dict:
    """Save ``steps`` (step -> scaled parameters) rank after rank; each rank's summaries by step."""
    done = {}
    for step, scale in steps.items():
        done[step] = [ckptstore.save_rank(v, root, step=step, strategy=layout.strategy_files, rank=r,
                                          incremental=incremental, attempt=f"a{step}")
                      for r, v in enumerate(rank_values(layout, scale))]
    return done


def test_a_full_run_writes_only_the_chunks_that_changed(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp2")
    first = rank_values(layout)[0]
    name = next(k for k, v in first.items() if getattr(v, "ndim", 0) >= 1 and v.dtype.kind == "f")
    done = save_job_steps(layout, tmp_path, {1: None, 2: {name: 2.0}, 3: {name: 3.0}}, incremental=True)
    store = ckptstore.open(tmp_path / "step_2")
    changed = store.manifest.params[name].chunks
    for step in (2, 3):
        assert sum(s.chunks_written for s in done[step]) == len(changed)
        assert sum(s.bytes_written for s in done[step]) == sum(changed.nbytes)
        files = ckptstore.open(tmp_path / f"step_{step}").manifest.params[name].chunks.files
        assert all(f.startswith(f"step_{step}/") for f in files)


def test_every_step_of_a_job_reads_and_exports_bit_identical_to_a_full_save(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp2")
    first = rank_values(layout)[0]
    name = next(k for k, v in first.items() if getattr(v, "ndim", 0) >= 1 and v.dtype.kind == "f")
    steps = {1: None, 2: {name: 2.0}, 3: {name: 2.0}}
    save_job_steps(layout, tmp_path / "inc", steps, incremental=True)
    save_job_steps(layout, tmp_path / "full", steps, incremental=False)
    for step in steps:
        inc = ckptstore.open(tmp_path / "inc" / f"step_{step}")
        full = ckptstore.open(tmp_path / "full" / f"step_{step}")
        assert inc.names() == full.names()
        for n in full.names():
            assert inc.read(n).tobytes() == full.read(n).tobytes(), (step, n)
        for r in range(layout.world):
            a = ckptstore.read_rank(inc, strategy=layout.strategy_arg, rank=r)
            b = ckptstore.read_rank(full, strategy=layout.strategy_arg, rank=r)
            assert {k: np.asarray(v).tobytes() for k, v in a.items()} == \
                {k: np.asarray(v).tobytes() for k, v in b.items()}
        ckptstore.export(inc, tmp_path / f"x_inc_{step}", strategy=layout.strategy_arg)
        ckptstore.export(full, tmp_path / f"x_full_{step}", strategy=layout.strategy_arg)
        for f in sorted((tmp_path / f"x_full_{step}").rglob("*.ckpt")):
            twin = tmp_path / f"x_inc_{step}" / f.relative_to(tmp_path / f"x_full_{step}")
            assert twin.read_bytes() == f.read_bytes()


def test_a_background_saver_references_unchanged_slices(tmp_path):
    from ckptstore.write.saver import StoreSaver

    with StoreSaver(tmp_path, keep=2, async_save=True, incremental=True, attempt="job") as saver:
        for s in range(1, 5):
            saver.save(s, frozen_base(s))
    written = [s.bytes_written for s in saver.summaries]
    assert written[1:] == [changed_bytes(frozen_base(1), frozen_base(2))] * 3
    assert_holds(ckptstore.open(tmp_path), frozen_base(4))
    assert [f.step for f in list_steps(tmp_path) if f.state == "committed"] == [4, 3]


# --- object storage (SeaweedFS on loopback) ---------------------------------------------------


@pytest.mark.slow
def test_incremental_steps_in_a_bucket_reference_pinned_objects_and_survive_a_prune(bucket):
    root = bucket.url("run")
    for s in range(1, 4):
        ckptstore.save_rank(frozen_base(s), root, step=s, incremental=True, attempt=f"a{s}")
    m = ckptstore.open(f"{root}/step_3").manifest
    assert m.params["base.0"].chunks.files == ("step_1/base.0/c.0.0",)
    assert all("etag" in r for r in m.extra["source_files"].values())  # each referenced object pinned
    removed = prune_steps(root, 1)
    assert removed.steps == [1, 2] and sorted(removed.referenced) == [1]
    assert_holds(ckptstore.open(root), frozen_base(3))


def test_info_says_a_step_is_incremental(tmp_path):
    from click.testing import CliRunner

    from ckptstore.cli import main

    save_steps(tmp_path, range(1, 3))
    out = CliRunner().invoke(main, ["info", str(tmp_path / "step_2")]).output
    assert out.splitlines()[0] == (f"{tmp_path / 'step_2'}: ckptstore store (an incremental step: its own and "
                                   "earlier steps' files) of step 2 saved by 1 rank(s)")


@pytest.mark.mindspore
def test_store_checkpoint_passes_incremental_to_its_saver(tmp_path):
    assert ckptstore.StoreCheckpoint(tmp_path, incremental=True).saver.incremental is True
    assert ckptstore.StoreCheckpoint(tmp_path).saver.incremental is False
