"""Stores and rank files on object storage: a real S3 server (SeaweedFS) on loopback, no mocked client.

Tests that count requests or inject faults use a ``watched_bucket``: every request goes through the
counting proxy of :mod:`ckptstore.testing.s3_server`, so request counts, ranges and bytes transferred are
what the server saw; moto serves only the access-denied tests (its authentication, in test_s3_errors.py,
with the other object-storage tests that need no checkpoint). Values are compared
with MindSpore's ``transform_checkpoints`` (the ``load_env`` oracle), and stores written to S3 with the same
conversion written to a local folder, byte for byte. The tests that ask MindSpore are marked ``mindspore``.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")

import ckptstore
from ckptstore.errors import (
    IncompleteStoreError,
    SourceChangedError,
    StoreCorruptError,
    StoreExistsError,
    StoreUnavailableError,
    UnsupportedLocationError,
)
from ckptstore.store.kinds import ROOT_METADATA
from ckptstore.testing import s3_server as S
from ckptstore.testing.store_kind_tests import CONFORMANCE_CASES
from convert_fixtures import REPO, run_cli, s3_store, store_files, strategy_args, strategy_urls
from load_fixtures import CASES, assert_same_dict, to_numpy


def _runs(ranges) -> int:
    """Maximal runs of touching byte ranges per file: what one ranged GET each can fetch."""
    runs = 0
    by_file: dict[str, list[tuple[int, int]]] = {}
    for _, key, off, n, _ in ranges:
        by_file.setdefault(key, []).append((off, off + n))
    for spans in by_file.values():
        end = None
        for a, b in sorted(spans):
            if end is None or a > end:
                runs += 1
            end = b if end is None else max(end, b)
    return runs


# ---- reading ---------------------------------------------------------------------------------


#: Every layout pair from a Zarr store in the bucket; an index reads the same way (through the same
#: byte source) from rank files in the bucket, checked on the layouts whose rank files differ most.
S3_CASES = [("zarr", c) for c in CONFORMANCE_CASES] + [
    ("index", c) for c in ("dp2_mp4->dp4_mp2", "pipeline2->1stage", "mixed_dtypes->dp2_mp2_optshard")]


@pytest.mark.slow
@pytest.mark.mindspore  # load_env.target: MindSpore's transform_checkpoints
@pytest.mark.parametrize("kind,case_id", S3_CASES)
def test_every_target_rank_from_s3_equals_transform_checkpoints(bucket, load_env, kind, case_id):
    t = load_env.target(case_id)
    url = s3_store(bucket, load_env.saved_layout(CASES[case_id].kind), kind)
    with ckptstore.open(url) as store:
        assert store.kind == kind
        for rank in range(t.world):
            params = ckptstore.load_rank(store, t.strategy, rank)
            assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(rank),
                             f"{kind} on s3 {case_id} rank {rank}")


@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_a_store_copied_to_a_bucket_reads_like_the_local_one(bucket, load_env, fmt):
    local = load_env.store("mixed_dtypes", format=fmt) if fmt != "zarr" else load_env.store("mixed_dtypes")
    S.upload(Path(local), bucket.url("copy"))
    with ckptstore.open(local) as a, ckptstore.open(bucket.url("copy")) as b:
        assert a.names() == b.names()
        for name in a.names():
            x, y = a.read(name), b.read(name)
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), name


@pytest.mark.mindspore  # load_env.target: MindSpore's transform_checkpoints
def test_loading_a_rank_reads_only_its_ranges_in_few_requests(watched_bucket, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    watched_bucket.proxy.reset()
    params = ckptstore.load_rank(url, t.strategy, 1)
    metadata = watched_bucket.proxy.requests()
    params.materialize()
    data = watched_bucket.proxy.requests()[len(metadata):]
    # opening: one GET, of zarr.json (the default kind's manifest is looked for first)
    assert [(s.method, s.path.rsplit("/", 1)[-1], s.range) for s in metadata] == [("GET", ROOT_METADATA, None)]
    gets = [s for s in data if s.method == "GET"]
    heads = [s for s in data if s.method != "GET"]
    assert all(s.range is not None and s.status == 206 for s in gets)  # no whole objects
    wanted = params.plan.nbytes
    assert wanted == sum(v.nbytes for v in t.oracle(1).values())
    # exactly the planned GETs: a gap is fetched only where the cost model says a request costs more
    assert (len(gets), sum(s.nbytes for s in gets)) == (params.plan.requests, params.plan.fetched)
    assert len(gets) <= _runs(params.plan.ranges())
    assert heads == []  # every object is pinned to the version the manifest recorded: no HEAD
    print(f"load of rank 1: {len(metadata)} GET to open, {len(gets)} ranged GETs, {len(heads)} HEADs, "
          f"{len(params.plan.files)} data objects")


def test_neighbouring_ranges_are_fetched_by_one_request(watched_bucket, load_env):
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    with ckptstore.open(url) as store:
        info = store.info("layer0.w")  # four 512-byte chunks, one after another in one object
        watched_bucket.proxy.reset()
        whole = store.read("layer0.w")
    assert len(info.chunks.offsets) == 4
    gets = watched_bucket.proxy.requests("GET")
    assert len(gets) == 1 and gets[0].range == f"bytes=0-{whole.nbytes - 1}"


@pytest.mark.mindspore  # load_env.target: MindSpore's transform_checkpoints
def test_server_errors_are_retried(watched_bucket, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    watched_bucket.proxy.reset()
    watched_bucket.proxy.fail_next(3, status=503)
    params = ckptstore.load_rank(url, t.strategy, 0)
    assert_same_dict({n: to_numpy(v) for n, v in params.items()}, t.oracle(0), "after 503s")
    assert [s.status for s in watched_bucket.proxy.requests()][:3] == [503, 503, 503]


def test_an_unknown_scheme_is_refused_not_taken_for_a_folder(load_env, tmp_path):
    with pytest.raises(UnsupportedLocationError, match="gs:// locations are not supported"):
        ckptstore.open("gs://bucket/model.zarr")
    layout = load_env.saved_layout("dp2_mp4")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", "gs://bucket/model.zarr")
    assert r.returncode == 2 and "gs:// locations are not supported" in r.stderr
    assert not (REPO / "gs:").exists()


# ---- writing and converting from the bucket ----------------------------------------------------


@pytest.mark.slow
def test_convert_to_s3_writes_the_same_store_as_to_a_folder(bucket, load_env, tmp_path):
    layout = load_env.saved_layout("opt_shard")
    ckptstore.convert(layout.root, tmp_path / "local", strategy=layout.strategy_files)
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", bucket.url("model.zarr"), "-q",
                env=bucket.env)
    assert r.returncode == 0, r.stderr
    assert S.comparable(S.objects(bucket.url("model.zarr"))) == S.comparable(store_files(tmp_path / "local"))


@pytest.mark.slow
def test_rank_files_in_a_bucket_convert_like_local_ones(bucket, load_env, tmp_path):
    layout = load_env.saved_layout("pipeline2")
    S.upload(layout.root, bucket.url("ckpt"))
    ckptstore.convert(bucket.url("ckpt"), tmp_path / "from_s3", strategy=strategy_urls(layout, bucket.url("ckpt")))
    ckptstore.convert(layout.root, tmp_path / "from_disk", strategy=layout.strategy_files)
    a, b = store_files(tmp_path / "from_s3"), store_files(tmp_path / "from_disk")
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k != ROOT_METADATA} == {k: v for k, v in b.items() if k != ROOT_METADATA}
    files = json.loads(a[ROOT_METADATA])["attributes"]["ckptstore"]["source"]["files"]
    assert files["0"] == bucket.url("ckpt/rank_0/net-1_1.ckpt")


@pytest.mark.slow
def test_an_interrupted_conversion_to_s3_is_refused_then_resumed(bucket, load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    url = bucket.url("model.zarr")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", url, "-q",
                env=bucket.env, kill_at="commit")
    assert r.returncode == -signal.SIGKILL
    with pytest.raises(IncompleteStoreError):
        ckptstore.open(url)
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", url, "-q", env=bucket.env)
    assert r.returncode == 0, r.stderr
    ckptstore.convert(layout.root, tmp_path / "local", strategy=layout.strategy_files)
    assert S.comparable(S.objects(url)) == S.comparable(store_files(tmp_path / "local"))


def test_a_big_parameter_is_uploaded_in_parts(watched_bucket, tmp_path, monkeypatch):
    import mindspore_fixtures as T
    from ckptstore.io import s3_sink

    monkeypatch.setattr(s3_sink, "UPLOAD_PART", 5 << 20)  # S3's smallest part
    specs = [T.ParamSpec("big.w", (1024, 4096), "float32", (2,), (0, -1))]  # 16 MiB, 8 MiB per rank
    tensors = T.make_global_tensors(specs, seed=3)
    T.save_distributed(tmp_path / "ckpt", specs, tensors, world_size=2, writer="ckptstore")
    ckptstore.convert(tmp_path / "ckpt", watched_bucket.url("big.zarr"),
                      strategy=[tmp_path / "ckpt" / "strategy.ckpt"])
    posts = [s.path for s in watched_bucket.proxy.requests("POST")]
    assert any("uploads" in p for p in posts)  # a multipart upload was started and completed
    stored = ckptstore.open(watched_bucket.url("big.zarr")).read("big.w")
    assert stored.tobytes() == np.asarray(tensors["big.w"]).tobytes()


@pytest.mark.slow
def test_an_index_in_a_bucket_refuses_a_rank_object_that_changed(bucket, load_env):
    layout = load_env.saved_layout("dp2_mp4")
    url = s3_store(bucket, layout, "index")
    raw = bytearray(layout.rank_file(3).read_bytes())
    raw[-1] ^= 0xFF
    import obstore
    from obstore.store import S3Store

    obstore.put(S3Store(bucket.name), "ckpt/rank_3/net-1_1.ckpt", bytes(raw))
    with pytest.raises(SourceChangedError, match=r"ckpt/rank_3/net-1_1.ckpt changed since the index was made"):
        ckptstore.open(url)


def test_a_safetensors_store_in_a_bucket_is_the_one_written_to_a_folder(bucket, load_env, tmp_path, monkeypatch):
    from ckptstore.write.kinds import safetensors as dense_writer

    monkeypatch.setattr(dense_writer, "ROW_BLOCK", 256)  # many row blocks per tensor: the assembly is exercised
    layout = load_env.saved_layout("mixed_dtypes")
    ckptstore.convert(layout.root, tmp_path / "local", strategy=layout.strategy_files, format="safetensors")
    ckptstore.convert(layout.root, bucket.url("st"), strategy=layout.strategy_files, format="safetensors")
    assert S.comparable(S.objects(bucket.url("st"))) == S.comparable(store_files(tmp_path / "local"))


def test_a_prefix_holding_other_objects_is_not_written_into(bucket, load_env):
    layout = load_env.saved_layout("dp2_mp4")
    import obstore
    from obstore.store import S3Store

    obstore.put(S3Store(bucket.name), "busy/notes.txt", b"not a store")
    with pytest.raises(StoreExistsError, match="is not empty and is not a ckptstore store"):
        ckptstore.convert(layout.root, bucket.url("busy"), strategy=layout.strategy_files)


def test_obs_urls_are_s3_through_the_same_client(bucket, load_env):
    """ModelArts names checkpoints obs://bucket/...: the same protocol, endpoint from the environment."""
    layout = load_env.saved_layout("dp2_mp4")
    ckptstore.convert(layout.root, f"obs://{bucket.name}/model.zarr", strategy=layout.strategy_files)
    with ckptstore.open(f"obs://{bucket.name}/model.zarr") as a, ckptstore.open(bucket.url("model.zarr")) as b:
        assert a.read("layer0.w").tobytes() == b.read("layer0.w").tobytes() == layout.tensors["layer0.w"].tobytes()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "safetensors"])
