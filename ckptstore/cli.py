"""The ``ckptstore`` command: parse arguments, call the library, print.

Library errors (:class:`~ckptstore.errors.CkptStoreError`, missing files) become one line on
stderr and exit status 2 here, in one place; nothing else in the package prints.
"""
from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable, TypeVar

import click

from . import describe
from .errors import CkptStoreError
from .source import find_rank_files, open_source
from .strategy import load_strategy

F = TypeVar("F", bound=Callable[..., Any])


def _friendly_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CkptStoreError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
            kind = type(e).__name__
            msg = str(e) if isinstance(e, CkptStoreError) else f"{e.strerror}: {e.filename}"
            click.echo(f"ckptstore: error: {msg} [{kind}]", err=True)
            sys.exit(2)
    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ckptstore")
def main() -> None:
    """Reshard MindSpore distributed checkpoints without running out of memory.

    ckptstore reads the per-rank .ckpt files MindSpore saves (rank_<i>/*.ckpt) and the
    strategy file the parallel compiler writes, and tells you what they hold. Every command
    reads file headers, never whole checkpoints.
    """


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _print_checkpoint(info: dict[str, Any]) -> None:
    params = info["params"]
    click.echo(f"{info['path']}: MindSpore checkpoint, {len(params)} parameters, "
               f"{_fmt_bytes(info['size'])}, CRC trailer: {'yes' if info['crc'] is not None else 'no'}")
    width = max([len(n) for n in params] + [9])
    click.echo(f"  {'parameter':<{width}}  {'dtype':<8}  {'shape':<18}  {'bytes':>12}")
    for name, p in params.items():
        click.echo(f"  {name:<{width}}  {p['dtype']:<8}  {str(p['shape']):<18}  {p['nbytes']:>12,}")
    total = sum(p["nbytes"] for p in params.values())
    click.echo(f"  {'total':<{width}}  {'':<8}  {'':<18}  {total:>12,}")


def _print_strategy(info: dict[str, Any]) -> None:
    click.echo(f"{', '.join(info['paths'])}: MindSpore strategy, {info['world_size']} ranks "
               f"({info['num_stages']} pipeline stage(s) x {info['stage_devices']} devices), "
               f"{len(info['params'])} parameters")
    rank = info.get("rank")
    if rank is not None:
        click.echo(f"rank {rank} (stage {rank // info['stage_devices']}):")
    width = max([len(n) for n in info["params"]] + [9])
    for name, p in info["params"].items():
        stages = p["stages"]
        lay = next(iter(stages.values()))
        where = "" if info["num_stages"] == 1 else f"  stages {','.join(stages)}"
        line = (f"  {name:<{width}}  dev_matrix {lay['dev_matrix']}  tensor_map {lay['tensor_map']}"
                f"  opt_shard {lay['opt_shard_size']}/{lay['opt_shard_step']}{where}")
        if rank is not None:
            split = p["split"]
            line += "  not on this rank" if split is None else (
                f"  parts {split['parts_per_axis']} x opt {split['opt_shard_parts']}")
            if p.get("box") is not None:
                box = p["box"]
                line += "  box " + " x ".join(f"[{a}:{b})" for a, b in zip(box["start"], box["stop"]))
                line += f" of {p['global_shape']}"
        click.echo(line)


@main.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
@click.option("--rank", type=int, default=None,
              help="Strategy only: show the split that this global rank holds.")
@click.option("--ckpt-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Strategy only: the folder of rank_<i>/ checkpoints, to show global shapes and each "
                   "rank's box.")
@click.option("--strategy", "extra_strategies", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Strategy only: more strategy files (one per pipeline stage), read together with PATH.")
@_friendly_errors
def info(path: str, as_json: bool, rank: int | None, ckpt_dir: str | None, extra_strategies: tuple[str, ...]) -> None:
    """Describe a .ckpt file or a strategy file.

    For a checkpoint: its parameters, dtypes, local shapes and byte sizes, read from the record
    headers only. For a strategy file (protobuf as MindSpore saves it, or .json): each
    parameter's device matrix, tensor map and optimizer sharding; with --rank, the split that
    rank holds; with --ckpt-dir too, the global box of each parameter on that rank.
    """
    kind = describe.sniff_kind(path)
    if kind == "checkpoint":
        if rank is not None or ckpt_dir is not None or extra_strategies:
            raise click.UsageError(f"{path} is a checkpoint file; --rank, --ckpt-dir and --strategy are for "
                                   "strategy files")
        result = describe.describe_checkpoint(path)
        printer = _print_checkpoint
    elif kind == "strategy":
        strategy = load_strategy([path, *extra_strategies])
        source = None
        if ckpt_dir is not None:
            source = open_source(find_rank_files(ckpt_dir), strategy)
        result = describe.describe_strategy(strategy, rank=rank, source=source)
        printer = _print_strategy
    else:
        raise click.UsageError(f"{path} is a directory; pass a .ckpt file or a strategy file")
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        printer(result)


if __name__ == "__main__":  # pragma: no cover
    main()
