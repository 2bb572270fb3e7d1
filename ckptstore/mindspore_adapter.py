"""MindSpore side: Parameters built on demand from a store, loading into a Cell.

This is the only module that imports MindSpore, and only when one of its functions is called.

How a Parameter gets its memory: the rank's slice is read into a fresh numpy array (ordinary
anonymous memory, filled once from the page cache); a placeholder Parameter is created with
initialisation off (what ``mindspore.nn.utils.no_init_parameters`` does, so no data is allocated)
and ``set_data`` hands it ``Tensor.from_numpy(array)``, which shares the array's memory. The bytes are therefore copied
exactly once, page cache -> Parameter. (``Parameter(Tensor(array))`` copies twice and
``Parameter(Tensor.from_numpy(array))`` copies once more at ~1.5 GB/s, and fails for bfloat16
with numpy 2.) With ``copy=False``, slices that are one whole stored chunk are handed over as
copy-on-write memory maps of the store file instead: no copy at all, for host-side use.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np

from .dtypes import mindspore_name
from .errors import LayoutMismatchError
from .loader import RankView, StrategyLike, rank_view
from .store import Store, open as open_store
from .strategy import Layout, Strategy, strategy_from_layouts


def _ms() -> Any:
    import mindspore

    return mindspore


def _ms_dtype(dtype: np.dtype) -> Any:
    name = mindspore_name(dtype)  # "BFloat16" -> mindspore.bfloat16, "Bool" -> mindspore.bool_
    return getattr(_ms(), "bool_" if name == "Bool" else name.lower())


def to_parameter(name: str, array: np.ndarray, *, requires_grad: bool = True) -> Any:
    """A ``mindspore.Parameter`` named ``name`` that shares ``array``'s memory (no copy)."""
    ms = _ms()
    from mindspore.common.initializer import Zero

    # The placeholder must not allocate (or, for bfloat16 under numpy 2, fail to): this is what
    # mindspore.nn.utils.no_init_parameters does (deprecated after 2.9, so done here directly).
    previous = getattr(ms.Parameter, "init_param", True)
    ms.Parameter.init_param = False
    try:
        param = ms.Parameter(ms.Tensor(shape=array.shape, dtype=_ms_dtype(array.dtype), init=Zero()), name=name,
                             requires_grad=requires_grad)
    finally:
        ms.Parameter.init_param = previous
    param.set_data(ms.Tensor.from_numpy(array))
    return param


class RankParameters(Mapping[str, Any]):
    """The Parameters of one target rank: keys known at once, each built on first access.

    ``plan`` shows every read before any happens; ``view`` is the numpy-level
    :class:`~ckptstore.loader.RankView`. String values (``append_dict`` text) are returned as
    ``str``, like ``mindspore.load_checkpoint``.
    """

    def __init__(self, view: RankView, *, copy: bool = True) -> None:
        self.view = view
        self.copy = copy
        self._built: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def plan(self) -> Any:
        return self.view.plan

    def __getitem__(self, name: str) -> Any:
        if name not in self.view.boxes:
            raise KeyError(name)
        with self._lock:
            if name in self._built:
                return self._built[name]
        value = self._build(name)  # outside the lock: materialize() builds several at once
        with self._lock:
            return self._built.setdefault(name, value)

    def materialize(self, workers: int = 4) -> dict[str, Any]:
        """Build every Parameter now, ``workers`` parameters at a time; return them as a dict."""
        names = list(self.view.boxes)
        if workers > 1 and len(names) > 1:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(self.__getitem__, names))
        return {n: self[n] for n in names}

    def _build(self, name: str) -> Any:
        array = None if self.copy else self.view.mapped(name)
        if array is None:
            array = self.view.read(name)
        return array if isinstance(array, str) else to_parameter(name, array)

    def __contains__(self, name: object) -> bool:
        return name in self.view.boxes  # (Mapping's default would build the Parameter, reading it)

    def __iter__(self) -> Iterator[str]:
        return iter(self.view.boxes)

    def __len__(self) -> int:
        return len(self.view.boxes)

    def __repr__(self) -> str:
        return f"<RankParameters {len(self)} parameters, {len(self._built)} built>"


def _as_store(store: Store | str | os.PathLike[str]) -> Store:
    return store if isinstance(store, Store) else open_store(store)