def test_bucket_to_bucket_convert_writes_the_store_a_local_conversion_writes(bucket, load_env, tmp_path, fmt):
    """ModelArts: rank files and the store both on OBS."""
    layout = load_env.saved_layout("pipeline2")
    src = bucket.url("ckpt")
    S.upload(layout.root, src)
    strategy = [a for u in strategy_urls(layout, src) for a in ("-s", u)]
    r = run_cli("convert", src, *strategy, "--out", bucket.url("model"), "--format", fmt, "-j", "1", "-q",
                env=bucket.env)
    assert r.returncode == 0, r.stderr
    ckptstore.convert(src, tmp_path / "local", strategy=strategy_urls(layout, src), format=fmt)
    assert S.comparable(S.objects(bucket.url("model"))) == S.comparable(store_files(tmp_path / "local"))


@pytest.mark.slow
def test_bucket_to_bucket_index_reads_like_the_rank_files(bucket, load_env):
    layout = load_env.saved_layout("pipeline2")
    src = bucket.url("ckpt")
    S.upload(layout.root, src)
    strategy = [a for u in strategy_urls(layout, src) for a in ("-s", u)]
    r = run_cli("index", src, *strategy, "--out", bucket.url("model.index"), "--checksum", "-q", env=bucket.env)
    assert r.returncode == 0, r.stderr
    with ckptstore.open(bucket.url("model.index")) as store:
        assert store.kind == "index"
        for name, value in layout.tensors.items():
            assert store.read(name).tobytes() == np.asarray(value).tobytes(), name


