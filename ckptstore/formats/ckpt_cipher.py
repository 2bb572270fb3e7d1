"""Checkpoints saved with ``enc_key``: read as their plaintext, one encrypted block at a time.

``mindspore.save_checkpoint(..., enc_key=, enc_mode=)`` writes the checkpoint's bytes in blocks
of ``ENCRYPT_BLOCK_SIZE`` KiB (64 MiB), each encrypted on its own and framed as: the mode's magic
number (4 bytes, :data:`~ckptstore.formats.ckpt_reader.CIPHER_MAGICS`), for AES-GCM 16 more
bytes, the length of the rest of the block (int32 little-endian), the rest (IV and ciphertext).
:class:`DecryptedFile` serves the plaintext's byte ranges by decrypting the blocks that hold them
with MindSpore's own block decryption (``mindspore._c_expression._decrypt_data``, what
``load_checkpoint(dec_key=, dec_mode=)`` runs), so a conversion never holds more than a few
blocks in memory. Opening the file decrypts every block once to learn where its plaintext lies.
MindSpore is imported only when a file is decrypted.
"""
from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence

from ckptstore.errors import EncryptedCheckpointError, InvalidOptionError, ShortReadError
from ckptstore.formats.ckpt_reader import CIPHER_MAGICS
from ckptstore.formats.ckpt_reader import CRC_MAGIC as _CRC_MAGIC
from ckptstore.formats.ckpt_reader import CRC_TRAILER_BYTES as _CRC_TRAILER_BYTES
from ckptstore.io.base import ByteSource, ReadableFile, Request, SourceWrapper

#: The ``enc_mode`` values MindSpore writes.
MODES = tuple(CIPHER_MAGICS.values())
#: Decrypted plaintext kept per file: two of MindSpore's 64 MiB blocks (enough for a header scan
#: and the converter's workers reading nearby parameters), or every block of a smaller file.
CACHED_BYTES = 128 << 20
_KEY_LENGTHS = (16, 24, 32)


def check_key(key: bytes, mode: str | None) -> None:
    """Refuse a key MindSpore cannot use (16, 24 or 32 bytes) or an unknown mode, naming the option."""
    if not isinstance(key, (bytes, bytearray)) or len(key) not in _KEY_LENGTHS:
        raise InvalidOptionError(f"the decryption key must be 16, 24 or 32 bytes (as enc_key was), not "
                                 f"{len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__}")
    if mode is not None and mode not in MODES:
        raise InvalidOptionError(f"unknown decryption mode {mode!r}; choose one of {', '.join(MODES)}")


