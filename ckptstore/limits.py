"""Bounds on every number ckptstore reads from a file before that number sizes anything.

Checkpoints, strategy files and store metadata are data, not trust: a flipped byte or a hostile
file can claim 2^40 devices, a billion dimensions or an exabyte tensor. Each such number is
checked here against a limit far above anything a real job has, before it sizes a list, an
allocation or a loop, so a bad file costs a typed error, never memory or time.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

#: Ranks of one job (the largest Ascend clusters have ~10^5 cards).
MAX_WORLD = 1 << 20
#: Dimensions of one tensor, and entries of one device matrix / tensor map.
MAX_NDIM = 64
#: Bytes of one tensor (1 PiB).
MAX_TENSOR_BYTES = 1 << 50
#: Chunks of one parameter in a store.
MAX_CHUNKS = 1 << 24
#: Bytes of a parameter name, a type string or a file name in metadata.
MAX_NAME_BYTES = 1 << 16
#: Bytes of one string value (``append_dict`` text) read into memory.
MAX_STR_BYTES = 64 << 20
#: Bytes of a metadata document read whole: a store manifest, a strategy file, a safetensors header.
MAX_METADATA_BYTES = 2 << 30
#: Bytes of the JSON header of a safetensors file (the safetensors library refuses > 100 MB).
MAX_SAFETENSORS_HEADER = 100 << 20


def check(value: int, limit: int, what: str, error: Callable[[str], Exception]) -> int:
    """Return ``value`` if ``0 <= value <= limit``, else raise ``error(message)`` naming ``what``."""
    if not 0 <= value <= limit:
        raise error(f"{what} is {value}, outside the supported range 0..{limit}")
    return value


def product(values: Sequence[int], limit: int, what: str, error: Callable[[str], Exception]) -> int:
    """The product of ``values`` (each in ``0..limit``), raising ``error`` once it exceeds ``limit``.

    Multiplying step by step with a check keeps a hostile list of dimensions from building a
    huge integer before it is refused.
    """
    total = 1
    for v in values:
        if not 0 <= v <= limit:
            raise error(f"{what} {list(values)[:MAX_NDIM]} has an entry outside the supported range 0..{limit}")
        total *= v
        if total > limit:
            raise error(f"{what} {list(values)[:MAX_NDIM]} exceeds the supported limit {limit}")
    return total
