"""What ``ckptstore info`` reports, as JSON-able dicts (the CLI only formats them).

The dict shapes are part of the public interface (``ckptstore info --json``):

* checkpoint file: ``{"kind": "checkpoint", "path", "size", "crc": int|null,
  "params": {name: {"dtype", "shape", "nbytes"}}}``
* strategy: ``{"kind": "strategy", "paths", "world_size", "stage_devices", "num_stages",
  "params": {name: {"stages": {stage: {"dev_matrix", "tensor_map", "opt_shard_step",
  "opt_shard_size"}}}}}``; with a rank, each param also has ``"split"`` (parts per axis, and
  ``"opt_shard_parts"``) and, when rank files are given, ``"global_shape"`` and ``"box"``
  (``{"start": [...], "stop": [...]}``, or null when the rank does not hold it); when rank
  files are given, ``"unsaved"`` lists the parameters no rank file holds (a filtered save).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptstore.checkpoint.layout import layout_to_json
from ckptstore.checkpoint.rank_files import scan_rank_file
from ckptstore.checkpoint.source import DistributedSource
from ckptstore.checkpoint.strategy import Strategy
from ckptstore.dtypes import dtype_name
from ckptstore.formats.ckpt_reader import CkptIndex
from ckptstore.io import is_url, open_location, open_user_file
from ckptstore.store.kinds import WORK_DIR, manifest_files, read_manifest, store_kind

if TYPE_CHECKING:
    from ckptstore.store.store import Store

#: First byte of a checkpoint (Checkpoint.value, field 1 length-delimited) and of a strategy
#: file (ParallelStrategyMap.current_stage, field 1 varint). Both are often named ``*.ckpt``.
_CHECKPOINT_FIRST_BYTE = 0x0A
_STRATEGY_FIRST_BYTE = 0x08


def sniff_kind(path: str | os.PathLike[str]) -> str:
    """Return ``"store"``, ``"strategy"``, or ``"checkpoint"`` for a path given to ``info``.

    Strategy files and checkpoints are both protobuf and both often end in ``.ckpt``; their
    first byte tells them apart. JSON files are strategies; directories are stores, except a
    folder of strategy files only (MindFormers' ``strategy/``: no store metadata, no work
    folder, no ``rank_<i>/``), which is a strategy.
    """
    if is_url(path):
        url = str(path)
        if url.endswith(".json"):
            return "strategy"
        location = open_location(url)
        if read_manifest(location) is not None:
            return "store"
        folders, files = location.list()
        if folders or files:  # a prefix holding objects: a store or an unfinished one, which open() names
            return "store"
        f = open_user_file(url)
        first = f.pread(0, 1)
        return "strategy" if first and first[0] == _STRATEGY_FIRST_BYTE else "checkpoint"
    p = Path(path)
    if p.is_dir():
        return "strategy" if _strategy_folder(p) else "store"
    if p.suffix == ".json":
        return "strategy"
    with open(p, "rb") as fh:
        first = fh.read(1)
    return "strategy" if first and first[0] == _STRATEGY_FIRST_BYTE else "checkpoint"


def _strategy_folder(p: Path) -> bool:
    names = [e.name for e in os.scandir(p)]
    if any(n in (*manifest_files(), WORK_DIR) or n.startswith("rank_") for n in names):
        return False
    return any(n.endswith((".ckpt", ".json")) for n in names)


def describe_checkpoint(index: CkptIndex | str | os.PathLike[str]) -> dict[str, Any]:
    """Parameters, dtypes, shapes and byte counts of one ``.ckpt`` or ``.safetensors`` file (headers only)."""
    idx = index if isinstance(index, CkptIndex) else scan_rank_file(index)
    params = {
        e.name: {"dtype": "str" if e.is_str else dtype_name(e.dtype), "shape": list(e.shape), "nbytes": e.nbytes}
        for e in idx.entries.values()
    }
    return {"kind": "checkpoint", "path": idx.path, "size": idx.size, "crc": idx.stored_crc, "params": params}


def describe_strategy(strategy: Strategy, *, rank: int | None = None,
                      source: DistributedSource | None = None) -> dict[str, Any]:
    """Each parameter's layout; with ``rank``, its split there; with ``source``, its global box."""
    params: dict[str, dict[str, object]] = {}
    for name, stages in strategy.layouts.items():
        item: dict[str, object] = {"stages": {str(s): layout_to_json(lay) for s, lay in stages.items()}}
        if rank is not None:
            layout = strategy.layout(name, rank)
            item["split"] = None if layout is None else {
                "parts_per_axis": list(layout.splits()), "opt_shard_parts": layout.opt_shard_parts()}
            if source is not None and name in source.params:
                shape = source.params[name].shape
                box = strategy.box(name, rank, shape)
                item["global_shape"] = list(shape)
                item["box"] = None if box is None else {"start": list(box.start), "stop": list(box.stop)}
        params[name] = item
    return {"kind": "strategy", "paths": list(strategy.sources), "world_size": strategy.world_size,
            "stage_devices": strategy.stage_devices, "num_stages": strategy.num_stages,
            **({"rank": rank} if rank is not None else {}),
            **({"unsaved": list(source.unsaved)} if source is not None else {}), "params": params}


