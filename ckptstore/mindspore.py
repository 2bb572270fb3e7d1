"""MindSpore side: Parameters built on demand from a store, and loading a store into a Cell.

This is the only module that imports MindSpore, and only when one of its functions is called.

How a Parameter gets its memory: the rank's slice is read into a fresh array (anonymous memory,
filled once from the page cache); a placeholder Parameter is made on MindSpore's ``meta`` device
(no data allocated, no process-wide switch flipped, so threads may build Parameters at once) and
``set_data`` hands it ``Tensor.from_numpy(array)``, which shares the array's memory. The bytes
are therefore copied exactly once, page cache -> Parameter. (``Parameter(Tensor(array))``
copies twice, slowly, and fails for bfloat16 under numpy 2.) With ``copy=False``, slices that
are one whole stored chunk are handed over as copy-on-write memory maps of the store file: no
copy at all, for host-side use.

:func:`load_into_net` follows ``mindspore.load_param_into_net``: network parameters are matched
by ``Parameter.name`` (the checkpoint key), so an ``nn.TrainOneStepCell`` gets its optimizer
state too. Slices are read straight into the network's own memory when MindSpore exposes it
(an initialised CPU tensor), else handed over with ``set_data``.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections.abc import ItemsView, KeysView, ValuesView
from typing import Any, Iterator, Sequence

import numpy as np

from ckptstore.dtypes import is_float, lookup, mindspore_name
from ckptstore.deprecated import synonym
from ckptstore.errors import InvalidOptionError, LayoutMismatchError
from ckptstore.read.loader import (
    RankView,
    StrategyLike,
    check_workers,
    float_dtype,
    rank_view,
    resolve_rank,
    resolve_target,
    target_boxes,
)
from ckptstore.store.read_plan import plan_param
from ckptstore.store.executor import Executor, check_extents
from ckptstore.store.store import Store, StoreLike, as_store
from ckptstore.checkpoint.strategy import Layout, Strategy, strategy_from_layouts


def _ms() -> Any:
    """MindSpore, imported on first use; where it is not installed, an error that says what
    needs it and what reads the same values without it (the parameters are built lazily, so
    this may first be reached when one is looked up)."""
    try:
        import mindspore
    except ModuleNotFoundError as e:
        if e.name != "mindspore":  # a module MindSpore itself lacks: its own message says which
            raise
        raise ModuleNotFoundError("ckptstore's load_rank, load_into_net and StoreCheckpoint build mindspore.Parameters "
                                  "and need MindSpore, which this Python cannot import (pip install "
                                  "'ckptstore[mindspore]'); ckptstore.read_rank gives the same values as numpy arrays "
                                  "without it", name="mindspore") from e
    return mindspore


def _ms_dtype(dtype: np.dtype) -> Any:
    name = mindspore_name(dtype)  # "BFloat16" -> mindspore.bfloat16, "Bool" -> mindspore.bool_
    return getattr(_ms(), "bool_" if name == "Bool" else name.lower())


_flag_lock = threading.Lock()
_meta_supported: bool | None = None


def _placeholder(name: str, shape: tuple[int, ...], dtype: np.dtype, requires_grad: bool) -> Any:
    """A Parameter with no data yet: on the ``meta`` device where MindSpore has it (2.5 and
    later), else created with initialisation switched off (a class-wide flag: under a lock)."""
    global _meta_supported
    ms = _ms()
    from mindspore.common.initializer import Zero

    if _meta_supported is not False:
        try:
            tensor = ms.Tensor(shape=shape, dtype=_ms_dtype(dtype), init=Zero(), device="meta")
            _meta_supported = True
            return ms.Parameter(tensor, name=name, requires_grad=requires_grad)
        except TypeError:
            _meta_supported = False
    with _flag_lock:
        previous = getattr(ms.Parameter, "init_param", True)
        ms.Parameter.init_param = False
        try:
            return ms.Parameter(ms.Tensor(shape=shape, dtype=_ms_dtype(dtype), init=Zero()), name=name,
                                requires_grad=requires_grad)
        finally:
            ms.Parameter.init_param = previous


def to_parameter(name: str, array: np.ndarray, *, requires_grad: bool = True) -> Any:
    """A ``mindspore.Parameter`` named ``name`` that shares ``array``'s memory (no copy)."""
    param = _placeholder(name, tuple(array.shape), array.dtype, requires_grad)
    param.set_data(_ms().Tensor.from_numpy(array))
    return param


