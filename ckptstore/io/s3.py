"""Object storage (S3 and Huawei OBS) as a byte source, through obstore.

``s3://bucket/prefix`` and ``obs://bucket/prefix`` are one protocol: OBS speaks S3, and
ModelArts jobs name their checkpoints ``obs://...``. The endpoint, region and credentials come
only from the client's usual configuration (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, ...); ckptstore never stores,
prints or logs them, and error messages are built from the status code and the S3 error code,
never from the client's own text (which echoes request details).

Reads are ranged GETs streamed straight into the callers' buffers: the requests of one call are
sorted and neighbours whose gap costs at most :data:`MAX_GAP_FRACTION` of the bytes wanted are
fetched by one GET (so bytes transferred stay within 2% of bytes wanted). Opening an object
costs no request: its size is asked for (one HEAD) only when a caller needs it, so reading a
store's chunks costs one GET per coalesced range. An opened object is pinned to the version
(ETag) its first request saw and kept, pinned, until the source is closed: its later GETs send
``If-Match``, so reads of one object never mix two versions (:class:`S3File`). Retries with exponential backoff on 5xx
answers, dropped connections and time-outs are the client's (:data:`RETRY`); what still fails
after them is a :class:`~ckptstore.errors.StoreUnavailableError` (an outage, not damage).

The configuration is checked before a client is built (:func:`check_environment`: an empty or
malformed ``AWS_ENDPOINT_URL`` would make the client panic, plain http needs
``AWS_ALLOW_HTTP=true``), and, where requests may carry a session token, the endpoint is asked
once whether it redirects the bucket elsewhere (:func:`check_redirects`: obstore follows
redirects and cannot be told not to). Credentials in a URL are refused, and :func:`redact` hides
them in every message that may hold a location or an endpoint.

obstore was chosen by measurement: 256 ranged GETs of 256 KiB through 8 threads cost 0.47 s of
client CPU with obstore against 1.7-1.9 s with s3fs on this machine, and it is the client
zarr-python's object store uses.
"""
from __future__ import annotations

import contextlib
import errno
import os
import queue
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Sequence

from ckptstore.errors import (AccessDeniedError, CkptStoreError, FileAccessError, MissingFileError,
                              ObjectStoreConfigError, ShortReadError, StoreChangedError, StoreUnavailableError,
                              UnsupportedLocationError)
from ckptstore.io.base import ByteSource, FileStat, ReadableFile, Request, check_key, worth_merging
from ckptstore.io.schemes import Scheme

