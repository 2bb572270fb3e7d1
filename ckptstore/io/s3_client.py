"""The obstore client of a bucket: the configuration checked before it is built, its retries, and
one place every request goes through (counted, and its failure made a typed error).

The endpoint, region and credentials come only from the client's usual configuration
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ALLOW_HTTP``, ...); ckptstore never stores, prints or logs them. The configuration is
checked first (:func:`check_environment`: an empty or malformed ``AWS_ENDPOINT_URL`` would make
the client panic, plain http needs ``AWS_ALLOW_HTTP=true``), and the endpoint is probed for
redirects, which the client would follow (:mod:`ckptstore.io.s3_redirects`).
Retries with exponential backoff on 5xx answers, dropped connections and time-outs are the
client's (:data:`RETRY`); what still fails after them is a
:class:`~ckptstore.errors.StoreUnavailableError` (an outage, not damage).
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ckptstore.errors import CkptStoreError, ObjectStoreConfigError
from ckptstore.io import s3_redirects
from ckptstore.io.counting import Counters
from ckptstore.io.s3_errors import client_error, plain_http_error
from ckptstore.io.s3_redirects import ENDPOINT_ENV
from ckptstore.io.urls import redact

if TYPE_CHECKING:  # obstore is imported on first use of a URL
    from obstore.store import RetryConfig

#: The client's retries: 5xx answers, connection errors and time-outs, with backoff and jitter.
RETRY: RetryConfig = {"max_retries": 8, "retry_timeout": timedelta(seconds=120),
         "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=5), "base": 2}}


@dataclass
class RequestStats(Counters):
    """Requests and bytes this process sent to object storage: a test and benchmark hook."""

    gets: int = 0
    heads: int = 0
    lists: int = 0
    puts: int = 0
    deletes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


REQUEST_STATS = RequestStats()


@contextlib.contextmanager
def request(url: str, action: str, **counts: int) -> Iterator[None]:
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
        raise client_error(e, url, action) from None
    finally:
        if counts:
            REQUEST_STATS.add(**counts)


_CLIENTS: dict[tuple[str, ...], Any] = {}
_CLIENT_ENV = (*ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_TOKEN",
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
    for var in ENDPOINT_ENV:
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
            parts.port  # noqa: B018  (reading it raises ValueError for a port out of range)
        except ValueError:
            parts = None
        if (parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname
                or not _URL_CHARS.match(value)):
            raise ObjectStoreConfigError(
                f"{var}={shown!r} is not an endpoint URL: write it as https://host[:port] (http://host[:port] with "
                "AWS_ALLOW_HTTP=true)")
        if parts.scheme.lower() == "http" and os.environ.get("AWS_ALLOW_HTTP", "").strip().lower() not in _TRUE:
            raise plain_http_error(shown)


def client(bucket: str, url: str) -> Any:
    """The obstore client of ``bucket`` (``url`` names it in messages), built once per bucket and
    environment after the configuration is checked, so sources of one bucket share connections."""
    # keyed by the environment too: a process may point AWS_ENDPOINT_URL elsewhere later
    key = (bucket, *(os.environ.get(v, "\0") for v in _CLIENT_ENV))
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None:
            from obstore.store import S3Store

            check_environment()
            try:
                # client options (time-outs, AWS_ALLOW_HTTP, proxies) stay the environment's
                built = S3Store(bucket, retry_config=RETRY)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # configuration errors: a bad region, a value the client panics on
                raise ObjectStoreConfigError(f"cannot set up the object store client for {url} ({type(e).__name__}); "
                                             "check the AWS_* environment variables") from None
            # before its first request, token or not: a followed redirect would read another host's answers
            s3_redirects.check_redirects(bucket, built)
            found = _CLIENTS[key] = built
        return found

