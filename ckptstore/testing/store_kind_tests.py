"""``StoreKindTests``: the behaviour every kind of store shares (in the spirit of zarr-python's ``StoreTests``).

A Zarr store, a safetensors store and an index of the original rank files must behave the same
through the public API: every target rank equals MindSpore's ``transform_checkpoints``, exactly
the planned bytes are read and only when a parameter is touched, a damaged manifest is refused,
an interrupted write resumes to the same store, and file names in the metadata cannot reach
outside the store (or, for an index, outside its rank files' folder).

A new store kind is declared by its own module (``KIND = StoreKind(...)``, see
:mod:`ckptstore.store.kinds`; a third party's through the entry-point group
``ckptstore.store_kinds``) and passes by subclassing (pytest collects ``Test*`` classes): set
``kind`` (what ``Store.kind`` and ``ckptstore info`` say) and ``manifest_file`` when it is not
``ckptstore.json``, write a store of a saved layout in :meth:`write`,
and give the ``ckptstore`` arguments that write one (without the source, strategy and
``--out``) in :meth:`cli_args`::

    from ckptstore.testing.store_kind_tests import StoreKindTests

    class TestMyKind(StoreKindTests):
        kind = "mykind"

        def write(self, layout, out):
            ckptstore.convert(layout.root, out, strategy=layout.strategy_files, format="mykind")

        def cli_args(self):
            return ["convert", "--format", "mykind"]

The checkpoints are the standard layouts of :mod:`ckptstore.testing.layouts`, saved once per
session (byte-identical to MindSpore's own save, without needing MindSpore) and shared with every
other user of :func:`~ckptstore.testing.layouts.session_layouts`; the expected values are
MindSpore's own ``transform_checkpoints`` output, or the global tensors the layout was made from.
The tests that run MindSpore's oracle are marked ``mindspore`` (skipped without it); the crash
test, which runs the CLI in subprocesses, is marked ``slow`` (a project of its own registers both
markers in its pytest configuration, as ckptstore's pyproject.toml does).
"""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptstore
from ckptstore.errors import IncompleteStoreError, StoreCorruptError
from ckptstore.store.executor import IO_STATS
from ckptstore.store.kinds import MANIFEST, ROOT_METADATA
from ckptstore.testing.compare import assert_same_dict, store_files, to_numpy
from ckptstore.testing.kill_at import run_cli
from ckptstore.testing.layouts import CASES, SampleLayouts, SavedLayout, session_layouts
from ckptstore.testing.oracle import load_oracle

#: Source -> target pairs every kind is checked on (all layouts, dtypes, pipeline, opt sharding).
CONFORMANCE_CASES = ["mp_cols->mp2", "dp2_mp4->dp2_mp2", "dp2_mp4->dp4_mp2", "opt_shard->dp2_mp2_optshard",
                     "pipeline2->1stage", "pipeline2->same-none", "mixed_dtypes->dp2_mp2_optshard",
                     "mixed_dtypes->1rank"]

#: Stores written by :meth:`StoreKindTests.make`, per (session folder, kind, layout): written once.
_STORES: dict[tuple[Path, str, str], Path] = {}


