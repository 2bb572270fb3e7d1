"""One exception hierarchy for ckptstore.

Every error a user can trigger with bad input is a :class:`CkptStoreError`; each also
subclasses the builtin that fits (a missing file is a ``FileNotFoundError``, malformed input a
``ValueError``) so callers that already catch those keep working. Messages name the file, the
parameter and the byte offset where they are known, and say what to do.
"""
from __future__ import annotations

import os
from typing import Literal, overload


class CkptStoreError(Exception):
    """Base class of every error ckptstore raises on purpose."""


def _where(path: str | os.PathLike[str] | None, param: str | None, offset: int | None) -> str:
    parts = []
    if path is not None:
        parts.append(f"file {os.fspath(path)!s}")
    if param is not None:
        parts.append(f"parameter {param!r}")
    if offset is not None:
        parts.append(f"byte offset {offset}")
    return ", ".join(parts)


class CheckpointFileError(CkptStoreError, ValueError):
    """A MindSpore ``.ckpt`` file that cannot be read as a checkpoint.

    Attributes ``path``, ``param`` and ``offset`` locate the problem (``None`` when unknown).
    """

    def __init__(
        self,
        problem: str,
        *,
        path: str | os.PathLike[str] | None = None,
        param: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.path = None if path is None else os.fspath(path)
        self.param = param
        self.offset = offset
        self.problem = problem
        where = _where(path, param, offset)
        super().__init__(f"{problem} ({where})" if where else problem)


class TruncatedCheckpointError(CheckpointFileError):
    """The file ends in the middle of a record, or before parameters it must hold."""


class CorruptCheckpointError(CheckpointFileError):
    """The bytes are not a valid MindSpore checkpoint record."""


class EncryptedCheckpointError(CheckpointFileError):
    """The file was saved with ``enc_key`` and is not readable without ``dec_key``."""


class UnsupportedCheckpointError(CheckpointFileError):
    """A valid checkpoint feature ckptstore does not handle (map tensors, Int4)."""


class ChecksumMismatchError(CheckpointFileError):
    """Stored and computed checksums differ: the bytes were damaged after saving."""


class StrategyError(CkptStoreError, ValueError):
    """A strategy file that cannot be read, or a layout that cannot be applied."""


class ForeignStrategyError(StrategyError):
    """A target strategy that lays out none, or almost none, of the store's parameters: another model's."""


class LayoutMismatchError(CkptStoreError, ValueError):
    """Checkpoint files disagree with the strategy or with each other (shape, dtype, names)."""


class MissingRankError(CkptStoreError, FileNotFoundError):
    """A rank's checkpoint file that the layout needs is not there."""


class StoreNotFoundError(CkptStoreError, FileNotFoundError):
    """No ckptstore store at the given path."""


class IncompleteStoreError(CkptStoreError, ValueError):
    """The store was not finished (an interrupted ``convert``); rerun the same command."""


class StoreCorruptError(CkptStoreError, ValueError):
    """A store whose metadata or chunk bytes fail validation or their checksum."""


class StoreExistsError(CkptStoreError, FileExistsError):
    """The output path already holds a complete store (pass ``overwrite=True``)."""


class StoreWriteError(CkptStoreError, OSError):
    """Writing the store failed (no space left, permissions); rerun the same command to resume."""


class ReplicaMismatchError(CkptStoreError, ValueError):
    """Ranks that should hold identical replicas of a slice hold different bytes."""


class InvalidOptionError(CkptStoreError, ValueError):
    """Options that do not go together or are not known (e.g. compression for safetensors)."""


class NameMapError(CkptStoreError, ValueError):
    """A name-map rule file (``--name-map``) that is malformed, or a rule that does not fit the
    tensors it matched. ``path`` is the rule file and ``rule`` the rule (``"renames[3]"``), when known."""

    def __init__(self, problem: str, *, path: str | None = None, rule: str | None = None) -> None:
        self.problem, self.path, self.rule = problem, path, rule
        where = ", ".join(x for x in (f"rule file {path}" if path else "", f"rule {rule}" if rule else "") if x)
        super().__init__(f"{where}: {problem}" if where else problem)


class UnsafePathError(CkptStoreError, ValueError):
    """A path read from metadata leaves the folder it must stay in (``..``, absolute, a symlink)."""


class MissingFileError(CkptStoreError, FileNotFoundError):
    """A file that metadata or the caller names does not exist."""


class FileAccessError(CkptStoreError, OSError):
    """A file exists but cannot be read as one (a directory, no permission, an I/O error)."""


class ShortReadError(CkptStoreError, EOFError):
    """A file ends before bytes that must be in it (it was truncated or replaced).

    ``path``, ``offset`` (where the read started) and ``end`` (where the file ended) locate it.
    """

    def __init__(self, path: str, offset: int, nbytes: int, end: int) -> None:
        self.path, self.offset, self.nbytes, self.end = path, offset, nbytes, end
        super().__init__(f"file {path} ends at byte offset {end}, before the {nbytes} bytes needed at byte "
                         f"offset {offset}; it was truncated or replaced")


class SourceChangedError(CkptStoreError, ValueError):
    """A file changed since it was recorded (size, modification time or version differ)."""


class StoreChangedError(SourceChangedError):
    """The store was replaced (``convert --overwrite``) while it was open: open it again."""


class ConversionInProgressError(CkptStoreError, RuntimeError):
    """Another process is converting into the same output folder."""


class ParameterNotFoundError(CkptStoreError, KeyError):
    """A parameter name that the store does not hold."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class InvalidIndexError(CkptStoreError, IndexError):
    """An index that does not select a box of the parameter (out of bounds, a step, a list)."""


class AccessDeniedError(FileAccessError):
    """The object store refused the request (HTTP 401/403): credentials or permissions."""


class UnsupportedLocationError(CkptStoreError, ValueError):
    """A location with a URL scheme ckptstore does not read or write (only s3:// and obs://)."""


class StoreUnavailableError(FileAccessError, ConnectionError):
    """The object store did not answer (5xx answers, time-outs, refused connections) after the
    client's retries. Nothing is known to be wrong with the data: rerun when the server is back (a
    conversion resumes where it stopped)."""


class ObjectStoreConfigError(CkptStoreError, ValueError):
    """The object-store client's configuration (the ``AWS_*`` environment variables) cannot be
    used: an empty or malformed ``AWS_ENDPOINT_URL``, plain http without ``AWS_ALLOW_HTTP``, an
    endpoint that redirects to another host."""


class StaleStepError(StoreExistsError):
    """A training save whose step is not newer than the newest committed step of its folder (a
    resumed job counting steps from 1 again): retention would delete it, ``open(ROOT)`` would
    never return it. Resume from the newest step, or pass ``replace=True``."""


class EndpointRedirectError(ObjectStoreConfigError):
    """The object store's endpoint redirects requests for a bucket (to another host, or with no
    place to go): a wrong or hostile ``AWS_ENDPOINT_URL``, never a damaged store. Set it to the
    endpoint that serves the bucket."""


class CooperativeLoadError(CkptStoreError, RuntimeError):
    """A cooperative load (``cooperative=``) failed on another rank of the group, or its collectives
    failed: every rank of the group raises it (the failing rank its own error), none waits for bytes
    that will not come. The message names the failing rank and what it said."""


@overload
def check_int(value: object, what: str, *, least: int = 1, most: int | None = None,
              none_ok: Literal[False] = False) -> int: ...
@overload
def check_int(value: object, what: str, *, least: int = 1, most: int | None = None,
              none_ok: Literal[True]) -> int | None: ...


def check_int(value: object, what: str, *, least: int = 1, most: int | None = None,
              none_ok: bool = False) -> int | None:
    """``value`` if it is an integer (a ``bool`` is not one) in ``least..most``, else an
    :class:`InvalidOptionError` naming the option ``what`` and the value; ``None`` is accepted
    when ``none_ok``. The one check of an integer option, so that every one reads the same:
    "must be a positive integer" (``least=1``), "a non-negative integer" (``least=0``), "an
    integer in A..B" (with ``most``)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        kind = (f"an integer in {least}..{most}" if most is not None else "a positive integer" if least == 1
                else "a non-negative integer" if least == 0 else f"an integer of at least {least}")
        raise InvalidOptionError(f"{what} must be {kind}, not {value!r}")
    return value


class NotRegularFileError(FileAccessError):
    """A folder, FIFO, device or socket stands where the store (or a rank file) has a file: what is
    there is not the data, so a verified load counts it as damage, not as an outage."""
