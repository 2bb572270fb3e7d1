"""Seeded synthetic PanGu-Alpha-shaped distributed checkpoints, written by MindSpore and cached.

A :class:`Synth` is one source checkpoint: ``rank_<i>/pangu-1_1.ckpt`` for every rank of a
``dp x mp`` mesh plus its ``strategy.ckpt``, saved by ``mindspore.save_checkpoint`` through
:func:`ckptstore.testing.sample_checkpoint.save_distributed` (local slices cut by MindSpore's own slicing code,
strategy written as the parallel compiler writes it), for a
:func:`ckptstore.testing.sample.pangu_specs` model whose global tensors (weights and both Adam
moments) add up to about the requested size.

Memory stays bounded: the parameters are saved in groups of at most ``GROUP_BYTES`` global
bytes, each group into its own temporary ``rank_<i>/`` files which are appended to the final
ones. A ``.ckpt`` without a CRC trailer is the concatenation of its records, so the result is
byte for byte what one ``save_distributed`` call on all parameters writes (checked by
:func:`check_grouped_save` on a small model), at the cost of one group in memory instead of the
whole model plus every rank's slices.

Everything derived from the checkpoint is cached next to it on first use: target strategies
(:meth:`Synth.target_strategy`), the ckptstore store (:meth:`Synth.store`) and an index of the
rank files (:meth:`Synth.index_store`), the flat file of
one target rank's bytes for the lower bound (:meth:`Synth.flat_file`), and MindSpore's unified
safetensors (:meth:`Synth.unified_dir`). The cache key holds every parameter (size, meshes,
seed, generator version); a directory only gets its final name once complete.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CACHE_DIR = Path(__file__).resolve().parent / "cache"
#: Bump when the layout or the values change, so stale cached checkpoints are not reused.
GENERATOR_VERSION = 1
#: Largest group of parameters (global bytes) generated and saved at once.
GROUP_BYTES = 256 << 20
PREFIX, STEP_SUFFIX = "pangu", "-1_1"
SEQ = 64
_HIDDEN_GRAIN = 64  # hidden is a multiple of this: even splits up to dp * mp = 64


@contextlib.contextmanager
def cache_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root`` (a cached checkpoint) while creating files in it, so two
    benchmark runs (or the quick test beside a real run) never write the same cache entry."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True, order=True)
class Mesh:
    """A ``dp x mp`` device mesh (the data- and model-parallel sizes of a layout)."""

    dp: int
    mp: int

    @property
    def world(self) -> int:
        return self.dp * self.mp

    @property
    def tag(self) -> str:
        return f"dp{self.dp}xmp{self.mp}"

    def __str__(self) -> str:
        return f"{self.world} (dp{self.dp}×mp{self.mp})"


def source_mesh(world: int) -> Mesh:
    """The source layout used for a world size: 4 = dp1×mp4, 8 = dp2×mp4, 16 = dp2×mp8, 32 = dp4×mp8."""
    mp = 4 if world <= 8 else 8
    mp = min(mp, world)
    if world % mp:
        raise ValueError(f"source world size {world} is not a multiple of mp={mp}")
    return Mesh(world // mp, mp)


def target_mesh(world: int) -> Mesh:
    """The target layout used for a world size: pure model parallel up to 8, then dp × mp8."""
    mp = min(world, 8)
    if world % mp:
        raise ValueError(f"target world size {world} is not a multiple of mp={mp}")
    return Mesh(world // mp, mp)


def parse_mesh(text: str, *, source: bool) -> Mesh:
    """``"8"`` (the default mesh of that world size) or ``"2x4"`` (dp × mp)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[x×*]\s*(\d+))?\s*", text)
    if not m:
        raise ValueError(f"cannot read world size {text!r}; write e.g. 8 or 2x4 (dp x mp)")
    if m.group(2):
        return Mesh(int(m.group(1)), int(m.group(2)))
    return (source_mesh if source else target_mesh)(int(m.group(1)))