class RankParameters(dict):  # type: ignore[type-arg]
    """The Parameters of one target rank: every name known at once, each built on first access.

    A ``dict`` (so ``mindspore.load_param_into_net`` takes it as it is) whose values are read
    and built when first asked for: ``params[name]``, ``get``, iterating ``items()`` or
    ``values()`` (which build everything: the pool reads every slice first, then the Parameters
    are built; not overlapped, which measured slower on 2 cores), or :meth:`materialize`. Each Parameter is built once, even when threads ask for it
    together. ``plan`` shows every read before any happens; ``view`` is the numpy-level
    :class:`~ckptstore.read.loader.RankView`. String values (``append_dict`` text) are returned as
    ``str``, like ``mindspore.load_checkpoint``. The mapping is read-only.
    """

    def __init__(self, view: RankView, *, copy: bool = True) -> None:
        super().__init__()
        self.view = view
        self.copy = copy
        self._names = list(view.boxes)
        self._known = set(self._names)
        self._lock = threading.Lock()
        self._building: dict[str, threading.Event] = {}

    @property
    def plan(self) -> Any:
        return self.view.plan

    # -- reading the mapping ------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        if name not in self._known:
            raise KeyError(name)
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        if self._claim([name]):
            try:
                self._build_all([name])
            finally:
                self._release([name])
        else:
            self._wait(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in self._known else default

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        return KeysView(self)  # type: ignore[arg-type]

    def items(self) -> ItemsView[str, Any]:  # type: ignore[override]
        self.materialize()
        return ItemsView(self)  # type: ignore[arg-type]

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        self.materialize()
        return ValuesView(self)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dict) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<RankParameters {len(self)} parameters, {dict.__len__(self)} built>"

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("RankParameters is read-only; materialize() returns an ordinary dict of its Parameters")

    __setitem__ = __delitem__ = pop = popitem = setdefault = update = clear = _read_only  # type: ignore[assignment]

    # -- building -----------------------------------------------------------------------------

    def materialize(self, workers: int | None = None) -> dict[str, Any]:
        """Build every Parameter now (every read first, then every Parameter); return them as a dict."""
        if workers is not None:
            self.view.workers = workers
        mine = [n for n in self._names if not dict.__contains__(self, n)]
        claimed = [n for n in mine if self._claim([n])]
        try:
            self._build_all(claimed)
        finally:
            self._release(claimed)
        for name in mine:
            if name not in claimed:
                self._wait(name)
        return {n: dict.__getitem__(self, n) for n in self._names}

    def _claim(self, names: Sequence[str]) -> bool:
        """Mark ``names`` as being built by this thread; False if one is built or being built."""
        with self._lock:
            if any(dict.__contains__(self, n) or n in self._building for n in names):
                return False
            for n in names:
                self._building[n] = threading.Event()
            return True

    def _release(self, names: Sequence[str]) -> None:
        with self._lock:
            for n in names:
                event = self._building.pop(n, None)
                if event is not None:
                    event.set()

    def _wait(self, name: str) -> None:
        with self._lock:
            event = self._building.get(name)
        if event is not None:
            event.wait()
        if not dict.__contains__(self, name):  # the builder failed: try ourselves
            self[name]

    def _build_all(self, names: Sequence[str]) -> None:
        rest = list(names)
        if not self.copy:
            for name in names:
                mapped = self.view.mapped(name)
                if mapped is not None:
                    dict.__setitem__(self, name, to_parameter(name, mapped))
                    rest.remove(name)
        # every read first, then every Parameter: building them while the pool reads (both need
        # the interpreter) measured slower and less steady on 2 cores
        values = self.view.read_many(rest) if len(rest) > 1 else {n: self.view.read(n) for n in rest}
        for name, value in values.items():
            dict.__setitem__(self, name, value if isinstance(value, str) else to_parameter(name, value))