def describe_store(store: Store) -> dict[str, Any]:
    """Parameters of a converted store: shape, dtype, bytes, chunk grid, and dedup savings.

    ``{"kind": "store", "path", "store_kind": "zarr"|"safetensors"|"index", "source": {...}, "params": {name:
    {"dtype", "shape", "nbytes", "stored_bytes", "chunk_shape", "chunks", "codec"}}, "totals": {"nbytes",
    "stored_bytes", "source_bytes", "dedup_saved_bytes"}}``; ``source_bytes`` counts every replica the
    source rank files held; ``source["unsaved"]`` names what the source strategy laid out but no rank
    file held (a filtered save), so the store does not hold it either. An index stores no tensor
    bytes: its ``stored_bytes`` are 0, and ``referenced_bytes`` (per parameter and in the totals) are
    the rank-file bytes it refers to. ``"kind"`` says what ``info`` describes (a store, a
    checkpoint, a strategy), so the store's own kind is ``"store_kind"`` (``Store.kind``, the
    manifest's ``"kind"``).
    """
    params: dict[str, dict[str, object]] = {}
    nbytes = stored = source = 0
    kind = store_kind(store.kind)
    is_index = kind is not None and not kind.stores_data  # the chunks are bytes of the rank files
    for name in store.names():
        p = store.info(name)
        if p.is_str:
            params[name] = {"dtype": "str", "shape": [], "nbytes": 0, "stored_bytes": 0, "value": p.value}
            continue
        item = p.np_dtype.itemsize
        replicated = sum(p.chunk_box(i).size * item * r for i, r in enumerate(p.chunks.replicas))
        params[name] = {"dtype": p.dtype, "shape": list(p.shape), "nbytes": p.nbytes,
                        "stored_bytes": 0 if is_index else p.stored_bytes, "chunk_shape": list(p.chunk_shape),
                        "chunks": len(p.chunks), "codec": p.codec}
        if is_index:
            params[name]["referenced_bytes"] = p.stored_bytes
        nbytes += p.nbytes
        stored += p.stored_bytes
        source += replicated
    src = store.source
    totals = {"nbytes": nbytes, "stored_bytes": 0 if is_index else stored, "source_bytes": source,
              "dedup_saved_bytes": source - nbytes}
    if is_index:
        totals["referenced_bytes"] = stored
    return {"kind": "store", "path": str(store.root), "store_kind": store.kind,
            "source": {**{k: src.get(k) for k in ("world_size", "step", "created_by", "saved_by")},
                       "unsaved": list(src.get("unsaved") or []), **_hf_source(store),
                       **({"incremental": True} if src.get("incremental") else {})},
            "params": params, "totals": totals}


def _hf_source(store: Store) -> dict[str, object]:
    """For an index over a Hugging Face folder: ``format`` (``"huggingface"``), the ``folder``, the
    ``files`` its tensors are read from and the ``name_map`` it was indexed with (a shipped one by
    its name); nothing for any other store."""
    src = store.source
    if src.get("format") != HF_FORMAT:
        return {}
    recorded = src.get("name_map")
    name_map = recorded[:-len(SHIPPED)] if isinstance(recorded, str) and recorded.endswith(SHIPPED) else recorded
    files = {f for p in store.manifest.params.values() for f in p.chunks.files}
    return {"format": HF_FORMAT, "folder": src.get("folder"), "files": len(files), "name_map": name_map}


#: ``source["format"]`` of an index over a Hugging Face folder (``write/hf_index.py``'s ``SOURCE_FORMAT``).
HF_FORMAT = "huggingface"
#: How a shipped rule set is recorded (``"llama (shipped)"``).
SHIPPED = " (shipped)"
