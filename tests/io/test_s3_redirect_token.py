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