def load_rank(store: StoreLike, strategy: StrategyLike = None, rank: int | None = None, *,
              include: str | Sequence[str] | None = None, dtype: Any = None, copy: bool = True,
              verify: bool = False, workers: int | None = None, allow_whole: bool = False,
              names: str | Sequence[str] | None = None) -> RankParameters:
    """The ``mindspore.Parameter``\\ s rank ``rank`` of ``strategy`` holds, built lazily from ``store``.

    ``store`` is a path, an ``s3://``/``obs://`` URL or a :class:`~ckptstore.store.store.Store`.
    ``strategy`` is the target's strategy file(s) or a :class:`~ckptstore.checkpoint.strategy.Strategy`;
    ``None`` means the store's source layout. ``rank=None`` is this process's rank
    (``mindspore.communication`` when initialised, else ``RANK_ID``; an error when neither says
    and the target has several ranks; any process reads a one-rank target). ``include`` are globs
    of the parameters to load, as ``--include`` (``names=`` is the same option); ``dtype`` (e.g.
    ``mindspore.float16``) converts floating-point parameters while reading, chunk by chunk;
    ``verify`` checks each touched chunk's CRC-32C; ``workers`` threads read (by default 2-4 for
    local stores, 16 for object storage). Values equal what
    ``mindspore.transform_checkpoints`` followed by ``load_checkpoint`` gives for that rank;
    parameters the target does not describe come whole. A ``strategy`` that describes fewer
    than half of them is refused as another model's
    (:class:`~ckptstore.errors.ForeignStrategyError`) unless ``allow_whole``. The result is a
    ``dict`` that ``mindspore.load_param_into_net`` accepts.
    """
    include = synonym(include, names, name="include", other_name="names")
    view = rank_view(as_store(store), strategy, rank, names=include, dtype=dtype, verify=verify,
                     workers=workers, allow_whole=allow_whole)
    return RankParameters(view, copy=copy)


def net_strategy(net: Any, store: Store) -> Strategy | None:
    """The layouts of a Cell compiled in (semi-)auto parallel mode, or ``None`` if it has none.

    Reads ``net.parameter_layout_dict`` as MindSpore's parallel compiler fills it: per
    ``Parameter.name``, ``[dev_matrix, tensor_map, slice_shape, field_size, uniform_split,
    opt_shard_group, ...]``. Optimizer sharding shows as a slice with fewer rows than the
    model-parallel split gives; the number of shards is that ratio, taken over the replica
    axes as MindSpore's optimizer does.
    """
    layouts = {name: _compiled_layout(lay, store.info(name).shape if name in store else None)
               for name, lay in (getattr(net, "parameter_layout_dict", None) or {}).items()}
    return strategy_from_layouts(layouts) if layouts else None


def _compiled_layout(lay: Sequence[Any], full_shape: Sequence[int] | None) -> Layout:
    """One ``parameter_layout_dict`` entry as a :class:`Layout`, given the parameter's global shape
    (optimizer sharding is the ratio of the model-parallel slice to the compiled slice)."""
    maps = tuple(() if m == -1 else tuple(m) if isinstance(m, (list, tuple)) else (int(m),) for m in lay[1])
    base = Layout(tuple(int(d) for d in lay[0]), maps)
    slice_shape, parts = [int(x) for x in lay[2]], 0
    if full_shape and slice_shape and base.splits():
        mp_rows = int(full_shape[0]) // base.splits()[0]
        parts = mp_rows // slice_shape[0] if slice_shape[0] and slice_shape[0] < mp_rows else 0
    return Layout(base.dev_matrix, maps, 1 if parts else 0, parts)


