"""An HTTP proxy that makes a loopback S3 server answer like a remote one: a delay per request and
an optional bandwidth cap (this kernel has no ``netem``, so the network is modelled here).

``python -m ckptstore.testing.latency_proxy --upstream 8333 --delay-ms 20 [--bandwidth-mbps 500] [--port 0]``
prints ``http://127.0.0.1:PORT`` on its first line, then serves until killed; in a program,
``with LatencyProxy(upstream_port, delay_ms=20) as proxy: ... proxy.url``.

Every request waits ``delay_ms`` before it is forwarded (one round trip of a far server: OBS
answers in 10-50 ms whatever the request's size), on its own: requests on different connections
wait at the same time, as they would on a real network, so a client that keeps many requests in
flight pays the delay once per wave, not once per request. Answers are relayed as they arrive; with
``bandwidth_mbps`` the bytes of all answers together are paced to that rate (megabytes, 10**6 bytes,
per second). HTTP/1.1 keep-alive is kept per client connection (one upstream connection each);
bodies are delimited by ``Content-Length`` or chunked encoding, as S3 servers send them. asyncio,
one thread: it is a test and benchmark tool, not a production proxy.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Sequence

#: Bytes relayed per read of an answer (and per step of the bandwidth pacing).
PIECE = 256 << 10


class LatencyProxy:
    """The proxy, run on an event loop in a daemon thread; see the module docstring."""

    def __init__(self, upstream_port: int, *, delay_ms: float = 20.0, bandwidth_mbps: float | None = None,
                 port: int = 0, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay_ms / 1e3
        self.rate = None if not bandwidth_mbps else bandwidth_mbps * 1e6
        self.requests = 0
        self._next_free = 0.0  # when the paced link is free again (monotonic seconds)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, args=(port,), name="latency-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._server is None:
            raise RuntimeError("the latency proxy did not start")
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the listening socket and stop the loop (open connections are dropped)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", port))
        finally:
            self._ready.set()
        self._loop.run_forever()
        # stopped: drop the connections still open, then close the loop
        self._server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(self._server.wait_closed())
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader: asyncio.StreamReader | None = None
        up_writer: asyncio.StreamWriter | None = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method = head.split(b" ", 1)[0].upper()
                body = await _read_body(reader, head, request=True)
                self.requests += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                if up_reader is None or up_writer is None:
                    up_reader, up_writer = await asyncio.open_connection(*self.upstream)
                up_writer.write(head + body)
                await up_writer.drain()
                answer = await _read_head(up_reader)
                if answer is None:
                    return
                writer.write(answer)
                status = int(answer.split(b" ", 2)[1])
                if method != b"HEAD" and status not in (204, 304) and not 100 <= status < 200:
                    await self._relay(up_reader, writer, answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    async def _relay(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, head: bytes) -> None:
        length = _content_length(head)
        if length is not None:
            left = length
            while left:
                piece = await src.read(min(PIECE, left))
                if not piece:
                    raise ConnectionError("upstream closed inside an answer")
                left -= len(piece)
                await self._pace(len(piece))
                dst.write(piece)
                await dst.drain()
        elif b"transfer-encoding: chunked" in head.lower():
            while True:
                size_line = await src.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                data = await src.readexactly(size + 2)
                await self._pace(size)
                dst.write(size_line + data)
                await dst.drain()
                if size == 0:
                    return
        else:  # delimited by the end of the connection
            while piece := await src.read(PIECE):
                await self._pace(len(piece))
                dst.write(piece)
            dst.close()

    async def _pace(self, n: int) -> None:
        """Wait for ``n`` bytes' turn on the shared link (all answers together at ``rate``)."""
        if self.rate is None:
            return
        now = time.monotonic()
        start = max(now, self._next_free)
        self._next_free = start + n / self.rate
        if self._next_free > now:
            await asyncio.sleep(self._next_free - now)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """A request's or answer's head up to its blank line, or ``None`` at the end of the connection."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise
        return None


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


async def _read_body(reader: asyncio.StreamReader, head: bytes, *, request: bool) -> bytes:
    """The body after ``head`` (``Content-Length`` or chunked; a request without either has none)."""
    length = _content_length(head)
    if length is not None:
        return await reader.readexactly(length)
    if b"transfer-encoding: chunked" in head.lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            out += size_line + await reader.readexactly(size + 2)
            if size == 0:
                return bytes(out)
    return b""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ckptstore.testing.latency_proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=int, required=True, help="port of the S3 server on 127.0.0.1")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="delay per request (default 20)")
    ap.add_argument("--bandwidth-mbps", type=float, default=None, help="cap on all answers together, MB/s")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    args = ap.parse_args(argv)
    proxy = LatencyProxy(args.upstream, delay_ms=args.delay_ms, bandwidth_mbps=args.bandwidth_mbps, port=args.port)
    print(proxy.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
