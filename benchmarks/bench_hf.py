"""Hugging Face route: index a LLaMA-shaped folder, read one rank of a tp 4 layout from it.

    python -m benchmarks.bench_hf --gb 1 --rounds 3 --work /tmp/bench-hf

Makes (once, cached in ``--work``) a Hugging Face folder of random bf16 weights of a LLaMA shape
(hidden 2048, 16 heads, 4 KV heads, ffn 5632, vocab 32000, layers to reach ``--gb``), sharded at
500 MB as ``save_pretrained`` would; then, each in a fresh process, alternating: the index of the
folder under the ``mcore`` rules (``ckptstore.index(FOLDER, STORE, name_map="mcore")``, what
``ckptstore index FOLDER --out STORE --name-map mcore`` does) (fused linear_qkv per KV group,
linear_fc1 interleaved row by row) and
``read_rank`` of rank 1 of a tp 4 layout (column-parallel weights split by rows, row-parallel by
columns; the embedding and output split by rows), reporting bytes read against the slice (planned:
``ckptstore.plan_rank``; sent: ``ckptstore.io_counts()`` around the read) and peak RSS above the
process's RSS just before the read. Prints one Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHAPE = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4,
         "vocab_size": 32000}


def make_folder(work: Path, gb: float) -> Path:
    """The cached LLaMA-shaped folder of about ``gb`` GB."""
    import ml_dtypes

    from ckptstore.testing.hf_folder import llama_config, write_hf_folder

    h, f, v = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["vocab_size"]
    kv = SHAPE["num_key_value_heads"] * h // SHAPE["num_attention_heads"]
    per_layer = 2 * (2 * h * h + 2 * kv * h + 3 * f * h + 2 * h)
    layers = max(1, round((gb * 1e9 - 2 * 2 * v * h) / per_layer))
    folder = work / f"llama-{gb}gb"
    if (folder / "model.safetensors.index.json").exists() or (folder / "model.safetensors").exists():
        return folder  # one shard has no index file: without this check a small folder was rewritten every run
    config = llama_config(layers=layers, hidden=h, heads=SHAPE["num_attention_heads"],
                          kv_heads=SHAPE["num_key_value_heads"], ffn=f, vocab=v)
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    tensors = {n: rng.standard_normal(s, dtype=np.float32).astype(ml_dtypes.bfloat16) for n, s in shapes.items()}
    total = sum(a.nbytes for a in tensors.values())
    write_hf_folder(folder, tensors, shards=max(1, round(total / 500e6)), config=config)
    return folder


def strategy(store_path: Path, out: Path) -> Path:
    import ckptstore
    from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json

    st = ckptstore.open(store_path)
    specs = []
    for n in st.names():
        shape = st.info(n).shape
        if len(shape) == 1:
            tmap = (-1,)
        elif "linear_proj" in n or "linear_fc2" in n:
            tmap = (-1, 0)  # row-parallel: the input axis split
        else:
            tmap = (0, -1)
        specs.append(ParamSpec(n, shape, "bfloat16", dev_matrix=(4,), tensor_map=tmap))
    return write_strategy_json(out, specs)


def child(args: argparse.Namespace) -> None:
    """One timed run in this process; prints a JSON line."""
    import ckptstore

    if args.child == "index":
        t0 = time.perf_counter()
        ckptstore.index(args.folder, args.store, name_map="mcore", overwrite=True)
        print(json.dumps({"seconds": time.perf_counter() - t0}))
        return
    st = ckptstore.open(args.store)
    plan = ckptstore.plan_rank(st, args.strategy, rank=1)
    # ru_maxrss survives fork and exec (Linux keeps the parent's high-water mark in the child), so
    # a parent that once held a folder's tensors inflated it; reset this process's high-water mark
    # to its current RSS instead (clear_refs 5) and read VmHWM after the read
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kb("VmRSS") * 1024
    before = ckptstore.io_counts()
    t0 = time.perf_counter()
    got = ckptstore.read_rank(st, args.strategy, rank=1)
    seconds = time.perf_counter() - t0
    sent = ckptstore.io_counts() - before
    peak = _status_kb("VmHWM") * 1024
    slice_bytes = sum(a.nbytes for a in got.values())
    print(json.dumps({"seconds": seconds, "bytes_read": plan.nbytes, "bytes_fetched": sent.bytes_fetched,
                      "planned_fetched": plan.fetched_bytes, "slice_bytes": slice_bytes,
                      "peak_above_start": peak - base, "requests": plan.requests,
                      "requests_sent": sent.requests}))


def _status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (VmRSS: resident now; VmHWM: its high-water mark)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-hf"))
    ap.add_argument("--child", choices=["index", "read"], default=None)
    ap.add_argument("--folder", type=str)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--strategy", type=Path)
    ap.add_argument("--s3", action="store_true",
                    help="Also from a real S3 server on loopback (SeaweedFS): the folder uploaded, indexed and "
                         "read there")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    folder = make_folder(args.work, args.gb)
    store = args.work / "store"
    env = {**os.environ, "GLOG_v": "3", "NUMPY_MADVISE_HUGEPAGE": "0"}

    def run(kind: str, *extra: str) -> dict:
        cmd = [sys.executable, "-m", "benchmarks.bench_hf", "--child", kind, "--folder", str(where),
               "--store", str(at), *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    where, at = folder, store

    run("index")  # warm-up (and the store the reads use)
    strat = strategy(store, args.work / "tp4.json")
    run("read", "--strategy", str(strat))
    index_s, reads = [], []
    for _ in range(args.rounds):
        index_s.append(run("index")["seconds"])
        reads.append(run("read", "--strategy", str(strat)))
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(f"| folder | index (median of {args.rounds}) | tp4 rank 1 read (median) | bytes read / slice | "
          "bytes fetched / slice | peak RSS above start / slice | requests (planned = sent) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = [("local", index_s, reads)]
    if args.s3:
        from ckptstore.testing import s3_server as S

        server = S.start_server()
        try:
            server.create_bucket("bench-hf")
            env.update(S.env_for(server.url))
            os.environ.update(S.env_for(server.url))
            S.upload(folder, "s3://bench-hf/llama")
            where, at = "s3://bench-hf/llama", args.work / "store-s3"
            run("index")
            run("read", "--strategy", str(strat))
            s3_index, s3_reads = [], []
            for _ in range(args.rounds):
                s3_index.append(run("index")["seconds"])
                s3_reads.append(run("read", "--strategy", str(strat)))
            rows.append(("S3 (SeaweedFS, loopback)", s3_index, s3_reads))
        finally:
            server.stop()
    for label, idx, rr in rows:
        r = rr[-1]
        print(f"| {label}: {size / 1e9:.2f} GB, {len(list(folder.glob('*.safetensors')))} shards | "
              f"{statistics.median(idx):.3f} s | {statistics.median(x['seconds'] for x in rr):.3f} s | "
              f"{max(x['bytes_read'] / x['slice_bytes'] for x in rr):.4f}x ({r['slice_bytes'] / 1e6:.1f} MB) | "
              f"{max(x['bytes_fetched'] / x['slice_bytes'] for x in rr):.4f}x | "
              f"{max(x['peak_above_start'] / x['slice_bytes'] for x in rr):.3f}x | "
              f"{r['requests']} {'=' if all(x['requests'] == x['requests_sent'] for x in rr) else '!='} "
              f"{r['requests_sent']} |")
    print(f"loadavg: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
