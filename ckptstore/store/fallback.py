"""Verified fallback: load the newest step whose chunks verify, and let every rank agree on it.

A committed step can be damaged after its commit: a chunk file deleted, truncated or changed
(for an index, a rank file). With ``fallback=True`` a load checks, before it reads, the chunks it
will read (their CRC-32C; for chunks stored without one, that their bytes are all in their
files), one chunk at a time in bounded blocks (:func:`~ckptstore.store.checksum.crc32c_of`, the
loop ``ckptstore verify`` runs), and moves to the newest earlier committed step that passes.

*Damage* is what the bytes say (a missing file, a short file, a checksum mismatch, a manifest or
index record that no longer holds); an *outage* says nothing about the bytes (a refused or
unanswered request, a permission error, the step replaced while it was read) and is raised,
never a reason to load an older step.

When the job's collectives are up, the ranks of the job agree through one small gather per
round (an :data:`Agree` the caller passes: :func:`ckptstore.read.exchange.job_agreement`, over the
same collectives a cooperative load uses): each offers the newest step that verifies for it,
and the minimum is taken until every rank offers the same step, so no two ranks resume from
different steps. A rank that failed (an outage) offers a mark that makes every rank raise.
"""
from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

from ckptstore.boxes import Box
from ckptstore.errors import (
    CheckpointFileError,
    CkptStoreError,
    MissingFileError,
    NotRegularFileError,
    ShortReadError,
    SourceChangedError,
    StoreChangedError,
    StoreCorruptError,
)
from ckptstore.io.base import ByteSource
from ckptstore.store.checksum import crc32c_of
from ckptstore.store.manifest import ParamManifest

#: Bytes one verifying thread reads at a time (threads x this bounds verification's memory).
VERIFY_BLOCK = 4 << 20
#: Offers of a rank in the agreement besides a step: nothing verifies for it; it failed (an outage).
NO_STEP, FAILED = -1, -2

#: ``agree(offer)``: the smallest and the largest offer of every rank of the job.
Agree = Callable[[int], tuple[int, int]]


def is_damage(error: BaseException) -> bool:
    """Whether ``error`` says the stored bytes are damaged (as opposed to unreachable).

    A missing or short file, bytes that fail their checksum, a manifest or an index's rank file
    record that no longer holds: damage. A permission error, an unanswered or refused request
    (:class:`~ckptstore.errors.FileAccessError` and its kinds) or the store replaced while it was
    read (:class:`~ckptstore.errors.StoreChangedError`) say nothing about the bytes: not damage.
    """
    if isinstance(error, StoreChangedError):
        return False
    return isinstance(error, (MissingFileError, ShortReadError, StoreCorruptError, SourceChangedError,
                              CheckpointFileError, NotRegularFileError))


def chunk_problem(data: ByteSource, info: ParamManifest, i: int, *, block: int = VERIFY_BLOCK) -> str | None:
    """What is wrong with chunk ``i`` of ``info`` as ``data`` holds it, or ``None`` when it verifies.

    A chunk with a checksum is read (at most ``block`` bytes at a time) and its CRC-32C compared
    with the manifest's; one without (an index made without ``--checksum``) must lie within its
    files. Damage is returned as one line naming the parameter, chunk, file and offset; an outage
    is raised (see :func:`is_damage`).
    """
    t = info.chunks
    try:
        if t.crc32c is None:
            for key, offset, nbytes in info.chunk_pieces(i):
                size = data.open(key).size
                if offset + nbytes > size:
                    raise ShortReadError(data.key_url(key), offset, nbytes, size)
            return None
        crc = crc32c_of(data.open, info.chunk_pieces(i), block=block)
    except CkptStoreError as e:
        if not is_damage(e):
            raise
        return f"parameter {info.name!r}: chunk {i}: {e}"
    if crc != t.crc32c[i]:
        return (f"parameter {info.name!r}: chunk {i}: checksum mismatch in {data.key_url(t.files[i])} at byte "
                f"offset {t.offsets[i]} ({t.nbytes[i]} bytes)")
    return None


