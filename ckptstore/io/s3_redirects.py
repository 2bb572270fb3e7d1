"""The redirect probe: whether the endpoint sends requests for a bucket to another host.

obstore (0.12) follows redirects and cannot be told not to; to another host it drops the
``Authorization`` header but still sends ``x-amz-security-token``, and what that host answers is
read as the bucket's (a damaged store, to every reader). So before the client of a bucket sends
its first request, the endpoint is asked here, never following a redirect and never with the
session token, the way the client will ask: ``HEAD`` and ``GET`` of an object, a ``LIST``, and
the same signed. An answer that points elsewhere is an
:class:`~ckptstore.errors.EndpointRedirectError`, which says it is a redirect.
"""
from __future__ import annotations

import os
import re
import urllib.parse
from datetime import timedelta
from typing import Any, Literal

from ckptstore.errors import EndpointRedirectError
from ckptstore.io.s3_errors import endpoint
from ckptstore.io.urls import redact

ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")


def may_send_token() -> bool:
    """Whether requests may carry a session token (``x-amz-security-token``): one in the
    environment, or credentials from an instance role or web identity (always temporary)."""
    return bool(os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_TOKEN")
                or not os.environ.get("AWS_ACCESS_KEY_ID"))


def check_redirects(bucket: str, store: Any) -> None:
    """Refuse an endpoint that redirects requests for ``bucket`` to another host.

    Probes are sent to the endpoint before ``store`` (the bucket's client) sends anything, none
    following a redirect: unsigned ``HEAD`` and ``GET`` of a key that need not exist and a
    ``LIST`` of the bucket, then the ``HEAD`` and ``GET`` signed with ``store``'s credentials
    (presigned URLs, since an endpoint may redirect only signed requests) with the session token
    taken out of them, so that no probe carries it. An answer of any that points to another host
    is refused. A probe that gets no answer (within :func:`probe_timeout`) ends the probing: the
    client's own requests then report the outage. An endpoint that redirects only some requests
    (writes, some keys, later ones) is not caught: use endpoints you trust, over https.
    """
    import obstore

    configured = next((os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    base = urllib.parse.urlsplit(configured or f"https://s3.{region}.amazonaws.com")
    root = f"{base.path.rstrip('/')}/{bucket}"
    for method, target in (("HEAD", f"{root}/{PROBE_KEY}"), ("GET", f"{root}/{PROBE_KEY}"),
                           ("GET", f"{root}?list-type=2&max-keys=1&prefix={PROBE_KEY}")):
        answer = _probe(base, method, target)
        if answer is None:  # unreachable or hung: one wait, not five; the requests will report the outage
            return
        _refuse_elsewhere(base, answer, bucket, "requests")
    signed_methods: tuple[Literal["HEAD", "GET"], ...] = ("HEAD", "GET")
    for method in signed_methods:
        try:
            signed = urllib.parse.urlsplit(obstore.sign(store, method, PROBE_KEY, timedelta(minutes=5)))
        except Exception:  # no credentials to sign with yet: the requests themselves will say so
            return
        if (signed.hostname, _port(signed)) != (base.hostname, _port(base)):
            return  # the client addresses another host itself (virtual-hosted buckets): probed above
        target = f"{signed.path}?{without_token(signed.query)}"
        answer = _probe(signed, method, target)
        if answer is None:
            return
        _refuse_elsewhere(base, answer, bucket, "signed requests")


def without_token(query: str) -> str:
    """A presigned URL's query without its ``X-Amz-Security-Token`` (the session token): the
    probe shows how the endpoint answers a signed request without handing it the token."""
    kept = [p for p in query.split("&") if p.split("=", 1)[0].lower() != "x-amz-security-token"]
    return "&".join(kept)


#: The key the probes ask for (a HEAD and a GET: nothing is written).
PROBE_KEY = ".ckptstore-redirect-probe"


def _port(url: urllib.parse.SplitResult) -> int:
    return url.port or (443 if url.scheme.lower() == "https" else 80)


def _probe(base: urllib.parse.SplitResult, method: str, target: str) -> tuple[int, str | None] | None:
    """``(status, Location)`` of one ``method target`` sent to ``base``'s host, not followed;
    ``None`` when it is unreachable now (the requests themselves will say so)."""
    import http.client

    https = base.scheme.lower() == "https"
    conn_type = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = conn_type(base.hostname or "", _port(base), timeout=probe_timeout())
    try:
        conn.request(method, target)
        resp = conn.getresponse()
        resp.read(1 << 16)  # a small body at most; the answer's status and Location are what counts
        return resp.status, resp.getheader("Location")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def probe_timeout() -> float:
    """Seconds a probe waits for an answer: the client's ``AWS_TIMEOUT`` (``300ms``, ``2s``, ``1m``)
    where it is shorter than 5 s, so that a hung endpoint costs the probe no more than a request."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", os.environ.get("AWS_TIMEOUT", ""))
    if match is None:
        return 5.0
    value = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2) or "s"]
    return min(5.0, value) if value > 0 else 5.0


def _refuse_elsewhere(base: urllib.parse.SplitResult, answer: tuple[int, str | None] | None, bucket: str,
                      what: str) -> None:
    if answer is None:
        return
    status, location = answer
    if not (300 <= status < 400 and location):
        return
    target = urllib.parse.urlsplit(urllib.parse.urljoin(base.geturl() + "/", location))
    if (target.hostname, _port(target)) != (base.hostname, _port(base)):
        token = may_send_token()
        raise EndpointRedirectError(
            f"the object store at {endpoint()} redirects {what} for bucket {bucket} to another host "
            f"({redact(f'{target.scheme}://{target.netloc}')}, HTTP {status}); ckptstore refuses it, as the client "
            + ("would send that host your session token" if token else "would read that host's answers as the "
               "bucket's") + ": set AWS_ENDPOINT_URL to the host that serves the bucket")