#: The largest key file read: the longest key and a trailing newline.
KEY_FILE_MAX = max(_KEY_LENGTHS) + 1


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The key in ``path``: its bytes, less one trailing newline when that makes a valid key length.
    ``path`` must be a regular file of at most :data:`KEY_FILE_MAX` bytes, checked before it is
    opened and again on the descriptor (opened non-blocking, so a FIFO or a device swapped in
    between cannot hang the run); anything else is an :class:`~ckptstore.errors.InvalidOptionError`."""
    _check_key_file(path, os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _check_key_file(path, os.fstat(fd))
        key = os.read(fd, KEY_FILE_MAX + 1)
    finally:
        os.close(fd)
    if len(key) - 1 in _KEY_LENGTHS and key.endswith(b"\n"):
        key = key[:-1]
    return key


def _check_key_file(path: str | os.PathLike[str], st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InvalidOptionError(f"--dec-key-file {os.fspath(path)} is not a regular file; give the file that "
                                 "holds the key")
    if st.st_size > KEY_FILE_MAX:
        raise InvalidOptionError(f"--dec-key-file {os.fspath(path)} is {st.st_size} bytes; a key file holds the "
                                 f"16, 24 or 32 bytes of the key (and at most one newline)")


#: MindSpore's own log lines of a block that does not decrypt (crypto.cc, pipeline_py.cc), which
#: its C++ code writes to file descriptor 2 at level ERROR whatever Python does with sys.stderr.
_DECRYPT_LOG = re.compile(rb"^\[ERROR\] (CORE|COMMON)\(.*\] (BlockDecrypt|Decrypt|PyDecryptData)\] ")
_STDERR_LOCK = threading.Lock()


def _flush_stderr() -> None:
    if sys.stderr is not None:  # None under pythonw
        sys.stderr.flush()


def _decrypt_block(block: bytes, key: bytes, mode: str) -> bytes | None:
    os.environ.setdefault("GLOG_v", "3")
    from mindspore._c_expression import _decrypt_data

    # A wrong key is reported once, by the caller's EncryptedCheckpointError: file descriptor 2 is
    # captured during the call and replayed without MindSpore's decryption log lines (anything
    # else written meanwhile, by any thread, is replayed as it was).
    with _STDERR_LOCK:
        _flush_stderr()
        try:
            saved = os.dup(2)
        except OSError:
            return _decrypt_data(block, len(block), key, len(key), mode)
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                return _decrypt_data(block, len(block), key, len(key), mode)
            finally:
                _flush_stderr()
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                kept = b"".join(line for line in captured.read().splitlines(keepends=True)
                                if not _DECRYPT_LOG.match(line))
                if kept:
                    os.write(2, kept)


class DecryptedFile(ReadableFile):
    """The plaintext of an encrypted checkpoint ``inner``, read block by block; thread-safe.

    Raises :class:`~ckptstore.errors.EncryptedCheckpointError` naming the file when it is not
    encrypted with ``mode``, a block is malformed, or the key does not decrypt it.
    """

    def __init__(self, inner: ReadableFile, secret: bytes, mode: str | None = None) -> None:
        check_key(secret, mode)
        self.inner, self.key = inner, inner.key
        found = CIPHER_MAGICS.get(inner.pread(0, 4))
        if found is None:
            raise EncryptedCheckpointError("a decryption key was given but the file is not encrypted (it does not "
                                           "start with the magic number of AES-GCM, AES-CBC or SM4-CBC)",
                                           path=inner.url, offset=0)
        if mode is not None and mode != found:
            raise EncryptedCheckpointError(f"the file is encrypted with {found}, not {mode}; pass --dec-mode {found}",
                                           path=inner.url, offset=0)
        self.mode, self._secret = found, bytes(secret)
        self._magic = inner.pread(0, 4)
        self._blocks: list[tuple[int, int, int, int]] = []  # (cipher offset, cipher bytes, plain offset, plain bytes)
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()
        plain = 0
        self._trailer = b""
        for offset, length in self._frames():
            data = self._decrypt(len(self._blocks), offset, length)
            self._blocks.append((offset, length, plain, len(data)))
            self._keep(len(self._blocks) - 1, data)
            plain += len(data)
        self._plain_end = plain
        self.size = plain + len(self._trailer)

    @property
    def url(self) -> str:
        return self.inner.url

    def _frames(self) -> list[tuple[int, int]]:
        skip = 16 if self.mode == "AES-GCM" else 0
        frames: list[tuple[int, int]] = []
        pos, size = 0, self.inner.size
        while pos < size:
            if size - pos == _CRC_TRAILER_BYTES and self.inner.pread(pos, len(_CRC_MAGIC)) == _CRC_MAGIC:
                # crc_check=True appends its trailer unencrypted after the blocks: kept after the plaintext
                self._trailer = self.inner.pread(pos, _CRC_TRAILER_BYTES)
                break
            head = self.inner.pread(pos, 8 + skip)
            if len(head) < 8 + skip or head[:4] != self._magic:
                raise EncryptedCheckpointError(f"encrypted block {len(frames)} does not start with the {self.mode} "
                                               "header (the file is cut short or damaged)", path=self.url, offset=pos)
            rest = int.from_bytes(head[4 + skip:8 + skip], "little", signed=True)
            end = pos + 8 + skip + rest
            if rest <= 0 or end > size:
                raise EncryptedCheckpointError(f"encrypted block {len(frames)} declares {rest} bytes, past the end of "
                                               "the file (cut short?)", path=self.url, offset=pos)
            frames.append((pos, end - pos))
            pos = end
        return frames

    def _decrypt(self, index: int, offset: int, length: int) -> bytes:
        data = _decrypt_block(self.inner.pread(offset, length), self._secret, self.mode)
        if data is None:
            raise EncryptedCheckpointError(
                f"encrypted block {index} does not decrypt with the key given ({self.mode}); is it the enc_key the "
                "checkpoint was saved with?", path=self.url, offset=offset)
        return data

    def _block(self, index: int) -> bytes:
        with self._lock:
            data = self._cache.get(index)
            if data is not None:
                self._cache.move_to_end(index)
                return data
        offset, length, _, _ = self._blocks[index]
        data = self._decrypt(index, offset, length)
        with self._lock:
            self._keep(index, data)
        return data

    def _keep(self, index: int, data: bytes) -> None:
        # least recently used first out; the block just decrypted always stays
        self._cache[index] = data
        self._cache.move_to_end(index)
        while len(self._cache) > 1 and sum(len(b) for b in self._cache.values()) > CACHED_BYTES:
            self._cache.popitem(last=False)

    def read_requests(self, requests: Sequence[Request]) -> None:
        starts = [b[2] for b in self._blocks]
        for offset, buf in requests:
            view = memoryview(buf).cast("B")
            if offset < 0 or offset + len(view) > self.size:
                raise ShortReadError(self.url, offset, len(view), self.size)
            done = 0
            while done < len(view):
                at = offset + done
                if at >= self._plain_end:
                    n = len(view) - done
                    view[done:] = self._trailer[at - self._plain_end:at - self._plain_end + n]
                    break
                i = _block_of(starts, at)
                data = self._block(i)
                lo = at - starts[i]
                n = min(len(view) - done, len(data) - lo)
                view[done:done + n] = data[lo:lo + n]
                done += n

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


#: What decrypts a source: the key, and the mode (``None``: the one the file's magic number names).
Decryption = tuple[bytes, "str | None"]


def open_decrypted(f: ReadableFile, decryption: Decryption | None) -> ReadableFile:
    """``f`` itself, or its plaintext when ``decryption`` is given."""
    return f if decryption is None else DecryptedFile(f, decryption[0], decryption[1])


def _block_of(starts: Sequence[int], offset: int) -> int:
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecryptingSource(SourceWrapper):
    """A byte source whose files are encrypted checkpoints, opened as their plaintext (each once)."""

    def __init__(self, inner: ByteSource, secret: bytes, mode: str | None) -> None:
        super().__init__(inner)
        check_key(secret, mode)
        self._secret, self._mode = bytes(secret), mode
        self._files: dict[str, DecryptedFile] = {}
        self._lock = threading.Lock()

    def open(self, key: str) -> ReadableFile:
        with self._lock:
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = DecryptedFile(self.inner.open(key), self._secret, self._mode)
            return f
