"""Parameters built on demand from a store: :func:`load_rank` and its lazy mapping.

How a Parameter gets its memory: the rank's slice is read into a fresh array (anonymous memory,
filled once from the page cache); a placeholder Parameter is made on MindSpore's ``meta`` device
(no data allocated, no process-wide switch flipped, so threads may build Parameters at once) and
``set_data`` hands it ``Tensor.from_numpy(array)``, which shares the array's memory. The bytes
are therefore copied exactly once, page cache -> Parameter. (``Parameter(Tensor(array))``
copies twice, slowly, and fails for bfloat16 under numpy 2.) With ``copy=False``, slices that
are one whole stored chunk are handed over as copy-on-write memory maps of the store file: no
copy at all, for host-side use.
"""
from __future__ import annotations

import threading
from collections.abc import ItemsView, Iterator, KeysView, Sequence, ValuesView
from typing import Any

import numpy as np

from ckptstore.collector import collector_paused
from ckptstore.mindspore._import import mindspore as _ms
from ckptstore.mindspore._import import ms_dtype as _ms_dtype
from ckptstore.read.group_load import Cooperative
from ckptstore.read.loader import (
    RankView,
    StrategyLike,
    include_globs,
    rank_view,
    read_together,
    verified_store,
)
from ckptstore.store.store import StoreLike, as_store

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


class RankParameters(dict):
    """The Parameters of one target rank: every name known at once, each built on first access.

    A ``dict`` (so ``mindspore.load_param_into_net`` takes it as it is) whose values are read
    and built when first asked for: ``params[name]``, ``get``, iterating ``items()`` or
    ``values()`` (which build everything: the pool reads every slice first, then the Parameters
    are built; not overlapped, which measured slower on 2 cores), or :meth:`materialize`. Each
    Parameter is built once, even when threads ask for it together. ``plan`` shows every read
    before any happens; ``view`` is the numpy-level :class:`~ckptstore.read.loader.RankView`.
    String values (``append_dict`` text) are returned as ``str``, like
    ``mindspore.load_checkpoint``. The mapping is read-only.
    """

    def __init__(self, view: RankView, *, copy: bool = True) -> None:
        super().__init__()
        self.view = view
        self.copies = copy  # not self.copy, which would hide dict.copy()
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

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self._known else default

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self) -> KeysView[str]:  # type: ignore[override]  # a view over the lazy mapping, not dict_keys
        return KeysView(self)

    def items(self) -> ItemsView[str, Any]:  # type: ignore[override]  # a view over the built mapping, not dict_items
        self.materialize()
        return ItemsView(self)

    def values(self) -> ValuesView[Any]:  # type: ignore[override]  # a view over the built mapping, not dict_values
        self.materialize()
        return ValuesView(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dict) and dict(self.items()) == dict(other.items())

    __hash__ = None

    def summary(self) -> str:
        """One line: the rank, the store and its step, parameters and bytes (:meth:`RankView.summary
        <ckptstore.read.loader.RankView.summary>`), and how many Parameters are built so far."""
        return f"{self.view.summary()}; {dict.__len__(self)} built"

    def __repr__(self) -> str:
        return f"<RankParameters {self.summary()}>"

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("RankParameters is read-only; materialize() returns an ordinary dict of its Parameters")

    __setitem__ = __delitem__ = pop = popitem = setdefault = update = clear = _read_only  # type: ignore[assignment]  # all raise

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
        with collector_paused():  # Parameters are a few objects each: no collection midway
            self._build(names)

    def _build(self, names: Sequence[str]) -> None:
        rest = list(names)
        if not self.copies:
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
              quiet: bool = True, names: str | Sequence[str] | None = None,
              cooperative: Cooperative = None, fallback: bool = False) -> RankParameters:
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
    ``dict`` that ``mindspore.load_param_into_net`` accepts. ``quiet=False`` shows the progress
    of building many Parameters at once (``items()``, ``values()``, :meth:`~RankParameters.materialize`).
    ``cooperative`` (``"replicas"``, ``"node"`` or a list of ranks; every rank of the group calls at
    once, after ``mindspore.communication.init()``) reads everything now, each distinct byte once in the
    group, as :func:`ckptstore.read_rank` does; the Parameters are built from those values.
    ``fallback=True`` loads the newest committed step of the root ``store`` whose chunks this rank
    reads verify, the same step on every rank of the job (:func:`~ckptstore.read.loader.verified_store`).
    """
    include = include_globs(include, names)
    if fallback:
        store = verified_store(store, strategy, rank, include, workers)
    if cooperative is not None:
        st = as_store(store)
        view, values = read_together(st, strategy, rank, cooperative, names=include, dtype=dtype, verify=verify,
                                     workers=workers, allow_whole=allow_whole)
        built = RankParameters(view, copy=copy)
        for name, value in values.items():
            dict.__setitem__(built, name, value if isinstance(value, str) else to_parameter(name, value))
        return built
    view = rank_view(as_store(store), strategy, rank, names=include, dtype=dtype, verify=verify,
                     workers=workers, allow_whole=allow_whole, quiet=quiet)
    return RankParameters(view, copy=copy)
