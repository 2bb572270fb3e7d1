"""The benchmark report as a newcomer reads it (issue 25 item 9): a peer that is not installed is
one line in its table cell, quick mode judges no target, a reach check that differs says why on
the console, and the plots name the extra they need. No MindSpore and no benchmark run: the
functions that write those lines are called on small records."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import bench_load, targets
from benchmarks.harness import Contender
from benchmarks.report import markdown_table

NOT_INSTALLED = "not installed (pip install 'ckptstore[bench]')"


def _record(unavailable: dict[str, str]) -> dict:
    return {"summary": {}, "contenders": [{"name": n} for n in unavailable], "unavailable": unavailable}


def test_a_submodule_of_a_missing_package_is_reported_missing_not_raised():
    from benchmarks.peers import missing

    assert missing("no_such_package_xyz.checkpoint") == f"no_such_package_xyz.checkpoint {NOT_INSTALLED}"


def test_a_peer_that_is_not_installed_is_one_line_in_its_table_cell(monkeypatch):
    from benchmarks import peers

    monkeypatch.setattr(peers, "_installed", lambda module: module == "jax")  # jax here, orbax not
    [row] = peers.orbax_contenders(setup=None)
    assert row.unavailable == f"orbax.checkpoint {NOT_INSTALLED}"
    table = markdown_table(_record({row.name: row.unavailable}))
    assert f"| `{row.name}` | 0 | unavailable: orbax.checkpoint {NOT_INSTALLED} |" in table


def test_a_contender_factory_that_raises_is_one_line_in_its_cell_and_its_traceback_goes_to_stderr(
        monkeypatch, capsys):
    from benchmarks import registry

    def broken(setup: object) -> Contender:
        raise RuntimeError("no cache folder\nsecond line")

    monkeypatch.setattr(registry, "FACTORIES", {"load": [broken]})
    monkeypatch.setattr(registry, "load_plugins", lambda: [])
    [row] = registry.contenders_for("load", setup=None)
    assert row.unavailable == "setting up failed: RuntimeError: no cache folder"
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_reason_recorded_with_a_traceback_shows_only_its_first_line():
    reason = "setting up failed: ModuleNotFoundError: No module named 'orbax'\nTraceback (most recent call last):\n  x"
    table = markdown_table(_record({"orbax restore": reason}))
    assert "| `orbax restore` | 0 | unavailable: setting up failed: ModuleNotFoundError: No module named 'orbax' |" \
        in table
    assert "Traceback" not in table


def test_quick_mode_judges_no_target_and_says_it_is_a_smoke_test():
    verdicts = [targets.Verdict("Convert: peak RSS", "0.6 GiB", False)]
    assert targets.markdown(verdicts, quick=True) == targets.SMOKE_TEST
    assert "smoke test" in targets.SMOKE_TEST and "**" not in targets.SMOKE_TEST
    assert "**not met**" in targets.markdown(verdicts)  # a full run judges


def test_the_quick_suite_report_has_no_verdicts(tmp_path):
    from benchmarks.suite import SuiteConfig, report

    text = report({"seconds": 90.0}, SuiteConfig(quick=True, out=tmp_path), "python -m benchmarks run --quick")
    section = text.split("## Targets (benchmarks/README.md)\n\n", 1)[1].split("\n\n", 1)[0]
    assert section == targets.SMOKE_TEST
    assert "not judged |" not in text and "**met**" not in text and "**not met**" not in text


def test_a_reach_check_with_other_values_says_why_on_the_console():
    line = bench_load.reach_line(3, bench_load.MS_LDC, same=False)
    assert line.startswith(f"  reach rank 3 {bench_load.MS_LDC:<40} DIFFERENT values: without init() ")
    assert "rank 0's slices" in line and "\n" not in line
    assert (bench_load.reach_line(0, bench_load.MS_LDC, same=True)
            == f"  reach rank 0 {bench_load.MS_LDC:<40} same values")


def test_a_route_without_a_known_cause_points_to_the_report():
    line = bench_load.reach_line(1, "some.other.route", same=False)
    assert line.endswith('DIFFERENT values: not explained yet: compare its values by hand (REPORT.md, "Which '
                         'target ranks each MindSpore route reaches")')


def test_the_plots_name_the_extra_they_need(monkeypatch):
    from benchmarks import plots

    assert "pip install -e '.[bench]'" in plots.MISSING and "bench extra" in plots.MISSING
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    assert plots.plot_scaling([], plots.Path(".")) == ([], plots.MISSING)


@pytest.mark.slow
def test_the_scaling_option_names_the_plots_extra_in_its_help():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--help"], capture_output=True, text=True,
                         timeout=120).stdout
    assert "PNG plots need the bench extra: pip install -e '.[bench]'" in " ".join(out.split())


def _walls(**medians: float) -> dict:
    return {name: {"wall_s": {"median": m}} for name, m in medians.items()}


def _steps_record(**rows: dict) -> dict:
    """A load record whose step-by-step rows returned the given figures (two runs each, the same)."""
    nt = bench_load.bound_name(2)
    return {"params": {"bound_threads": 2}, "summary": _walls(**{nt: 0.100}),
            "contenders": [{"name": name} for name in rows],
            "samples": [{"contender": name, "returned": figures} for name, figures in rows.items() for _ in range(2)]}


_STEPS = {"open_s": 0.020, "open_cpu_s": 0.020, "layout_s": 0.010, "layout_cpu_s": 0.010, "read_s": 0.150,
          "read_cpu_s": 0.250, "parameters_s": 0.040, "parameters_cpu_s": 0.040, "plan_s": 0.030, "plan_cpu_s": 0.030}


def test_the_step_by_step_row_says_where_load_rank_time_goes_against_the_n_thread_bound():
    """Issue 36: where a target is missed, the benchmark shows the measured cause."""
    lines = bench_load.steps_lines(_steps_record(**{bench_load.STEPS: _STEPS}))
    assert lines[4:11] == [
        "| open | 20 ms / 20 ms | `ckptstore.open(store)`: the manifest read, parsed and validated |",
        "| layout | 10 ms / 10 ms | `ckptstore.load_rank(st, strategy, rank)`: the strategy file parsed, the "
        "rank's boxes cut |",
        "| read | 150 ms / 250 ms | `RankParameters.view.read_many(names)`: every read planned, then read by the "
        "pool |",
        "| … of it planning | 30 ms / 30 ms | `RankParameters.plan` timed again afterwards: the plans the read step "
        "made before reading |",
        "| parameters | 40 ms / 40 ms | `to_parameter(name, array)` for each: MindSpore's `Parameter` built around "
        "the array |",
        "| **sum** | 220 ms / 320 ms | |", ""]
    # reads alone 120 ms; single-thread work 20 + 10 + 30 + 40 = 100 ms
    assert lines[11].startswith("The pool's reads alone (read − planning) take 120 ms = **1.20× the N-thread "
                                "bound** (100 ms); the steps one thread runs in Python (open, layout, planning, "
                                "Parameters) take 100 ms.")
    assert "at least the bound plus 1/2 of it, 150 ms = 1.50× the bound" in lines[11]
    assert "200 ms = 2.00×. 1.3× leaves 30 ms for everything but the copy." in lines[11]


def test_the_step_by_step_table_has_a_column_for_the_base_revision():
    base = f"{bench_load.STEPS} [base abc1234]"
    lines = bench_load.steps_lines(_steps_record(**{bench_load.STEPS: _STEPS, base: {**_STEPS, "open_s": 0.05}}))
    assert lines[2] == (f"| step | `{bench_load.STEPS}` wall / CPU | `{base}` wall / CPU | what it is |")
    assert lines[4].startswith("| open | 20 ms / 20 ms | 50 ms / 20 ms |")


def test_cold_the_step_table_stands_without_the_copy_bound_arithmetic():
    lines = bench_load.steps_lines({**_steps_record(**{bench_load.STEPS: _STEPS}), "cache": "cold"})
    assert lines[-2] == "| **sum** | 220 ms / 320 ms | |" and not any("pool's reads" in x for x in lines)


def test_cold_load_rank_is_judged_against_the_faster_dcp_row():
    """Issue 36: cold, load_rank ≤ 0.8× DCP (the faster of its rows)."""
    record = {"cache": "cold", "summary": _walls(**{bench_load.CKPTSTORE: 0.45, "torch DCP dcp.load (a)": 0.75,
                                                     "torch DCP dcp.load (b)": 0.60})}
    assert bench_load.dcp_lines(record)[0] == (
        f"Against PyTorch DCP: `{bench_load.CKPTSTORE}` 450 ms vs `torch DCP dcp.load (b)` 600 ms (the faster DCP "
        "row; medians of one run) = **0.75×** (target ≤ 0.8× cold: met).")
    record["summary"][bench_load.CKPTSTORE]["wall_s"]["median"] = 0.5
    assert bench_load.dcp_lines(record)[0].endswith("= **0.83×** (target ≤ 0.8× cold: **MISSED**).")


def test_warm_the_dcp_line_judges_nothing_and_cold_the_bound_line_judges_nothing():
    nt = bench_load.bound_name(2)
    walls = _walls(**{bench_load.CKPTSTORE: 0.6, nt: 0.25, "torch DCP dcp.load": 1.0})
    assert bench_load.dcp_lines({"summary": walls})[0].endswith("= **0.60×**.")
    [line, _] = bench_load.bound_lines({"cache": "cold", "params": {"bound_threads": 2}, "summary": walls})
    assert "**2.40× the N-thread bound** (the target is for a warm page cache: not judged cold)" in line


def test_no_step_by_step_section_without_its_row():
    assert bench_load.steps_lines(_steps_record()) == []


def test_only_keeps_the_rows_whose_name_holds_one_of_the_strings():
    rows = [Contender(n, "m", "f") for n in (bench_load.CKPTSTORE, bench_load.BOUND, bench_load.MS_LDC)]
    assert [c.name for c in bench_load.only(rows, ["ckptstore", "preadv"])] == [bench_load.CKPTSTORE, bench_load.BOUND]
    assert bench_load.only(rows, None) == rows


def test_base_rows_repeat_the_ckptstore_rows_with_the_other_revision_on_the_path(tmp_path):
    rows = [Contender(n, "m", "f", env={"RANK_ID": "0"})
            for n in (bench_load.CKPTSTORE, bench_load.BOUND, bench_load.STEPS)]
    got = bench_load.base_rows(rows, tmp_path, "0123456789abcdef")
    assert [c.name for c in got] == [f"{bench_load.CKPTSTORE} [base 0123456]", f"{bench_load.STEPS} [base 0123456]"]
    assert got[0].env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
    assert got[0].env["RANK_ID"] == "0" and got[0].env["PYTHONSAFEPATH"] == "1"


def test_load_rank_is_judged_against_the_n_thread_preadv_bound_beside_the_one_thread_one():
    """Issue 36.1: the bound is N threads of preadv, N = the cores the loader may use (here 2)."""
    nt = bench_load.bound_name(2)
    record = {"params": {"bound_threads": 2},
              "summary": _walls(**{bench_load.CKPTSTORE: 0.6, bench_load.BOUND: 0.4, nt: 0.25})}
    assert bench_load.nthread_bound(record) == nt
    assert bench_load.bound_verdict(record) == (0.6, 0.25, False)  # 2.4x > 1.3x
    [line, _] = bench_load.bound_lines(record)
    assert "**2.40× the N-thread bound** (target ≤ 1.3×: **MISSED**), 1.50× the single-thread one" in line
