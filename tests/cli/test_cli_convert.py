"""The ``ckptstore`` command line for converting and checking stores, on real MindSpore fixtures:
in this process through click's CliRunner (:func:`convert_fixtures.run_cli`), and the one-line
summary also as a real subprocess (the installed console script, whose whole stderr is checked)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ckptstore
from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint
from convert_fixtures import (
    assert_same_array,
    copy_saved,
    expected_for,
    expected_values,
    flip_byte,
    run_cli,
    strategy_args,
)


@pytest.mark.mindspore  # expected_for: MindSpore's own slicing
def test_convert_prints_a_one_line_summary(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "s.zarr"
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q", process=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # -q: no progress, and nothing else on the process's stderr
    exp = expected_for(layout)
    (line,) = r.stdout.splitlines()
    params, chunks = len(exp.shapes), sum(exp.chunks(n) for n in exp.shapes)
    assert line.startswith(f"wrote {out}: {params} parameters in {chunks} chunks, "), line
    saved = sum(exp.source_bytes(n) - exp.nbytes(n) for n in exp.shapes)
    assert f"replicas stored once saved {saved / 1024:.1f} KiB" in line, line
    with ckptstore.open(out) as store:
        for name, want in expected_values(layout).items():
            assert_same_array(store.read(name), want, name)


@pytest.mark.mindspore  # expected_for: MindSpore's own slicing
def test_convert_json_summary(saved_layout, tmp_path):
    layout = saved_layout("opt_shard")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", tmp_path / "s.zarr", "-q", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    exp = expected_for(layout)
    assert summary["params"] == len(exp.shapes)
    assert summary["chunks"] == summary["chunks_written"] == sum(exp.chunks(n) for n in exp.shapes)
    assert summary["unique_bytes"] == summary["stored_bytes"] == sum(exp.nbytes(n) for n in exp.shapes)
    assert summary["source_bytes"] == sum(exp.source_bytes(n) for n in exp.shapes)
    assert summary["dedup_saved_bytes"] == summary["source_bytes"] - summary["unique_bytes"]


def test_convert_a_single_checkpoint_file_without_strategy(saved_layout, tmp_path):
    layout = saved_layout("dp2_mp4")
    out = tmp_path / "rank3.zarr"
    r = run_cli("convert", layout.rank_file(3), "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    local = scan_checkpoint(layout.rank_file(3))
    with ckptstore.open(out) as store:
        assert store.names() == local.names()
        for name, entry in local.entries.items():
            assert_same_array(store.read(name), read_entry(layout.rank_file(3), entry), name)


@pytest.mark.mindspore  # expected_for: MindSpore's own slicing
@pytest.mark.parametrize("kind", ["dp2_mp4", "pipeline2", "mixed_dtypes"])
def test_info_json_describes_every_parameter(converted, kind):
    c = converted(kind)
    r = run_cli("info", c.store, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    exp = expected_for(c.layout)
    assert info["kind"] == "store"
    assert sorted(info["params"]) == sorted(exp.shapes)
    for name, p in info["params"].items():
        (first, *_) = exp.slices[name]
        assert p["shape"] == list(exp.shapes[name]), name
        assert p["dtype"] == ("bfloat16" if exp.dtypes[name].name == "bfloat16" else exp.dtypes[name].name), name
        assert p["chunk_shape"] == list(first.shape), name  # chunks are the distinct slices
        assert p["chunks"] == exp.chunks(name), name
    totals = info["totals"]
    assert totals["nbytes"] == totals["stored_bytes"] == sum(exp.nbytes(n) for n in exp.shapes)
    assert totals["source_bytes"] == sum(exp.source_bytes(n) for n in exp.shapes)
    assert totals["dedup_saved_bytes"] == totals["source_bytes"] - totals["nbytes"]
    assert info["source"]["world_size"] == c.layout.world


def test_info_json_dedup_saved_bytes_is_positive_for_dp2_mp4(converted):
    c = converted("dp2_mp4")
    totals = json.loads(run_cli("info", c.store, "--json").stdout)["totals"]
    assert totals["dedup_saved_bytes"] == c.summary.dedup_saved_bytes > 0


def test_info_table_of_a_store(converted):
    c = converted("dp2_mp4")
    r = run_cli("info", c.store)
    assert r.returncode == 0, r.stderr
    first, *rows = r.stdout.splitlines()
    assert first.startswith(f"{c.store}: ckptstore store") and "8 rank file(s)" in first, first
    assert any(re.match(r"\s+layer0\.w\s+float32\s+\[32, 16\]\s+\[8, 16\]\s+4\s+2,048$", row) for row in rows), rows


def test_verify_passes_on_a_fresh_store(converted):
    c = converted("dp2_mp4")
    r = run_cli("verify", c.store)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"OK: 15 parameters, {c.summary.chunks} chunks, ")
    assert r.stdout.rstrip().endswith("; 0 problem(s)")


@pytest.fixture
def private_store(converted, tmp_path) -> tuple[Path, object]:
    """A writable copy of the dp2_mp4 store (it records absolute source paths, so the copy still
    verifies against the session source)."""
    import shutil

    c = converted("dp2_mp4")
    out = tmp_path / "s.zarr"
    shutil.copytree(c.store, out)
    return out, c


@pytest.mark.parametrize(("name", "chunk"), [
    pytest.param("layer0.w", 2, id="sharded-param"),
    pytest.param("embedding.table", 0, id="single-chunk-param"),
])
def test_verify_fails_on_a_flipped_byte_naming_parameter_and_chunk(private_store, name, chunk):
    out, _ = private_store
    with ckptstore.open(out) as store:
        t = store.info(name).chunks
        path, offset = out / t.files[chunk], t.offsets[chunk] + t.nbytes[chunk] // 2
    flip_byte(path, offset)
    r = run_cli("verify", out)
    assert r.returncode == 1
    problems = r.stderr.strip().splitlines()
    assert len(problems) == 1
    assert problems[0].startswith(f"ckptstore: parameter '{name}': chunk {chunk}: checksum mismatch in {path}")
    assert r.stdout.startswith("FAILED:") and "1 problem(s)" in r.stdout


@pytest.mark.parametrize("kind", ["dp2_mp4", "opt_shard", "pipeline2", "mixed_dtypes"])
def test_verify_against_the_source_passes(converted, kind):
    c = converted(kind)
    r = run_cli("verify", c.store, "--against", c.layout.root, *strategy_args(c.layout))
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"{c.summary.chunks} chunks compared with the source; 0 problem(s)" in r.stdout


def test_verify_against_a_source_with_a_damaged_replica_names_the_rank(saved_layout, tmp_path):
    """The store came from rank 0's copy; rank 4's replica of layer0.w is then damaged."""
    layout = copy_saved(saved_layout("dp2_mp4"), tmp_path / "src")
    out = tmp_path / "s.zarr"
    assert run_cli("convert", layout.root, *strategy_args(layout), "--out", out, "-q").returncode == 0
    offset, length = scan_checkpoint(layout.rank_file(4))["layer0.w"].pieces[0]
    flip_byte(layout.rank_file(4), offset + length - 1)
    r = run_cli("verify", out, "--against", layout.root, *strategy_args(layout))
    assert r.returncode == 1
    (problem,) = r.stderr.strip().splitlines()
    assert problem == f"ckptstore: parameter 'layer0.w': chunk 0 differs from rank 4 ({layout.rank_file(4)})"


@pytest.mark.mindspore  # expected_for: MindSpore's own slicing
@pytest.mark.parametrize("command", ["convert", "index"])
def test_the_progress_line_counts_every_parameter(saved_layout, tmp_path, command):
    layout = saved_layout("dp2_mp4")
    r = run_cli(command, layout.root, *strategy_args(layout), "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    params = len(expected_for(layout).shapes)
    last = r.stderr.strip().splitlines()[-1]  # not a terminal: a final plain progress line
    assert last.startswith(f"{command}: {params}/{params} params"), last
    # an index without --checksum reads no slice: no byte rate
    assert ("MiB/s" in last) == (command == "convert"), last


@pytest.mark.slow  # the real script, its stderr a pipe with no reader
def test_convert_whose_stderr_reader_went_away_completes_the_store(saved_layout, tmp_path):
    """Issue 37 item 10: the progress line written to a closed pipe ended the run with the store
    incomplete and exit 0."""
    import os
    import subprocess

    from convert_fixtures import cli_command, expected_values, strategy_args

    layout = saved_layout("dp2_mp4")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([*cli_command(), "convert", str(layout.root), *map(str, strategy_args(layout)), "--out",
                            str(tmp_path / "s")], stderr=write_end, stdout=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 's'}: "), r.stdout
    with ckptstore.open(tmp_path / "s") as store:
        for name, value in expected_values(layout).items():
            assert_same_array(store.read(name), value)