def chunks_read(params: Mapping[str, ParamManifest],
                boxes: Mapping[str, Box | None] | None) -> Iterator[tuple[ParamManifest, int]]:
    """``(parameter, chunk)`` for every chunk a read of ``boxes`` touches (``None``: every chunk
    of every parameter; a ``None`` box: the whole parameter)."""
    wanted: Iterable[tuple[str, Box | None]] = ((n, None) for n in params) if boxes is None else boxes.items()
    for name, box in wanted:
        info = params[name]
        if info.is_str or not len(info.chunks):
            continue
        yield from ((info, i) for i in (range(len(info.chunks)) if box is None else info.chunks_overlapping(box)))


def first_problem(data: ByteSource, params: Mapping[str, ParamManifest], boxes: Mapping[str, Box | None] | None,
                  *, workers: int = 1) -> str | None:
    """The first damage found among the chunks a read of ``boxes`` touches (:func:`chunks_read`),
    checked by ``workers`` threads; ``None`` when every one verifies. An outage is raised."""
    chunks = list(chunks_read(params, boxes))
    if workers <= 1 or len(chunks) <= 1:
        return next((p for info, i in chunks if (p := chunk_problem(data, info, i)) is not None), None)
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(chunks))) as pool:
        found = [pool.submit(chunk_problem, data, info, i) for info, i in chunks]
        try:
            return next((p for f in found if (p := f.result()) is not None), None)
        finally:
            for f in found:
                f.cancel()


def choose_step(candidates: Iterable[int], problem: Callable[[int], str | None],
                agree: Agree | None = None) -> tuple[int | None, list[tuple[int, str]]]:
    """The newest of ``candidates`` (committed steps, newest first) that verifies for this rank and,
    with ``agree``, for every rank of the job; and the newer ones skipped, with why.

    ``problem(step)`` checks a step (``None``: it verifies), each at most once. Returns
    ``(None, skipped)`` when no step verifies (for some rank). An outage in ``problem`` is raised
    after the other ranks were told, so they raise too rather than wait.
    """
    steps = list(candidates)
    verdicts: dict[int, str | None] = {}
    bound: int | None = None
    while True:
        offer, error = NO_STEP, None
        try:
            for step in steps:
                if bound is not None and step > bound:
                    continue
                if step not in verdicts:
                    verdicts[step] = problem(step)
                if verdicts[step] is None:
                    offer = step
                    break
        except Exception as e:  # raised below, once the other ranks know
            if agree is None:
                raise
            offer, error = FAILED, e
        low, high = (offer, offer) if agree is None else agree(offer)
        if error is not None:
            raise error
        if low == FAILED:
            raise CkptStoreError("another rank of the job failed while verifying the steps it reads (its log says "
                                 "why); no rank loads")
        skipped = [(s, verdicts.get(s) or _OTHER_RANK) for s in steps if s > low]
        if low == NO_STEP:
            return None, skipped
        if low == high:
            return low, skipped
        bound = low


_OTHER_RANK = "another rank of the job found damage in the chunks it reads (its log names them)"


def say_skipped(where: str, chosen: int, skipped: list[tuple[int, str]]) -> None:
    """The one log line of a fallback: the step loaded, each step skipped and why."""
    if skipped:
        logging.getLogger("ckptstore").warning(
            "ckptstore: %s: loading step %d, not the newer committed step(s) that failed verification: %s", where,
            chosen, "; ".join(f"step {s}: {why}" for s, why in skipped))


def no_step_error(where: str, skipped: list[tuple[int, str]]) -> StoreCorruptError:
    """The error when no committed step verifies."""
    said = "; ".join(f"step {s}: {why}" for s, why in skipped[:5]) + (" ..." if len(skipped) > 5 else "")
    return StoreCorruptError(f"{where}: no committed step verifies for the chunks this load reads"
                             + (f" ({said})" if said else "") + "; restore a step from a backup, or save again")
