"""The planner and the executor on stores written here with numpy (pure: no MindSpore, no converter).

Each example lays a random tensor out as a store would — chunked (each chunk contiguous, or in
two pieces in two files, as a tensor MindSpore wrote in several records) or dense (the whole
tensor in C order, as in safetensors) — plans random boxes and runs the plans: the result is
the tensor's box, the bytes read are exactly the plan's, and the plan's ranges tile the box.
"""
from __future__ import annotations

import itertools
from math import prod
from pathlib import Path

import crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptstore.boxes import Box
from ckptstore.io import LocalSource
from ckptstore.store.executor import IO_STATS, Executor, IOStats
from ckptstore.store.manifest import ChunkTable, ParamManifest, StoreManifest
from ckptstore.store.read_plan import ParamReadPlan, plan_param, plan_ranges
from ckptstore.store.store import Store
from conftest import examples


def _chunk_boxes(shape, chunk_shape):
    grid = [-(-n // c) for n, c in zip(shape, chunk_shape, strict=True)]
    for coords in itertools.product(*(range(g) for g in grid)):
        start = tuple(i * c for i, c in zip(coords, chunk_shape, strict=True))
        yield Box(start, tuple(min(s + c, n) for s, c, n in zip(start, chunk_shape, shape, strict=True)))


def write_store(root: Path, values: np.ndarray, chunk_shape, layout: str, seed: int) -> Store:
    """Lay ``values`` out under ``root`` as one parameter ``w`` of the given layout; open it."""
    rng = np.random.default_rng(seed)
    boxes = list(_chunk_boxes(values.shape, chunk_shape)) if values.shape else [Box((), ())]
    blobs = [np.ascontiguousarray(values[b.slices()]).tobytes() for b in boxes]
    crcs = tuple(crc32c.crc32c(b) for b in blobs)
    files, offsets, pieces = [], [], {}
    if layout == "dense":
        head = 24  # a header before the tensor, as in safetensors
        (root / "d.bin").write_bytes(bytes(head) + values.tobytes())
        item = values.dtype.itemsize
        strides = [prod(values.shape[a + 1:]) for a in range(values.ndim)]
        offsets = [head + sum(s * st for s, st in zip(b.start, strides, strict=True)) * item for b in boxes]
        table = ChunkTable(("d.bin",) * len(boxes), tuple(offsets), tuple(map(len, blobs)), crcs,
                           (0,) * len(boxes), (1,) * len(boxes))
        p = ParamManifest("w", "d.bin", values.dtype.name, values.shape, tuple(chunk_shape), table, None, None,
                          "dense", head)
    else:
        order = rng.permutation(len(blobs))  # chunks are stored in any order
        data = {"a.bin": bytearray(b"\xee" * 8), "b.bin": bytearray()}
        placed: dict[int, list] = {}
        for i in order.tolist():
            blob = blobs[i]
            cut = len(blob) // 2 if layout == "pieces" and len(blob) > 1 else len(blob)
            parts = [("a.bin", blob[:cut]), ("b.bin", blob[cut:])] if cut < len(blob) else [("a.bin", blob)]
            placed[i] = []
            for f, part in parts:
                placed[i].append((f, len(data[f]), len(part)))
                data[f] += part
        for f, d in data.items():
            (root / f).write_bytes(bytes(d))
        files = [placed[i][0][0] for i in range(len(blobs))]
        offsets = [placed[i][0][1] for i in range(len(blobs))]
        pieces = {i: tuple(ps) for i, ps in placed.items() if len(ps) > 1}
        table = ChunkTable(tuple(files), tuple(offsets), tuple(map(len, blobs)), crcs, (0,) * len(blobs),
                           (1,) * len(blobs), pieces)
        p = ParamManifest("w", "w", values.dtype.name, values.shape, tuple(chunk_shape), table)
    p.validate()
    manifest = StoreManifest.from_json(StoreManifest({"w": p}).to_json(), where=str(root))  # through JSON too
    return Store(LocalSource(root), manifest)


@st.composite
def case(draw):
    ndim = draw(st.integers(min_value=0, max_value=3))
    shape = tuple(draw(st.integers(min_value=1, max_value=7)) for _ in range(ndim))
    chunk = tuple(draw(st.integers(min_value=1, max_value=n)) for n in shape)
    dtype = draw(st.sampled_from(["uint8", "int16", "float32", "float64"]))
    start = tuple(draw(st.integers(min_value=0, max_value=n - 1)) for n in shape)
    stop = tuple(draw(st.integers(min_value=s + 1, max_value=n)) for s, n in zip(start, shape, strict=True))
    layout = draw(st.sampled_from(["chunks", "pieces", "dense"]))
    return shape, chunk, np.dtype(dtype), Box(start, stop), layout, draw(st.integers(0, 2**16))


_SETTINGS = settings(max_examples=examples(150), deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def _values(shape, dtype, seed) -> np.ndarray:
    return (np.random.default_rng(seed).integers(0, 200, size=shape) - 100).astype(dtype)


@_SETTINGS
@given(case())
def test_a_box_reads_exactly_its_values_and_bytes(tmp_path_factory, c):
    shape, chunk, dtype, box, layout, seed = c
    values = _values(shape, dtype, seed)
    store = write_store(tmp_path_factory.mktemp("s"), values, chunk, layout, seed)
    plan = store.plan("w", box)
    assert plan.nbytes == box.size * dtype.itemsize
    IO_STATS.reset()
    got = store.read("w", box.slices() if box.ndim else None)
    assert np.array_equal(got, values[box.slices()])
    assert IO_STATS.bytes_read == plan.nbytes


@_SETTINGS
@given(case())
def test_the_ranges_fill_every_destination_byte_once_from_inside_the_files(tmp_path_factory, c):
    shape, chunk, dtype, box, layout, seed = c
    root = tmp_path_factory.mktemp("s")
    store = write_store(root, _values(shape, dtype, seed), chunk, layout, seed)
    ranges = list(store.plan("w", box).ranges())
    covered = np.zeros(box.size * dtype.itemsize, dtype=np.int64)
    for key, offset, length, dest in ranges:
        assert length > 0 and 0 <= offset and offset + length <= (root / key).stat().st_size
        covered[dest:dest + length] += 1
    assert np.all(covered == 1)


@_SETTINGS
@given(case(), st.integers(min_value=1, max_value=64), st.integers(min_value=2, max_value=4))
def test_many_threads_and_tiny_units_read_the_same_values(tmp_path_factory, c, unit, workers):
    shape, chunk, dtype, box, layout, seed = c
    values = _values(shape, dtype, seed)
    store = write_store(tmp_path_factory.mktemp("s"), values, chunk, layout, seed)
    out = np.empty(box.shape, dtype=dtype)
    Executor(store.data, workers=workers, unit_bytes=unit, pool_min_bytes=0).run([(store.plan("w", box), out)])
    assert np.array_equal(out, values[box.slices()])


@_SETTINGS
@given(case(), st.sampled_from(["float64", "float16"]), st.booleans())
def test_converting_and_verifying_read_the_same_values(tmp_path_factory, c, out_dtype, verify):
    shape, chunk, dtype, box, layout, seed = c
    values = _values(shape, dtype, seed)
    store = write_store(tmp_path_factory.mktemp("s"), values, chunk, layout, seed)
    out = np.empty(box.shape, dtype=out_dtype)
    plan = plan_param(store.info("w"), box, out_dtype=np.dtype(out_dtype), verify=verify)
    Executor(store.data).run([(plan, out)])
    assert np.array_equal(out, values[box.slices()].astype(out_dtype))


def test_a_row_block_of_consecutive_chunks_is_one_range(tmp_path):
    values = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    root = tmp_path / "s"
    root.mkdir()
    (root / "a.bin").write_bytes(values.tobytes())
    n = 8
    table = ChunkTable(("a.bin",) * n, tuple(range(0, 2048, 256)), (256,) * n, tuple(range(n)), (0,) * n, (1,) * n)
    store = Store(LocalSource(root), StoreManifest({"w": ParamManifest("w", "w", "float32", (64, 8), (8, 8), table)}))
    assert list(store.plan("w", Box((4, 0), (60, 8))).ranges()) == [("a.bin", 4 * 32, 56 * 32, 0)]


def test_a_checksum_mismatch_names_the_parameter_chunk_and_file(tmp_path):
    values = np.arange(16, dtype=np.int16)
    root = tmp_path / "s"
    root.mkdir()
    store = write_store(root, values, (4,), "chunks", 0)
    data = bytearray((root / "a.bin").read_bytes())
    i = store.info("w").chunks.offsets[2]
    data[i] ^= 1
    (root / "a.bin").write_bytes(bytes(data))
    from ckptstore.errors import StoreCorruptError

    with pytest.raises(StoreCorruptError, match=r"checksum mismatch in chunk 2 of parameter 'w' \(file .*a.bin"):
        store.read("w", verify=True)


@st.composite
def byte_chunks(draw):
    """A one-dimensional byte array as a converter describes rank files: ``nbytes``-byte chunks,
    each one range or two pieces in two files, often right after the previous range of a file."""
    nbytes = draw(st.integers(min_value=1, max_value=9))
    chunks, end = [], {"a.bin": 0, "b.bin": 0}
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        cut = draw(st.integers(min_value=0, max_value=nbytes - 1))  # 0: one piece
        pieces = []
        for size in ([cut, nbytes - cut] if cut else [nbytes]):
            f = draw(st.sampled_from(["a.bin", "b.bin"]))
            offset = end[f] if draw(st.booleans()) else draw(st.integers(min_value=0, max_value=100))
            pieces.append((f, offset, size))
            end[f] = offset + size
        chunks.append(tuple(pieces))
    return nbytes, chunks


@settings(max_examples=300, deadline=None)
@given(byte_chunks())
def test_plan_ranges_is_what_plan_param_makes_of_the_index_like_manifest(c):
    nbytes, chunks = c
    n = len(chunks)
    table = ChunkTable(tuple(p[0][0] for p in chunks), tuple(p[0][1] for p in chunks), (nbytes,) * n, None,
                       (0,) * n, (1,) * n, {k: p for k, p in enumerate(chunks) if len(p) > 1})
    want = plan_param(ParamManifest("x", "x", "uint8", (n * nbytes,), (nbytes,), table))
    keys = ["a.bin", "b.bin"]
    flat = [piece for p in chunks for piece in p]
    got = plan_ranges("x", keys, [keys.index(f) for f, _, _ in flat], [o for _, o, _ in flat], [m for _, _, m in flat])
    assert sorted(got.ranges()) == sorted(want.ranges())  # the same ranges (plan_param's sorted by file offset)
    assert (got.box, got.dtype, got.nbytes) == (want.box, want.dtype, want.nbytes)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(byte_chunks())
def test_a_byte_ranges_plan_read_in_place_makes_the_calls_of_its_group(tmp_path, c):
    nbytes, chunks = c
    files = {name: np.random.default_rng(len(name)).integers(0, 256, 200, dtype=np.uint8)
             for name in ("a.bin", "b.bin")}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data.tobytes())
    keys = ["a.bin", "b.bin"]
    flat = [piece for p in chunks for piece in p]
    plan = plan_ranges("x", keys, [keys.index(f) for f, _, _ in flat], [o for _, o, _ in flat], [m for _, _, m in flat])
    want = np.concatenate([files[f][o:o + m] for f, o, m in flat])
    seen = []
    # in place from the plan's columns, then its group through the general path (a plain ParamReadPlan)
    for p in (plan, ParamReadPlan(plan.name, plan.dtype, plan.box, plan.keys, plan.groups, None)):
        out, stats = np.zeros(len(want), dtype=np.uint8), IOStats()
        with Executor(LocalSource(tmp_path), stats=stats) as ex:
            ex.submit(p, out).wait()
            assert stats.requests == ex.requests(p)
        assert np.array_equal(out, want)
        seen.append((stats.bytes_read, stats.reads, stats.requests, stats.files))
    assert seen[0] == seen[1]




def test_a_chunk_converted_to_another_dtype_is_read_through_one_block_of_scratch_at_a_time(tmp_path):
    from ckptstore.store.read_plan import CAST_BLOCK_BYTES

    values = np.random.default_rng(3).standard_normal((1024, 1024)).astype(np.float32)  # one 4 MiB chunk
    root = tmp_path / "s"
    root.mkdir()
    store = write_store(root, values, (1024, 1024), "chunks", 0)
    box = Box((10, 0), (1010, 1024))
    plan = plan_param(store.info("w"), box, out_dtype=np.dtype(np.float16))
    out, stats = np.empty(box.shape, dtype=np.float16), IOStats()
    Executor(store.data, stats=stats).run([(plan, out)])
    assert np.array_equal(out, values[10:1010].astype(np.float16))
    # 1000 rows of 4 KiB: blocks of 256 rows (1 MiB), not the whole overlap (4,096,000 bytes) at once
    assert CAST_BLOCK_BYTES == 1 << 20 and stats.scratch_peak == CAST_BLOCK_BYTES
    assert [g.scratch_nbytes for g in plan.groups] == [1 << 20] * 3 + [232 * 4096]
    assert plan.nbytes == stats.bytes_read == 1000 * 4096


@pytest.mark.parametrize("shape, limit", [((7, 5, 3), 4), ((7, 5, 3), 15), ((7, 5, 3), 40), ((7, 5, 3), 105),
                                          ((9,), 2), ((), 1), ((4, 6), 1)])
def test_cast_blocks_tile_the_box_in_c_order_within_the_limit(shape, limit):
    from ckptstore.store.read_plan import cast_blocks

    box = Box(tuple(1 for _ in shape), tuple(s + 1 for s in shape))
    blocks = cast_blocks(box, limit)
    assert all(0 < b.size <= limit for b in blocks) and sum(b.size for b in blocks) == box.size
    cover = np.zeros(tuple(s + 1 for s in shape), dtype=np.int64)
    order = np.arange(box.size).reshape(box.shape)
    firsts = []
    for b in blocks:
        cover[b.slices()] += 1
        firsts.append(int(order[b.relative_to(box).slices()].min()))
    assert (cover[box.slices()] == 1).all() and cover.sum() == box.size
    assert firsts == sorted(firsts)


def _two_chunk_manifest(files: tuple[str, str], layout: str = "chunks") -> ParamManifest:
    """A (4, 4) float32 parameter in two (2, 4) chunks of 32 bytes, in ``files``."""
    table = ChunkTable(files, (0, 32), (32, 32), None, (0, 0), (1, 1))
    return ParamManifest("w", "w", "float32", (4, 4), (2, 4), table, None, None, layout)


@pytest.mark.parametrize("files, layout, box, partial", [
    (("a", "a"), "chunks", Box((0, 0), (4, 4)), set()),
    (("a", "a"), "chunks", Box((0, 0), (2, 4)), {"a"}),  # chunk 1 left unread beside chunk 0
    (("a", "b"), "chunks", Box((0, 0), (2, 4)), set()),  # its file holds nothing else of w
    (("a", "b"), "chunks", Box((0, 0), (2, 2)), {"a"}),  # a chunk read in part
    (("a", "b"), "chunks", Box((1, 0), (3, 4)), {"a", "b"}),
    (("d", "d"), "dense", Box((0, 0), (2, 4)), {"d"}),  # part of the one tensor record
    (("d", "d"), "dense", Box((0, 0), (4, 4)), set()),
], ids=["whole", "chunk-skipped-in-its-file", "chunk-per-file", "chunk-in-part", "both-in-part", "dense-part",
        "dense-whole"])
def test_partial_files_are_the_files_whose_bytes_of_the_parameter_are_read_in_part(files, layout, box, partial):
    plan = plan_param(_two_chunk_manifest(files, layout), box)
    assert {plan.keys[i] for i in plan.partial_files} == partial


def test_the_executor_tells_only_the_files_read_in_part_to_expect_holes(tmp_path, monkeypatch):
    from ckptstore.io.local import LocalFile

    told: list[str] = []
    monkeypatch.setattr(LocalFile, "expect_holes", lambda self: told.append(self.key))
    values = np.arange(16, dtype=np.float32).reshape(4, 4)
    (tmp_path / "a").write_bytes(values[:2].tobytes())
    (tmp_path / "b").write_bytes(values[2:].tobytes())
    table = ChunkTable(("a", "b"), (0, 0), (32, 32), None, (0, 0), (1, 1))
    manifest = ParamManifest("w", "w", "float32", (4, 4), (2, 4), table)
    store = Store(LocalSource(tmp_path), StoreManifest({"w": manifest}))
    box = Box((0, 0), (4, 2))  # half of each chunk
    out = np.empty(box.shape, dtype=np.float32)
    whole_a = plan_param(store.info("w"), Box((0, 0), (2, 4)))  # chunk 0, the whole of file a
    Executor(store.data).run([(whole_a, np.empty((2, 4), np.float32)), (plan_param(store.info("w"), box), out)])
    assert np.array_equal(out, values[:, :2]) and sorted(told) == ["a", "b"]
