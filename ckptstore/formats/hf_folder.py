"""A Hugging Face model folder, read as metadata: which tensors, in which shard, at which bytes.

A folder saved by ``save_pretrained`` holds ``model.safetensors`` or shards
``model-0000x-of-0000y.safetensors`` with ``model.safetensors.index.json`` (``{"metadata": ...,
"weight_map": {tensor: shard file}}``), and ``config.json``. :func:`read_hf_folder` reads the
index, every shard's safetensors header (:mod:`ckptstore.formats.safetensors_header`) and the
config, and no payload. Everything in them is untrusted: documents are read with a size bound,
shard names must be plain names inside the folder (:func:`~ckptstore.io.base.check_key`), every
tensor the index names must be in the shard it names, and the headers are validated as the
safetensors library does.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptstore.errors import CorruptCheckpointError, MissingFileError, UnsafePathError
from ckptstore.formats.safetensors_header import TensorInfo, parse_header
from ckptstore.io.base import ByteSource, check_key
from ckptstore.limits import MAX_NAME_BYTES

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
#: Largest index.json / config.json read (a 1T-parameter model's index is a few MB).
MAX_INDEX_BYTES = 256 << 20
MAX_CONFIG_BYTES = 4 << 20
#: Most tensors and shard files of one folder.
MAX_TENSORS = 1 << 22
MAX_SHARDS = 1 << 16


@dataclass(frozen=True)
class HFTensor:
    """One tensor of the folder: its shard (a key of the folder) and where its bytes are."""

    name: str
    file: str
    info: TensorInfo


@dataclass(frozen=True)
class HFFolder:
    """The tensors of a Hugging Face folder, in index order (a shard's file order without one),
    and its ``config.json`` (empty when absent)."""

    url: str
    tensors: Mapping[str, HFTensor]
    files: tuple[str, ...]
    config: Mapping[str, Any] = field(default_factory=dict)


def _json(source: ByteSource, key: str, limit: int) -> Any:
    raw = source.read_bytes(key, limit=limit)
    if raw is None:
        return None
    if len(raw) > limit:
        raise CorruptCheckpointError(f"{key} is larger than {limit} bytes", path=source.key_url(key))
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CorruptCheckpointError(f"{key} is not valid JSON: {e}", path=source.key_url(key)) from None


def read_hf_folder(source: ByteSource) -> HFFolder:
    """Read the folder ``source`` is rooted at (local or a bucket prefix): index, headers, config.

    Raises :class:`~ckptstore.errors.MissingFileError` when it has neither an index nor
    ``model.safetensors``, :class:`~ckptstore.errors.UnsafePathError` for a shard name that
    leaves the folder, and :class:`~ckptstore.errors.CorruptCheckpointError` naming the file
    and tensor for anything malformed.
    """
    index = _json(source, INDEX_FILE, MAX_INDEX_BYTES)
    if index is not None:
        weight_map = _weight_map(index, source.key_url(INDEX_FILE))
    elif source.stat(SINGLE_FILE) is not None:
        weight_map = None
    else:
        raise MissingFileError(f"{source.url} is not a Hugging Face model folder: it has neither {INDEX_FILE} nor "
                               f"{SINGLE_FILE}")
    files = list(dict.fromkeys(weight_map.values())) if weight_map is not None else [SINGLE_FILE]
    headers: dict[str, dict[str, TensorInfo]] = {}
    for key in files:
        try:
            if source.stat(key) is None:
                raise MissingFileError(f"shard {source.key_url(key)} named by {INDEX_FILE} does not exist")
            opened = source.open(key)
        except UnsafePathError as e:
            # the names passed check_key: what is refused is a symbolic link, as a Hugging Face cache
            # snapshot holds (every file a link into ../../blobs); say how to get real files
            raise UnsafePathError(f"{e}; a Hugging Face cache snapshot links its files into ../../blobs: index a "
                                  "copy with real files (cp -rL SNAPSHOT DIR, or huggingface-cli download "
                                  "--local-dir DIR)") from None
        _, headers[key] = parse_header(opened)
    if weight_map is None:
        weight_map = {name: SINGLE_FILE for name in headers[SINGLE_FILE]}
    tensors: dict[str, HFTensor] = {}
    for name, key in weight_map.items():
        info = headers[key].get(name)
        if info is None:
            raise CorruptCheckpointError(f"{INDEX_FILE} puts tensor {name!r} in {key}, whose header does not have it",
                                         path=source.key_url(key), param=name)
        tensors[name] = HFTensor(name, key, info)
    config = _json(source, CONFIG_FILE, MAX_CONFIG_BYTES)
    if config is not None and not isinstance(config, dict):
        raise CorruptCheckpointError(f"{CONFIG_FILE} is not a JSON object", path=source.key_url(CONFIG_FILE))
    return HFFolder(source.url, tensors, tuple(files), config or {})


def _weight_map(index: Any, where: str) -> dict[str, str]:
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise CorruptCheckpointError(f"{INDEX_FILE} has no 'weight_map' object of tensor names to shard files",
                                     path=where)
    if len(wm) > MAX_TENSORS:
        raise CorruptCheckpointError(f"{INDEX_FILE} lists {len(wm)} tensors, more than {MAX_TENSORS}", path=where)
    out: dict[str, str] = {}
    for name, key in wm.items():
        if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or not isinstance(key, str):
            raise CorruptCheckpointError(f"{INDEX_FILE} maps tensor {name[:80]!r} to {key!r}, not a shard file name",
                                         path=where, param=name[:80])
        try:
            check_key(key, where)
        except UnsafePathError as e:
            raise UnsafePathError(f"{e} (tensor {name!r} of {INDEX_FILE})") from None
        if "/" in key:
            raise UnsafePathError(f"{INDEX_FILE} puts tensor {name!r} in {key!r}: a shard must be a file of the folder "
                                  "itself")
        out[name] = key
    if len(set(out.values())) > MAX_SHARDS:
        raise CorruptCheckpointError(f"{INDEX_FILE} names more than {MAX_SHARDS} shard files", path=where)
    return out