SCHEMES = ("s3", "obs")
#: Extra bytes one coalesced GET may fetch between wanted ranges, as a fraction of the bytes wanted.
MAX_GAP_FRACTION = 0.02
#: Bytes streamed per piece of a GET (what one request holds in memory besides its destination).
STREAM_CHUNK = 256 << 10
#: Threads that read one load from object storage by default: requests wait on the network, not
#: on a core, so many are in flight at once.
READ_CONCURRENCY = 16
#: The client's retries: 5xx answers, connection errors and time-outs, with backoff and jitter.
RETRY = {"max_retries": 8, "retry_timeout": timedelta(seconds=120),
         "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=5), "base": 2}}
#: The longest ranged GET: longer runs are fetched as pieces of this size, several at once (one
#: connection's throughput is what limits a big GET; a request costs little beside 64 MiB).
GET_PIECE = 64 << 20
#: Parts of a multipart upload (S3 needs at least 5 MiB per part but the last).
UPLOAD_PART = 16 << 20

_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://(.*)$", re.IGNORECASE)
_S3_CODE = re.compile(r"<Code>([A-Za-z0-9]{1,64})</Code>")
_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")


#: Credentials written into a URL (``s3://KEY:SECRET@bucket``): everything from the scheme's
#: slashes to the last ``@`` before a blank or a quote (a secret may hold ``/``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:/{1,2})[^\s@'\"]*@")
#: Schemes whose name followed by one slash or none (``s3:/bucket``) is a mistyped URL, not a folder.
KNOWN_SCHEMES = (*SCHEMES, "gs", "oss", "cos", "hdfs", "http", "https", "file")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it hidden (``s3://***@bucket/...``).

    Every message that may hold a location the user typed or an endpoint goes through this one
    function: job logs are kept and shared, and a secret must never reach them.
    """
    return _USERINFO.sub(r"\1***@", text)


def url_scheme(location: object) -> str | None:
    """The lower-case scheme of ``location`` if it is a URL (``"s3"`` for ``s3://b/p``), else ``None``.

    A location whose first path component is a known scheme and a colon (``obs:/ckpt/x.zarr``,
    ``s3:``) is a URL with a slash missing, not a local folder named ``obs:``: it is refused with
    :class:`~ckptstore.errors.UnsupportedLocationError` (a local folder of that name can be
    written ``./obs:/...``).
    """
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        return None
    m = _URL.match(location)
    if m:
        return m.group(1).lower()
    first = location.split("/", 1)[0]
    if first.endswith(":") and first[:-1].lower() in KNOWN_SCHEMES:
        scheme = first[:-1]
        rest = location[len(first):].lstrip("/") or "bucket/prefix"
        raise UnsupportedLocationError(
            f"{redact(location)} is not a URL (it needs two slashes after '{scheme}:') and ckptstore will not take it "
            f"for a local folder named '{first}': write {redact(f'{scheme}://{rest}')}, or ./{redact(location)} if you "
            "mean a local folder")
    return None


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)`` of an ``s3://`` or ``obs://`` URL; other schemes are refused."""
    scheme = url_scheme(url)
    if scheme not in SCHEMES:
        raise UnsupportedLocationError(
            f"{url.split('://')[0]}:// locations are not supported: use a local or shared-filesystem path, "
            "or s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or redact(url) != url and ":" in bucket:
        raise UnsupportedLocationError(
            f"{redact(url)} has credentials in it: ckptstore takes none from a URL (they would be printed and "
            "recorded in the store); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) instead")
    if not bucket or _FORBIDDEN_BUCKET.search(bucket):
        raise UnsupportedLocationError(f"{redact(url)} does not name a bucket: write {scheme}://bucket/prefix")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix, redact(url))
    return scheme, bucket, prefix


_FORBIDDEN_BUCKET = re.compile(r"[^a-z0-9.\-_]", re.IGNORECASE)


@dataclass
class RequestStats:
    """Requests and bytes this process sent to object storage: a test and benchmark hook."""

    gets: int = 0
    heads: int = 0
    lists: int = 0
    puts: int = 0
    deletes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def reset(self) -> None:
        with self._lock:
            self.gets = self.heads = self.lists = self.puts = self.deletes = self.bytes_in = self.bytes_out = 0


REQUEST_STATS = RequestStats()


_RETRIES = re.compile(r"after (\d+) retries")
_ELAPSED = re.compile(r" in (\d+(?:\.\d+)?)(ns|µs|us|ms|s|m)\b")
_UNIT_SECONDS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def endpoint() -> str:
    """The object store requests go to, as a message names it (credentials hidden)."""
    url = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    if url:
        return redact(url)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return f"AWS S3 ({region}; AWS_ENDPOINT_URL is not set)"


def _outage(text: str, status: str | None) -> str | None:
    """What went wrong, if ``text`` (the client's error) says the server could not be reached or
    did not answer successfully: an outage, not a fault of the data."""
    if status is not None and status.startswith("5"):
        return f"it answered HTTP {status}"
    if "kind: Timeout" in text or "TimedOut" in text or "operation timed out" in text:
        return "it did not answer within the time-out (AWS_TIMEOUT, 30 s unless set)"
    if "kind: Connect" in text or "ConnectionRefused" in text:
        return "the connection was refused or could not be made"
    if any(m in text for m in ("error sending request", "connection closed", "ConnectionReset", "IncompleteBody",
                               "error decoding response body", "request or response body error")):
        return "the connection broke off"
    return None


def _attempts(text: str) -> str:
    """``"9 attempts over 12.3 s"``, from the client's retry error (numbers only are taken from it)."""
    retries, elapsed = _RETRIES.search(text), _ELAPSED.search(text)
    tried = f"{int(retries.group(1)) + 1} attempts" if retries else "several attempts"
    if elapsed:
        tried += f" over {float(elapsed.group(1)) * _UNIT_SECONDS[elapsed.group(2)]:.1f} s"
    return tried


def _client_error(e: BaseException, url: str, action: str) -> Exception:
    """A typed error for a failed request, naming the URL but never the client's raw text."""
    text = str(e)
    m = _STATUS.search(text)
    status = next((g for g in m.groups() if g), None) if m else None
    code = _S3_CODE.search(text)
    detail = ", ".join(x for x in (f"HTTP {status}" if status else "", code.group(1) if code else "") if x)
    detail = f" ({detail})" if detail else ""
    import obstore.exceptions as oe

    if isinstance(e, FileNotFoundError) or isinstance(e, oe.NotFoundError):
        return MissingFileError(errno.ENOENT, f"{url} does not exist{detail}", url)
    if isinstance(e, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or status in ("401", "403"):
        return AccessDeniedError(errno.EACCES, f"access to {url} was denied{detail} when trying to {action}: check "
                                 "the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or your AWS "
                                 "profile) and the bucket's permissions")
    if "BadScheme" in text or "URL scheme is not allowed" in text:
        return _plain_http_error(endpoint())
    what = _outage(text, status)
    if what is not None:
        return StoreUnavailableError(
            errno.EAGAIN, f"the object store at {endpoint()} is unavailable: {what} when trying to {action} {url} "
            f"({_attempts(text)}, with back-off). Nothing is known to be wrong with the data: rerun the same "
            "command when the server answers again (a conversion resumes where it stopped)")
    if _is_panic(e):
        return ObjectStoreConfigError(f"the object store client failed on {url} (it panicked); check the AWS_* "
                                      "environment variables (AWS_ENDPOINT_URL must be an http(s):// URL); if they "
                                      "are right, this is a bug in ckptstore or obstore: please report it")
    if isinstance(e, oe.BaseError) or isinstance(e, OSError):
        kind = type(e).__name__
        return FileAccessError(errno.EIO, f"cannot {action} {url}{detail or f' ({kind})'}: the object store at "
                               f"{endpoint()} did not answer successfully after retries; check AWS_ENDPOINT_URL and "
                               "the network")
    return e if isinstance(e, Exception) else RuntimeError(str(e))


def _is_panic(e: BaseException) -> bool:
    """Whether ``e`` is a Rust panic inside the client (``pyo3_runtime.PanicException``, a
    ``BaseException``): a last resort, as the configuration is checked before any call."""
    return type(e).__name__ == "PanicException"


def _plain_http_error(url: str) -> ObjectStoreConfigError:
    return ObjectStoreConfigError(
        f"AWS_ENDPOINT_URL is {url}, plain http, which the object store client refuses unless AWS_ALLOW_HTTP=true "
        "is set: set AWS_ALLOW_HTTP=true (only on a network you trust) or use the endpoint's https:// URL")


@contextlib.contextmanager
def _request(url: str, action: str, **counts: int) -> Iterator[None]:
    """One call to object storage: counted in :data:`REQUEST_STATS` whether it was answered or
    not, and any client error raised as ckptstore's typed error naming ``url`` (never the
    client's own text). ckptstore's own errors pass through; a caller that expects an answer
    (a 404, an existing object) catches it inside the block."""
    try:
        yield
    except CkptStoreError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a Rust panic is a BaseException
        raise _client_error(e, url, action) from None
    finally:
        if counts:
            REQUEST_STATS.add(**counts)


_CLIENTS: dict[tuple[str, ...], Any] = {}
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")
_CLIENT_ENV = (*_ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_TOKEN",
               "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP", "AWS_PROFILE", "AWS_TIMEOUT")
_CLIENTS_LOCK = threading.Lock()
#: Characters an endpoint URL may hold (RFC 3986); anything else makes the client panic.
_URL_CHARS = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+$")
_TRUE = ("true", "1", "yes", "on", "y")


def check_environment() -> None:
    """Refuse an ``AWS_*`` configuration the client cannot use, before it is given to it.

    An empty ``AWS_ENDPOINT_URL`` (what a launch script leaves when the variable it copies is
    unset) is refused rather than taken as unset: unset means AWS S3 itself, where an OBS job's
    credentials would only be denied. A malformed one would make the client panic on the first
    request; a plain ``http://`` one is refused by the client unless ``AWS_ALLOW_HTTP=true``.
    """
    for var in _ENDPOINT_ENV:
        value = os.environ.get(var)
        if value is None:
            continue
        if not value.strip():
            raise ObjectStoreConfigError(
                f"{var} is set but empty (a launch script copying an unset variable leaves it so): set it to your "
                "object store's endpoint, e.g. https://obs.cn-north-4.myhuaweicloud.com, or unset it to use AWS S3")
        shown = redact(value)
        try:
            parts = urllib.parse.urlsplit(value)
            parts.port  # noqa: B018 -- raises ValueError for a port out of range
        except ValueError:
            parts = None
        if (parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname
                or not _URL_CHARS.match(value)):
            raise ObjectStoreConfigError(
                f"{var}={shown!r} is not an endpoint URL: write it as https://host[:port] (http://host[:port] with "
                "AWS_ALLOW_HTTP=true)")
        if parts.scheme.lower() == "http" and os.environ.get("AWS_ALLOW_HTTP", "").strip().lower() not in _TRUE:
            raise _plain_http_error(shown)


def _may_send_token() -> bool:
    """Whether requests may carry a session token (``x-amz-security-token``): one in the
    environment, or credentials from an instance role or web identity (always temporary)."""
    return bool(os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_TOKEN")
                or not os.environ.get("AWS_ACCESS_KEY_ID"))


def check_redirects(bucket: str) -> None:
    """Refuse an endpoint that redirects requests for ``bucket`` to another host.

    obstore (0.12) follows redirects and cannot be told not to; to another host it drops the
    ``Authorization`` header but still sends ``x-amz-security-token``. So before the first
    request that could carry a session token, one unauthenticated ``HEAD /bucket`` is sent
    here (not following redirects) and an answer that points elsewhere is refused. A server that
    redirects only some requests is not caught: use endpoints you trust, over https.
    """
    import http.client

    configured = next((os.environ[v] for v in _ENDPOINT_ENV if os.environ.get(v)), None)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    base = urllib.parse.urlsplit(configured or f"https://s3.{region}.amazonaws.com")
    https = base.scheme.lower() == "https"
    default_port = 443 if https else 80
    conn_type = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = conn_type(base.hostname or "", base.port or default_port, timeout=5)
    try:
        conn.request("HEAD", f"{base.path.rstrip('/')}/{bucket}")
        resp = conn.getresponse()
        status, location = resp.status, resp.getheader("Location")
    except (OSError, http.client.HTTPException, ValueError):
        return  # unreachable now: the requests themselves will say so
    finally:
        conn.close()
    if not (300 <= status < 400 and location):
        return
    target = urllib.parse.urlsplit(urllib.parse.urljoin(base.geturl() + "/", location))
    t_port = target.port or (443 if target.scheme.lower() == "https" else 80)
    if (target.hostname, t_port) != (base.hostname, base.port or default_port):
        raise ObjectStoreConfigError(
            f"the object store at {endpoint()} redirects requests for bucket {bucket} to another host "
            f"({redact(f'{target.scheme}://{target.netloc}')}, HTTP {status}); ckptstore refuses it, as the client "
            "would send that host your session token: set AWS_ENDPOINT_URL to the host that serves the bucket")


def _client(bucket: str, url: str) -> Any:
    # keyed by the environment too: a process may point AWS_ENDPOINT_URL elsewhere later
    key = (bucket, *(os.environ.get(v, "\0") for v in _CLIENT_ENV))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            from obstore.store import S3Store

            check_environment()
            if _may_send_token():
                check_redirects(bucket)
            try:
                # client options (time-outs, AWS_ALLOW_HTTP, proxies) stay the environment's
                client = _CLIENTS[key] = S3Store(bucket, retry_config=RETRY)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # configuration errors: a bad region, a value the client panics on
                raise ObjectStoreConfigError(f"cannot set up the object store client for {url} ({type(e).__name__}); "
                                             "check the AWS_* environment variables") from None
        return client


def _coalesce(requests: Sequence[Request]) -> list[tuple[int, int, list[Request]]]:
    """``(start, end, requests)`` per GET: sorted requests merged while the gaps stay cheap."""
    ordered = sorted((r for r in requests if len(r[1])), key=lambda r: r[0])
    out: list[tuple[int, int, list[Request]]] = []
    wanted = 0
    for off, buf in ordered:
        end = off + len(buf)
        if out:
            start, stop, group = out[-1]
            if worth_merging(stop - start, wanted, off - stop, len(buf), MAX_GAP_FRACTION):
                group.append((off, buf))
                out[-1] = (start, max(stop, end), group)
                wanted += len(buf)
                continue
        out.append((off, end, [(off, buf)]))
        wanted = len(buf)
    return out


class S3File(ReadableFile):
    """One object; reads are ranged GETs. Its size costs a HEAD, asked for only when needed.

    The object is pinned to the version its first request saw (the ETag of the HEAD or of the
    first GET's answer): every later GET sends that ETag as ``If-Match``, so a replaced object
    answers 412 instead of other bytes, and every answer's ETag is compared with the pin (which
    also catches GETs sent at once before any answer had pinned it, and a server that ignores
    ``If-Match``). A change is a :class:`~ckptstore.errors.StoreChangedError` naming the object,
    as is a pinned object that disappeared: reads of one file never mix two versions.
    """

    read_ahead = 256 << 10

    def __init__(self, source: "S3Source", key: str, size: int | None = None) -> None:
        self.source, self.key = source, key
        self._size = size
        self._etag: str | None = None
        self._changed: Callable[[], Exception] | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.source.key_url(self.key)

    @property
    def etag(self) -> str | None:
        """The ETag this object is pinned to (``None`` before its first request)."""
        return self._etag

    @property
    def size(self) -> int:  # type: ignore[override]
        if self._size is None:
            st = self.source.stat(self.key)
            if st is None:
                raise MissingFileError(errno.ENOENT, f"{self.url} does not exist", self.url)
            self._seen(st.version or None, st.size)
        assert self._size is not None
        return self._size

    def pin(self, etag: str, size: int, changed: Callable[[], Exception] | None = None) -> None:
        """Pin the object to a version known beforehand (an index's record of a rank file), before
        any request: its first GET already sends ``If-Match``. ``changed`` makes the error raised
        when the object is another version (default: :class:`~ckptstore.errors.StoreChangedError`)."""
        with self._lock:
            self._changed = changed
        self._seen(etag, size)

    def _seen(self, etag: str | None, size: int) -> None:
        """Take the version an answer reports: the pin if there is none yet, else compared with it."""
        with self._lock:
            if self._etag is None:
                if etag:  # a server that reports no ETag leaves the object unpinned
                    self._etag, self._size = etag, size
                elif self._size is None:
                    self._size = size
                return
            if etag == self._etag and size == self._size:
                return
        raise self._replaced(f"ETag {etag}, {size} bytes, was {self._etag}, {self._size} bytes")

    def _replaced(self, what: str) -> Exception:
        if self._changed is not None:
            return self._changed()
        return StoreChangedError(f"{self.url} was replaced while it was read ({what}); open it again")

    def read_requests(self, requests: Sequence[Request]) -> None:
        for start, end, group in _coalesce(requests):
            self._get(start, end, group)

    def _get(self, start: int, end: int, group: list[Request]) -> None:
        import obstore
        import obstore.exceptions as oe

        path = self.source.path(self.key)
        pinned = self._etag
        options: dict[str, Any] = {"range": (start, end)}
        if pinned is not None:
            options["if_match"] = pinned
        try:
            result = obstore.get(self.source.store, path, options=options)
            meta = result.meta
            self._seen(meta.get("e_tag"), int(meta["size"]))  # before any byte reaches a caller's buffer
            pos = start
            # each piece of the answer goes straight into the requests it overlaps
            i = 0
            for piece in result.stream(min_chunk_size=STREAM_CHUNK):
                view = memoryview(piece)
                n = len(view)
                REQUEST_STATS.add(bytes_in=n)
                while i < len(group) and group[i][0] + len(group[i][1]) <= pos:
                    i += 1
                j = i
                while j < len(group) and group[j][0] < pos + n:
                    off, buf = group[j]
                    lo, hi = max(off, pos), min(off + len(buf), pos + n)
                    if lo < hi:
                        buf[lo - off:hi - off] = view[lo - pos:hi - pos]
                    j += 1
                pos += n
        except CkptStoreError:
            raise
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(e, oe.PreconditionError):  # 412: the object is not the pinned version
                raise self._replaced(f"its ETag is no longer {pinned}") from None
            if pinned is not None and isinstance(e, (FileNotFoundError, oe.NotFoundError)):
                raise self._replaced("it no longer exists") from None
            if _is_range_error(e):
                raise ShortReadError(self.url, start, end - start, self.size) from None
            raise _client_error(e, self.url, "read") from None
        finally:
            REQUEST_STATS.add(gets=1)
        if pos < end:
            raise ShortReadError(self.url, start, end - start, pos)

    def close(self) -> None:
        pass


def _is_range_error(e: BaseException) -> bool:
    text = str(e)
    return "416" in text or "InvalidRange" in text or "Range" in type(e).__name__


class S3Source(ByteSource):
    """A bucket prefix as a byte source (read and write); see the module docstring."""

    default_workers = READ_CONCURRENCY
    coalesces = True
    unit_bytes = GET_PIECE
    gap_fraction = MAX_GAP_FRACTION
    pins_read_files = True

    def __init__(self, url: str) -> None:
        self.scheme, self.bucket, self.prefix = split_url(url)
        self._url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._store: Any = None
        self._lock = threading.Lock()
        self._files: dict[str, S3File] = {}  # kept (with their pins) until close()

    @property
    def store(self) -> Any:
        """The obstore client of this bucket (shared with other sources of the same bucket and
        environment, so rank files opened one by one share its connections)."""
        with self._lock:
            if self._store is None:
                self._store = _client(self.bucket, self._url)
            return self._store

    @property
    def url(self) -> str:
        return self._url

    def path(self, key: str) -> str:
        """The object path of ``key`` inside the bucket."""
        check_key(key, self._url)
        return f"{self.prefix}/{key}" if self.prefix else key

    def open(self, key: str) -> S3File:
        """The object ``key`` (no request): the same :class:`S3File`, pinned to the version its
        first request saw, for every open of ``key`` until :meth:`close`."""
        f = self._files.get(key)
        if f is None:
            check_key(key, self._url)
            with self._lock:
                f = self._files.setdefault(key, S3File(self, key))
        return f

    def close(self) -> None:
        """Forget the opened objects and their pins: the next open of a key reads it as it is then."""
        with self._lock:
            self._files = {}

    def stat(self, key: str) -> FileStat | None:
        import obstore

        with _request(self.key_url(key), "look up", heads=1):
            try:
                meta = obstore.head(self.store, self.path(key))
            except FileNotFoundError:
                return None
        return _stat(meta)

    def read_bytes(self, key: str, *, limit: int) -> bytes | None:
        got = self.read_bytes_stat(key, limit=limit)
        return None if got is None else got[0]

    def read_bytes_stat(self, key: str, *, limit: int) -> tuple[bytes, FileStat | None] | None:
        """The whole object ``key`` (one GET) and the :class:`FileStat` its answer reports, the
        ETag of exactly these bytes; ``None`` when it does not exist."""
        import obstore

        with _request(self.key_url(key), "read", gets=1):
            try:
                result = obstore.get(self.store, self.path(key))
            except FileNotFoundError:
                return None
            size = result.meta["size"]
            if size > limit:
                raise FileAccessError(errno.EFBIG, f"{self.key_url(key)} is {size} bytes, more than the {limit} a "
                                      "metadata file may have")
            data = bytes(result.bytes())
        REQUEST_STATS.add(bytes_in=len(data))
        return data, _stat(result.meta)

    def list(self, prefix: str = "") -> tuple[list[str], list[str]]:
        import obstore

        base = self.path(prefix) if prefix else self.prefix
        with _request(self.key_url(prefix) if prefix else self._url, "list", lists=1):
            listing = obstore.list_with_delimiter(self.store, base or None)
        cut = len(base) + 1 if base else 0
        folders = sorted(p[cut:].strip("/") for p in listing["common_prefixes"])
        files = sorted(o["path"][cut:] for o in listing["objects"])
        return folders, files

    def walk(self, prefix: str = "") -> Iterator[tuple[str, FileStat]]:
        """Every object below ``prefix`` (recursively): ``(key, stat)``."""
        import obstore

        base = self.path(prefix) if prefix else self.prefix
        cut = len(self.prefix) + 1 if self.prefix else 0
        with _request(self.key_url(prefix) if prefix else self._url, "list"):
            for batch in obstore.list(self.store, (base + "/") if base else None, chunk_size=1000):
                REQUEST_STATS.add(lists=1)  # one request per page of the listing
                for meta in batch:
                    yield meta["path"][cut:], _stat(meta)

    # --- writing -------------------------------------------------------------------------------

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write the object ``key`` whole (one PUT)."""
        import obstore

        with _request(self.key_url(key), "write", puts=1):
            obstore.put(self.store, self.path(key), data, use_multipart=False)
        REQUEST_STATS.add(bytes_out=len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if no object has that name (a conditional PUT); return whether it did."""
        import obstore
        import obstore.exceptions as oe

        with _request(self.key_url(key), "write", puts=1):
            try:
                obstore.put(self.store, self.path(key), data, mode="create")
            except (FileExistsError, oe.AlreadyExistsError):
                return False
        REQUEST_STATS.add(bytes_out=len(data))
        return True

    def put_stream(self, key: str, pieces: Iterable[Any]) -> int:
        """Write ``key`` from an iterable of byte buffers (a multipart upload); return its size.

        The object appears only when the last piece is uploaded; if ``pieces`` raises, the upload
        is abandoned and nothing becomes visible. ``pieces`` runs in this thread, one piece each
        time the upload asks for one, so it may itself read from object storage (a conversion
        from a bucket into a bucket): obstore drives the iterator it is given from inside its
        runtime, where another obstore call would panic ("Cannot start a runtime from within a
        runtime"), so the upload runs in a helper thread and is handed the pieces from here.
        """
        import obstore

        handoff = _Handoff(pieces)
        path = self.path(key)
        uploader = threading.Thread(
            target=handoff.upload, name="ckptstore-upload", daemon=True,
            args=(lambda it: obstore.put(self.store, path, it, chunk_size=UPLOAD_PART, max_concurrency=4),))
        uploader.start()
        try:
            handoff.produce()
        finally:
            uploader.join()
            REQUEST_STATS.add(puts=max(1, -(-handoff.nbytes // UPLOAD_PART)), bytes_out=handoff.nbytes)
        if handoff.error is not None:
            raise handoff.error
        e = handoff.upload_error
        if e is not None:
            if isinstance(e, CkptStoreError):
                raise e
            raise _client_error(e, self.key_url(key), "write") from None
        return handoff.nbytes

    def delete(self, keys: Sequence[str]) -> None:
        """Delete objects (missing ones are fine)."""
        import obstore

        paths = [self.path(k) for k in keys]
        for i in range(0, len(paths), 1000):
            with _request(self._url, "delete objects in", deletes=1):
                try:
                    obstore.delete(self.store, paths[i:i + 1000])
                except FileNotFoundError:
                    pass


def _stat(meta: Any) -> FileStat:
    modified = meta.get("last_modified")
    mtime_ns = int(modified.timestamp() * 1e9) if modified is not None else 0
    return FileStat(int(meta["size"]), mtime_ns, str(meta.get("e_tag") or meta.get("version") or ""))


class _Handoff:
    """Hands the pieces of an upload, produced in the caller's thread, to an upload that runs in
    another thread, one at a time: the producer makes a piece only when the upload asks for the
    next one (as a generator would run), so nothing is read ahead and a piece's producer never
    runs inside obstore's runtime. Keeps the producer's error and the upload's."""

    _END = object()

    def __init__(self, pieces: Iterable[Any]) -> None:
        self.pieces = pieces
        self.nbytes = 0
        self.error: BaseException | None = None  # raised by the producer of the pieces
        self.upload_error: BaseException | None = None  # raised by the upload
        self._wanted: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: next piece, please; False: upload over
        self._given: queue.SimpleQueue[Any] = queue.SimpleQueue()  # a piece, _END, or the producer's error

    def consume(self) -> Iterator[Any]:
        """The iterator the upload is given (runs wherever obstore drives it)."""
        while True:
            self._wanted.put(True)
            item = self._given.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise RuntimeError("the producer of the upload's pieces failed")  # obstore abandons the upload
            yield item

    def upload(self, put: Any) -> None:
        """Run ``put(iterator)`` (the helper thread's body)."""
        try:
            put(self.consume())
        except BaseException as e:  # noqa: BLE001 -- a Rust panic is a BaseException; reported by the caller
            self.upload_error = e
        finally:
            self._wanted.put(False)

    def produce(self) -> None:
        """Make pieces as the upload asks for them, until it has them all or is over."""
        it = iter(self.pieces)
        try:
            while self._wanted.get():
                try:
                    piece = next(it)
                except StopIteration:
                    self._given.put(self._END)
                    continue
                self.nbytes += memoryview(piece).nbytes
                self._given.put(piece)
        except BaseException as e:
            self.error = e
            self._given.put(e)  # the upload is abandoned, then says it is over
            while self._wanted.get():
                pass


#: ``s3://`` and ``obs://`` URLs are read from object storage.
BYTE_SOURCE = Scheme(SCHEMES, S3Source, "s3://bucket/prefix (obs://bucket/prefix for Huawei OBS)")
