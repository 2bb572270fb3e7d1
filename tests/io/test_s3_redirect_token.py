"""An endpoint that redirects to another host: refused before the client sends anything, the
session token never reaching that host nor carried by a probe, and reported as a redirect
(EndpointRedirectError), never as a damaged store. Loopback servers of the test's own."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("obstore")

import ckptstore
from ckptstore.errors import EndpointRedirectError
from ckptstore.testing import s3_server as S
from convert_fixtures import run_cli

TOKEN = "SESSION-TOKEN-Zq81"
Seen = list[tuple[str, str, str, str]]  # (host, method, path, headers)


@contextlib.contextmanager
def redirecting(monkeypatch: pytest.MonkeyPatch, redirects: Callable[[BaseHTTPRequestHandler], bool], *,
                token: bool = True) -> Iterator[tuple[Seen, dict[str, str]]]:
    """An endpoint on 127.0.0.1 answering ``307`` to 127.0.0.2 (which answers ``200`` and bytes
    that are no store) for the requests ``redirects`` picks and ``404`` for the others, made the
    client's endpoint (with a session token unless ``token=False``). Yields what each host saw
    and the client's environment."""
    seen: Seen = []

    class Quiet(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def answer(self, status: int, location: str | None = None, body: bytes = b"") -> None:
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    class Elsewhere(Quiet):
        def do_GET(self) -> None:
            seen.append(("elsewhere", self.command, self.path, str(self.headers)))
            self.answer(200, body=b"no store here")

        do_HEAD = do_PUT = do_GET

    elsewhere = ThreadingHTTPServer(("127.0.0.2", 0), Elsewhere)

    class Endpoint(Quiet):
        def do_GET(self) -> None:
            seen.append(("endpoint", self.command, self.path, str(self.headers)))
            if redirects(self):
                self.answer(307, f"http://127.0.0.2:{elsewhere.server_address[1]}{self.path}")
            else:
                self.answer(404)

        do_HEAD = do_PUT = do_GET

    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    for s in (elsewhere, endpoint):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    env = S.env_for(f"http://127.0.0.1:{endpoint.server_address[1]}")
    if token:
        env["AWS_SESSION_TOKEN"] = TOKEN
    try:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        if not token:
            monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        yield seen, env
    finally:
        for s in (elsewhere, endpoint):
            s.shutdown()
            s.server_close()


def _gets(request: BaseHTTPRequestHandler) -> bool:
    return request.command == "GET"


def test_an_endpoint_redirecting_only_gets_is_refused_before_the_token_reaches_the_other_host(monkeypatch,
                                                                                             quick_retries):
    with redirecting(monkeypatch, _gets) as (seen, _):
        with pytest.raises(EndpointRedirectError, match=r"redirects requests for bucket some-bucket to another host "
                                                        r"\(http://127.0.0.2:\d+, HTTP 307\); ckptstore refuses it, "
                                                        r"as the client would send that host your session token"):
            ckptstore.open("s3://some-bucket/model.zarr")
        assert [(w, m) for w, m, _, _ in seen] == [("endpoint", "HEAD"), ("endpoint", "GET")]


def test_no_probe_carries_the_session_token(monkeypatch, quick_retries):
    def signed(request: BaseHTTPRequestHandler) -> bool:
        return "X-Amz-Signature=" in request.path

    with redirecting(monkeypatch, signed) as (seen, _):
        with pytest.raises(EndpointRedirectError, match=r"redirects signed requests for bucket some-bucket"):
            ckptstore.open("s3://some-bucket/model.zarr")
        assert [w for w, _, _, _ in seen] == ["endpoint"] * 4  # HEAD, GET, LIST, then the signed HEAD
        assert "X-Amz-Signature=" in seen[-1][2]
        assert not any(TOKEN in path or TOKEN in headers for _, _, path, headers in seen)


def test_a_redirect_without_a_session_token_is_reported_as_a_redirect_not_a_damaged_store(monkeypatch,
                                                                                           quick_retries):
    with redirecting(monkeypatch, _gets, token=False) as (seen, _):
        with pytest.raises(EndpointRedirectError, match=r"redirects requests for bucket some-bucket to another host "
                                                        r"\(http://127.0.0.2:\d+, HTTP 307\); ckptstore refuses it, "
                                                        r"as the client would read that host's answers as the "
                                                        r"bucket's: set AWS_ENDPOINT_URL"):
            ckptstore.open("s3://some-bucket/model.zarr")
        assert not [w for w, _, _, _ in seen if w == "elsewhere"]


@pytest.mark.slow
def test_cli_names_the_redirect_in_one_line_with_exit_2(monkeypatch):
    with redirecting(monkeypatch, lambda request: True) as (seen, env):
        r = run_cli("info", "s3://some-bucket/model.zarr", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "redirects requests for bucket some-bucket to another host" in r.stderr
    assert r.stderr.rstrip().endswith("[EndpointRedirectError]")
    assert not [w for w, _, _, _ in seen if w == "elsewhere"]


@pytest.mark.parametrize("setting,seconds", [(None, 5.0), ("300ms", 0.3), ("2s", 2.0), ("2", 2.0), ("1m", 5.0),
                                             ("0s", 5.0), ("soon", 5.0)])
def test_a_probe_waits_the_clients_time_out_when_it_is_shorter_than_5_s(monkeypatch, setting, seconds):
    from ckptstore.io.s3_redirects import probe_timeout

    if setting is None:
        monkeypatch.delenv("AWS_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("AWS_TIMEOUT", setting)
    assert probe_timeout() == seconds


def test_an_endpoint_that_never_answers_is_probed_once(monkeypatch):
    """A hung endpoint gets one probe, not five: each would wait out its time-out before the
    client's own requests (which report the outage) are even sent."""
    import socket

    import obstore

    from ckptstore.io.s3_redirects import check_redirects

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel accepts connections nobody answers
    try:
        for k, v in S.env_for(f"http://127.0.0.1:{listener.getsockname()[1]}").items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_TIMEOUT", "100ms")
        check_redirects("hung-bucket", obstore.store.S3Store("hung-bucket", client_options={"allow_http": True}))
        listener.setblocking(False)
        accepted = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                listener.accept()[0].close()
                accepted += 1
        assert accepted == 1
    finally:
        listener.close()
