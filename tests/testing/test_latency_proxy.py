"""The latency proxy the object-storage benchmark puts in front of SeaweedFS: a delay per request
(concurrent requests wait together) and a cap on the bandwidth, the bytes relayed unchanged."""
from __future__ import annotations

import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("obstore")
pytestmark = pytest.mark.slow

from ckptstore.testing.latency_proxy import LatencyProxy


def _client(bucket, endpoint: str):
    from obstore.store import S3Store

    return S3Store(bucket.name, config={"endpoint": endpoint, "access_key_id": bucket.env["AWS_ACCESS_KEY_ID"],
                                        "secret_access_key": bucket.env["AWS_SECRET_ACCESS_KEY"],
                                        "region": "us-east-1", "allow_http": "true"})


def _get(store, key: str, start: int, end: int) -> bytes:
    import obstore

    return bytes(obstore.get(store, key, options={"range": (start, end)}).bytes())


def test_each_request_waits_the_delay_and_concurrent_ones_wait_together(bucket):
    import obstore

    data = bytes(range(256)) * 64
    direct = _client(bucket, bucket.endpoint or bucket.env["AWS_ENDPOINT_URL"])
    obstore.put(direct, "x", data)
    port = urllib.parse.urlsplit(bucket.env["AWS_ENDPOINT_URL"]).port
    with LatencyProxy(port, delay_ms=100) as proxy:
        store = _client(bucket, proxy.url)
        _get(store, "x", 0, 1)  # the connection is made
        t = time.perf_counter()
        assert _get(store, "x", 10, 20) == data[10:20]
        one = time.perf_counter() - t
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: _get(store, "x", i * 100, i * 100 + 50), range(8)))
        eight = time.perf_counter() - t
    assert got == [data[i * 100:i * 100 + 50] for i in range(8)]
    assert 0.1 <= one < 0.5
    assert 0.1 <= eight < 0.5  # not 8 x 0.1 s


def test_the_bandwidth_cap_paces_the_answers(bucket):
    import obstore

    data = bytes(2 << 20)
    obstore.put(_client(bucket, bucket.env["AWS_ENDPOINT_URL"]), "big", data)
    port = urllib.parse.urlsplit(bucket.env["AWS_ENDPOINT_URL"]).port
    with LatencyProxy(port, delay_ms=0, bandwidth_mbps=10) as proxy:
        store = _client(bucket, proxy.url)
        t = time.perf_counter()
        assert _get(store, "big", 0, len(data)) == data
        took = time.perf_counter() - t
    assert 0.2 <= took < 1.5  # 2 MiB at 10 MB/s: 0.21 s
