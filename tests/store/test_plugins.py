"""A store kind, a byte source and a byte sink that ckptstore does not know, each declared in one
file of tests/plugins/ and registered only through entry points (as a third party's package
would be), are picked up by ``ckptstore.open``, ``convert(format=...)``, the CLI's ``--format``
and the commit, and pass the conformance classes (issue 16: "a new store kind, byte source or
byte sink is one new file that passes its conformance class").

The entry points live in a ``*.dist-info`` folder that :func:`plugins` puts on ``sys.path``
(and on ``PYTHONPATH`` for the CLI's subprocesses) for one test at a time, so no other test sees
the plugins.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from itertools import count
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ckptstore
from ckptstore.cli import main  # imported before any plugin is installed
from ckptstore.errors import InvalidOptionError
from ckptstore.io.locations import open_location
from ckptstore.io.schemes import BYTE_SINKS, BYTE_SOURCES
from ckptstore.io.sink import open_sink
from ckptstore.registry import Registry
from ckptstore.store.kinds import KINDS, StoreKind, manifest_files, store_kind, store_kinds
from ckptstore.testing.kill_at import run_cli
from ckptstore.testing.sink_tests import ByteSinkTests
from ckptstore.testing.source_tests import ByteSourceTests
from ckptstore.testing.store_kind_tests import StoreKindTests
from repo_paths import PLUGINS, TESTS

ENTRY_POINTS = """\
[ckptstore.store_kinds]
tiny = tiny_kind:KIND

[ckptstore.byte_sources]
memtest = memtest_scheme:BYTE_SOURCE

