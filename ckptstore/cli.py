"""The ``ckptstore`` command: parse arguments, call the library, print.

Library errors (:class:`~ckptstore.errors.CkptStoreError`, missing files) become one line on
stderr and exit status 2 here, in one place; nothing else in the package prints.
"""
from __future__ import annotations

import fnmatch
import functools
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

from ckptstore.checkpoint.rank_files import describe_rank_folders, find_rank_files, holds_rank_folders
from ckptstore.checkpoint.selection import OPTIMIZER_STATE_PREFIXES, TRAINING_COUNTERS
from ckptstore.checkpoint.source import open_source
from ckptstore.checkpoint.strategy import load_strategy
from ckptstore.errors import CkptStoreError
from ckptstore.io import is_url
from ckptstore.io.urls import redact, split_url
from ckptstore.progress import binary_size as _fmt_bytes
from ckptstore.progress import rank_list
from ckptstore.read import describe
from ckptstore.read.verify import verify_store
from ckptstore.store.codecs import CODECS
from ckptstore.store.kinds import StoreKind, store_kind, store_kinds
from ckptstore.store.store import open as open_store
from ckptstore.write.convert import convert as convert_store

F = TypeVar("F", bound=Callable[..., Any])


class Location(click.Path):
    """A local path (checked like ``click.Path``) or an ``s3://``/``obs://`` URL (checked when used)."""

    def __init__(self, *, local_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.local_only = local_only

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        # every message here may echo what was typed: credentials in it are hidden (redact)
        try:
            url = is_url(value)
            if url:
                split_url(value)
        except CkptStoreError as e:
            self.fail(redact(str(e)), param, ctx)
        if url:
            if self.local_only:
                self.fail(f"{redact(value)} is a URL; this writes local files, so give a folder", param, ctx)
            return value
        if self.exists and os.path.islink(value) and not os.path.exists(value):  # else "does not exist"
            self.fail(f"{redact(os.fspath(value))} is a symbolic link that cannot be followed: a loop of links, or a "
                      "link to nothing; remove or fix it", param, ctx)
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as e:
            # a new error, not chained: the original's message holds the credentials redact() removes
            raise click.BadParameter(redact(e.message), ctx=e.ctx, param=e.param, param_hint=e.param_hint) from None


#: Exit status after Ctrl-C (SIGINT): 128 + 2, as a shell reports a process that SIGINT ended.
EXIT_INTERRUPTED = 130
#: Exit status of every error ckptstore reports (bad input, bad options); 1 is verify's "problems found".
EXIT_ERROR = 2


def _interrupted(resumes: bool) -> None:
    click.echo("ckptstore: interrupted" + ("; run the same command again to resume where it stopped" if resumes
                                           else ""), err=True)
    sys.exit(EXIT_INTERRUPTED)


def _friendly_errors(fn: F | None = None, *, resumes: bool = False) -> Any:
    """Library errors as one line and exit 2; Ctrl-C as one line (saying that a rerun resumes, for
    the commands that resume) and exit 130."""
    if fn is None:
        return functools.partial(_friendly_errors, resumes=resumes)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            _interrupted(resumes)
        except BrokenPipeError:  # the reader of our output went away (| head): not an error of ours
            sys.stderr.close()
            sys.exit(0)
        except (CkptStoreError, OSError) as e:
            kind = type(e).__name__
            if isinstance(e, CkptStoreError):  # our messages say everything; no "[Errno 13]" prefix
                msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            else:
                msg = f"{e.strerror or e}: {e.filename}"
            click.echo(f"ckptstore: error: {redact(msg)} [{kind}]", err=True)
            sys.exit(EXIT_ERROR)
    return wrapper


class _Commands(click.Group):
    """The command group, with click's own errors as one line too.

    Click prints a usage error in three lines (``Usage: ...``, ``Try ...``, ``Error: ...``) and
    ``Aborted!`` with exit 1 on Ctrl-C; here each is one line like every other error, exit 2
    for a usage error and 130 for Ctrl-C.
    """

    def main(  # type: ignore[override]  # always standalone_mode=False: click's overloads on it do not apply
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        try:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare 'ckptstore': the help, as asked
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.exceptions.UsageError as e:
            command = e.ctx.command_path if e.ctx is not None else "ckptstore"
            click.echo(f"ckptstore: error: {e.format_message()} (see '{command} --help') [UsageError]", err=True)
            sys.exit(EXIT_ERROR)
        except click.exceptions.Abort:  # Ctrl-C while click itself was running (parsing, a prompt)
            _interrupted(False)
        except click.ClickException as e:
            click.echo(f"ckptstore: error: {e.format_message()} [{type(e).__name__}]", err=True)
            sys.exit(e.exit_code)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ckptstore")
def main() -> None:
    """Reshard MindSpore distributed checkpoints without running out of memory.

    ckptstore reads the per-rank files MindSpore saves (rank_<i>/*.ckpt or *.safetensors) with
    the strategy file the parallel compiler writes, and converts them once into a store of
    global tensors in which every replicated slice is stored once: Zarr v3 (the default) or
    safetensors files. 'ckptstore index' makes a store that copies nothing instead: an index
    of the slices in the rank files. Loading a rank of any new layout then reads only the
    bytes that rank needs.

    SRC, STORE, --out and --strategy may be s3://bucket/prefix URLs (obs:// for Huawei OBS),
    with the endpoint and credentials from the AWS environment (AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); export writes local files.

    
    Typical use:
      ckptstore info rank_0/net-1_100.ckpt          what a rank file holds
      ckptstore convert ckpt_dir --strategy strategy.ckpt --out model.zarr
      ckptstore verify model.zarr                   re-check every chunk's checksum
      ckptstore plan model.zarr -s new_strategy.ckpt --rank 3
                                                    what rank 3 of the new layout will read
    """


def _print_checkpoint(info: dict[str, Any]) -> None:
    params = info["params"]
    click.echo(f"{info['path']}: MindSpore checkpoint, "
               f"{_fmt_bytes(info['size'])}, CRC trailer: {'yes' if info['crc'] is not None else 'no'}")
    width = max([len(n) for n in params] + [9])
    click.echo(f"  {'parameter':<{width}}  {'dtype':<8}  {'shape':<18}  {'bytes':>12}")
    for name, p in params.items():
        click.echo(f"  {name:<{width}}  {p['dtype']:<8}  {str(p['shape']):<18}  {p['nbytes']:>12,}")
    shown = sum(p["nbytes"] for p in params.values())
    click.echo(f"  {'total':<{width}}  {'':<8}  {'':<18}  {shown:>12,}")


def _print_strategy(info: dict[str, Any]) -> None:
    click.echo(f"{', '.join(info['paths'])}: MindSpore strategy, {info['world_size']} ranks "
               f"({info['num_stages']} pipeline stage(s) x {info['stage_devices']} devices)")
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
                line += "  box " + " x ".join(f"[{a}:{b})" for a, b in zip(box["start"], box["stop"], strict=True))
                line += f" of {p['global_shape']}"
        if name in info.get("unsaved", ()):
            line += "  not saved (in no rank file)"
        click.echo(line)


def _print_store(info: dict[str, Any]) -> None:
    params, totals = info["params"], info["totals"]
    src = info["source"]
    declared = store_kind(info["store_kind"])
    kind = declared.label if declared is not None else info["store_kind"]
    if src.get("incremental"):  # save_rank(incremental=True): an index over files of the step's root
        kind = "an incremental step: its own and earlier steps' files"
    copied = declared is None or declared.stores_data
    verb = "converted from" if copied else "of"
    saved = bool(src.get("saved_by"))  # a training step saved by its ranks (save_rank, StoreCheckpoint)
    hf = src.get("format") == "huggingface"  # describe._hf_source: an index over a Hugging Face folder
    origin = f"of step {src['step']} saved by {src['world_size']} rank(s)" if saved else \
        f"{verb} {src['world_size']} rank file(s)"
    if hf:
        click.echo(f"{info['path']}: ckptstore store, an index over a Hugging Face folder ({src['files']} files, "
                   f"name map {src['name_map']})")
    else:
        click.echo(f"{info['path']}: ckptstore store ({kind}) {origin}")
    width = max([len(n) for n in params] + [9])
    click.echo(f"  {'parameter':<{width}}  {'dtype':<8}  {'shape':<16}  {'chunk':<16}  {'chunks':>6}  {'bytes':>12}")
    for name, p in params.items():
        if p["dtype"] == "str":
            click.echo(f"  {name:<{width}}  {'str':<8}  {p['value']!r}")
            continue
        click.echo(f"  {name:<{width}}  {p['dtype']:<8}  {str(p['shape']):<16}  {str(p['chunk_shape']):<16}  "
                   f"{p['chunks']:>6}  {p['nbytes']:>12,}")
    if not copied:
        held = f"of the Hugging Face files in {src['folder']}" if hf else \
            f"of the rank files, which held {_fmt_bytes(totals['source_bytes'])} (each replica referenced once)"
        click.echo(f"  tensors: {_fmt_bytes(totals['nbytes'])}, none of it stored here: the index refers to "
                   f"{_fmt_bytes(totals['referenced_bytes'])} {held}")
        return
    click.echo(f"  tensors: {_fmt_bytes(totals['nbytes'])}, stored: {_fmt_bytes(totals['stored_bytes'])}; "
               f"the {'ranks' if saved else 'rank files'} held {_fmt_bytes(totals['source_bytes'])} (replicas "
               f"{'written' if saved else 'stored'} once saved {_fmt_bytes(totals['dedup_saved_bytes'])})")
    if src.get("unsaved"):
        click.echo(f"  {_unsaved_line(src['unsaved'])}")


def _unsaved_line(names: list[str]) -> str:
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f"not saved (the strategy lists them, no rank file holds them), so not stored: {shown}"


@main.command()
@click.argument("path", type=Location(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of a table.")
@click.option("--rank", type=int, default=None,
              help="Strategy only: show the split that this global rank holds.")
@click.option("--ckpt-dir", type=Location(exists=True, file_okay=False), default=None,
              help="Strategy only: the folder of rank_<i>/ checkpoints, to show global shapes and each "
                   "rank's box.")
@click.option("--strategy", "extra_strategies", multiple=True, type=Location(exists=True),
              help="Strategy only: more strategy files (one per pipeline stage), read together with PATH.")
@click.option("--include", multiple=True, metavar="GLOB",
              help="List only parameters matching (repeatable); totals still cover everything.")
@_friendly_errors
def info(path: str, as_json: bool, rank: int | None, ckpt_dir: str | None, extra_strategies: tuple[str, ...],
         include: tuple[str, ...]) -> None:
    """Describe a .ckpt file, a strategy file, or a converted store.

    For a store (made by 'ckptstore convert' or 'ckptstore index'; a folder or a URL): each
    parameter's global shape, dtype, bytes and chunk grid, and how much deduplicating replicas
    saved. For a checkpoint: its parameters, dtypes, local shapes and byte sizes, read from the
    record headers only. For a strategy file (protobuf as MindSpore saves it, or .json): each
    parameter's device matrix, tensor map and optimizer sharding; with --rank, the split that
    rank holds; with --ckpt-dir too, the global box of each parameter on that rank.
    """
    if holds_rank_folders(path):
        if rank is not None or ckpt_dir is not None or extra_strategies:
            raise click.UsageError(f"{path} is a folder of rank_<i>/ checkpoints; --rank, --ckpt-dir and --strategy "
                                   "are for strategy files")
        folders = describe_rank_folders(path)
        click.echo(json.dumps(folders, indent=2) if as_json else _rank_folders_text(folders))
        return
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
        if rank is not None or ckpt_dir is not None or extra_strategies:
            raise click.UsageError(f"{path} is a store; --rank, --ckpt-dir and --strategy are for strategy files "
                                   "(what one rank of a layout reads from a store: 'ckptstore plan STORE "
                                   "--strategy FILE --rank R')")
        with open_store(path) as store:
            result = describe.describe_store(store)
        printer = _print_store
    total = len(result["params"])
    if include:
        result["params"] = {n: p for n, p in result["params"].items()
                            if any(fnmatch.fnmatchcase(n, g) for g in include)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    printer(result)
    if include:
        click.echo(f"  ({len(result['params'])} of {total} parameters shown)")


def _rank_folders_text(folders: dict[str, Any]) -> str:
    """``info CKPT_DIR``: each rank's checkpoints, the ones a conversion takes marked ``*``."""
    chosen = folders["chosen"] or {}
    lines = [f"{folders['path']}: {len(folders['ranks'])} rank folders"]
    for r, files in folders["ranks"].items():
        names = [("*" if chosen.get(r) == f["name"] else "") + f["name"] for f in files]
        lines.append(f"  rank_{r}: {', '.join(names) or '(no checkpoint)'}")
    if folders["error"]:
        lines.append(f"convert/index would refuse: {folders['error']}")
    elif folders["note"]:
        lines.append(f"* taken by convert/index: {folders['note']}")
    else:
        lines.append("* taken by convert/index")
    return "\n".join(lines)


_STRATEGY_HELP = ("MindSpore strategy file of the source (protobuf as saved, or .json); repeat it for one file "
                  "per pipeline stage, or give a folder of them (MindFormers' strategy/ckpt_strategy_rank_<r>.ckpt). "
                  "Not needed for a single .ckpt file.")


def _source_options(fn: F) -> F:
    """The options that choose and check what is read, shared by ``convert`` and ``index``."""
    options = [
        click.argument("src", type=Location(exists=True)),
        click.option("--out", "-o", required=True, type=Location(),
                     help="The store to create: a folder, or s3://bucket/prefix (obs://bucket/prefix for OBS)."),
        click.option("--strategy", "-s", "strategies", multiple=True,
                     type=Location(exists=True), help=_STRATEGY_HELP),
        click.option("--step", type=click.IntRange(0), default=None,
                     help="Use each rank's checkpoint of this step (-<epoch>_<step>.ckpt) instead of the newest."),
        click.option("--epoch", type=click.IntRange(0), default=None,
                     help="Use each rank's checkpoint of this epoch (-<epoch>_<step>.ckpt); with --step, one "
                          "checkpoint of a folder that holds several (default: the newest every rank holds)."),
        click.option("--prefix", default=None, help="Use only checkpoint files whose name starts with this "
                     "({rank} stands for each folder's rank: MindFormers' '<p>_rank_{rank}-')."),
        click.option("--src-format", type=click.Choice(["ckpt", "safetensors"]), default=None,
                     help="Use only rank files of this format, when a rank folder holds both for one step "
                          "(default: whichever each rank has)."),
        click.option("--include", multiple=True, metavar="GLOB", help="Keep only parameters matching (repeatable)."),
        click.option("--exclude", multiple=True, metavar="GLOB", help="Drop parameters matching (repeatable)."),
        click.option("--drop-optimizer", is_flag=True,
                     help="Drop optimizer state and training counters, for inference or a fresh optimizer. "
                          "State: <prefix>.P or <prefix>_P of a parameter P the checkpoint holds, for the prefixes "
                          + ", ".join(OPTIMIZER_STATE_PREFIXES) + "; Counters: " + ", ".join(TRAINING_COUNTERS)),
        click.option("--workers", "-j", type=click.IntRange(1), default=4, show_default=True,
                     help="Parameters written in parallel."),
        click.option("--verify-crc", is_flag=True,
                     help="Check each rank file's checksum (crc_num) first (reads them whole)."),
        click.option("--no-layout-check", is_flag=True,
                     help="Skip the check that the strategy describes the rank files (a few sampled bytes of every "
                          "slice must agree between replicas and differ between slices). Use only if ranks really "
                          "hold identical slices of a parameter."),
        click.option("--overwrite", is_flag=True,
                     help="Replace the store at --out, or start an unfinished one there over. Only files ckptstore "
                          "wrote are deleted."),
        click.option("--part", default=None, metavar="I/N|auto",
                     help="Convert only part I of N (0 <= I < N), a byte-balanced share, so N processes on one or "
                          "more hosts split the work; the last part to finish completes the store (or run "
                          "'ckptstore commit'). 'auto' takes I and N from RANK_ID/RANK_SIZE (msrun) or "
                          "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress output."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _source_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """The library keyword arguments of the shared options (and a message while waiting)."""
    out, quiet = kw["out"], kw["quiet"]

    def waiting(holder: str) -> None:
        if not quiet:
            click.echo(f"ckptstore: {out} is being written by another process ({holder}); waiting for it", err=True)

    return {"strategy": kw["strategies"], "step": kw["step"], "epoch": kw["epoch"], "prefix": kw["prefix"],
            "src_format": kw["src_format"], "include": kw["include"], "exclude": kw["exclude"],
            "drop_optimizer": kw["drop_optimizer"], "workers": kw["workers"], "verify_crc": kw["verify_crc"],
            "check_layout": not kw["no_layout_check"], "overwrite": kw["overwrite"], "quiet": quiet,
            "on_wait": waiting, "part": kw["part"]}


def _dec_kwargs(key_file: str | None, mode: str | None) -> dict[str, Any]:
    """``dec_key``/``dec_mode`` from --dec-key-file or CKPTSTORE_DEC_KEY (the key never on the command line)."""
    from ckptstore.formats.ckpt_cipher import read_key_file

    if key_file is not None:
        return {"dec_key": read_key_file(key_file), "dec_mode": mode}
    text = os.environ.get("CKPTSTORE_DEC_KEY")
    if text:
        return {"dec_key": text.encode(), "dec_mode": mode}
    return {"dec_mode": mode} if mode is not None else {}


def _print_skipped(summary: Any, as_json: bool) -> None:
    click.echo(json.dumps(summary.to_json(), indent=2) if as_json else f"ckptstore: {summary.skipped}")


def _print_summary(summary: Any, as_json: bool, done: str) -> None:
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
    elif summary.already_complete:
        click.echo(f"{summary.store} already holds this conversion, complete: {summary.params} parameters; "
                   "nothing to do")
    elif not summary.committed:
        click.echo(f"part {summary.part}: " + done.replace("wrote ", "wrote its share of ", 1)
                   + "; the store is complete once every part has finished (the last one commits)")
    else:
        share = f"{summary.params} of the store's {summary.store_params} parameters (this part's share)"
        click.echo(done if summary.part == "0/1" else f"part {summary.part}, the last to finish: "
                   + done.replace(f"{summary.params} parameters", share, 1))
    if summary.unsaved and not as_json:
        click.echo(_unsaved_line(list(summary.unsaved)))
    if summary.chosen and not as_json:
        click.echo(f"note: {summary.chosen}")


def _convert_kinds() -> list[StoreKind]:
    """The store kinds ``convert`` may produce, in the registry's order: the order
    ``ckptstore.convert(format=...)``'s error message lists them in (``--help`` marks the default)."""
    return store_kinds(convert=True)


class _KindChoice(click.Choice):
    """``--format``'s choices: the store kinds ``convert`` may produce, asked when used (so a kind
    registered after this module was imported counts, see :mod:`ckptstore.store.kinds`)."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(k.name for k in _convert_kinds())

    @choices.setter
    def choices(self, value: object) -> None:
        pass  # set by click.Choice.__init__; the registry answers instead


class _KindOption(click.Option):
    """``--format``, whose help lists each kind with its own help line."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = "Store format (kind): " + "; ".join(f"{k.name}: {k.help}" for k in _convert_kinds()) + "."
        return super().get_help_record(ctx)


@main.command()
@_source_options
@click.option("--format", "fmt", cls=_KindOption, type=_KindChoice(), default="zarr", show_default=True)
@click.option("--compress", type=click.Choice(["none", *CODECS]), default="none", show_default=True,
              help="Compress chunks (smaller store; chunks are then decoded whole on read, not memory-mapped).")
@click.option("--chunk-mb", type=click.IntRange(1), default=None,
              help="Largest chunk in MiB (default 256, or 16 when compressed). Chunks follow the source slices "
                   "and are cut further only above this size.")
@click.option("--verify-replicas", is_flag=True,
              help="Also read every replica of each slice and fail if ranks disagree (reads all rank files).")
@click.option("--dec-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Rank files saved with enc_key: the file holding that key (16, 24 or 32 bytes), or set "
                   "CKPTSTORE_DEC_KEY to the key's text. Never on the command line. The store is plain.")
@click.option("--dec-mode", type=click.Choice(["AES-GCM", "AES-CBC", "SM4-CBC"]), default=None,
              help="With a key: the enc_mode the files were saved with (default: the one their header names).")
@_friendly_errors(resumes=True)
def convert(fmt: str, compress: str, chunk_mb: int | None, verify_replicas: bool, dec_key_file: str | None,
            dec_mode: str | None, **kw: Any) -> None:
    """Convert a MindSpore distributed checkpoint into a store of global tensors.

    The store is Zarr v3 (default: chunked, optional compression) or, with --format
    safetensors, whole global tensors in model-*.safetensors files. To copy nothing, 'ckptstore
    index' takes the same SRC and options and makes an index of the rank files instead.

    SRC is the folder holding rank_0/, rank_1/, ... (each rank's newest .ckpt or MindSpore
    .safetensors file is used) or a single such file. Saves made with remove_redundancy=True
    (each replicated slice on one rank only) and with integrated_save=True (whole tensors on
    every rank) are recognised. Each parameter becomes one global array; a slice held by several
    ranks (data-parallel replicas) is read and stored once. Memory use stays small whatever the
    checkpoint size. If the run is interrupted, run the same command again: it resumes. Once the
    store is complete, the same command again does nothing. Several processes may run the same
    command on one --out (every rank of a job, say): one converts, the others wait for it.
    """
    summary = convert_store(kw["src"], kw["out"], format=fmt, compress=compress, chunk_mb=chunk_mb,
                            verify_replicas=verify_replicas, **_dec_kwargs(dec_key_file, dec_mode),
                            **_source_kwargs(kw))
    if summary.skipped:
        _print_skipped(summary, kw["as_json"])
        return
    _print_summary(summary, kw["as_json"],
                   f"wrote {summary.store}: {summary.params} parameters in {summary.chunks} chunks, "
                   f"{_fmt_bytes(summary.stored_bytes)} stored from {_fmt_bytes(summary.source_bytes)} in the rank "
                   f"files (replicas stored once saved {_fmt_bytes(summary.dedup_saved_bytes)}), "
                   f"{summary.seconds:.1f} s" + (f"; resumed {summary.chunks_resumed} chunks already written"
                                                if summary.chunks_resumed else ""))


@main.command()
@_source_options
@click.option("--checksum", is_flag=True,
              help="Read every slice once to record its CRC-32C, so 'ckptstore verify' can check the bytes later "
                   "(without it the index records only each rank file's size, times and inode).")
@click.option("--name-map", default=None, metavar="llama|qwen2|mcore|RULES.json",
              help="SRC is a Hugging Face folder (model*.safetensors, model.safetensors.index.json): index its "
                   "tensors under the names of this rule set (shipped: llama, qwen2, mcore) or rule file; fused "
                   "parameters (QKV, gate/up) are views over their sources. No --strategy.")
@_friendly_errors(resumes=True)
def index(checksum: bool, name_map: str | None, **kw: Any) -> None:
    """Make a store that copies nothing: an index into the original rank files.

    Takes the same SRC and options as 'convert'. The store folder holds only ckptstore.json: for
    each distinct slice of each parameter, where its bytes are in the rank files (replicas
    referenced once), and each rank file's size, modification time, inode and status-change time.
    It opens, reads, loads and exports like a converted store, with the same values, as long as
    the rank files stay where they are (or move together with the store on one file system) and
    unchanged: a changed file is refused, and so is a copy.
    """
    from ckptstore.io.sink import open_sink
    from ckptstore.store.kinds import MANIFEST
    from ckptstore.write.convert import index as index_store

    if name_map is not None:
        _index_hf(name_map, checksum, kw)
        return
    summary = index_store(kw["src"], kw["out"], checksum=checksum, **_source_kwargs(kw))
    if summary.skipped:
        _print_skipped(summary, kw["as_json"])
        return
    size = open_sink(kw["out"]).size(MANIFEST) or 0
    _print_summary(summary, kw["as_json"],
                   f"wrote {summary.store}: an index of {summary.params} parameters in {summary.chunks} slices, "
                   f"{_fmt_bytes(summary.stored_bytes)} of the rank files' {_fmt_bytes(summary.source_bytes)} "
                   f"referenced (replicas once); the index itself is {_fmt_bytes(size)}, {summary.seconds:.1f} s")


def _index_hf(name_map: str, checksum: bool, kw: dict[str, Any]) -> None:
    """``index --name-map``: a Hugging Face folder, names mapped, fused views."""
    from ckptstore.write.convert import rank_file_options_given
    from ckptstore.write.hf_index import index_hf

    given = ["--" + o.replace("_", "-") for o in rank_file_options_given({**kw, "strategy": kw["strategies"],
                                                                          "checksum": checksum})]
    if given:
        raise click.UsageError(f"{', '.join(given)} do(es) not apply to a Hugging Face folder (--name-map)")
    summary = index_hf(kw["src"], kw["out"], name_map=name_map, include=kw["include"], exclude=kw["exclude"],
                       overwrite=kw["overwrite"], quiet=kw["quiet"])
    _print_summary(summary, kw["as_json"],
                   f"wrote {summary.store}: an index of {summary.params} parameters of a Hugging Face folder in "
                   f"{summary.chunks} chunks, {_fmt_bytes(summary.stored_bytes)} of its "
                   f"{_fmt_bytes(summary.source_bytes)} referenced, {summary.seconds:.1f} s")


@main.command()
@click.argument("store", type=Location(exists=True, file_okay=False))
@click.option("--against", type=Location(exists=True), default=None,
              help="Also compare with the source checkpoint (folder of rank_<i>/ or one .ckpt/.safetensors), every "
                   "replica.")
@click.option("--strategy", "-s", "strategies", multiple=True, type=Location(exists=True),
              help="With --against: the source strategy file(s).")
@click.option("--step", type=click.IntRange(0), default=None, help="With --against: which step's files.")
@click.option("--prefix", default=None, help="With --against: which files, by name prefix.")
@click.option("--src-format", type=click.Choice(["ckpt", "safetensors"]), default=None,
              help="With --against: which format, when a rank folder holds both.")
@_friendly_errors
def verify(store: str, against: str | None, strategies: tuple[str, ...], step: int | None,
           prefix: str | None, src_format: str | None) -> None:
    """Re-read every chunk of STORE and check its checksum (and, with --against, its bytes).

    Exits 0 when everything matches, 1 when a problem is found (each is listed).
    """
    with open_store(store) as st:
        report = verify_store(st, against=against, strategy=strategies, step=step, prefix=prefix,
                              src_format=src_format)
    for problem in report.problems:
        click.echo(f"ckptstore: {problem}", err=True)
    if report.without_checksum == report.chunks and report.chunks and not against:
        click.echo(f"nothing to check: {store} is an index made without --checksum, so it holds no checksums of "
                   f"its {report.chunks} chunks; compare it with the rank files (--against SRC --strategy FILE), or "
                   "index again with --checksum")
        sys.exit(0 if report.ok else 1)
    checked = [f"{_fmt_bytes(report.bytes_checked)} checked"] if report.without_checksum < report.chunks else []
    if against:
        checked.append(f"{report.compared_with_source} chunks compared with the source")
    if report.without_checksum and not against:
        checked.append(f"{report.without_checksum} chunks have no checksums (an index made without --checksum): "
                       "compare with --against to check their bytes")
    click.echo(f"{'OK' if report.ok else 'FAILED'}: {report.params} parameters, {report.chunks} chunks, "
               f"{', '.join(checked)}; {len(report.problems)} problem(s)")
    sys.exit(0 if report.ok else 1)


@main.command()
@click.argument("store", type=Location(exists=True, file_okay=False))
@_friendly_errors(resumes=True)
def commit(store: str) -> None:
    """Complete a store converted in parts (convert --part I/N) whose parts have all finished.

    The same for a training step saved by its ranks (StoreCheckpoint, save_rank): STORE is then
    the step's folder, ROOT/step_<N>. The last part or rank to finish does this by itself; run
    it when that one could not (it was killed after its share was written). Fails, naming them,
    while parts or ranks have not finished.
    """
    from ckptstore.write.convert import commit_store

    done = commit_store(store)
    with open_store(store) as st:  # what the store now holds, in one line (the step, for a saved one)
        what = st.summary()
    click.echo(f"committed {store}: the store is complete; {what}" if done else
               f"{store} is already complete; nothing to do; {what}")


@main.command()
@click.argument("store", type=Location(exists=True, file_okay=False))
@click.option("--strategy", "-s", "strategies", multiple=True, type=Location(exists=True),
              help="Strategy file(s) of the target layout; repeat per pipeline stage, or give a folder of them. "
                   "Without it, the store's source layout.")
@click.option("--rank", type=click.IntRange(0), default=None,
              help="The target rank (default: this process's, from RANK_ID (msrun) or OMPI_COMM_WORLD_RANK "
                   "(mpirun); needed when the layout has several ranks and nothing says).")
@click.option("--include", multiple=True, metavar="GLOB", help="Only parameters matching (repeatable).")
@click.option("--dtype", default=None, help="Plan a load that converts floating-point parameters, e.g. float16.")
@click.option("--allow-whole", is_flag=True,
              help="Plan even when the target strategy lays out few of the store's parameters (they come whole).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
@click.option("--cooperative", "cooperative", default=None, metavar="GROUP",
              help="Plan a cooperative load (load_rank(..., cooperative=GROUP)): 'replicas', 'node' or ranks like "
                   "0,2; shows bytes and requests from storage per rank and per group.")
@_friendly_errors
def plan(store: str, strategies: tuple[str, ...], rank: int | None, include: tuple[str, ...], dtype: str | None,
         allow_whole: bool, as_json: bool, cooperative: str | None = None) -> None:
    """What loading one rank of a target layout from STORE will read, before anything is read.

    Bytes, files (or objects), read requests and peak memory of load_rank / read_rank for that
    rank, worked out from the store's metadata and the strategy alone. A load then reads
    exactly these bytes in these requests.
    """
    from ckptstore.read.rank_plan import plan_rank

    if cooperative is not None:
        _plan_cooperative(store, strategies, rank, include, dtype, allow_whole, as_json, cooperative)
        return
    result = plan_rank(store, list(strategies) or None, rank, include=list(include) or None, dtype=dtype,
                       allow_whole=allow_whole)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    files = "objects" if is_url(result.store) else "files"
    click.echo(f"rank {result.rank} of {result.world_size} from {result.store}: {result.params} parameters")
    click.echo(f"  reads {_fmt_bytes(result.nbytes)} ({result.nbytes:,} bytes) in {result.requests:,} requests "
               f"from {result.files:,} {files}")
    click.echo(f"  fetches {_fmt_bytes(result.fetched_bytes)} ({result.over_read_bytes:,} bytes over-read between "
               f"wanted ranges); modelled {result.modelled_seconds:.3f} s at {result.request_ms:g} ms per request, "
               f"{result.bandwidth_mbps:g} MB/s, {result.in_flight} in flight")
    if result.over_read_params:  # why: reading only the wanted bytes costs more requests than the gaps cost bytes
        name, wanted, fetched = result.over_read_top[0]
        click.echo(f"  over-read from {result.over_read_params} parameter(s), most {name} ({fetched / wanted:.2f}x "
                   f"its {_fmt_bytes(wanted)}): the wanted bytes alone take {result.exact_requests:,} requests, "
                   f"modelled {result.exact_seconds:.3f} s")
    click.echo(f"  peak memory {_fmt_bytes(result.peak_bytes)}: {_fmt_bytes(result.result_bytes)} of arrays"
               + (f" + at most {_fmt_bytes(result.scratch_bytes)} of chunks read whole" if result.scratch_bytes
                  else ", every byte read in place") + f" ({result.workers} reading threads)")


def _plan_cooperative(store: str, strategies: tuple[str, ...], rank: int | None, include: tuple[str, ...],
                      dtype: str | None, allow_whole: bool, as_json: bool, cooperative: str) -> None:
    """``plan --cooperative``: per rank and per group, what a cooperative load fetches from storage."""
    from ckptstore.read.rank_plan import plan_cooperative

    group: str | list[int] = cooperative
    if cooperative not in ("replicas", "node"):
        group = list(_parse_ranks(cooperative) or [])
    result = plan_cooperative(store, list(strategies) or None, rank, cooperative=group, include=list(include) or None,
                              dtype=dtype, allow_whole=allow_whole)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    click.echo(f"group {list(result.ranks)} from {result.store}: "
               + ("cooperative" if result.cooperative else "each rank reads alone") + f" ({result.reason})")
    for r in result.per_rank:
        requests = f"{r.requests:,} requests" if r.requests >= 0 else "its own requests"
        click.echo(f"  rank {r.rank}: fetches {_fmt_bytes(r.fetched_bytes)} ({r.fetched_bytes:,} bytes) in {requests}"
                   f", receives {_fmt_bytes(r.received_bytes)}; needs {_fmt_bytes(r.needed_bytes)}")
    ratio = result.fetched_bytes / result.distinct_bytes if result.distinct_bytes else 1.0
    click.echo(f"  group: fetches {result.fetched_bytes:,} bytes ({ratio:.2f}x the {result.distinct_bytes:,} distinct) "
               + (f"in {result.requests:,} requests " if result.cooperative else "")
               + f"vs {result.independent_bytes:,} bytes in {result.independent_requests:,} requests reading alone")


def _parse_ranks(value: str | None) -> Iterable[int] | None:
    """The ranks of ``--ranks`` (``0,1,4-7``), checked for form here and yielded lazily: only export
    knows the target's rank count, and a range like ``0-99999999999`` must fail there at its first
    rank outside the layout, not be listed first."""
    if value is None:
        return None
    ranges: list[range] = []
    for part in value.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:  # "4-" is no range (not "4 to the end"): refused, not read as rank 4
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a list like 0,1,4-7", param_hint="--ranks") from None
        if first < 0 or last < first:
            raise click.BadParameter(f"{part.strip()!r} is not a rank or an increasing range like 4-7",
                                     param_hint="--ranks")
        ranges.append(range(first, last + 1))
    return itertools.chain.from_iterable(ranges)


@main.command()
@click.argument("store", type=Location(exists=True, file_okay=False))
@click.argument("out", type=Location(file_okay=False, local_only=True))
@click.option("--strategy", "-s", "strategies", multiple=True, type=Location(exists=True),
              help="Strategy file(s) of the target layout (the new card count); repeat per pipeline stage, or give "
                   "a folder of them. "
                   "Without it, the source layout is written back.")
@click.option("--ranks", default=None, help="Target ranks to write, e.g. 0,1,4-7 (default: all).")
@click.option("--format", "fmt", type=click.Choice(["ckpt", "safetensors", "hf"]), default="ckpt", show_default=True,
              help="File format of the per-rank files; hf: one Hugging Face folder (sharded safetensors and "
                   "model.safetensors.index.json, names by --name-map, fused tensors split back).")
@click.option("--name-map", default=None, metavar="llama|qwen2|mcore|RULES.json",
              help="With --format hf: the rule set the store's names came from, read backwards (default: the "
                   "shipped one the index recorded).")
@click.option("--max-shard-size", default="5GB", show_default=True,
              help="With --format hf: largest shard file (5GB, 500MiB, bytes).")
@click.option("--include", multiple=True, metavar="GLOB", help="Export only parameters matching (repeatable).")
@click.option("--dtype", default=None,
              help="Convert floating-point parameters while reading, e.g. float16 or bfloat16 (integer and bool "
                   "parameters keep their type; default: as stored).")
@click.option("--crc", is_flag=True,
              help="Append MindSpore's crc_num trailer (ckpt only), as save_checkpoint(crc_check=True).")
@click.option("--allow-whole", is_flag=True,
              help="Accept a --strategy that lays out fewer than half of the store's parameters (refused by default "
                   "as another model's): the others are written whole into every rank's file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option("--overwrite", is_flag=True,
              help="Replace what an earlier export wrote into OUT (only those files; refused without it when OUT "
                   "holds files).")
@_friendly_errors
def export(store: str, out: str, strategies: tuple[str, ...], ranks: str | None, fmt: str,
           include: tuple[str, ...], dtype: str | None, crc: bool, allow_whole: bool, name_map: str | None,
           max_shard_size: str, quiet: bool, overwrite: bool) -> None:
    """Write per-rank checkpoints of STORE for a target layout into OUT.

    Produces OUT/rank_<j>/checkpoint_<j>.ckpt for each target rank, readable by
    mindspore.load_checkpoint: the same result as mindspore.transform_checkpoints, but each
    rank reads only its own slices and memory stays at one parameter slice.
    """
    from ckptstore.dtypes import numpy_dtype
    from ckptstore.read.export import export as export_store

    if fmt == "hf" or name_map is not None:
        _export_hf(store, out, fmt, name_map, max_shard_size, include,
                   [o for o, v in (("--strategy", strategies), ("--ranks", ranks), ("--dtype", dtype), ("--crc", crc),
                                   ("--allow-whole", allow_whole)) if v], overwrite)
        return
    try:
        target_dtype = numpy_dtype(dtype) if dtype else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--dtype") from None
    with open_store(store) as st:
        summary = export_store(st, out, strategy=list(strategies) or None, ranks=_parse_ranks(ranks),
                               include=list(include) or None, dtype=target_dtype, format=fmt, crc=crc,
                               allow_whole=allow_whole, quiet=quiet, overwrite=overwrite)
        exported = st.location.url + ("" if summary.step is None else f", step {summary.step}")
    click.echo(f"wrote {len(summary.files)} file(s) under {out} from {exported}, reading "
               f"{_fmt_bytes(summary.bytes_read)} from the store")


@main.command()
@click.argument("root", type=Location(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--clean", is_flag=True,
              help="Remove the unfinished steps older than the newest committed one (only the files ckptstore "
                   "wrote), then list.")
@click.option("--keep", type=click.IntRange(min=1), default=None, metavar="K",
              help="Remove the steps older than the newest K committed ones, by the rules of StoreSaver's keep-K "
                   "(only the files ckptstore wrote; a folder it did not save stays whole), then list.")
@click.option("--dry-run", is_flag=True, help="With --clean or --keep: say what would be removed, remove nothing.")
@click.option("--verify", is_flag=True,
              help="Read every chunk of each committed step and list it as verified or damaged (the check a load "
                   "with fallback=True makes).")
@_friendly_errors
def steps(root: str, as_json: bool, clean: bool, keep: int | None, dry_run: bool, verify: bool = False) -> None:
    """List the steps saved into ROOT (save_rank, StoreCheckpoint): each step committed or unfinished
    (with --verify: verified or damaged, and then exits 1 when a step is damaged, as verify does),
    the ranks an unfinished one waits for, its size and when it was last written."""
    import warnings

    from ckptstore.write.retention import foreign_names, list_steps, prune_steps, remove_unfinished

    if dry_run and not (clean or keep):
        raise click.UsageError("--dry-run goes with --clean or --keep K")
    removed = []
    with warnings.catch_warnings():  # what was left is printed below, once
        warnings.simplefilter("ignore")
        if clean:
            removed.append(remove_unfinished(root, dry_run=dry_run))
        if keep is not None:
            removed.append(prune_steps(root, keep, dry_run=dry_run))
    found, foreign = list_steps(root, verify=verify), foreign_names(root)
    if as_json:
        click.echo(json.dumps({"root": root, "steps": [f.to_json() for f in found], "not_ckptstores": foreign,
                               **({"dry_run": dry_run, "removed": sorted({s for r in removed for s in r.steps}),
                                   "left": {str(k): v for r in removed for k, v in r.left.items()}}
                                  if removed else {})}, indent=2))
    else:
        for r in removed:
            click.echo(f"ckptstore: {r.describe()}")
        _print_steps(root, found)
        if foreign:
            click.echo(f"not ckptstore's, left alone: {', '.join(foreign)}")
    if any(f.problem is not None for f in found):
        sys.exit(1)


def _print_steps(root: str, found: list[Any]) -> None:
    """The table of ``ckptstore steps``."""
    import time

    from ckptstore.write.retention import UNFINISHED

    if not found:
        click.echo(f"no step folders in {root}")
        return
    click.echo(f"{'step':>8}  {'state':<16} {'ranks missing':<16} {'size':>10}  last written")
    damaged = [f for f in found if f.problem is not None]
    for f in found:
        missing = "-" if f.state != UNFINISHED else (
            "none finished" if f.world is None else
            f"{rank_list(f.missing, most=8)} of {f.world}"
            if f.missing else f"none (of {f.world})")
        when = "-" if f.mtime is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.mtime))
        click.echo(f"{f.step:>8}  {f.state:<16} {missing:<16} {_fmt_bytes(f.bytes):>10}  {when}")
    for f in damaged:
        click.echo(f"step {f.step} is damaged: {f.problem}")
    newest = next((f.step for f in found if f.state in ("committed", "verified", "damaged")), None)
    stale = [f.step for f in found if f.state == UNFINISHED and newest is not None and f.step < newest]
    if stale:
        click.echo(f"{len(stale)} unfinished step(s) older than the newest committed step {newest}: remove them with "
                   f"'ckptstore steps {root} --clean'")


def _export_hf(store: str, out: str, fmt: str, name_map: str | None, max_shard_size: str, include: tuple[str, ...],
               others: list[str], overwrite: bool = False) -> None:
    """``export --format hf``: a Hugging Face folder (by default under the name map the index recorded)."""
    from ckptstore.read.hf_export import export_hf

    if fmt != "hf":
        raise click.UsageError("--name-map applies to --format hf only")
    if others:
        raise click.UsageError(f"{', '.join(others)} do(es) not apply to --format hf")
    with open_store(store) as st:
        summary = export_hf(st, out, name_map=name_map, max_shard_size=max_shard_size, include=list(include) or None,
                            overwrite=overwrite)
    click.echo(f"wrote {summary.tensors} tensors in {len(summary.files)} file(s) under {out}, reading "
               f"{_fmt_bytes(summary.bytes_read)} from the store")


@main.command()
@click.argument("store")
@click.option("--name-map", required=True, metavar="llama|llama-concat|qwen2|mcore|RULES.json",
              help="The rule set the store's names come from; its 'tensor_parallel' section says which "
                   "parameters are cut along rows, which along columns, and which stay whole.")
@click.option("--tp", type=int, required=True, help="Cards each pipeline stage cuts a parameter over.")
@click.option("--pp", type=int, default=1, show_default=True,
              help="Pipeline stages: layers split evenly in order, the embedding on the first, the rest on the last.")
@click.option("--out", required=True, help="The strategy file (*.json); with --pp above 1, a folder of stage_<s>.json.")
@click.option("--overwrite", is_flag=True, help="Replace strategy files that exist.")
@_friendly_errors()
def strategy(store: str, name_map: str, tp: int, pp: int, out: str, overwrite: bool) -> None:
    """Write a strategy file to load STORE (an index of a Hugging Face folder) on --tp cards.

    The file is in MindSpore's JSON strategy form: give it as --strategy to 'ckptstore plan' and
    'export', as strategy= to load_rank / load_into_net, or to mindspore.transform_checkpoints.
    Each rank of the target layout then reads only its cut of each parameter.
    """
    from ckptstore.checkpoint.tp_strategy import write_tp_strategy

    with open_store(store) as st:
        shapes = {name: st.info(name).shape for name in st.names()}
    files = write_tp_strategy(shapes, out, name_map=name_map, tp=tp, pp=pp, overwrite=overwrite)
    click.echo(f"wrote {', '.join(files)}: {len(shapes)} parameters for {tp * pp} card(s) "
               f"(tp {tp} x pp {pp}) by the tensor_parallel rules of {name_map}")


if __name__ == "__main__":  # pragma: no cover
    main()