class StoreKindTests:
    """Conformance tests of a store kind; see the module docstring for how to add a kind."""

    #: What ``Store.kind``, the manifest's ``"kind"`` and ``ckptstore info --json``'s ``"store_kind"``
    #: say for this kind.
    kind = ""
    #: The file that holds the store's manifest (the root ``zarr.json`` for a Zarr store).
    manifest_file = MANIFEST

    def write(self, layout: SavedLayout, out: Path, **kwargs: Any) -> None:
        """Write a store of this kind of ``layout`` (a saved distributed checkpoint) at ``out``."""
        raise NotImplementedError(f"{type(self).__name__} must say how to write a {self.kind or 'new'} store")

    def cli_args(self) -> list[str]:
        """The ``ckptstore`` command and options that write this kind (source, ``-s`` and ``--out`` follow)."""
        raise NotImplementedError(f"{type(self).__name__} must give the command that writes a {self.kind} store")

    # ---- fixtures ----------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _needs_mindspore(self, request: pytest.FixtureRequest) -> None:
        if request.node.get_closest_marker("mindspore"):  # the oracle's tests
            pytest.importorskip("mindspore")

    @pytest.fixture
    def sample_layouts(self, tmp_path_factory: pytest.TempPathFactory) -> SampleLayouts:
        """The session's saved layouts and MindSpore's answer for each target."""
        return session_layouts(tmp_path_factory)

    def make(self, layouts: SampleLayouts, layout_kind: str) -> Path:
        """The session's store of this kind of ``layout_kind`` (written on first use). Read only."""
        key = (layouts.base, self.kind, layout_kind)
        if key not in _STORES:
            out = layouts.base / f"conformance_{self.kind}_{layout_kind}"
            shutil.rmtree(out, ignore_errors=True)  # a write that failed half-way
            self.write(layouts.saved_layout(layout_kind), out)
            _STORES[key] = out
        return _STORES[key]

    # ---- values ------------------------------------------------------------------------------

    @pytest.mark.mindspore
    @pytest.mark.parametrize("case_id", CONFORMANCE_CASES)
    def test_every_target_rank_equals_transform_checkpoints(self, sample_layouts: SampleLayouts,
                                                            case_id: str) -> None:
        t = sample_layouts.target(case_id)
        store = ckptstore.open(self.make(sample_layouts, CASES[case_id].kind))
        assert store.kind == self.kind
        for rank in range(t.world):
            params = ckptstore.load_rank(store, t.strategy, rank)
            assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank),
                             f"{self.kind} {case_id} rank {rank}")

    def test_global_tensors_read_back_exactly(self, sample_layouts: SampleLayouts) -> None:
        layout = sample_layouts.saved_layout("mixed_dtypes")
        with ckptstore.open(self.make(sample_layouts, "mixed_dtypes")) as store:
            for name, value in layout.tensors.items():
                got = store.read(name)
                assert isinstance(got, np.ndarray), name
                assert got.dtype == np.asarray(value).dtype and got.tobytes() == np.asarray(value).tobytes(), name

    @pytest.mark.mindspore
    def test_export_writes_what_transform_checkpoints_writes(self, sample_layouts: SampleLayouts,
                                                             tmp_path: Path) -> None:
        t = sample_layouts.target("dp2_mp4->dp2_mp2")
        with ckptstore.open(self.make(sample_layouts, "dp2_mp4")) as store:
            ckptstore.export(store, tmp_path / "out", strategy=t.strategy)
        for rank in range(t.world):
            assert_same_dict(load_oracle(tmp_path / "out" / f"rank_{rank}" / f"checkpoint_{rank}.ckpt"),
                             t.oracle(rank), f"export rank {rank}")

    # ---- reads -------------------------------------------------------------------------------

    @pytest.mark.mindspore
    def test_exactly_the_planned_bytes_are_read_and_only_on_access(self, sample_layouts: SampleLayouts) -> None:
        t = sample_layouts.target("dp2_mp4->dp2_mp2")
        store = ckptstore.open(self.make(sample_layouts, "dp2_mp4"))
        IO_STATS.reset()
        params = ckptstore.load_rank(store, t.strategy, 1)
        assert IO_STATS.bytes_read == 0
        params["layer1.w"]
        assert IO_STATS.bytes_read == params.plan.params["layer1.w"].nbytes == t.oracle(1)["layer1.w"].nbytes
        params.materialize()
        assert IO_STATS.bytes_read == params.plan.nbytes

    def test_info_names_the_kind(self, sample_layouts: SampleLayouts) -> None:
        r = run_cli("info", self.make(sample_layouts, "dp2_mp4"), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert (doc["kind"], doc["store_kind"]) == ("store", self.kind)
        assert "backend" not in doc  # one name for the store kind

    def test_verify_passes_and_compares_with_the_source(self, sample_layouts: SampleLayouts) -> None:
        layout = sample_layouts.saved_layout("opt_shard")
        with ckptstore.open(self.make(sample_layouts, "opt_shard")) as store:
            report = ckptstore.verify(store, against=layout.root, strategy=layout.strategy_files)
        assert report.ok, report.problems

    # ---- damage ------------------------------------------------------------------------------

    def test_metadata_file_names_outside_the_folder_are_refused(self, sample_layouts: SampleLayouts,
                                                                tmp_path: Path) -> None:
        store = copy_store(self.make(sample_layouts, "dp2_mp4"), tmp_path / "s")
        doc = json.loads((store / self.manifest_file).read_text())
        manifest = doc["attributes"]["ckptstore"] if self.manifest_file == ROOT_METADATA else doc
        manifest["params"]["layer0.w"]["chunks"]["files"] = ["../../etc/passwd"]
        (store / self.manifest_file).write_text(json.dumps(doc))
        with pytest.raises(StoreCorruptError, match="'..' component"):
            ckptstore.open(store)

    @pytest.mark.slow
    def test_an_interrupted_write_is_refused_then_resumed_to_the_same_store(self, sample_layouts: SampleLayouts,
                                                                            tmp_path: Path) -> None:
        layout = sample_layouts.saved_layout("dp2_mp4")
        strategy = [a for f in layout.strategy_files for a in ("-s", f)]
        reference, out = tmp_path / "one_go", tmp_path / "s"
        r = run_cli(*self.cli_args(), layout.root, *strategy, "--out", reference, "-q")
        assert r.returncode == 0, r.stderr
        r = run_cli(*self.cli_args(), layout.root, *strategy, "--out", out, "-q", "--workers", "1", kill_at="commit")
        assert r.returncode == -signal.SIGKILL, r.stderr
        with pytest.raises(IncompleteStoreError):
            ckptstore.open(out)
        r = run_cli(*self.cli_args(), layout.root, *strategy, "--out", out, "-q")
        assert r.returncode == 0, r.stderr
        same = {k: v for k, v in store_files(out).items() if k != self.manifest_file}
        assert same == {k: v for k, v in store_files(reference).items() if k != self.manifest_file}
        with ckptstore.open(out) as a, ckptstore.open(reference) as b:
            for name in a.names():
                assert np.array_equal(np.asarray(a.read(name)), np.asarray(b.read(name))), name


def copy_store(src: Path, dst: Path) -> Path:
    """A private copy of a store (symbolic links copied as links), safe to damage."""
    shutil.copytree(src, dst, symlinks=True)
    return dst