[ckptstore.byte_sinks]
memtest = memtest_scheme:BYTE_SINK
"""
_names = count()


def _install(site: Path, dist: str, entry_points: str) -> None:
    """What ``pip install`` of a distribution with these entry points leaves in ``site``."""
    info = site / f"{dist}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(entry_points)


def _rediscover() -> None:
    importlib.invalidate_caches()
    for registry in (KINDS, BYTE_SOURCES, BYTE_SINKS):
        registry.reload()


@pytest.fixture
def plugins(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    site = tmp_path_factory.getbasetemp() / "plugin-site"
    _install(site, "ckptstore_test_plugins", ENTRY_POINTS)
    for path in (site, PLUGINS):
        monkeypatch.syspath_prepend(str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), str(site), os.environ.get("PYTHONPATH", "")]))
    _rediscover()
    yield
    monkeypatch.undo()
    _rediscover()


# ---- the store kind --------------------------------------------------------------------------


class TestTinyKind(StoreKindTests):
    kind = "tiny"
    manifest_file = "tiny.json"

    @pytest.fixture(autouse=True)
    def _plugged_in(self, plugins: None) -> None:
        pass

    def write(self, layout, out, **kwargs):
        ckptstore.convert(layout.root, out, strategy=layout.strategy_files, format="tiny", **kwargs)

    def cli_args(self):
        return ["convert", "--format", "tiny"]


def test_without_its_entry_point_the_kind_is_unknown():
    assert store_kind("tiny") is None and "tiny.json" not in manifest_files()
    with pytest.raises(InvalidOptionError, match=r"unknown store format 'tiny'; choose one of: safetensors, zarr;"):
        ckptstore.convert("src", "out", format="tiny")


def test_the_kind_joins_convert_s_choices_and_its_message(plugins):
    kind = store_kind("tiny")
    assert kind is not None and kind.writer_class().__module__ == "tiny_kind"
    assert manifest_files() == ["zarr.json", "ckptstore.json", "tiny.json"]  # the default kind's first
    with pytest.raises(InvalidOptionError, match=r"choose one of: safetensors, zarr, tiny; index is not made by"):
        ckptstore.convert("src", "out", format="bogus")


def test_the_cli_and_the_api_list_the_store_kinds_in_the_registry_s_order():
    order = [k.name for k in store_kinds(convert=True)]
    with pytest.raises(InvalidOptionError) as api:
        ckptstore.convert("src", "out", format="bogus")
    assert f"choose one of: {', '.join(order)};" in str(api.value)
    r = CliRunner().invoke(main, ["convert", "SRC", "--out", "OUT", "--format", "bogus"])
    assert r.exit_code == 2 and f"'bogus' is not one of {', '.join(map(repr, order))}." in r.output


def test_the_cli_offers_the_kind_with_its_help(plugins):
    r = run_cli("convert", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # as click wraps it
    assert "--format [safetensors|zarr|tiny]" in text and "tiny: Zarr arrays with the manifest in tiny.json" in text


def test_the_cli_asks_for_the_kinds_when_it_runs_not_when_it_is_imported(plugins):
    r = CliRunner().invoke(main, ["convert", "SRC", "--out", "OUT", "--format", "nonesuch"])
    assert r.exit_code == 2 and "'nonesuch' is not one of 'safetensors', 'zarr', 'tiny'" in r.output


def test_info_names_the_kind_by_its_label(plugins, tiny_store):
    r = run_cli("info", tiny_store)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"{tiny_store}: ckptstore store (tiny test kind) converted from")


@pytest.fixture
def tiny_store(plugins, saved_layout, tmp_path) -> Path:
    layout = saved_layout("dp2_mp4")
    ckptstore.convert(layout.root, tmp_path / "s", strategy=layout.strategy_files, format="tiny")
    return tmp_path / "s"


# ---- the byte source and sink ----------------------------------------------------------------


class TestMemtestSource(ByteSourceTests):
    @pytest.fixture
    def source(self, plugins):
        source = open_location(f"memtest://source-{next(_names)}")
        assert type(source).__module__ == "ckptstore.io.memory_sink"  # what the plugin's scheme opens
        yield source

    def put(self, source, key, data):
        open_sink(source.url).put(key, data)


class TestMemtestSink(ByteSinkTests):
    has_locks = False

    @pytest.fixture
    def sink(self, plugins):
        yield open_sink(f"memtest://sink-{next(_names)}")


def test_a_store_is_converted_into_and_opened_from_the_plugin_s_scheme(plugins, saved_layout):
    layout = saved_layout("mixed_dtypes")
    url = f"memtest://store-{next(_names)}"
    summary = ckptstore.convert(layout.root, url, strategy=layout.strategy_files, format="tiny")
    assert summary.committed and summary.store == url
    assert "tiny.json" in sys.modules["memtest_scheme"].sink(url).keys()
    with ckptstore.open(url) as store:
        assert store.kind == "tiny"
        for name, value in layout.tensors.items():
            got = store.read(name)
            assert got.dtype == np.asarray(value).dtype and got.tobytes() == np.asarray(value).tobytes(), name


# ---- the registry ------------------------------------------------------------------------------


def _kind_registry_seeing(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """A new store-kind registry, like ``ckptstore.store.kinds.KINDS``, that sees what is installed in ``folder``."""
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    return Registry("store kind", StoreKind, "ckptstore.store.kinds", "KIND", "ckptstore.store_kinds",
                    lambda k: (k.name,))


def test_a_plugin_that_does_not_load_is_skipped_with_a_warning(tmp_path, monkeypatch):
    _install(tmp_path, "broken_plugin", "[ckptstore.store_kinds]\nbroken = no_such_module_here:KIND\n")
    registry = _kind_registry_seeing(tmp_path, monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"'no_such_module_here:KIND' \(entry point 'broken' .*could not be loaded"):
        assert registry.names() == ["index", "safetensors", "zarr"]


def test_a_plugin_cannot_take_a_built_in_name(tmp_path, monkeypatch):
    _install(tmp_path, "usurper", "[ckptstore.store_kinds]\nzarr = usurper_kind:KIND\n")
    (tmp_path / "usurper_kind.py").write_text(
        "import dataclasses\nfrom ckptstore.store.kinds.zarr import KIND as ZARR\n"
        "KIND = dataclasses.replace(ZARR, label='not zarr')\n")
    registry = _kind_registry_seeing(tmp_path, monkeypatch)
    with pytest.warns(RuntimeWarning, match="declares the store kind 'zarr', which is taken already"):
        assert registry.entries()["zarr"].label == "Zarr v3"
    assert registry.get("zarr").label == "Zarr v3"


def test_a_built_in_is_found_without_reading_the_entry_points(tmp_path, monkeypatch):
    # every rank's first open of a local store looks up a built-in scheme and kind
    _install(tmp_path, "broken", "[ckptstore.store_kinds]\nbroken = no_such_module_here:KIND\n")
    registry = _kind_registry_seeing(tmp_path, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading the broken plugin would warn
        assert registry.get("zarr").label == "Zarr v3"
    with pytest.warns(RuntimeWarning, match="could not be loaded"):
        assert registry.get("tiny-unknown") is None


def test_a_built_in_scheme_of_a_module_already_imported_is_found_without_importing_the_others():
    # a fresh process's first open of a local path imported every module of ckptstore.io (~2.5 ms)
    code = ("import sys, ckptstore\n"
            "from ckptstore.io.locations import open_location\n"
            "before = set(sys.modules)\n"
            "source = open_location(sys.argv[1])\n"
            "print(type(source).__name__, sorted(m for m in set(sys.modules) - before if m.startswith('ckptstore')))\n")
    out = subprocess.run([sys.executable, "-c", code, str(TESTS)], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "LocalSource []"



def test_a_plugin_that_looks_the_kinds_up_while_it_is_imported_is_refused_not_hung(tmp_path, monkeypatch):
    _install(tmp_path, "eager", "[ckptstore.store_kinds]\neager = eager_kind:KIND\n")
    (tmp_path / "eager_kind.py").write_text(
        "from ckptstore.store.kinds import store_kinds\nKNOWN = store_kinds()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _rediscover()
    try:
        with pytest.warns(RuntimeWarning, match="'eager_kind:KIND'.*looked the store kinds up while it was being"):
            assert [k.name for k in KINDS.entries().values()] == ["index", "safetensors", "zarr"]
    finally:
        monkeypatch.undo()
        _rediscover()
