"""The redirect probe: whether the endpoint sends requests for a bucket to another host.

obstore (0.12) follows redirects and cannot be told not to; to another host it drops the
``Authorization`` header but still sends ``x-amz-security-token``. So before the client of a
bucket is built, where its requests may carry a session token, the endpoint is asked once here
(not following redirects) and an answer that points elsewhere is refused.
"""
from __future__ import annotations

import os
import urllib.parse

from ckptstore.errors import ObjectStoreConfigError
from ckptstore.io.s3_errors import endpoint
from ckptstore.io.urls import redact

ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")


def may_send_token() -> bool:
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

    configured = next((os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
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

