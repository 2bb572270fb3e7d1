"""A real S3 server on loopback (for the object-storage tests and benchmarks), and a proxy that watches it.

``moto`` in server mode (``python -m moto.server``) is a real HTTP S3 endpoint, started here as
a subprocess; nothing in the client is mocked. Between ckptstore and the server sits
:class:`CountingProxy`, a small HTTP proxy that records every request (method, path, ``Range``
header, status, bytes sent back) and can answer the next few matching requests with an error
(503 Slow Down) to prove retries. A second server with moto's authentication switched on
answers 403 to unknown credentials.
"""
from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

#: Credentials of the test server (moto accepts any); distinctive so a leak is easy to find.
ACCESS_KEY = "AKIACKPTSTORETESTKEY1"
SECRET_KEY = "ckptstore-test-secret-Zq81xW"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on a free loopback port (``auth=True``: credentials are checked)."""

    def __init__(self, *, auth: bool = False) -> None:
        self.port = free_port()
        env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start (is moto[server] installed?)")
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=30).read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass(frozen=True)
class Seen:
    """One request the proxy forwarded (or answered itself with a fault)."""

    method: str
    path: str
    range: str | None
    status: int
    nbytes: int  # response body bytes sent to the client


class CountingProxy:
    """Forwards HTTP to ``upstream``, recording requests; can inject error answers."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.seen: list[Seen] = []
        self._faults: list[tuple[str, int]] = []  # (method, status) to answer instead of forwarding
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take_fault(self.command)
                if fault is not None:
                    payload = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                    # recorded before answering: the client may act on the answer at once
                    proxy._record(Seen(self.command, self.path, self.headers.get("Range"), fault, len(payload)))
                    self.send_response(fault)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                proxy._record(Seen(self.command, self.path, self.headers.get("Range"), resp.status,
                                   0 if self.command == "HEAD" else len(data)))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                # a HEAD answer has no body but says the object's size
                size = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", size or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _take_fault(self, method: str) -> int | None:
        with self._lock:
            for i, (m, status) in enumerate(self._faults):
                if m == method:
                    del self._faults[i]
                    return status
        return None

    def fail_next(self, count: int, *, method: str = "GET", status: int = 503) -> None:
        """Answer the next ``count`` ``method`` requests with ``status`` instead of forwarding them."""
        with self._lock:
            self._faults += [(method, status)] * count

    def reset(self) -> None:
        with self._lock:
            self.seen.clear()
            self._faults.clear()

    def requests(self, method: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if method is None or s.method == method]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def env_for(endpoint: str, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
    """The standard AWS environment a user sets for an S3-compatible endpoint."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def upload(folder: Path, url: str) -> None:
    """Copy every file under ``folder`` to the bucket prefix ``url`` (with the test client)."""
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    store = S3Store(bucket)
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            key = f"{prefix}/{p.relative_to(folder)}" if prefix else str(p.relative_to(folder))
            obstore.put(store, key, p.read_bytes())


def objects(url: str) -> dict[str, bytes]:
    """Every object under the prefix ``url`` (key relative to it -> bytes)."""
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    store = S3Store(bucket)
    out = {}
    for batch in obstore.list(store, prefix + "/" if prefix else None):
        for meta in batch:
            out[meta["path"][len(prefix) + 1 if prefix else 0:]] = bytes(obstore.get(store, meta["path"]).bytes())
    return out


def iter_servers() -> Iterator[tuple[MotoServer, CountingProxy]]:
    server = MotoServer()
    proxy = CountingProxy(server.port)
    try:
        yield server, proxy
    finally:
        proxy.stop()
        server.stop()
