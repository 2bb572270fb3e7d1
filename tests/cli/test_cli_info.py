"""``ckptstore info`` on real checkpoints and strategy files (click's CliRunner, plus one real process)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import mindspore_fixtures as T
from ckptstore.cli import main
from ckptstore.formats.ckpt_writer import CheckpointWriter

KNOWN = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "table": np.arange(10, dtype=np.int8).reshape(5, 2),
    "bf": np.ones((2, 2), dtype=ml_dtypes.bfloat16),
    "flag": np.array([True, False]),
    "scale": np.array(0.5, dtype=np.float64),
}
KNOWN_JSON_PARAMS = {
    "w": {"dtype": "float32", "shape": [3, 4], "nbytes": 48},
    "table": {"dtype": "int8", "shape": [5, 2], "nbytes": 10},
    "bf": {"dtype": "bfloat16", "shape": [2, 2], "nbytes": 8},
    "flag": {"dtype": "bool", "shape": [2], "nbytes": 2},
    "scale": {"dtype": "float64", "shape": [], "nbytes": 8},
    "epoch_num": {"dtype": "int64", "shape": [], "nbytes": 8},
    "lr": {"dtype": "float32", "shape": [], "nbytes": 4},
    "net_name": {"dtype": "str", "shape": [], "nbytes": 20},
}


def _save_known(path: Path, crc_check: bool = False) -> Path:
    """What ``mindspore.save_checkpoint(KNOWN, append_dict={"epoch_num": 3, "lr": 0.25, "net_name":
    "gpt-2"})`` writes (appended Python int/float/str as Int64/Float32 scalars and a str), by
    ckptstore's CheckpointWriter, byte-identical to it for every dtype, scalars and str included
    (tests/read/test_export.py::test_checkpoint_writer_is_byte_identical_to_save_checkpoint)."""
    with CheckpointWriter(path, crc=crc_check) as w:
        for n, a in KNOWN.items():
            w.add(n, a)
        w.add("epoch_num", np.array(3, dtype=np.int64))
        w.add("lr", np.array(0.25, dtype=np.float32))
        w.add("net_name", "gpt-2")
    return path


@pytest.fixture(scope="module")
def known_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    return {"plain": _save_known(root / "known.ckpt"), "crc": _save_known(root / "known_crc.ckpt", crc_check=True)}


def _run(*args: object):
    return CliRunner().invoke(main, ["info", *map(str, args)], catch_exceptions=False)


# ---- checkpoint files --------------------------------------------------------------------------

def test_checkpoint_table_lists_every_parameter(known_files):
    path = known_files["plain"]
    result = _run(path)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    size = path.stat().st_size
    assert size < 1024
    assert lines[0].startswith(f"{path}: MindSpore checkpoint, ")
    assert lines[0].endswith(f"{size} B, CRC trailer: no")
    assert lines[1].split() == ["parameter", "dtype", "shape", "bytes"]
    for line, (name, p) in zip(lines[2:-1], KNOWN_JSON_PARAMS.items(), strict=True):  # (the last line: the total)
        assert re.fullmatch(rf"  {re.escape(name)} +{p['dtype']} +{re.escape(str(p['shape']))} +{p['nbytes']:,}",
                            line), line
    total = sum(p["nbytes"] for p in KNOWN_JSON_PARAMS.values())
    assert lines[2 + len(KNOWN_JSON_PARAMS)].split() == ["total", f"{total:,}"]
    assert len(lines) == 3 + len(KNOWN_JSON_PARAMS)


@pytest.mark.parametrize("variant", ["plain", "crc"])
def test_checkpoint_json_is_exact(known_files, variant):
    path = known_files[variant]
    result = _run(path, "--json")
    assert result.exit_code == 0
    raw = path.read_bytes()
    crc = int.from_bytes(raw[-10:], "big") if variant == "crc" else None
    assert json.loads(result.stdout) == {"kind": "checkpoint", "path": str(path), "size": len(raw), "crc": crc,
                                         "params": KNOWN_JSON_PARAMS}


def test_checkpoint_table_reports_a_crc_trailer(known_files):
    assert _run(known_files["crc"]).stdout.splitlines()[0].endswith("CRC trailer: yes")


def test_strategy_options_on_a_checkpoint_are_a_usage_error(known_files):
    result = _run(known_files["plain"], "--rank", 0)
    assert result.exit_code == 2
    assert "is a checkpoint file; --rank, --ckpt-dir and --strategy are for strategy files" in result.stderr


def test_strategy_options_on_a_store_are_a_usage_error_pointing_to_plan(known_files, tmp_path):
    import ckptstore

    ckptstore.convert(known_files["plain"], tmp_path / "s.zarr")
    result = _run(tmp_path / "s.zarr", "--rank", 3)
    assert result.exit_code == 2 and result.stdout == ""
    assert (f"{tmp_path / 's.zarr'} is a store; --rank, --ckpt-dir and --strategy are for strategy files (what one "
            "rank of a layout reads from a store: 'ckptstore plan STORE --strategy FILE --rank R')") in result.stderr


def test_a_truncated_checkpoint_is_one_line_naming_file_and_offset(known_files, tmp_path):
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(known_files["plain"].read_bytes()[:60])  # inside the first record, "w"
    result = _run(cut)
    assert result.exit_code == 2 and result.stdout == ""
    assert re.fullmatch(rf"ckptstore: error: a record of \d+ bytes runs \d+ bytes past the end of the file "
                        rf"\(file {re.escape(str(cut))}, parameter 'w', byte offset 0\) \[TruncatedCheckpointError\]\n",
                        result.stderr), result.stderr


@pytest.mark.slow
def test_console_script_reports_a_truncated_file_without_traceback(known_files, tmp_path):
    cut = tmp_path / "cut.ckpt"
    raw = known_files["plain"].read_bytes()
    cut.write_bytes(raw[:len(raw) - 3])  # inside the last record, "net_name"
    script = Path(sys.executable).parent / "ckptstore"
    proc = subprocess.run([str(script), "info", str(cut)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ckptstore: error: ")
    assert f"(file {cut}, parameter 'net_name', byte offset " in proc.stderr
    assert proc.stderr.rstrip().endswith("[TruncatedCheckpointError]")


# ---- strategy files ----------------------------------------------------------------------------

def _layout_json(spec: T.ParamSpec) -> dict:
    s = T.normalize_spec(spec)
    return {"dev_matrix": list(s.dev_matrix), "tensor_map": list(s.tensor_map),
            "opt_shard_step": s.opt_shard_step, "opt_shard_size": s.opt_shard_size}


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
def test_strategy_json_lists_every_layout(saved_layout, fmt):
    layout = saved_layout("opt_shard", fmt)
    path = layout.strategy_files[0]
    result = _run(path, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "kind": "strategy", "paths": [str(path)], "world_size": 8, "stage_devices": 8, "num_stages": 1,
        "params": {s.name: {"stages": {"0": _layout_json(s)}} for s in layout.specs if s.in_strategy},
    }


def test_strategy_table_lists_every_parameter(saved_layout):
    layout = saved_layout("dp2_mp4")
    path = layout.strategy_files[0]
    lines = _run(path).stdout.splitlines()
    in_strategy = [s for s in layout.specs if s.in_strategy]
    assert lines[0].startswith(f"{path}: MindSpore strategy, 8 ranks (1 pipeline stage(s) x 8 devices)")
    assert len(lines) == 1 + len(in_strategy)
    for line, spec in zip(lines[1:], in_strategy, strict=True):
        assert re.fullmatch(rf"  {re.escape(spec.name)} +dev_matrix \[2, 4\]  tensor_map "
                            rf"{re.escape(str(list(spec.tensor_map)))}  opt_shard 0/0", line), line


def test_pipeline_strategy_files_are_read_together(saved_layout):
    layout = saved_layout("pipeline2")
    stage0, stage1 = layout.strategy_files
    info = json.loads(_run(stage0, "--strategy", stage1, "--json").stdout)
    assert (info["paths"], info["world_size"], info["stage_devices"], info["num_stages"]) == (
        [str(stage0), str(stage1)], 8, 4, 2)
    assert {n: list(p["stages"]) for n, p in info["params"].items()} == {
        s.name: [str(s.stage)] for s in layout.specs if s.in_strategy}


def test_one_pipeline_stage_alone_is_refused_naming_it(saved_layout):
    stage1 = saved_layout("pipeline2").strategy_files[1]
    result = _run(stage1)
    assert result.exit_code == 2
    assert result.stderr == (f"ckptstore: error: the strategy ({stage1}) has pipeline stages [1]; every stage from "
                             "0 to 1 is needed (pass each stage's strategy file) [StrategyError]\n")


@pytest.mark.parametrize(
    "name,box",
    [
        ("embedding.table", "box [0:40) x [0:16) of [40, 16]"),
        ("layer0.w", "box [8:16) x [0:16) of [32, 16]"),
        ("layer0.b", "box [8:16) of [32]"),
        ("layer1.w", "box [0:16) x [8:16) of [16, 32]"),
        ("moe.w", "box [2:4) x [0:8) x [2:4) of [4, 8, 8]"),
    ],
    ids=["embedding.table", "layer0.w", "layer0.b", "layer1.w", "moe.w"],
)
def test_rank_and_ckpt_dir_print_the_box_of_each_parameter(saved_layout, name, box):
    layout = saved_layout("dp2_mp4")
    result = _run(layout.strategy_files[0], "--rank", 5, "--ckpt-dir", layout.root)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1] == "rank 5 (stage 0):"
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith(f"  {name} "))
    assert line.endswith(box), line


@pytest.mark.mindspore
@pytest.mark.parametrize("kind,rank", [("opt_shard", 5), ("mixed_dtypes", 6), ("pipeline2", 6)])
def test_rank_boxes_in_json_cut_what_mindspore_cuts(saved_layout, kind, rank):
    layout = saved_layout(kind)
    files = layout.strategy_files
    args = [files[0], *[a for f in files[1:] for a in ("--strategy", f)]]
    info = json.loads(_run(*args, "--rank", rank, "--ckpt-dir", layout.root, "--json").stdout)
    per_stage = layout.world // layout.stages
    stage, local = divmod(rank, per_stage)
    for spec in (s for s in layout.specs if s.in_strategy):
        item = info["params"][spec.name]
        if spec.stage != stage:
            assert item["split"] is None and item["box"] is None, spec.name
            continue
        box = tuple(slice(lo, hi) for lo, hi in zip(item["box"]["start"], item["box"]["stop"], strict=True))
        want = T.mindspore_rank_slice(spec, layout.tensors[spec.name], local)
        assert item["global_shape"] == list(spec.shape)
        assert np.array_equal(layout.tensors[spec.name][box], want), spec.name


def test_rank_without_ckpt_dir_prints_the_split_only(saved_layout):
    layout = saved_layout("opt_shard")
    info = json.loads(_run(layout.strategy_files[0], "--rank", 3, "--json").stdout)
    assert info["rank"] == 3
    assert info["params"]["layer0.w"]["split"] == {"parts_per_axis": [4, 1], "opt_shard_parts": 2}
    assert info["params"]["embedding.table"]["split"] == {"parts_per_axis": [1, 1], "opt_shard_parts": 2}
    assert "box" not in info["params"]["layer0.w"]
