"""Loading a store into a MindSpore Cell: :func:`load_into_net`, as ``load_param_into_net`` loads.

Network parameters are matched by ``Parameter.name`` (the checkpoint key), so an
``nn.TrainOneStepCell`` gets its optimizer state too. Slices are read straight into the
network's own memory when MindSpore exposes it (an initialised CPU tensor), else handed over
with ``set_data``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import prod
from typing import Any

import numpy as np

from ckptstore.checkpoint.strategy import Strategy
from ckptstore.collector import collector_paused
from ckptstore.dtypes import is_float, lookup
from ckptstore.errors import InvalidOptionError, LayoutMismatchError
from ckptstore.mindspore._import import mindspore as _ms
from ckptstore.mindspore.layouts import net_strategy
from ckptstore.progress import Progress
from ckptstore.read.exchange import Exchange, job_agreement
from ckptstore.read.group_load import Cooperative, exchange_for, load_together
from ckptstore.read.loader import (
    StrategyLike,
    check_workers,
    float_dtype,
    replica_ranks,
    resolve_rank,
    resolve_target,
    target_boxes,
)
from ckptstore.store.executor import Executor, check_extents
from ckptstore.store.read_plan import plan_param
from ckptstore.store.store import Store, StoreLike, as_store, open_verified


def load_into_net(net: Any, store: StoreLike, strategy: StrategyLike = None,
                  rank: int | None = None, *, strict: bool = False, dtype: Any = None,
                  verify: bool = False, workers: int | None = None,
                  quiet: bool = True, cooperative: Cooperative = None,
                  fallback: bool = False) -> tuple[list[str], list[str]]:
    """Load this rank's slices from a store into a MindSpore Cell, as ``load_param_into_net`` would.

    The target layout is ``strategy`` when given, else the network's own layouts when it was
    compiled in (semi-)auto parallel mode, else whole tensors; ``rank=None`` is this process's
    rank (``mindspore.communication`` when initialised, else ``RANK_ID``; a one-rank target, as
    in a pure data-parallel job, is the same for every process). ``store`` is a path, an
    ``s3://``/``obs://`` URL or a :class:`~ckptstore.store.store.Store`. Network parameters are
    matched by ``Parameter.name`` with MindSpore's rules: names that are not in the store are
    returned in ``param_not_load`` (except ``accu_grads*``, pipeline-shared parameters and, in
    parallel mode, unsliced ones); a prefix the store's names carry is found and dropped (a
    network saved as ``network.x`` loads into ``x``), and a float (or int) slice of another width
    is converted to the parameter's dtype. Returns ``(param_not_load, ckpt_not_load)`` like
    ``mindspore.load_param_into_net``. ``strict=True`` asks for an exact match instead: names as
    they are, dtypes as they are, and every network parameter found (else an error). Each slice
    must have the network parameter's shape. ``quiet=False`` shows progress (a bar on a
    terminal, log lines otherwise). ``cooperative`` (``"replicas"``, ``"node"`` or a list of ranks;
    every rank of the group calls at once, after ``mindspore.communication.init()``) reads each
    distinct byte once in the group, as :func:`ckptstore.read_rank` does. ``fallback=True`` loads
    the newest committed step of the root ``store`` whose chunks this rank reads verify, the same
    on every rank of the job (:func:`verified_store_for_net`).
    """
    exact = strict
    st = verified_store_for_net(net, store, strategy, rank, workers) if fallback else as_store(store)
    resolved = resolve_target(st, strategy) if strategy is not None else net_strategy(net, st)
    target = resolved if resolved is not None else Strategy({}, 1, 1, ())
    rank = resolve_rank(rank, target)
    parallel = bool(getattr(net, "parameter_layout_dict", None))
    net_params = [p for _, p in net.parameters_and_names() if not _pipeline_shared(p)]
    available = target_boxes(st, target, rank)  # everything this rank holds, by store name
    matched, param_not_load = {}, []
    for p in net_params:
        if p.name in available:
            if not st.info(p.name).is_str:  # MindSpore skips a value without tensor data
                matched[p.name] = p
        elif not (p.name.startswith("accu_grads") or (parallel and not getattr(p, "sliced", True))):
            param_not_load.append(p.name)
    ckpt_not_load = [n for n in available if n not in matched]
    loads = {n: (n, p) for n, p in matched.items()}
    if param_not_load and not exact:
        prefix = _dropped_prefix(param_not_load, available)
        if prefix is not None:
            for p in net_params:
                if p.name in param_not_load and prefix + p.name in available:
                    loads[prefix + p.name] = (p.name, p)
                    param_not_load.remove(p.name)
    if strict and param_not_load:
        raise LayoutMismatchError(f"{len(param_not_load)} network parameters are not in the store {st.location.url}: "
                                  + ", ".join(param_not_load[:10]) + (" ..." if len(param_not_load) > 10 else ""))
    loader = _NetLoader(st, available, float_dtype(dtype), verify, exact, check_workers(workers, st))
    if cooperative is None:
        with collector_paused():
            loader.load(loads, rank, quiet)
    else:
        exchange = exchange_for(cooperative, lambda world: replica_ranks(st, resolved, rank, world))
        loader.load_together(loads, rank, exchange)
    return param_not_load, ckpt_not_load


def verified_store_for_net(net: Any, store: StoreLike, strategy: StrategyLike = None, rank: int | None = None,
                           workers: int | None = None) -> Store:
    """The newest committed step of the root ``store`` whose chunks this rank of ``net``'s layout
    (``strategy`` when given) reads verify, for every rank of the job when MindSpore's
    communication is initialised (:func:`~ckptstore.store.store.open_verified`)."""
    if isinstance(store, Store):
        raise InvalidOptionError("fallback=True needs the path or URL of the root of steps, not an open Store")

    def reads(st: Store) -> dict[str, Any]:
        resolved = resolve_target(st, strategy) if strategy is not None else net_strategy(net, st)
        target = resolved if resolved is not None else Strategy({}, 1, 1, ())
        return target_boxes(st, target, resolve_rank(rank, target))

    return open_verified(store, reads, workers=workers or 4, agree=job_agreement())


def _pipeline_shared(param: Any) -> bool:
    info = getattr(param, "param_info", None)
    return bool(getattr(info, "is_pipeline_shared_param", False))


def _dropped_prefix(not_loaded: Sequence[str], available: Iterable[str]) -> str | None:
    """The prefix MindSpore's loader would strip: that of the first store name ending with a
    network name it could not load (``_load_dismatch_prefix_params``)."""
    for net_name in not_loaded:
        for store_name in available:
            if store_name.endswith(net_name) and store_name != net_name:  # (equal names loaded already)
                return store_name[:-len(net_name)]
    return None


class _NetLoader:
    """Reads each matched slice into its network Parameter."""

    def __init__(self, store: Store, boxes: dict[str, Any], dtype: np.dtype | None, verify: bool,
                 strict_load: bool, workers: int) -> None:
        self.store, self.boxes, self.dtype, self.verify = store, boxes, dtype, verify
        self.strict_load, self.workers = strict_load, workers
        self.cost = store.data.read_cost()  # the store's source prices requests (local, or an object store)

    def load(self, loads: dict[str, tuple[str, Any]], rank: int, quiet: bool = True) -> None:
        """Read every slice of ``loads`` (store name -> (network name, Parameter)) into its Parameter.

        Every shape and dtype (and the byte extents of large slices) is checked before the first
        byte lands in the network, and Parameters are handed their data only once every read has
        finished: a mismatch, or a store that does not hold the bytes, leaves the network as it was
        (MindSpore's loader stops at the first mismatch with the parameters before it already
        loaded). Slices read in place into the network's own memory are the exception to the
        second half: a read error midway leaves those partly written.
        """
        plans = []
        for key, (_, param) in loads.items():
            if self.store.info(key).is_str:
                continue
            plan = self._plan(key, param, rank)
            check_extents(plan, self.store.data)
            plans.append((param, plan))
        pending = []
        with Executor(self.store.data, workers=self.workers) as executor:
            for param, plan in plans:
                target, in_place = self._destination(param, plan)
                pending.append((param, target, in_place, executor.submit(plan, target)))
            with Progress(sum(t.nbytes for _, t, _, _ in pending), len(pending),
                          desc=f"load_into_net rank {rank}", quiet=quiet) as progress:
                for _, target, _, job in pending:
                    job.wait()
                    progress.add(target.nbytes, 1)
            _hand_over([(param, target, in_place) for param, target, in_place, _ in pending])

    def load_together(self, loads: dict[str, tuple[str, Any]], rank: int, exchange: Exchange) -> None:
        """:meth:`load` with the ranks of ``exchange``'s group (:func:`~ckptstore.read.group_load.load_together`):
        a shape, dtype or extent error on any rank is raised on every rank before a byte moves."""
        error: BaseException | None = None
        plans: dict[str, Any] = {}
        outs: dict[str, np.ndarray] = {}
        ready = []
        try:
            for key, (_, param) in loads.items():
                if self.store.info(key).is_str:
                    continue
                plan = self._plan(key, param, rank)
                check_extents(plan, self.store.data)
                target, in_place = self._destination(param, plan)
                plans[key], outs[key] = plan, target
                ready.append((param, target, in_place))
        except Exception as e:  # any error: said to the group, then raised on every rank
            error = e
        load_together(exchange, self.store, None if error else plans, None if error else outs, error=error,
                      workers=self.workers)
        _hand_over(ready)

    def _plan(self, key: str, param: Any, rank: int) -> Any:
        info = self.store.read_info(key, verify=self.verify)
        box = self.boxes[key]
        shape = info.shape if box is None else box.shape
        if tuple(param.shape) != tuple(shape) and not same_but_trailing_ones(param.shape, shape):
            raise LayoutMismatchError(
                f"parameter {param.name!r}: the network expects shape {list(param.shape)} but rank {rank} of the "
                f"target layout holds {list(shape)} of the global {list(info.shape)}; pass the strategy file the "
                "network was compiled with (strategy=...)")
        return plan_param(info, box, out_dtype=self._dtype_for(param, info.np_dtype), verify=self.verify,
                          cost=self.cost)

    def _dtype_for(self, param: Any, stored: np.dtype) -> np.dtype:
        want = lookup(str(param.dtype)).numpy
        if self.dtype is not None and is_float(stored) and want == self.dtype:
            return want
        if want == stored:
            return stored
        same_kind = is_float(want) == is_float(stored) and np.dtype(want).kind != "b" and np.dtype(stored).kind != "b"
        if self.strict_load or not same_kind:
            raise InvalidOptionError(
                f"parameter {param.name!r} is {lookup(want).name} in the network but {lookup(stored).name} in the "
                "store" + ("; strict=True forbids converting it (pass strict=False to convert)" if same_kind else ""))
        return want

    def _destination(self, param: Any, plan: Any) -> tuple[np.ndarray, bool]:
        """The network's own memory when MindSpore exposes it writable, else a fresh array."""
        from ckptstore.store.memory import empty

        want_dtype = lookup(str(param.dtype)).numpy
        if not getattr(param, "has_init", True) and not getattr(param, "is_meta", False):
            try:
                host = param.asnumpy()
                shared = host.__array_interface__["data"][0] == param.data_ptr()  # a view, not a copy
            except (TypeError, RuntimeError, AttributeError):
                shared = False  # bfloat16 under numpy 2, a device tensor, or an older MindSpore
            if (shared and host.flags.writeable and host.flags.c_contiguous and host.dtype == want_dtype
                    and host.size == prod(plan.shape)):
                return host.reshape(plan.shape), True  # a view (C-contiguous): the same memory
        return empty(plan.shape, want_dtype), False


def _hand_over(filled: Sequence[tuple[Any, np.ndarray, bool]]) -> None:
    """Give each Parameter its filled array (those read in place already hold it)."""
    for param, target, in_place in filled:
        if not in_place:
            target = target.reshape(tuple(param.shape))  # a [1] value of a [] parameter, or the reverse
            param.set_data(_ms().Tensor.from_numpy(target), getattr(param, "sliced", False))
        if hasattr(param, "init_param") and not param.init_param:
            param.init_param = True


def same_but_trailing_ones(net_shape: Sequence[int], stored_shape: Sequence[int]) -> bool:
    """Whether two shapes differ only by trailing axes of size 1 (``[]`` and ``[1]``, ``[4]`` and
    ``[4, 1]``): MindSpore writes 0-d values as ``[1]`` on some paths and ``load_param_into_net``
    accepts a stored shape with such extra axes (``_special_process_par``); here either way round,
    the Parameter keeping its own shape. Any other difference is a layout mismatch."""
    def strip(shape: Sequence[int]) -> tuple[int, ...]:
        out = tuple(int(s) for s in shape)
        while out and out[-1] == 1:
            out = out[:-1]
        return out

    return strip(net_shape) == strip(stored_shape)