# ---- outages, configuration, credentials and redirects (issue 17 items 6-9, issue 19 items 3 and 7) ----------


@pytest.mark.mindspore  # load_env.target: MindSpore's transform_checkpoints
def test_server_errors_after_the_retries_are_an_outage_not_a_damaged_store(watched_bucket, load_env, quick_retries):
    t = load_env.target("dp2_mp4->dp2_mp2")
    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    params = ckptstore.load_rank(url, t.strategy, 0)
    watched_bucket.proxy.fail_next(1000, status=500)
    with pytest.raises(StoreUnavailableError) as e:
        params.materialize()
    message = str(e.value)
    assert isinstance(e.value, ConnectionError) and not isinstance(e.value, StoreCorruptError)
    assert f"the object store at {watched_bucket.proxy.url} is unavailable: it answered HTTP 500" in message
    assert "3 attempts" in message and "rerun the same command" in message and "verify" not in message
    assert f"{url}/" in message  # the object it tried to read


_KEY, _SECRET = "AKIAUSERINFOKEY", "userinfo/Secret+Zq81"


@pytest.mark.slow
@pytest.mark.parametrize("url", [f"s3://{_KEY}:{_SECRET}@bucket/store", f"obs://{_KEY}:{_SECRET}@bucket/store",
                                 f"s3://{_KEY}:{_SECRET.replace('/', '')}@bucket/store"])
