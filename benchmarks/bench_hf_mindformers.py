"""MindFormers' own Hugging Face converter beside ckptstore's index, on bench_hf's folder (run in .venv-mf).

    .venv-mf/bin/python -m benchmarks.bench_hf_mindformers --work /tmp/bench-hf --rounds 2

Each contender in a fresh process, alternating, after ``bench_hf`` made the folder: MindFormers 1.9.0's
``models/llama/convert_weight.py::convert_pt_to_ms`` (``LlamaForCausalLM.from_pretrained``, rename,
``mindspore.save_checkpoint`` of one whole bf16 ``.ckpt``), against ckptstore's index of the folder with the ``llama``
rules (``ckptstore.index(folder, store, name_map="llama")``, as ``ckptstore index --name-map
llama``) followed by ``read_rank`` of the whole model (every tensor under MindFormers' names, in
memory) and of
rank 1 of a tp 4 layout. The timed span is the whole route from the folder on disk to the weights a rank
needs, imports excluded; peak RSS is ``ru_maxrss`` above the RSS after the imports.
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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(kind: str, work: Path) -> None:
    import resource

    folder = work / "llama-1.0gb"
    if kind == "mindformers":
        import mindspore as ms
        from mindformers.models.llama.convert_weight import convert_pt_to_ms

        base = _rss()
        t0 = time.perf_counter()
        convert_pt_to_ms(str(folder), str(work / "mf.ckpt"), dtype=ms.bfloat16)
    else:
        import ckptstore
        from ckptstore.testing.sample_checkpoint import ParamSpec, write_strategy_json

        base = _rss()
        t0 = time.perf_counter()
        ckptstore.index(folder, work / "store-llama", name_map="llama", overwrite=True)
        if kind == "ckptstore-tp4":
            st = ckptstore.open(work / "store-llama")
            specs = [ParamSpec(n, st.info(n).shape, "bfloat16", dev_matrix=(4,),
                               tensor_map=(-1,) if len(st.info(n).shape) == 1 else
                               (-1, 0) if (".wo." in n or ".w2." in n) else (0, -1)) for n in st.names()]
            got = ckptstore.read_rank(st, write_strategy_json(work / "tp4-llama.json", specs), rank=1)
        else:
            got = ckptstore.read_rank(work / "store-llama")
        assert got
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    print(json.dumps({"seconds": seconds, "peak": peak}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-hf"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.work)
        return
    env = {**os.environ, "GLOG_v": "3", "LOCAL_DEFAULT_PATH": str(args.work / "mindformers-output")}  # its logs
    kinds = ["mindformers", "ckptstore-whole", "ckptstore-tp4"]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_hf_mindformers", "--child", k,
                                  "--work", str(args.work)], capture_output=True, text=True, env=env, check=True)
            results[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"| route (median of {args.rounds}) | time | peak RSS above start |")
    print("| --- | --- | --- |")
    labels = {"mindformers": "MindFormers convert_pt_to_ms -> whole .ckpt",
              "ckptstore-whole": "ckptstore index + read_rank (whole model)",
              "ckptstore-tp4": "ckptstore index + read_rank (tp4 rank 1)"}
    for k in kinds:
        rr = results[k]
        print(f"| {labels[k]} | {statistics.median(x['seconds'] for x in rr):.2f} s | "
              f"{max(x['peak'] for x in rr) / 1e9:.2f} GB |")
    print(f"loadavg: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
