"""MindSpore's safetensors rank files, indexed like ``.ckpt`` files: names, dtypes, shapes, byte ranges.

``mindspore.save_checkpoint(..., format="safetensors")``, ``ckpt_to_safetensors`` and
MindFormers write ordinary safetensors files whose header metadata says ``{"format": "ms"}``
(plus ``"remove_redundancy"`` and ``"crc_num"`` when asked). :func:`scan_safetensors` reads only
the header and returns the same :class:`~ckptstore.formats.ckpt_reader.CkptIndex` the ``.ckpt`` reader
does, each tensor one contiguous byte range, so everything downstream reads slices by offset
without knowing which format a rank saved. ``crc_num`` is MindSpore's CRC-32 over each tensor's
name and bytes in name order; :func:`verify_safetensors_crc` checks it.
"""
from __future__ import annotations

import zlib

from ckptstore.dtypes import mindspore_name
from ckptstore.errors import ChecksumMismatchError, CorruptCheckpointError, UnsupportedCheckpointError
from ckptstore.formats.ckpt_reader import CkptEntry, CkptIndex, open_file
from ckptstore.formats.safetensors_header import parse_header
from ckptstore.io.base import ReadableFile

_CRC_BLOCK = 8 << 20


def scan_safetensors(path: str | ReadableFile, *, verify_crc: bool = False) -> CkptIndex:
    """Index a safetensors rank file from its header alone (tensor data is not read).

    Raises :class:`~ckptstore.errors.CheckpointFileError` subclasses naming the file, tensor and
    byte offset for truncated or malformed headers, and for MindSpore's packed Int4 tensors,
    which ckptstore does not handle.
    """
    f, own = open_file(path)
    try:
        metadata, tensors = parse_header(f)
        for name, value in metadata.items():
            if value == "Int4":
                raise UnsupportedCheckpointError("packed 4-bit (qint4x2) tensors are not supported", path=f.url,
                                                 param=name)
        entries = {t.name: CkptEntry(t.name, mindspore_name(t.dtype), t.shape, ((t.start, t.nbytes),) if t.nbytes
                                     else (), t.start) for t in tensors.values()}
        index = CkptIndex(f.url, f.size, entries, _stored_crc(metadata, f.url), f.size)
        if verify_crc:
            verify_safetensors_crc(index, f)
        return index
    finally:
        if own:
            f.close()


def _stored_crc(metadata: dict[str, str], path: str) -> int | None:
    """The ``crc_num`` of the header metadata (``None`` when there is none), checked to be a CRC-32.

    Checked before ``int()``: ``str.isdigit`` accepts digits ``int`` refuses (``"²"``), and ``int``
    refuses strings beyond Python's digit limit, each a ValueError that names no file.
    """
    crc = metadata.get("crc_num")
    if crc is None:
        return None
    if not (0 < len(crc) <= 10 and crc.isascii() and crc.isdigit()) or int(crc) > 0xFFFFFFFF:
        shown = repr(crc) if len(crc) <= 24 else f"{crc[:20]!r}... ({len(crc)} characters)"
        raise CorruptCheckpointError(f"the safetensors __metadata__ crc_num {shown} is not a CRC-32 (a decimal "
                                     "number below 2**32): the header is damaged; save the file again",
                                     path=path, offset=8)
    return int(crc)


def verify_safetensors_crc(index: CkptIndex, f: ReadableFile) -> None:
    """Check MindSpore's ``crc_num``: CRC-32 of each tensor's name and bytes, names in sorted order.

    Raises :class:`~ckptstore.errors.ChecksumMismatchError` on a mismatch and when the file has
    none (it was saved without ``crc_check=True``).
    """
    if index.stored_crc is None:
        raise ChecksumMismatchError("the file has no crc_num in its metadata (it was saved without crc_check=True)",
                                    path=index.path)
    crc = 0
    buf = bytearray(_CRC_BLOCK)
    for name in sorted(index.entries):
        crc = zlib.crc32(name.encode("utf-8"), crc)
        for offset, length in index.entries[name].pieces:
            done = 0
            while done < length:
                view = memoryview(buf)[:min(len(buf), length - done)]
                f.read_into(offset + done, view)
                crc = zlib.crc32(view, crc)
                done += len(view)
    if crc != index.stored_crc:
        raise ChecksumMismatchError(f"CRC-32 of the tensors is {crc} but the metadata says {index.stored_crc}: the "
                                    "file is damaged", path=index.path)


def is_safetensors(f: ReadableFile) -> bool:
    """Whether the file starts like a safetensors file (a length, then a JSON object)."""
    head = f.pread(0, 9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 0 < n <= f.size - 8


__all__ = ["is_safetensors", "scan_safetensors", "verify_safetensors_crc"]
