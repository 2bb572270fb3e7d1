"""The redirect probe: whether the endpoint sends requests for a bucket to another host.

obstore (0.12) follows redirects and cannot be told not to; to another host it drops the
``Authorization`` header but still sends ``x-amz-security-token``. So before the client of a
bucket is used, where its requests may carry a session token, the endpoint is asked here (not
following redirects), unsigned and signed, and an answer that points elsewhere is refused.
"""
from __future__ import annotations

import os
import urllib.parse
from datetime import timedelta
from typing import Any

from ckptstore.errors import ObjectStoreConfigError
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

    obstore (0.12) follows redirects and cannot be told not to; to another host it drops the
    ``Authorization`` header but still sends ``x-amz-security-token``. So before the first
    request of ``store`` (the bucket's client) that could carry a session token, two probes are
    sent to the endpoint here, neither following a redirect: an unauthenticated ``HEAD /bucket``,
    and a signed ``HEAD`` of a key that need not exist (a presigned URL of ``store``'s
    credentials, which goes to the endpoint only), since an endpoint may redirect only signed
    requests. An answer of either that points to another host is refused. An endpoint that
    redirects only some signed requests (by key or by time) is not caught: use endpoints you
    trust, over https.
    """
    import obstore

    configured = next((os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    base = urllib.parse.urlsplit(configured or f"https://s3.{region}.amazonaws.com")
    _refuse_elsewhere(base, _probe(base, f"{base.path.rstrip('/')}/{bucket}"), bucket, "requests")
    try:
        signed = urllib.parse.urlsplit(obstore.sign(store, "HEAD", PROBE_KEY, timedelta(minutes=5)))
    except Exception:  # no credentials to sign with yet: the requests themselves will say so
        return
    if (signed.hostname, _port(signed)) != (base.hostname, _port(base)):
        return  # the client addresses another host itself (virtual-hosted buckets): probed above
    _refuse_elsewhere(base, _probe(signed, f"{signed.path}?{signed.query}"), bucket, "signed requests")


#: The key the signed probe asks for (a HEAD: nothing is read or written).
PROBE_KEY = ".ckptstore-redirect-probe"


def _port(url: urllib.parse.SplitResult) -> int:
    return url.port or (443 if url.scheme.lower() == "https" else 80)


def _probe(base: urllib.parse.SplitResult, target: str) -> tuple[int, str | None] | None:
    """``(status, Location)`` of one ``HEAD target`` sent to ``base``'s host, not followed;
    ``None`` when it is unreachable now (the requests themselves will say so)."""
    import http.client

    https = base.scheme.lower() == "https"
    conn_type = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = conn_type(base.hostname or "", _port(base), timeout=5)
    try:
        conn.request("HEAD", target)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Location")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def _refuse_elsewhere(base: urllib.parse.SplitResult, answer: tuple[int, str | None] | None, bucket: str,
                      what: str) -> None:
    if answer is None:
        return
    status, location = answer
    if not (300 <= status < 400 and location):
        return
    target = urllib.parse.urlsplit(urllib.parse.urljoin(base.geturl() + "/", location))
    if (target.hostname, _port(target)) != (base.hostname, _port(base)):
        raise ObjectStoreConfigError(
            f"the object store at {endpoint()} redirects {what} for bucket {bucket} to another host "
            f"({redact(f'{target.scheme}://{target.netloc}')}, HTTP {status}); ckptstore refuses it, as the client "
            "would send that host your session token: set AWS_ENDPOINT_URL to the host that serves the bucket")
