"""Helpers and fixtures shared by the converter tests (test_convert*.py, test_cli_convert.py).

Everything here works on real MindSpore files: checkpoints are what ``mindspore.save_checkpoint``
writes (the session layouts by ckptstore's byte-identical writer, see
:mod:`ckptstore.testing.layouts`), and damaged copies are re-saved the way a MindSpore load and
save would (:func:`rewrite_rank_file`). Expected values
(which rank holds which slice, how many distinct slices a parameter has, how many bytes the rank
files hold) are computed from the fixture specs with MindSpore's own slicing code
(:func:`mindspore_fixtures.mindspore_rank_slice`), never with ckptstore's layout math.

Test modules import the fixtures they use from here (``from convert_fixtures import ...``); the
session-wide ``saved_layout`` fixture comes from ``conftest.py``.
"""
from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ckptstore
import mindspore_fixtures as T
from ckptstore.testing import kill_at as kill_at_module
from ckptstore.testing.compare import assert_same_array, store_files  # noqa: F401  (re-exported for the test modules)
from ckptstore.write.convert import ConvertSummary
from conftest import SavedLayout

BF16 = np.dtype(ml_dtypes.bfloat16)
#: Scalars ``save_layout`` appends to every rank (``append_dict={"epoch_num": 1, "step_num": 1}``).
APPENDED = ("epoch_num", "step_num")
#: The zarr v3 sharding index: one (offset, nbytes) uint64 pair per chunk plus a 4-byte CRC-32C.
SHARD_INDEX_BYTES_PER_CHUNK = 16
SHARD_INDEX_CRC_BYTES = 4

REPO = Path(__file__).resolve().parents[1]
_CONSOLE_SCRIPT = Path(sys.executable).parent / "ckptstore"


# ---------------------------------------------------------------------------------------------
# comparing arrays and stores


def data_files(store: Path) -> dict[str, int]:
    """The store's data files (everything but ``zarr.json`` metadata): relative path -> size."""
    return {str(p.relative_to(store)): p.stat().st_size for p in sorted(store.rglob("*"))
            if p.is_file() and p.name != "zarr.json"}


def payload_bytes(store: Path) -> int:
    return sum(data_files(store).values())