def test_credentials_in_a_url_are_refused_without_printing_them(load_env, url):
    with pytest.raises(UnsupportedLocationError, match=r"://\*\*\*@bucket/store has credentials in it") as e:
        ckptstore.open(url)
    assert _SECRET.split("/")[0] not in str(e.value) and _KEY not in str(e.value)
    layout = load_env.saved_layout("dp2_mp4")
    for args in (["convert", layout.root, *strategy_args(layout), "--out", url], ["info", url], ["verify", url],
                 ["convert", url, "--out", "somewhere"]):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "***@bucket/store" in r.stderr, r.stderr
        assert _KEY not in r.stdout + r.stderr and _SECRET.split("/")[0] not in r.stdout + r.stderr


def test_credentials_in_a_mistyped_url_are_not_printed(load_env):
    layout = load_env.saved_layout("dp2_mp4")
    url = f"s3:/{_KEY}:{_SECRET}@bucket/store"
    for r in (run_cli("convert", layout.root, *strategy_args(layout), "--out", url), run_cli("info", url)):
        assert r.returncode == 2 and "s3:/***@bucket/store is not a URL" in r.stderr, r.stderr
        assert _KEY not in r.stdout + r.stderr and _SECRET.split("/")[0] not in r.stdout + r.stderr
    assert not (REPO / "s3:").exists()


@pytest.mark.parametrize("mistyped", ["obs:/ckpt/pangu/typo.zarr", "s3:/ckpt/pangu/typo.zarr", "s3:", "obs:",
                                      "S3:/ckpt/x"])