def load_rank(store: Store | str | os.PathLike[str], strategy: StrategyLike = None, rank: int = 0, *,
              names: Sequence[str] | None = None, dtype: Any = None, copy: bool = True, verify: bool = False,
              workers: int = 1) -> RankParameters:
    """The ``mindspore.Parameter``s rank ``rank`` of ``strategy`` holds, built lazily from ``store``.

    ``strategy`` is the target's strategy file(s) or a :class:`~ckptstore.strategy.Strategy`;
    ``None`` means the store's source layout. ``names`` are globs; ``dtype`` (e.g.
    ``mindspore.float16``) converts floating-point parameters while reading, chunk by chunk; ``verify`` checks each
    touched chunk's CRC-32C. Values equal what ``mindspore.transform_checkpoints`` followed by
    ``load_checkpoint`` gives for that rank; parameters the target does not describe come whole.
    """
    view = rank_view(_as_store(store), strategy, rank, names=names, dtype=dtype, verify=verify,
                     workers=workers)
    return RankParameters(view, copy=copy)


def current_rank() -> int:
    """This process's rank: from ``mindspore.communication`` when initialised, else ``RANK_ID``, else 0."""
    try:
        from mindspore.communication import get_rank

        return int(get_rank())
    except Exception:  # not initialised: MindSpore raises RuntimeError or ValueError here
        return int(os.environ.get("RANK_ID", "0"))


def net_strategy(net: Any, store: Store) -> Strategy | None:
    """The layouts of a Cell compiled in (semi-)auto parallel mode, or ``None`` if it has none.

    Reads ``net.parameter_layout_dict`` (device matrix, tensor map, slice shape, ...). Optimizer
    sharding shows as a slice with fewer rows than the model-parallel split gives; its parts
    are taken from the replica axes as MindSpore's optimizer does. (The parallel compiler does
    not run on the CPU wheel, so this path is untested here; pass ``strategy=`` to be explicit.)
    """
    layouts: dict[str, Layout] = {}
    for name, lay in (getattr(net, "parameter_layout_dict", None) or {}).items():
        maps = tuple(() if m == -1 else tuple(m) if isinstance(m, (list, tuple)) else (int(m),) for m in lay[1])
        base = Layout(tuple(int(d) for d in lay[0]), maps)
        slice_shape, parts = list(lay[2]), 0
        if name in store and slice_shape and base.splits():
            mp_rows = store.info(name).shape[0] // base.splits()[0]
            parts = mp_rows // slice_shape[0] if slice_shape[0] and slice_shape[0] < mp_rows else 0
        layouts[name] = Layout(base.dev_matrix, maps, 1 if parts else 0, parts)
    return strategy_from_layouts(layouts) if layouts else None


def load_into_net(net: Any, store: Store | str | os.PathLike[str], strategy: StrategyLike = None,
                  rank: int | None = None, *, strict: bool = False, dtype: Any = None,
                  verify: bool = False) -> tuple[list[str], list[str]]:
    """Load a store into a MindSpore Cell, one parameter slice at a time.

    The target layout is ``strategy`` when given, else the network's own layouts when it was
    compiled in (semi-)auto parallel mode, else whole tensors. ``rank`` defaults to this
    process's rank. Returns ``(param_not_load, ckpt_not_load)`` like
    ``mindspore.load_param_into_net``; with ``strict=True`` a network parameter missing from the
    store is an error. Each slice must have the network parameter's shape.
    """
    st = _as_store(store)
    rank = current_rank() if rank is None else rank
    target = strategy if strategy is not None else net_strategy(net, st)
    if target is None:
        target = Strategy({}, 1, 1, ())
    net_params = dict(net.parameters_and_names())
    wanted = [n for n in net_params if n in st]
    view = rank_view(st, target, rank, names=wanted, dtype=dtype, verify=verify)
    param_not_load = [n for n in net_params if n not in view.boxes]
    if strict and param_not_load:
        raise LayoutMismatchError(f"{len(param_not_load)} network parameters are not in the store {st.root}: "
                                  + ", ".join(param_not_load[:10]) + (" ..." if len(param_not_load) > 10 else ""))
    for name in view.names():
        param = net_params[name]
        array = view.read(name)
        if isinstance(array, str):
            continue
        if tuple(param.shape) != array.shape:
            raise LayoutMismatchError(
                f"parameter {name!r}: the network expects shape {list(param.shape)} but rank {rank} of the target "
                f"layout holds {list(array.shape)} of the global {list(st.info(name).shape)}; pass the strategy "
                "file the network was compiled with (strategy=...)")
        param.set_data(_ms().Tensor.from_numpy(array))
    ckpt_not_load = [n for n in st.names() if n not in net_params]
    return param_not_load, ckpt_not_load
