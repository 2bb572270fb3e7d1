"""A store on object storage replaced while it is read: a reader gets the old bytes or a
``StoreChangedError``, never a mix of two versions (the S3 twin of test_hostile_folders' 17.4).

Objects are pinned by ETag: the version an object's first request saw is sent as ``If-Match``
on its later GETs, and a store's manifest is looked at (one HEAD) after each data object is
pinned. The server is the tests' SeaweedFS (moto where it is not installed); both answer 412 to
a GET whose ``If-Match`` no longer holds, which the tests check through the counting proxy.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("obstore")

import ckptstore
from ckptstore.errors import SourceChangedError, StoreChangedError
from ckptstore.io import s3_client
from ckptstore.io.s3_sink import S3Sink
from ckptstore.store.kinds import MANIFEST, ROOT_METADATA
from ckptstore.testing import s3_server as S
from convert_fixtures import assert_same_array, convert_layout, expected_values


def _put(bucket, key: str, data: bytes) -> None:
    """Write an object behind ckptstore's back (another job's client)."""
    import obstore
    from obstore.store import S3Store

    obstore.put(S3Store(bucket.name), key, data)


def _name(seen) -> str:
    return seen.path.split("?")[0].rsplit("/", 1)[-1]


def test_a_reader_of_a_replaced_s3_store_gets_an_error_not_the_new_bytes(bucket, saved_layout):
    a, b = saved_layout("dp2_mp4"), saved_layout("mp_rows")
    url = bucket.url("s.zarr")
    convert_layout(a, url)
    store = ckptstore.open(url)
    first, *others = store.names()
    assert_same_array(store.read(first), expected_values(a)[first])
    convert_layout(b, url, overwrite=True)
    old, new = expected_values(a), expected_values(b)
    changed = [n for n in others if n in new and not np.array_equal(old[n], new[n])]
    same = [n for n in others if n in new and np.array_equal(old[n], new[n])]
    assert changed and same
    for name in [first, *changed]:  # objects read before (pinned) and objects first read now
        with pytest.raises(StoreChangedError, match="was replaced while it was read .*; open it again"):
            store.read(name)
    for name in same:  # rewritten with the same bytes: the committed version (same ETag) is read
        assert_same_array(store.read(name), old[name])
    store.close()
    with ckptstore.open(url) as fresh:
        for name, value in expected_values(b).items():
            assert_same_array(fresh.read(name), value)


@pytest.mark.slow  # ~2.5 s through the proxy
def test_an_object_overwritten_between_two_ranged_gets_of_one_reader_is_refused_naming_it(watched_bucket,
                                                                                           saved_layout):
    layout = saved_layout("dp2_mp4")
    url = watched_bucket.url("s.zarr")
    convert_layout(layout, url)
    with ckptstore.open(url) as store:
        info = store.info("layer0.w")
        [(key, offset, nbytes)] = info.container(0)[1]
        [(key3, offset3, _)] = info.container(3)[1]
        assert key3 == key and offset3 > offset  # two chunks of one object: two ranged GETs
        head = store.read("layer0.w", (slice(0, info.chunk_box(0).stop[0]),))
        assert_same_array(head, expected_values(layout)["layer0.w"][:len(head)])
        raw = bytearray(S.objects(watched_bucket.url("s.zarr"))[key])
        raw[offset3] ^= 0xFF  # same size: only the version tells the new object from the old
        _put(watched_bucket, f"s.zarr/{key}", bytes(raw))
        watched_bucket.proxy.reset()
        with pytest.raises(StoreChangedError, match=f"{url}/{key} was replaced while it was read"):
            store.read("layer0.w")
    assert [(s.method, s.status) for s in watched_bucket.proxy.requests()] == [("GET", 412)]


def test_an_open_object_is_read_at_its_first_version_or_refused(watched_bucket):
    sink = S3Sink(watched_bucket.url("src"))
    source = sink.source
    sink.put("f", b"A" * 64)
    f = source.open("f")
    assert f.pread(0, 8) == b"A" * 8
    sink.put("f", b"B" * 64)
    assert source.open("f") is f  # kept, with its pin, until close
    watched_bucket.proxy.reset()
    with pytest.raises(StoreChangedError, match=r"s3://ckptstore-test-\d+/src/f was replaced while it was read"):
        f.pread(8, 8)
    [get] = watched_bucket.proxy.requests()
    assert (get.method, get.status) == ("GET", 412)  # the server refused: no byte of the new version came
    source.close()
    assert source.open("f").pread(0, 8) == b"B" * 8  # opened again: the object as it is now


@pytest.mark.mindspore  # MindSpore's transform_checkpoints as the expected values
def test_a_store_in_a_bucket_is_read_with_no_head_each_first_get_asking_for_the_committed_version(
        watched_bucket, load_env):
    t = load_env.target("dp2_mp4->dp2_mp2")
    layout = load_env.saved_layout("dp2_mp4")
    url = watched_bucket.url("s.zarr")
    convert_layout(layout, url)
    convert_layout(layout, url)  # a rerun of the same conversion changes nothing
    recorded = ckptstore.open(url).manifest.extra["object_versions"]
    watched_bucket.proxy.reset()
    s3_client.REQUEST_STATS.reset()
    params = ckptstore.load_rank(url, t.strategy, 1, workers=1)
    opening = watched_bucket.proxy.requests()
    values = params.materialize()
    reading = watched_bucket.proxy.requests()[len(opening):]
    assert [(s.method, _name(s)) for s in opening] == [("GET", ROOT_METADATA)]
    objects = params.plan.files
    assert [s.method for s in reading] == ["GET"] * len(reading) and len(reading) >= len(objects)
    assert all(s.status == 206 for s in reading)
    # the manifest's recorded ETag goes with every GET, the first of each object included
    key = f"/{watched_bucket.name}/s.zarr/"
    assert all(s.if_match == recorded[s.path.split("?")[0].removeprefix(key)]["etag"] for s in reading)
    assert (s3_client.REQUEST_STATS.gets, s3_client.REQUEST_STATS.heads) == (1 + len(reading), 0)
    for name, value in t.oracle(1).items():
        assert np.asarray(values[name].asnumpy()).tobytes() == value.tobytes(), name


def test_an_object_changed_after_the_commit_is_refused_by_its_first_get(watched_bucket, saved_layout):
    layout = saved_layout("dp2_mp4")
    url = watched_bucket.url("s.zarr")
    convert_layout(layout, url)
    with ckptstore.open(url) as store:
        [(key, offset, _)] = store.info("layer0.w").container(0)[1]
        raw = bytearray(S.objects(url)[key])
        raw[offset] ^= 0xFF  # same size, manifest untouched: only the recorded version tells
        _put(watched_bucket, f"s.zarr/{key}", bytes(raw))
        watched_bucket.proxy.reset()
        with pytest.raises(StoreChangedError, match=f"{url}/{key} was replaced while it was read \\(it is no "
                                                    "longer the version the store's manifest recorded"):
            store.read("layer0.w")
    assert [(s.method, s.status) for s in watched_bucket.proxy.requests()] == [("GET", 412)]


def test_a_step_saved_into_a_bucket_records_its_objects_versions_and_is_read_without_a_head(watched_bucket):
    values = {"w": np.arange(48, dtype=np.float32).reshape(6, 8), "b": np.ones(5, np.float32)}
    ckptstore.save_rank(values, watched_bucket.url("root"), step=3)
    with ckptstore.open(watched_bucket.url("root")) as store:
        recorded = store.manifest.extra["object_versions"]
        assert sorted(recorded) == sorted({f for n in values for f in store.info(n).chunks.files})
        watched_bucket.proxy.reset()
        for name, value in values.items():
            assert store.read(name).tobytes() == value.tobytes()
    reads = watched_bucket.proxy.requests()
    assert [s.method for s in reads] == ["GET"] * len(values) and all(s.if_match for s in reads)


def test_a_server_that_sends_no_etag_pins_objects_by_size_and_last_modified(watched_bucket, saved_layout,
                                                                            monkeypatch):
    """The reader of a parameter's first rows that then races ``convert --overwrite`` gets an
    error for its other rows, not the new store's (one tensor from two stores)."""
    import time

    monkeypatch.setattr(watched_bucket.proxy, "strip", {"etag"})
    url = watched_bucket.url("s.zarr")
    convert_layout(saved_layout("dp2_mp4"), url)
    with ckptstore.open(url) as store:
        assert "object_versions" not in store.manifest.extra  # the listing had no ETags to record
        info = store.info("layer0.w")
        [(key, _, _)] = info.container(0)[1]
        [(key3, _, _)] = info.container(3)[1]
        assert key3 == key  # two chunks of one object
        first, later = info.chunk_box(0), info.chunk_box(3)
        store.read("layer0.w", tuple(slice(a, b) for a, b in zip(first.start, first.stop, strict=True)))
        time.sleep(1.1)  # Last-Modified counts whole seconds: a rewrite within the same one is not seen
        convert_layout(saved_layout("mp_rows"), url, overwrite=True)
        with pytest.raises(StoreChangedError, match=f"{url}/{key} was replaced while it was read"):
            store.read("layer0.w", tuple(slice(a, b) for a, b in zip(later.start, later.stop, strict=True)))