def test_a_url_with_one_slash_is_refused_not_written_to_a_local_folder(load_env, mistyped):
    layout = load_env.saved_layout("dp2_mp4")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", mistyped, "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is not a URL (it needs two slashes after" in r.stderr, r.stderr
    assert not (REPO / mistyped.split("/")[0]).exists()


def test_the_library_refuses_a_url_with_one_slash_everywhere_a_location_is_taken(load_env, tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    with pytest.raises(UnsupportedLocationError, match="write obs://ckpt/x.zarr, or ./obs:/ckpt/x.zarr"):
        ckptstore.convert(layout.root, "obs:/ckpt/x.zarr", strategy=layout.strategy_files)
    with pytest.raises(UnsupportedLocationError, match="needs two slashes"):
        ckptstore.open(Path("s3://bucket/model.zarr"))  # a Path keeps one slash of the two
    with pytest.raises(UnsupportedLocationError, match="needs two slashes"):
        ckptstore.convert("s3:/bucket/ckpt", tmp_path / "out", strategy=layout.strategy_files)
    local = tmp_path / "obs:" / "x.zarr"  # a local folder of that name is still reachable, written as a path
    ckptstore.convert(layout.root, local, strategy=layout.strategy_files)
    assert ckptstore.open(local).names()


@pytest.mark.slow
def test_info_on_an_unfinished_bucket_store_says_what_verify_says(bucket, load_env):
    layout = load_env.saved_layout("dp2_mp4")
    url = bucket.url("model.zarr")
    r = run_cli("convert", layout.root, *strategy_args(layout), "--out", url, "--part", "0/2", "-q", env=bucket.env)
    assert r.returncode == 0, r.stderr
    info = run_cli("info", url, env=bucket.env)
    verify = run_cli("verify", url, env=bucket.env)
    assert info.returncode == verify.returncode == 2
    assert info.stderr == verify.stderr
    assert "[IncompleteStoreError]" in info.stderr and "does not exist" not in info.stderr


def test_verify_during_an_outage_says_so_instead_of_listing_every_chunk(watched_bucket, load_env, quick_retries):
    from ckptstore.read.verify import verify_store

    url = s3_store(watched_bucket, load_env.saved_layout("dp2_mp4"), "zarr")
    with ckptstore.open(url) as store:
        watched_bucket.proxy.fail_next(1000, status=503)
        with pytest.raises(StoreUnavailableError, match="it answered HTTP 503 when trying to read"):
            verify_store(store)


def test_an_outage_while_writing_is_an_outage_and_the_rerun_resumes(watched_bucket, load_env, quick_retries,
                                                                      tmp_path):
    layout = load_env.saved_layout("dp2_mp4")
    url = watched_bucket.url("model.zarr")
    watched_bucket.proxy.fail_next(1000, method="PUT", status=500)
    with pytest.raises(StoreUnavailableError, match="it answered HTTP 500 when trying to write"):
        ckptstore.convert(layout.root, url, strategy=layout.strategy_files, workers=1)
    watched_bucket.proxy.reset()
    ckptstore.convert(layout.root, url, strategy=layout.strategy_files)
    ckptstore.convert(layout.root, tmp_path / "local", strategy=layout.strategy_files)
    assert S.comparable(S.objects(url)) == S.comparable(store_files(tmp_path / "local"))


def test_a_save_into_a_bucket_uploads_its_files_several_at_once(watched_bucket, monkeypatch):
    values = {f"layer{i}.w": np.full((64, 64), i, np.float32) for i in range(12)}
    monkeypatch.setattr(watched_bucket.proxy, "delay", 0.05)  # each request waits: uploads one by one would show
    ckptstore.save_rank(values, watched_bucket.url("root"), step=1)
    assert watched_bucket.proxy.peak["PUT"] >= 4
    with ckptstore.open(watched_bucket.url("root")) as store:
        for name, value in values.items():
            assert store.read(name).tobytes() == value.tobytes()


def test_a_data_upload_that_fails_fails_the_save_before_its_record(watched_bucket):
    from ckptstore.errors import AccessDeniedError

    values = {f"layer{i}.w": np.full((8, 8), i, np.float32) for i in range(4)}
    watched_bucket.proxy.fail_next(1, method="PUT", status=403, path="/layer2.w/")  # one data file's upload
    with pytest.raises(AccessDeniedError, match="access to s3://.*/root/step_1/layer2.w/.* was denied"):
        ckptstore.save_rank(values, watched_bucket.url("root"), step=1)
    written = S.objects(watched_bucket.url("root"))
    assert not any(k.startswith("step_1/.ckptstore-work/saved") or k == "step_1/zarr.json" for k in written), written