def flip_byte(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# ---------------------------------------------------------------------------------------------
# expectations from the specs, by MindSpore's slicing


@dataclass(frozen=True)
class ExpectedSlice:
    """A distinct slice of one parameter: its local shape and the global ranks that hold it."""

    shape: tuple[int, ...]
    ranks: tuple[int, ...]


def _stage_ranks(spec: T.ParamSpec, world: int, stages: int) -> list[int]:
    per = world // stages
    if spec.stage == -1:
        return list(range(world))
    return list(range(spec.stage * per, (spec.stage + 1) * per))


def expected_slices(spec: T.ParamSpec, world: int, stages: int) -> list[ExpectedSlice]:
    """The distinct slices of ``spec``, found by cutting an index tensor with MindSpore's code.

    Each global element is numbered (``arange``); two ranks hold the same slice exactly when
    MindSpore hands them the same element numbers.
    """
    per = world // stages
    index = np.arange(prod(spec.shape), dtype=np.int64).reshape(spec.shape)
    groups: dict[bytes, list[int]] = {}
    shapes: dict[bytes, tuple[int, ...]] = {}
    for g in _stage_ranks(spec, world, stages):
        local = T.mindspore_rank_slice(spec, index, g % per)
        key = local.tobytes()
        groups.setdefault(key, []).append(g)
        shapes[key] = tuple(local.shape)
    return [ExpectedSlice(shapes[k], tuple(r)) for k, r in groups.items()]


@dataclass(frozen=True)
class Expected:
    """What a full conversion of a saved layout must produce, per parameter."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    slices: dict[str, list[ExpectedSlice]]

    def nbytes(self, name: str) -> int:
        return prod(self.shapes[name]) * self.dtypes[name].itemsize

    def chunks(self, name: str) -> int:
        return len(self.slices[name])

    def source_bytes(self, name: str) -> int:
        """Bytes of ``name`` summed over every rank file that holds it (replicas included)."""
        return sum(prod(s.shape) * self.dtypes[name].itemsize * len(s.ranks) for s in self.slices[name])

    def stored_bytes(self, name: str) -> int:
        """Raw (uncompressed) bytes of the parameter's data file: every distinct slice once,
        plus the shard index when it has several chunks."""
        n = self.chunks(name)
        index = n * SHARD_INDEX_BYTES_PER_CHUNK + SHARD_INDEX_CRC_BYTES if n > 1 else 0
        return self.nbytes(name) + index


def expected_for(layout: SavedLayout) -> Expected:
    shapes, dtypes, slices = {}, {}, {}
    for spec in layout.specs:
        shapes[spec.name] = tuple(spec.shape)
        dtypes[spec.name] = spec.np_dtype
        slices[spec.name] = expected_slices(spec, layout.world, layout.stages)
    for name in APPENDED:  # int appended by save_checkpoint: Int64, shape (), whole on every rank
        shapes[name] = ()
        dtypes[name] = np.dtype(np.int64)
        slices[name] = [ExpectedSlice((), tuple(range(layout.world)))]
    return Expected(shapes, dtypes, slices)


def expected_values(layout: SavedLayout) -> dict[str, np.ndarray]:
    values = dict(layout.tensors)
    for name in APPENDED:
        values[name] = np.array(1, dtype=np.int64)
    return values


# ---------------------------------------------------------------------------------------------
# converting and re-saving


def convert_layout(layout: SavedLayout, out: Path, **kwargs) -> ConvertSummary:
    return ckptstore.convert(layout.root, out, strategy=layout.strategy_files, **kwargs)


def strategy_args(layout: SavedLayout) -> list[str]:
    args: list[str] = []
    for f in layout.strategy_files:
        args += ["-s", str(f)]
    return args


def rewrite_rank_file(path: Path, edit: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]) -> None:
    """Load ``path``, let ``edit`` change the arrays, save it back: MindSpore's load_checkpoint /
    save_checkpoint round trip, done by ckptstore's reader (which reads what load_checkpoint
    reads) and CheckpointWriter (which writes the bytes save_checkpoint writes, mode 0400 too),
    so the tests that damage a fixture this way need no MindSpore."""
    from ckptstore.formats.ckpt_reader import read_entry, scan_checkpoint
    from ckptstore.formats.ckpt_writer import CheckpointWriter

    index = scan_checkpoint(path)
    arrays = edit({name: np.asarray(read_entry(path, e)) for name, e in index.entries.items()})
    os.chmod(path, 0o644)
    with CheckpointWriter(path) as w:
        for n, a in arrays.items():
            w.add(n, np.asarray(a))
    os.chmod(path, 0o400)


def copy_saved(layout: SavedLayout, dst: Path) -> SavedLayout:
    """A private, writable copy of a session fixture."""
    shutil.copytree(layout.root, dst)
    for p in dst.rglob("*.ckpt"):
        os.chmod(p, 0o644)
    return SavedLayout(layout.kind, dst, layout.specs, layout.tensors, layout.world, layout.stages,
                       layout.strategy_format)


# ---------------------------------------------------------------------------------------------
# the command line: in this process (click's CliRunner), or in a subprocess where the process is the point


def cli_command(kill_at: str | None = None) -> list[str]:
    """The installed ``ckptstore`` console script (``python -m ckptstore.cli`` if it is absent);
    with ``kill_at``, the CLI under :mod:`ckptstore.testing.kill_at`, killed at that point."""
    if kill_at is not None:
        return [sys.executable, "-m", "ckptstore.testing.kill_at", kill_at, "--"]
    if _CONSOLE_SCRIPT.exists():
        return [str(_CONSOLE_SCRIPT)]
    return [sys.executable, "-m", "ckptstore.cli"]


def run_cli(*args: str | os.PathLike[str], env: Mapping[str, str] | None = None,
            timeout: float | None = None, kill_at: str | None = None,
            process: bool = False) -> subprocess.CompletedProcess[str]:
    """``ckptstore ARGS`` from the repository folder: in this process by default
    (:func:`ckptstore.testing.kill_at.run_cli`: no interpreter start per call; an exception the CLI
    does not turn into a message is raised into the test). In a subprocess, as :func:`cli_command`
    gives it, with ``process=True`` (tests of the process: the installed script, its real stderr),
    ``kill_at`` (``"commit"``, ``"chunks:N"``: SIGKILLed there) or a ``timeout`` (tests whose
    failure would be a hang: the subprocess is ended after ``timeout`` seconds and the test fails)."""
    if not process and kill_at is None and timeout is None:
        return kill_at_module.run_cli(*args, env=env, cwd=REPO)
    full_env = {**os.environ, "GLOG_v": "3", **(env or {})}
    return subprocess.run([*cli_command(kill_at), *map(str, args)], capture_output=True, text=True, env=full_env,
                          cwd=REPO, timeout=120 if timeout is None else timeout)


# ---------------------------------------------------------------------------------------------
# fixtures


def big_specs() -> tuple[list[T.ParamSpec], int, int]:
    """dp2_mp4 plus two 8 MiB weights whose 2 MiB slices are cut into 1 MiB chunks by
    ``--chunk-mb 1``: enough chunks (59) to interrupt a conversion at interesting points."""
    specs, world, stages = T.layout_specs("dp2_mp4")
    d = (2, 4)
    big = [
        T.ParamSpec("big.rows", (4096, 512), dev_matrix=d, tensor_map=(0, -1)),
        T.ParamSpec("big.cols", (512, 4096), dev_matrix=d, tensor_map=(-1, 0)),
    ]
    return big + specs, world, stages


@pytest.fixture(scope="session")
def big_layout(tmp_path_factory: pytest.TempPathFactory) -> SavedLayout:
    """A session-cached saved fixture with many chunks at ``--chunk-mb 1``, written without
    MindSpore (its bytes are MindSpore's: tests/testing/test_pure_fixtures.py). Do not modify it."""
    specs, world, stages = big_specs()
    tensors = T.make_global_tensors(specs, seed=5)
    root = tmp_path_factory.mktemp("big_layout")
    T.save_distributed(root, specs, tensors, world_size=world, stages=stages, extra_scalars=True, writer="ckptstore")
    return SavedLayout("big", root, specs, tensors, world, stages)


@dataclass(frozen=True)
class Converted:
    """A saved layout and its default conversion."""

    layout: SavedLayout
    store: Path
    summary: ConvertSummary


@pytest.fixture(scope="session")
def converted(saved_layout, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Converted]:
    """``converted(kind, strategy_format="protobuf")``: a session-cached default conversion of
    ``saved_layout(kind)``. Do not modify the files."""
    cache: dict[tuple[str, str], Converted] = {}

    def get(kind: str, strategy_format: str = "protobuf") -> Converted:
        key = (kind, strategy_format)
        if key not in cache:
            layout = saved_layout(kind, strategy_format)
            out = tmp_path_factory.mktemp(f"store_{kind}_{strategy_format}") / "store.zarr"
            cache[key] = Converted(layout, out, convert_layout(layout, out))
        return cache[key]

    return get


def strategy_urls(layout, src_url: str) -> list[str]:
    """The URLs of ``layout``'s strategy files once its folder is uploaded to ``src_url``."""
    return [f"{src_url}/{f.relative_to(layout.root)}" for f in layout.strategy_files]


def s3_store(bucket, layout, kind: str) -> str:
    """A store of ``layout`` in the bucket: converted from local files (zarr), or an index of
    rank files uploaded to the bucket (index)."""
    if kind == "zarr":
        url = bucket.url("model.zarr")
        ckptstore.convert(layout.root, url, strategy=layout.strategy_files)
    else:
        src = bucket.url("ckpt")
        from ckptstore.testing import s3_server  # needs obstore: only the object-storage tests call this

        s3_server.upload(layout.root, src)
        url = bucket.url("model.index")
        ckptstore.index(src, url, strategy=strategy_urls(layout, src), checksum=True)
    return url