def test_a_server_that_sends_neither_etag_nor_last_modified_is_refused(watched_bucket, saved_layout, monkeypatch):
    from ckptstore.errors import ObjectStoreConfigError

    monkeypatch.setattr(watched_bucket.proxy, "strip", {"etag", "last-modified"})
    url = watched_bucket.url("s.zarr")
    convert_layout(saved_layout("dp2_mp4"), url)
    with ckptstore.open(url) as store:
        with pytest.raises(ObjectStoreConfigError, match="answers with neither an ETag nor a Last-Modified time, so "
                                                  "ckptstore cannot keep its reads to one version"):
            store.read("layer0.w")


@pytest.mark.parametrize("fmt,tried", [("zarr", [ROOT_METADATA]), ("safetensors", [ROOT_METADATA, MANIFEST])])
def test_opening_a_store_in_a_bucket_looks_for_zarr_json_first(watched_bucket, saved_layout, fmt, tried):
    url = watched_bucket.url("s")
    convert_layout(saved_layout("dp2_mp4"), url, format=fmt)
    watched_bucket.proxy.reset()
    with ckptstore.open(url) as store:
        assert store.kind == fmt
    assert [(s.method, _name(s)) for s in watched_bucket.proxy.requests()] == [("GET", n) for n in tried]