@dataclass(frozen=True)
class Dims:
    """PanGu-Alpha dimensions."""

    hidden: int
    layers: int
    vocab: int


def _weight_params(d: Dims) -> int:
    """Trainable parameter count of :func:`ckptstore.testing.sample.pangu_specs` with these dims."""
    h = d.hidden
    per_layer = 12 * h * h + 13 * h  # q/k/v/proj + FFN matrices; 9 biases/norm vectors of h, one of 4h
    return d.layers * per_layer + (d.vocab + SEQ + 2) * h


def choose_dims(total_bytes: int, *, itemsize: int = 4, min_vocab: int = 64) -> Dims:
    """Dims whose weights and two Adam moments hold about ``total_bytes`` bytes.

    Proportions follow PanGu-Alpha 2.6B (hidden ≈ 80 × layers; the rest of the bytes go to the
    replicated word embedding, ~12% of the weights): layers from the size, hidden a multiple of
    64 so every split up to dp × mp = 64 is even, and ``vocab`` absorbing the remainder so the
    size is met closely.
    """
    params = total_bytes / (3 * itemsize)
    layers = max(2, round((0.88 * params / (12 * 80 * 80)) ** (1 / 3)))
    hidden = max(_HIDDEN_GRAIN, int(math.sqrt(0.88 * params / (12 * layers)) // _HIDDEN_GRAIN * _HIDDEN_GRAIN))
    while True:
        rest = params - _weight_params(Dims(hidden, layers, 0))
        vocab = int(rest // hidden)
        if vocab >= min_vocab or (hidden == _HIDDEN_GRAIN and layers == 1):
            return Dims(hidden, layers, max(vocab, min_vocab))
        if hidden > _HIDDEN_GRAIN:
            hidden -= _HIDDEN_GRAIN
        else:
            layers -= 1


def specs_for(dims: Dims, mesh: Mesh) -> list[Any]:
    """The PanGu parameter specs on ``mesh`` (optimizer sharding on, Adam moments, counters)."""
    from ckptstore.testing.sample import pangu_specs

    return pangu_specs(hidden=dims.hidden, layers=dims.layers, vocab=dims.vocab, seq=SEQ, dp=mesh.dp, mp=mesh.mp,
                       opt_shard=True)


@dataclass(frozen=True)
class Synth:
    """One cached synthetic distributed checkpoint and the files derived from it."""

    root: Path
    size: int
    src: Mesh
    seed: int
    dims: Dims

    # ---- the source checkpoint ---------------------------------------------------------
    @property
    def ckpt_dir(self) -> Path:
        return self.root / "ckpt"

    @property
    def strategy(self) -> Path:
        return self.ckpt_dir / "strategy.ckpt"

    def rank_file(self, rank: int) -> Path:
        return self.ckpt_dir / f"rank_{rank}" / f"{PREFIX}{STEP_SUFFIX}.ckpt"

    @property
    def rank_files(self) -> list[Path]:
        return [self.rank_file(r) for r in range(self.src.world)]

    @property
    def rank_file_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.rank_files)

    @property
    def specs(self) -> list[Any]:
        return specs_for(self.dims, self.src)

    @property
    def model_bytes(self) -> int:
        from ckptstore.testing.sample import model_bytes

        return model_bytes(self.specs)

    def describe(self) -> dict[str, Any]:
        """JSON-able facts about this checkpoint, recorded with every result."""
        return {"size_requested": self.size, "model_bytes": self.model_bytes, "src": asdict(self.src),
                "src_world": self.src.world, "seed": self.seed, **asdict(self.dims),
                "params": len(self.specs), "rank_file_bytes": self.rank_file_bytes, "root": str(self.root)}

    # ---- derived, cached ---------------------------------------------------------------
    def target_strategy(self, mesh: Mesh) -> Path:
        """The strategy file of the same parameters on ``mesh`` (no optimizer sharding)."""
        from ckptstore.testing import sample_checkpoint as testing
        from ckptstore.testing.sample import relayout

        path = self.root / "targets" / f"strategy_{mesh.tag}.ckpt"
        with cache_lock(self.root):
            if not path.exists():
                tmp = path.with_name(path.name + ".partial")
                testing.write_strategy(tmp, relayout(self.specs, dp=mesh.dp, mp=mesh.mp))
                os.replace(tmp, path)
        return path

    def store(self) -> Path:
        """The ckptstore Zarr store converted from the rank files (converted once)."""
        import ckptstore

        path = self.root / "store.zarr"
        with cache_lock(self.root):
            try:
                ckptstore.open(path).close()
            except Exception:  # missing, or written by an older ckptstore: convert again
                shutil.rmtree(path, ignore_errors=True)
                ckptstore.convert(self.ckpt_dir, path, strategy=[self.strategy], overwrite=True)
        return path

    def index_store(self) -> Path:
        """The ckptstore *index* of the rank files (``ckptstore.index``, no checksums): a store
        holding only a manifest of byte ranges in the rank files, made once, beside :meth:`store`.
        Made again when it no longer opens (e.g. the rank files were written anew)."""
        import ckptstore

        path = self.root / "index.ckptstore"
        with cache_lock(self.root):
            try:
                ckptstore.open(path).close()
            except Exception:  # missing, stale (rank files changed) or written by an older ckptstore
                shutil.rmtree(path, ignore_errors=True)
                ckptstore.index(self.ckpt_dir, path, strategy=[self.strategy], overwrite=True)
        return path

    def rank_nbytes(self, mesh: Mesh, rank: int) -> int:
        """Bytes of the tensors rank ``rank`` of ``mesh`` holds (the denominator of every ratio)."""
        import ckptstore

        return int(ckptstore.plan_rank(self.store(), self.target_strategy(mesh), rank).nbytes)

    def flat_file(self, mesh: Mesh, rank: int, names_file: Path) -> Path:
        """One file holding exactly rank ``rank``'s slices of ``mesh``, back to back in the order of
        ``names_file`` (the rank's tensors: ``benchmarks.contenders.write_names_file``), the lower bound."""
        import glob

        import ckptstore

        path = self.root / "flat" / f"{mesh.tag}_rank{rank}.bin"
        store, strategy = self.store(), self.target_strategy(mesh)
        with cache_lock(self.root):
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                names = [row[0] for row in json.loads(Path(names_file).read_text(encoding="utf-8"))]
                tmp = path.with_name(path.name + ".partial")
                with open(tmp, "wb") as f:
                    for batch in _batches(names, 64):  # a few tensors at a time: memory stays small
                        got = ckptstore.read_rank(store, strategy, rank, names=[glob.escape(n) for n in batch])
                        for name in batch:
                            f.write(memoryview(got[name].reshape(-1).view("uint8")))
                        del got
                os.replace(tmp, path)
        return path

    def safetensors_dir(self) -> Path:
        """``mindspore.ckpt_to_safetensors`` of the rank files (``rank_<i>/*.safetensors``)."""
        path = self.root / "safetensors"
        with cache_lock(self.root):
            if not path.exists():
                from benchmarks.contenders import patched_mindspore

                ms = patched_mindspore()  # see contenders.MEMORY_CHECK_NOTE
                tmp = self.root / "safetensors_partial"
                shutil.rmtree(tmp, ignore_errors=True)
                ms.ckpt_to_safetensors(str(self.ckpt_dir), str(tmp))
                os.replace(tmp, path)
        return path

    def unified_dir(self) -> Path:
        """``mindspore.parallel.unified_safetensors`` of :meth:`safetensors_dir` (global tensors)."""
        path = self.root / "unified"
        src = self.safetensors_dir()
        with cache_lock(self.root):
            if not path.exists():
                from benchmarks.contenders import patched_mindspore

                ms = patched_mindspore()
                tmp = self.root / "unified_partial"
                shutil.rmtree(tmp, ignore_errors=True)
                ms.parallel.unified_safetensors(str(src), str(self.strategy), str(tmp))
                os.replace(tmp, path)
        return path


def _batches(items: Sequence[Any], n: int) -> list[list[Any]]:
    return [list(items[i:i + n]) for i in range(0, len(items), n)]


def synth(size: int, src: Mesh, seed: int = 0, *, cache_dir: Path = CACHE_DIR) -> Synth:
    """The cached checkpoint of about ``size`` model bytes on ``src``, written on first use."""
    dims = choose_dims(size)
    root = Path(cache_dir) / f"pangu-v{GENERATOR_VERSION}-{size}B-{src.tag}-seed{seed}"
    s = Synth(root, size, src, seed, dims)
    with cache_lock(root):
        if not (root / "ckpt" / "DONE").exists():
            _write_source(s)
    return s


# ---------------------------------------------------------------------------------------------
# generation


def _groups(specs: Sequence[Any], max_bytes: int) -> list[list[Any]]:
    """Consecutive specs in groups of at most ``max_bytes`` global bytes (a bigger spec alone);
    each group holds at least one parameter in the strategy (``save_distributed`` needs one)."""
    from math import prod

    groups: list[list[Any]] = []
    size = 0
    for s in specs:
        nbytes = prod(s.shape) * s.np_dtype.itemsize
        if groups and size + nbytes <= max_bytes:
            groups[-1].append(s)
            size += nbytes
        else:
            groups.append([s])
            size = nbytes
    merged: list[list[Any]] = []
    for g in groups:
        if merged and not any(s.in_strategy for s in g):
            merged[-1].extend(g)
        else:
            merged.append(g)
    return merged


def _write_source(s: Synth, *, group_bytes: int = GROUP_BYTES) -> None:
    os.environ.setdefault("GLOG_v", "3")
    from ckptstore.testing import sample_checkpoint as testing

    s.root.mkdir(parents=True, exist_ok=True)
    tmp = s.root / "ckpt.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(s.ckpt_dir, ignore_errors=True)
    specs = s.specs
    finals = [tmp / f"rank_{r}" / f"{PREFIX}{STEP_SUFFIX}.ckpt" for r in range(s.src.world)]
    for p in finals:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    for i, group in enumerate(_groups(specs, group_bytes)):
        tensors = testing.make_global_tensors(group, seed=s.seed)  # each parameter seeded by its name
        piece_root = tmp / f"group{i}"
        pieces = testing.save_distributed(piece_root, group, tensors, world_size=s.src.world, prefix=PREFIX,
                                          step_suffix=STEP_SUFFIX)
        del tensors
        for piece, final in zip(pieces, finals, strict=False):
            with open(piece, "rb") as src, open(final, "ab") as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
        shutil.rmtree(piece_root)
    testing.write_strategy(tmp / "strategy.ckpt", specs)
    (tmp / "synth.json").write_text(json.dumps({"dims": asdict(s.dims), "src": asdict(s.src), "seed": s.seed,
                                                "size": s.size, "version": GENERATOR_VERSION}), encoding="utf-8")
    (tmp / "DONE").write_text("", encoding="utf-8")
    os.replace(tmp, s.ckpt_dir)


def check_grouped_save(tmp_dir: Path, *, size: int = 4 << 20, mesh: Mesh = Mesh(2, 4)) -> bool:
    """Whether the grouped writer gives the same bytes as one ``save_distributed`` call (small model)."""
    from ckptstore.testing import sample_checkpoint as testing

    s = Synth(Path(tmp_dir) / "grouped", size, mesh, 0, choose_dims(size))
    _write_source(s, group_bytes=256 << 10)
    specs = s.specs
    direct = testing.save_distributed(Path(tmp_dir) / "direct", specs, testing.make_global_tensors(specs, 0),
                                      world_size=mesh.world, prefix=PREFIX, step_suffix=STEP_SUFFIX)
    same = all(a.read_bytes() == b.read_bytes() for a, b in zip(s.rank_files, direct, strict=False))
    return same and s.strategy.read_bytes() == (Path(tmp_dir) / "direct" / "strategy.ckpt").read_bytes()
