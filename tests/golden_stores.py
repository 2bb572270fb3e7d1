"""Digests of every file of the stores ckptstore writes for the sample layouts: the byte-identical
guarantee of issue 34 (one writer pipeline must write exactly what the four writers before it did).

``python tests/golden_stores.py OUT.json`` (with ``PYTHONPATH`` at the revision to record) saves
the layouts with MindSpore, writes every store kind from them (convert to zarr and safetensors,
convert in two parts, index, save_rank from every rank, a zstd-compressed convert, a Hugging Face
``index --name-map``) and records each store's files as ``{relative path: sha256}``.
tests/data/golden_stores.json was recorded from 4ed4004 (before issue 34); test_golden_stores.py
compares today's output with it. Only the public API and the test helpers that 4ed4004 already
had are used, so the script runs unchanged on both revisions.

Normalised, because they legitimately differ between two runs of 4ed4004 (checked: with these
four normalised, two runs give the same digests; without ``fingerprint``, they do not):
* ``fingerprint``: a hash of the source files' identities (their modification times among them);
* ``mtime_ns``, ``ctime_ns``, ``ino``: the identity an index records for each source file;
* absolute paths of the scratch folders (the layouts' and the stores'), replaced by a token.
Each is masked in the bytes as written; everything else is compared byte for byte (a save is
given ``attempt="golden"``, so its attempt needs no mask).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The layouts whose stores are recorded (each under 2 MB).
LAYOUTS = ("dp2_mp4", "opt_shard", "pipeline2", "mixed_dtypes")
#: JSON fields whose values vary from run to run (see the module docstring), as they are written.
VARYING = re.compile(rb'"(fingerprint)": ?"[0-9a-f]*"|"(mtime_ns|ctime_ns|ino)": ?[0-9]+')


def _normalise(data: bytes, tmp: dict[str, str]) -> bytes:
    data = VARYING.sub(lambda m: b'"%s": "*"' % (m.group(1) or m.group(2)), data)
    for prefix, token in tmp.items():
        data = data.replace(prefix.encode(), token.encode())
    return data


def digest_tree(folder: Path, tmp: dict[str, str]) -> dict[str, str]:
    """``{path relative to folder: sha256}`` of every file under ``folder``, after the varying
    fields were masked and each prefix of ``tmp`` (a scratch folder) replaced by its token, in
    the bytes as written (so a JSON document's formatting counts too)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(folder))] = hashlib.sha256(_normalise(path.read_bytes(), tmp)).hexdigest()[:32]
    return out


def _local_slices(rank_file: Path) -> dict[str, Any]:
    from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint

    index = scan_checkpoint(str(rank_file))
    return {name: read_entry(str(rank_file), entry) for name, entry in index.entries.items()}


def build_stores(base: Path, layouts: Any) -> dict[str, Path]:
    """Write every store kind under ``base`` from ``layouts`` (``kind -> SavedLayout``); return
    ``{store id: folder}``."""
    import ckptstore

    stores: dict[str, Path] = {}
    for kind, layout in layouts.items():
        s = layout.strategy_files
        for fmt in ("zarr", "safetensors"):
            stores[f"{kind}/convert-{fmt}"] = out = base / kind / f"convert-{fmt}"
            ckptstore.convert(layout.root, out, strategy=s, format=fmt)
        stores[f"{kind}/convert-zarr-zstd"] = out = base / kind / "convert-zarr-zstd"
        ckptstore.convert(layout.root, out, strategy=s, compress="zstd")
        stores[f"{kind}/convert-zarr-parts"] = out = base / kind / "convert-zarr-parts"
        for i in range(2):
            ckptstore.convert(layout.root, out, strategy=s, part=f"{i}/2")
        stores[f"{kind}/index"] = out = base / kind / "index"
        ckptstore.index(layout.root, out, strategy=s)
        stores[f"{kind}/save"] = root = base / kind / "save"
        for rank in range(layout.world):
            ckptstore.save_rank(_local_slices(layout.rank_file(rank)), root, step=3, strategy=s, rank=rank,
                                attempt="golden")
    from ckptstore.testing.hf_folder import llama_config, llama_tensors, write_hf_folder

    config = llama_config()
    hf = write_hf_folder(base / "hf" / "src", llama_tensors(config, seed=3), shards=3, config=config)
    stores["hf/index-name-map"] = out = base / "hf" / "index"
    ckptstore.index(hf, out, name_map="llama")
    return stores


def digests(layouts: Any, work: Path) -> dict[str, dict[str, str]]:
    """The digests of every store, written under ``work`` from ``layouts`` (``kind -> SavedLayout``).
    An index records its source folder relative to itself: the layouts must be at
    ``work/../layouts/<kind>``, as :func:`main` puts them."""
    stores = build_stores(work, layouts)
    tmp = {str(layout.root): f"<{kind}>" for kind, layout in layouts.items()} | {str(work): "<work>"}
    return {sid: digest_tree(folder, tmp) for sid, folder in sorted(stores.items())}


def main() -> None:
    from ckptstore.testing.layouts import save_layout

    with tempfile.TemporaryDirectory() as tmp:
        layouts = {k: save_layout(Path(tmp) / "layouts" / k, k) for k in LAYOUTS}
        found = digests(layouts, Path(tmp) / "stores")
    Path(sys.argv[1]).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    main()