@pytest.mark.slow  # an index of rank files in a bucket: ~6 s
def test_a_rank_object_replaced_after_its_index_was_opened_is_refused_by_its_first_get(watched_bucket,
                                                                                       saved_layout):
    layout = saved_layout("dp2_mp4")
    src = watched_bucket.url("ckpt")
    S.upload(layout.root, src)
    url = watched_bucket.url("model.index")
    ckptstore.index(src, url, strategy=[f"{src}/{f.relative_to(layout.root)}" for f in layout.strategy_files])
    with ckptstore.open(url) as store:
        key = store.info("layer0.w").container(0)[1][0][0]
        raw = bytearray(S.objects(src)[key])
        raw[-1] ^= 0xFF
        _put(watched_bucket, f"ckpt/{key}", bytes(raw))
        watched_bucket.proxy.reset()
        with pytest.raises(SourceChangedError, match=f"rank file {src}/{key} changed since the index was made"):
            store.read("layer0.w")
    # the recorded ETag went with the first GET: the server refused it, no byte was read
    assert [(s.method, s.status) for s in watched_bucket.proxy.requests() if s.method == "GET"] == [("GET", 412)]


def test_a_look_at_the_manifest_vouches_only_for_files_pinned_before_it_began(tmp_path):
    """Callers that arrive while a look is under way wait for the next one (theirs may be after
    the replacement began), and one look serves all of them."""
    import threading

    from ckptstore.io.local import LocalSource
    from ckptstore.store.store import ReplaceGuard

    (tmp_path / "zarr.json").write_text("{}")
    original = LocalSource(tmp_path).stat("zarr.json")
    release, first_begun = threading.Event(), threading.Event()
    looks: list[int] = []

    class Location(LocalSource):
        def stat(self, key):
            looks.append(1)
            if len(looks) == 1:  # the first look began before the replacement: it sees the old manifest
                first_begun.set()
                release.wait(30)
                return original
            return super().stat(key)

    guard = ReplaceGuard(LocalSource(tmp_path), Location(tmp_path), ("zarr.json", original))
    results: dict[str, object] = {}

    def confirm(who: str) -> None:
        try:
            guard.confirm()
            results[who] = "ok"
        except StoreChangedError:
            results[who] = "changed"

    early = threading.Thread(target=confirm, args=("early",))
    early.start()
    assert first_begun.wait(30)
    late = [threading.Thread(target=confirm, args=(f"late{i}",)) for i in range(6)]
    for t in late:
        t.start()
    import time

    time.sleep(1)  # the late callers wait on the look under way
    (tmp_path / "zarr.json").write_text('{"replaced": true}')
    release.set()
    for t in [early, *late]:
        t.join(30)
    assert results == {"early": "ok", **{f"late{i}": "changed" for i in range(6)}}
    assert len(looks) == 2  # one look for all the late callers
