"""``bench_s3 --base``: the old revision's rows are the bulk and key-by-key S3 loads, run with that
revision's ckptstore and named after it (no server: the rows are only built here)."""
from __future__ import annotations

from types import SimpleNamespace

from benchmarks import bench_s3 as B


def _setup() -> SimpleNamespace:
    return SimpleNamespace(dst_strategy="strategy.ckpt", rank=0, names_file="names.json", store="/store")


def test_base_rows_are_the_bulk_and_key_by_key_loads_with_the_base_environment() -> None:
    base_env = {"PYTHONPATH": "/base:/harness", "PYTHONSAFEPATH": "1"}
    cs = B.contenders(_setup(), "s3://b/store", None, "gets.json", "not installed", {"AWS_REGION": "x"}, 32,
                      ("6e5d39d", base_env))
    old = {c.name: c for c in cs if "[old " in c.name}
    assert sorted(old) == sorted([f"{B.S3} [old 6e5d39d]", f"{B.S3_LAZY} [old 6e5d39d]"])
    assert old[f"{B.S3} [old 6e5d39d]"].env == {"AWS_REGION": "x", **base_env}
    assert old[f"{B.S3} [old 6e5d39d]"].func == "load_rank"


def test_an_old_row_times_what_its_head_row_times() -> None:
    assert B.timed_span(B.base_name(B.S3, "6e5d39d")) == (
        B.TIMED_SPANS[B.S3] + ", with ckptstore 6e5d39d (the `--base` revision)")
