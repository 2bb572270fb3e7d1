"""What a failed object-store request means, as ckptstore's typed errors (never the client's text).

obstore raises typed exceptions for what the S3 protocol names (a missing object, a failed
precondition, denied access, an existing object); its fallback :class:`obstore.exceptions.GenericError`
covers the rest (5xx answers, time-outs, broken connections after the client's retries, a missing
bucket), and for those only the HTTP status, the S3 error code and the retry count are taken
from its message. Messages name the URL and the endpoint (credentials hidden), never the
client's own text, which echoes request details.
"""
from __future__ import annotations

import errno
import os
import re

from ckptstore.errors import (
    AccessDeniedError,
    EndpointRedirectError,
    FileAccessError,
    MissingFileError,
    ObjectStoreConfigError,
    StoreUnavailableError,
)
from ckptstore.io.urls import redact

_S3_CODE = re.compile(r"<Code>([A-Za-z0-9]{1,64})</Code>")
_STATUS = re.compile(r"status code: (\d{3})|status: (\d{3})")
_RETRIES = re.compile(r"after (\d+) retries")
#: A URL in the client's text (the request's, the endpoint's): the names in it are the user's
#: (a port 41699, a key ``w416``), so no phrase or number is looked for inside one.
_URL_IN_TEXT = re.compile(r"\b[a-z][a-z0-9+.-]*://\S*", re.IGNORECASE)
_ELAPSED = re.compile(r" in (\d+(?:\.\d+)?)(ns|µs|us|ms|s|m)\b")
_UNIT_SECONDS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def endpoint() -> str:
    """The object store requests go to, as a message names it (credentials hidden)."""
    url = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    if url:
        return redact(url)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return f"AWS S3 ({region}; AWS_ENDPOINT_URL is not set)"


def _status(text: str) -> str | None:
    """The HTTP status the client's text reports (``"status code: 416"``), if any."""
    m = _STATUS.search(text)
    return next((g for g in m.groups() if g), None) if m else None


def _code(text: str) -> str | None:
    """The S3 error code the client's text quotes (``<Code>InvalidRange</Code>``), if any."""
    found = _S3_CODE.search(text)
    return found.group(1) if found else None


def _phrases(e: BaseException) -> str:
    """The client's text with its URLs cut out, to look for the client's own phrases in."""
    return _URL_IN_TEXT.sub("<url>", str(e))


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


def client_error(e: BaseException, url: str, action: str) -> Exception:
    """A typed error for a failed request, naming the URL but never the client's raw text.

    The client's exception type decides where it has one for the failure (a missing object,
    denied access); its message is read only for what no type says: the HTTP status, the S3
    error code (``NoSuchBucket``), whether it was a redirect and the retries of a
    :class:`obstore.exceptions.GenericError` (an outage, a redirect, a missing bucket's LIST).
    """
    import obstore.exceptions as oe

    text = _phrases(e)
    status, code = _status(text), _code(text)
    detail = ", ".join(x for x in (f"HTTP {status}" if status else "", code or "") if x)
    detail = f" ({detail})" if detail else ""

    if code == "NoSuchBucket":  # a GET answers FileNotFoundError, a LIST a GenericError: both say so
        return missing_bucket(url, detail)
    if isinstance(e, (FileNotFoundError, oe.NotFoundError)):
        return MissingFileError(errno.ENOENT, f"{url} does not exist{detail}", url)
    if isinstance(e, (oe.PermissionDeniedError, oe.UnauthenticatedError)) or status in ("401", "403"):
        return AccessDeniedError(errno.EACCES, f"access to {url} was denied{detail} when trying to {action}: check "
                                 "the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or your AWS "
                                 "profile) and the bucket's permissions")
    if is_panic(e):
        return ObjectStoreConfigError(f"the object store client failed on {url} (it panicked); check the AWS_* "
                                      "environment variables (AWS_ENDPOINT_URL must be an http(s):// URL); if they "
                                      "are right, this is a bug in ckptstore or obstore: please report it")
    if not isinstance(e, (oe.BaseError, OSError)):
        return e if isinstance(e, Exception) else RuntimeError(str(e))
    if "BadScheme" in text or "URL scheme is not allowed" in text:
        return plain_http_error(endpoint())
    bare = "BareRedirect" in text  # a 3xx with no Location: S3's answer for a bucket of another region
    if bare or (status or "").startswith("3") or code in ("PermanentRedirect", "TemporaryRedirect", "Redirect"):
        detail = " (a redirect with no Location)" if bare and not detail else detail
        return EndpointRedirectError(
            f"the object store at {endpoint()} redirects the request to {action} {url}{detail}: the bucket is served "
            "by another endpoint or region; set AWS_ENDPOINT_URL (and AWS_REGION) to the one that serves it")
    what = _outage(text, status)
    if what is not None:
        return StoreUnavailableError(
            errno.EAGAIN, f"the object store at {endpoint()} is unavailable: {what} when trying to {action} {url} "
            f"({_attempts(text)}, with back-off). Nothing is known to be wrong with the data: rerun the same "
            "command when the server answers again (a conversion resumes where it stopped)")
    kind = type(e).__name__
    return FileAccessError(errno.EIO, f"cannot {action} {url}{detail or f' ({kind})'}: the object store at "
                           f"{endpoint()} did not answer successfully after retries; check AWS_ENDPOINT_URL and "
                           "the network")


def missing_bucket(url: str, detail: str = " (HTTP 404, NoSuchBucket)") -> MissingFileError:
    """The error for a bucket that does not exist, naming it (``url`` is a location in it)."""
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    return MissingFileError(errno.ENOENT, f"bucket {bucket} does not exist at {endpoint()}{detail}, so {url} cannot "
                            "be there: check the bucket name, or create the bucket first", url)


def is_no_such_bucket(e: BaseException) -> bool:
    """Whether the server's answer says the bucket does not exist (S3 code ``NoSuchBucket``)."""
    return _code(str(e)) == "NoSuchBucket"


def is_panic(e: BaseException) -> bool:
    """Whether ``e`` is a Rust panic inside the client (``pyo3_runtime.PanicException``, a
    ``BaseException``): a last resort, as the configuration is checked before any call."""
    return type(e).__name__ == "PanicException"


def plain_http_error(url: str) -> ObjectStoreConfigError:
    return ObjectStoreConfigError(
        f"AWS_ENDPOINT_URL is {url}, plain http, which the object store client refuses unless AWS_ALLOW_HTTP=true "
        "is set: set AWS_ALLOW_HTTP=true (only on a network you trust) or use the endpoint's https:// URL")


def is_range_error(e: BaseException) -> bool:
    """Whether ``e`` is the server's refusal of a range past the object's end (HTTP 416, S3 code
    ``InvalidRange``): read from the status and the code, never from a "416" anywhere in the text,
    which also holds the endpoint's port and the key."""
    text = _phrases(e)
    return _status(text) == "416" or _code(text) == "InvalidRange"
