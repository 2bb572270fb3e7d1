"""``make demo``: the whole job on a built-in sample, with real MindSpore files.

1. MindSpore saves a small PanGu-Alpha-shaped checkpoint on 8 ranks (dp 2 x mp 4, optimizer
   sharding, Adam state) with its strategy file, plus a strategy for 4 cards.
2. ``ckptstore info`` on a rank file and on the strategy.
3. ``ckptstore convert`` into a store; ``ckptstore info`` on it.
4. ``ckptstore.load_rank`` for rank 0 of the 4-card layout: bytes read and peak memory, and a
   bit-for-bit comparison with what ``mindspore.transform_checkpoints`` gives for that rank.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _run(*args: str) -> None:
    exe = Path(sys.executable).with_name("ckptstore")
    shown = " ".join(["ckptstore", *args])
    print(f"\n$ {shown}", flush=True)
    subprocess.run([str(exe) if exe.exists() else "ckptstore", *args], check=True)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM (the peak) to the current RSS (Linux >= 4.0), so the
    # peak measured below is that of the load, not of importing MindSpore.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def make_sample(root: Path) -> tuple[list[str], str]:
    """Save the 8-rank sample with MindSpore; return (source strategy files, 4-card strategy)."""
    from ckptstore.testing import sample_checkpoint
    from ckptstore.testing.sample import pangu_specs, relayout

    specs = pangu_specs(hidden=128, layers=2, vocab=2048, dp=2, mp=4)
    tensors = sample_checkpoint.make_global_tensors(specs, seed=0)
    sample_checkpoint.save_distributed(root / "ckpt", specs, tensors, world_size=8, prefix="pangu",
                                       step_suffix="-1_100")
    target = sample_checkpoint.write_strategy(root / "strategy_4cards.ckpt", relayout(specs, dp=1, mp=4))
    return [str(root / "ckpt" / "strategy.ckpt")], str(target)


def main(out: str = "demo-output") -> None:
    """Run the demo in folder ``out`` (recreated)."""
    root = Path(out)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    print(f"Saving a PanGu-Alpha-shaped sample checkpoint on 8 ranks (dp 2 x mp 4) with MindSpore into {root}/ckpt")
    strategies, target = make_sample(root)
    rank0 = root / "ckpt" / "rank_0" / "pangu-1_100.ckpt"
    block0 = "backbone.blocks.0.*"
    _run("info", str(rank0), "--include", "backbone.*embedding*", "--include", block0)
    _run("info", strategies[0], "--rank", "5", "--ckpt-dir", str(root / "ckpt"), "--include", block0)
    store = root / "pangu.zarr"
    _run("convert", str(root / "ckpt"), "--strategy", strategies[0], "--out", str(store))
    _run("info", str(store), "--include", "*blocks.0.attention.*", "--include", "*embedding*")
    _run("verify", str(store))
    _run("plan", str(store), "--strategy", target, "--rank", "0")
    _load_rank0(store, target, root)


def _load_rank0(store: Path, target: str, root: Path) -> None:
    print(f"\n>>> params = ckptstore.load_rank('{store}', strategy='{target}', rank=0)")
    # Measured in a fresh process (MindSpore imported first, as in a training script), so the
    # peak is the load's own and not memory freed earlier by this demo.
    subprocess.run([sys.executable, "-m", "ckptstore.demo", "--measure-load", str(store), target, str(root)],
                   check=True)


def _measure_load(store: str, target: str, root: str) -> None:
    import mindspore  # noqa: F401  (imported before the clock starts: a load's cost, not MindSpore's import)

    import ckptstore
    from ckptstore.store.executor import IO_STATS
    from ckptstore.testing import oracle as conformance

    st = ckptstore.open(store)
    IO_STATS.reset()
    _reset_peak()
    rss0, rchar0 = _status("VmRSS"), _rchar()
    t0 = time.perf_counter()
    params = ckptstore.load_rank(st, target, 0)
    planned = params.plan.nbytes
    built = {name: params[name] for name in params}
    seconds = time.perf_counter() - t0
    read, peak = _rchar() - rchar0, _status("VmHWM") - rss0
    slice_bytes = sum(p.nbytes for p in built.values() if not isinstance(p, str))
    print(f"rank 0 of 4: {len(built)} Parameters built in {seconds:.3f} s; their bytes {_mib(slice_bytes)}, "
          f"planned reads {_mib(planned)}, bytes read {_mib(read)} ({IO_STATS.bytes_read:,} bytes of tensors in "
          f"{IO_STATS.requests} requests from {len(IO_STATS.files)} files), peak memory growth "
          f"{_mib(max(peak, 0))} (whole model in the store: {_mib(sum(st.info(n).nbytes for n in st.names()))})")
    oracle = conformance.transform_oracle(Path(root) / "ckpt", str(Path(root) / "ckpt" / "strategy.ckpt"), target,
                                      Path(root) / "oracle")
    reference = conformance.load_oracle(next((Path(oracle) / "rank_0").glob("*.ckpt")))
    same = all(np.asarray(_numpy(built[n])).tobytes() == np.asarray(reference[n]).tobytes() for n in reference)
    print(f"equal, bit for bit, to mindspore.transform_checkpoints + load_checkpoint for rank 0: "
          f"{'yes' if same and set(reference) == set(built) else 'NO'} ({len(reference)} parameters compared)")


def _numpy(p: Any) -> object:
    if isinstance(p, str):
        return p
    import mindspore as ms
    import ml_dtypes

    if p.dtype == ms.bfloat16:
        return p.astype(ms.float32).asnumpy().astype(ml_dtypes.bfloat16)
    return p.asnumpy()


if __name__ == "__main__":
    os.environ.setdefault("GLOG_v", "3")
    if sys.argv[1:2] == ["--measure-load"]:
        _measure_load(*sys.argv[2:5])
    else:
        main(*sys.argv[1:2])
