"""bench_versions (old vs new): each worker imports its revision's extracted ckptstore/, not the
checkout it runs in; the verdict is new/old of the median wall times against 1.05×. No MindSpore."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

BASE = "cee2ecf"  # the layout before the reorganisation by role: ckptstore/loader.py, no ckptstore/read/


def test_extract_takes_only_the_revisions_committed_ckptstore(tmp_path: Path) -> None:
    from benchmarks.bench_versions import extract
    from benchmarks.harness import REPO_ROOT, _git_revision

    rev = extract(BASE, REPO_ROOT, tmp_path / "old")
    assert rev.startswith(BASE) and len(rev) == 40
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["ckptstore"]
    assert (tmp_path / "old" / "ckptstore" / "loader.py").is_file()
    assert not (tmp_path / "old" / "ckptstore" / "read").exists()
    assert _git_revision() is not None  # the checkout itself was not touched


def test_unknown_revision_is_refused_naming_it(tmp_path: Path) -> None:
    from benchmarks.bench_versions import extract
    from benchmarks.harness import REPO_ROOT, BenchmarkError

    with pytest.raises(BenchmarkError, match="'no-such-rev' is neither a revision"):
        extract("no-such-rev", REPO_ROOT, tmp_path / "x")


@pytest.mark.slow
def test_worker_imports_the_extracted_tree_not_the_checkout_it_runs_in(tmp_path: Path) -> None:
    # The worker's working directory is the checkout (REPO_ROOT), which has a ckptstore/ of its own:
    # without PYTHONSAFEPATH it would come first on sys.path and both "revisions" would be this one.
    from benchmarks.bench_versions import MODULE, Tree, extract
    from benchmarks.harness import REPO_ROOT, Contender, run_contender

    extract(BASE, REPO_ROOT, tmp_path / "old")
    harness_dir = tmp_path / "harness"
    harness_dir.mkdir()
    (harness_dir / "benchmarks").symlink_to(REPO_ROOT / "benchmarks", target_is_directory=True)
    tree = Tree("old", BASE, "x", tmp_path / "old", tmp_path / "store")
    m = run_contender(Contender("which", MODULE, "which_ckptstore", env=tree.env(harness_dir)), timeout=120)
    assert m["returned"] == {"ckptstore": tree.init_file}


def _sample(name: str, rnd: int, wall: float) -> dict:
    return {"contender": name, "round": rnd, "wall_s": wall, "cpu_s": wall / 2, "peak_above_start": 100,
            "rchar": 1000}


def test_verdict_is_new_over_old_of_the_median_walls_against_1_05() -> None:
    from benchmarks.bench_versions import Tree, verdicts
    from benchmarks.harness import summarize

    old, new = (Tree(label, label, "0" * 40, Path("."), Path(".")) for label in ("old", "new"))
    a, b = "load_rank [old 0000000]", "load_rank [new 0000000]"
    c, d = "convert [old 0000000]", "convert [new 0000000]"
    samples = [_sample(a, 0, 9.0), _sample(b, 0, 9.0),  # round 0 is the warm-up: left out
               _sample(a, 1, 1.0), _sample(b, 1, 1.2), _sample(a, 2, 2.0), _sample(b, 2, 2.0),
               _sample(a, 3, 3.0), _sample(b, 3, 2.7),
               _sample(c, 1, 10.0), _sample(d, 1, 10.5), _sample(c, 2, 10.0), _sample(d, 2, 10.4),
               _sample(c, 3, 10.0), _sample(d, 3, 10.6)]
    record = {"summary": summarize([s for s in samples if s["round"] >= 1]), "samples": samples, "reps": 3}
    v = verdicts(record, [old, new], ["load_rank", "convert", "index"])
    assert v["load_rank"]["wall_ratio"] == pytest.approx(1.0) and v["load_rank"]["within"] is True
    assert v["load_rank"]["min_ratio"] == pytest.approx(1.2)
    assert v["load_rank"]["paired_ratios"] == pytest.approx([1.2, 1.0, 0.9])
    assert v["convert"]["wall_ratio"] == pytest.approx(1.05) and v["convert"]["within"] is True
    assert v["index"] == {"verdict": "not judged (a contender failed)"}
    record["summary"][d]["wall_s"]["median"] = 10.6
    assert verdicts(record, [old, new], ["convert"])["convert"]["within"] is False


def test_median_interval_of_ten_rounds_is_their_second_and_ninth_value() -> None:
    from benchmarks.bench_versions import median_ci

    # P(Binomial(10, 1/2) <= 1) = 11/1024 <= 2.5% < P(<= 2) = 56/1024: the 2nd and 9th order statistics
    assert median_ci([1.0, 10.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 2.0]) == (2.0, 9.0)


def test_median_interval_needs_six_rounds_at_95_percent() -> None:
    from benchmarks.bench_versions import median_ci

    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # even min-max covers the median with only 93.75%
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (1.0, 6.0)


@given(st.lists(st.floats(0.5, 2.0), min_size=6, max_size=40))
def test_median_interval_holds_the_median_and_is_made_of_the_values(values: list[float]) -> None:
    import statistics

    from benchmarks.bench_versions import median_ci

    got = median_ci(values)
    assert got is not None
    lo, hi = got
    assert lo in values and hi in values
    assert lo <= statistics.median(values) <= hi