def load_into_net(net: Any, store: StoreLike, strategy: StrategyLike = None,
                  rank: int | None = None, *, strict: bool = False, dtype: Any = None,
                  verify: bool = False, workers: int | None = None,
                  strict_load: bool | None = None) -> tuple[list[str], list[str]]:
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
    they are, dtypes as they are, and every network parameter found (else an error).
    ``strict_load=True`` (deprecated, MindSpore's name) keeps its old meaning: exact names and
    dtypes, with missing parameters returned rather than raised. Each slice must have the network
    parameter's shape.
    """
    if strict_load is not None:
        warnings.warn("ckptstore: load_into_net(strict_load=) is deprecated; use strict=True (exact names and dtypes, "
                      "and an error for network parameters not in the store)", DeprecationWarning, stacklevel=2)
    exact = strict or bool(strict_load)
    st = as_store(store)
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
    _NetLoader(st, available, float_dtype(dtype), verify, exact, check_workers(workers, st)).load(loads, rank)
    return param_not_load, ckpt_not_load


def _pipeline_shared(param: Any) -> bool:
    info = getattr(param, "param_info", None)
    return bool(getattr(info, "is_pipeline_shared_param", False))


def _dropped_prefix(not_loaded: Sequence[str], available: Sequence[str]) -> str | None:
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

    def load(self, loads: dict[str, tuple[str, Any]], rank: int) -> None:
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
            for *_, job in pending:
                job.wait()
            for param, target, in_place, _ in pending:
                if not in_place:
                    param.set_data(_ms().Tensor.from_numpy(target), getattr(param, "sliced", False))
                if hasattr(param, "init_param") and not param.init_param:
                    param.init_param = True

    def _plan(self, key: str, param: Any, rank: int) -> Any:
        info = self.store.info(key)
        box = self.boxes[key]
        shape = info.shape if box is None else box.shape
        if tuple(param.shape) != tuple(shape):
            raise LayoutMismatchError(
                f"parameter {param.name!r}: the network expects shape {list(param.shape)} but rank {rank} of the "
                f"target layout holds {list(shape)} of the global {list(info.shape)}; pass the strategy file the "
                "network was compiled with (strategy=...)")
        return plan_param(info, box, out_dtype=self._dtype_for(param, info.np_dtype), verify=self.verify)

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
                    and host.shape == plan.shape):
                return host, True
        return empty(plan.shape, want_dtype), False


# ---- saving: MindSpore values to host arrays, this process's place in the job ------------------


def host_values(params: Any) -> tuple[dict[str, np.ndarray | str], Strategy | None]:
    """What :func:`ckptstore.save_rank` was given, numpy-side, and a Cell's own layouts.

    A Cell gives its ``parameters_dict()`` (keyed by ``Parameter.name``, so an optimizer's state
    keeps the names ``load_param_into_net`` matches) and, when compiled in (semi-)auto parallel
    mode, the layouts of its ``parameter_layout_dict`` (whose entries carry each global shape).
    ``Parameter``/``Tensor`` values become :class:`~ckptstore.write.save.LazyArray` values, brought
    to host memory only when written (bfloat16 as ``ml_dtypes.bfloat16``, which ``asnumpy``
    cannot return under numpy 2); other values are taken as they are.
    """
    from ckptstore.write.save import LazyArray, plain_value

    ms = _ms()
    strategy = None
    if isinstance(params, ms.nn.Cell):
        compiled = getattr(params, "parameter_layout_dict", None) or {}
        layouts = {n: _compiled_layout(lay, lay[6] if len(lay) > 6 else None) for n, lay in compiled.items()}
        strategy = strategy_from_layouts(layouts) if layouts else None
        params = params.parameters_dict()
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, ms.Tensor):  # fetched when written: nothing is copied to plan the save
            out[str(name)] = LazyArray(value.shape, lookup(str(value.dtype)).numpy, lambda t=value: host_array(t))
        else:
            out[str(name)] = plain_value(str(name), value)
    return out, strategy


def host_array(tensor: Any) -> np.ndarray:
    """A MindSpore Tensor's (or Parameter's) values in host memory, C-contiguous."""
    ms = _ms()
    if tensor.dtype == ms.bfloat16:  # asnumpy() of bfloat16 fails under numpy 2: go through float32 (exact)
        from ckptstore.dtypes import BFLOAT16

        return np.asarray(tensor.astype(ms.float32).asnumpy().astype(BFLOAT16), order="C")
    return np.asarray(tensor.asnumpy(), order="C")


def initialised_rank() -> int | None:
    """This process's rank when MindSpore's communication is initialised, else ``None``."""
    from mindspore.communication import GlobalComm, get_rank

    # without init() get_rank() answers 0 (standalone), which would make every process rank 0
    return int(get_rank()) if GlobalComm.INITED else None


def group_size() -> int | None:
    """The job's size when MindSpore's communication is initialised, else ``None``."""
    from mindspore.communication import GlobalComm, get_group_size

    return int(get_group_size()) if GlobalComm.INITED else None


# ---- StoreCheckpoint: a training callback saving into a store ----------------------------------


def _store_checkpoint_class() -> type:
    """Build :class:`StoreCheckpoint` (a ``mindspore.train.Callback``, so MindSpore is imported
    only when it is first asked for)."""
    from mindspore.train import Callback

    from ckptstore.write.async_save import AsyncSaver
    from ckptstore.write.retention import prune_steps
    from ckptstore.write.save import SaveSummary, prepare_save

    class StoreCheckpoint(Callback):  # type: ignore[misc, valid-type]
        """Save the trained cell into ``root/step_<N>`` every ``save_checkpoint_steps`` steps.

        For ``Model.train(callbacks=[...])`` (and MindFormers' callback lists) on every rank of
        the job, like ``ModelCheckpoint``: the saved cell is the training network (weights and
        optimizer state, by ``Parameter.name``), each distinct slice written once across the job
        (:func:`ckptstore.save_rank`). ``strategy`` is the job's strategy file(s); by default the
        network's compiled layouts, or whole tensors. With ``async_save`` the step waits only
        while this rank's slices are copied to host memory (at most ``memory_budget_mb`` MB at a
        time; the copy waits for the writer when the rank holds more), a background thread
        writes them, the next save waits for the previous, and an error of the writer is raised
        at the next step or at the end of training. The newest ``keep_checkpoint_max`` committed
        steps are kept; older ones are deleted once a newer one is committed. ``append_info``
        adds ``"epoch_num"``/``"step_num"`` (names) or a dict of values, as ``CheckpointConfig``
        does. ``include``/``exclude`` are name globs.
        """

        def __init__(self, root: str | os.PathLike[str], *, save_checkpoint_steps: int = 1,
                     keep_checkpoint_max: int | None = 5, strategy: Any = None, async_save: bool = True,
                     include: Sequence[str] = (), exclude: Sequence[str] = (), memory_budget_mb: int | None = None,
                     append_info: Any = None, rank: int | None = None) -> None:
            super().__init__()
            for what, v in (("save_checkpoint_steps", save_checkpoint_steps), ("keep_checkpoint_max",
                                                                             keep_checkpoint_max or 1),
                            ("memory_budget_mb", memory_budget_mb or 1)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise InvalidOptionError(f"{what} must be a positive integer, not {v!r}")
            self.root, self.every, self.keep = root, save_checkpoint_steps, keep_checkpoint_max
            self.strategy, self.rank, self.async_save = strategy, rank, async_save
            self.include, self.exclude, self.append_info = tuple(include), tuple(exclude), append_info
            self.saver = AsyncSaver(memory_budget=None if memory_budget_mb is None else memory_budget_mb << 20,
                                    on_done=self._after)
            self.summaries: list[SaveSummary] = []
            self._last = 0

        def on_train_step_end(self, run_context: Any) -> None:
            self.saver.check()  # a background save that failed stops training here
            cb = run_context.original_args()
            # as ModelCheckpoint triggers: in sink mode the step number advances by the sink size
            if cb.cur_step_num - self._last >= self.every:
                self._last = cb.cur_step_num
                self._save(cb)

        def on_train_end(self, run_context: Any) -> None:
            self.saver.wait()

        def _save(self, cb: Any) -> None:
            values, compiled = host_values(cb.train_network)
            values.update(_append(self.append_info, cb))
            strategy = self.strategy if self.strategy is not None else compiled
            job = prepare_save(values, self.root, step=int(cb.cur_step_num), strategy=strategy, rank=self.rank,
                               include=self.include, exclude=self.exclude)  # the saver copies within its budget
            if self.async_save:
                self.saver.save(job)
            else:
                self._after(job.write())

        def _after(self, summary: SaveSummary) -> None:
            self.summaries.append(summary)
            if summary.committed and self.keep:
                prune_steps(self.root, self.keep, protect=(summary.step,))

    return StoreCheckpoint


def _append(info: Any, cb: Any) -> dict[str, Any]:
    """The ``append_info`` values of this step (``CheckpointConfig``'s meaning)."""
    if not info:
        return {}
    if isinstance(info, dict):
        return dict(info)
    counters = {"epoch_num": int(cb.cur_epoch_num), "step_num": int(cb.cur_step_num)}
    out = {}
    for item in info:
        if isinstance(item, dict):
            out.update(item)
        elif item in counters:
            out[item] = counters[item]
        else:
            raise InvalidOptionError(f"append_info entries are 'epoch_num', 'step_num' or a dict, not {item!r}")
    return out


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name == "StoreCheckpoint":
        if name not in _CLASSES:
            _CLASSES[name] = _store_checkpoint_class()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
