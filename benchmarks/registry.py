"""Which contenders each scenario runs: a list of factories per scenario, open to plug-ins.

A *factory* takes the scenario's setup (``bench_load.LoadSetup``, ``bench_convert.ConvertSetup``,
``bench_node.NodeSetup``) and returns a :class:`~benchmarks.harness.Contender`, a list of
them, or ``None`` (nothing to add for this setup). Benchmarks call :func:`contenders_for`, which
first imports the optional plug-in package ``benchmarks.peers`` (PyTorch DCP, Orbax, ...) so
that its modules can register their own factories::

    from benchmarks.registry import register

    @register("load")
    def torch_dcp(setup):
        return Contender("torch.distributed.checkpoint", "benchmarks.peers.dcp", "load", {...},
                         unavailable=None if have_torch() else "torch is not installed")

A factory that raises is reported as an unavailable contender (its error in one line, for the
table cell; the traceback goes to stderr), never as a crashed benchmark.
"""
from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import Contender

FactoryResult = Contender | Sequence[Contender] | None
Factory = Callable[[Any], FactoryResult]
SCENARIOS = ("load", "convert", "node")

FACTORIES: dict[str, list[Factory]] = {s: [] for s in SCENARIOS}
_PLUGINS = ("benchmarks.peers",)


def register(scenario: str) -> Callable[[Factory], Factory]:
    """Decorator: add a contender factory to ``scenario`` (in registration order)."""
    if scenario not in FACTORIES:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")

    def add(factory: Factory) -> Factory:
        if factory not in FACTORIES[scenario]:
            FACTORIES[scenario].append(factory)
        return factory

    return add


def load_plugins() -> list[str]:
    """Import the optional plug-in packages; returns the ones that failed, with the reason."""
    problems = []
    for name in _PLUGINS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # the package exists but one of its imports is missing
                problems.append(f"{name}: {e}")
        except Exception as e:  # a broken plug-in must not stop the suite
            problems.append(f"{name}: {type(e).__name__}: {e}")
    return problems


def contenders_for(scenario: str, setup: Any) -> list[Contender]:
    """Every registered factory's contenders for ``setup`` (plug-ins loaded first)."""
    load_plugins()
    out: list[Contender] = []
    for factory in FACTORIES[scenario]:
        try:
            made = factory(setup)
        except Exception as e:
            name = getattr(factory, "__name__", repr(factory))
            print(f"contender factory {name} failed:\n{traceback.format_exc(limit=3)}", file=sys.stderr, flush=True)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            out.append(Contender(name, "", "", unavailable=f"setting up failed: {type(e).__name__}: {first}"))
            continue
        if made is None:
            continue
        out += [made] if isinstance(made, Contender) else list(made)
    return out
