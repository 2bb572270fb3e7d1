"""Hooks by which a higher floor serves a lower one without the lower importing it.

The write side takes numpy values; a MindSpore Cell, ``Parameter`` or ``Tensor`` handed to
:func:`ckptstore.save_rank` or :class:`ckptstore.StoreSaver` is turned into them by the MindSpore
side (:mod:`ckptstore.mindspore.values`), which imports the write side. The package
(``ckptstore/__init__.py``, which every import of a submodule runs first) installs that adapter
here, and :func:`ckptstore.write.values.host_values` calls it: so no module imports from a floor
above its own (tests/test_import_graph.py), and numpy callers never import MindSpore.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``params -> (host values, a Cell's own strategy or None)`` for values that are not plain.
ValueAdapter = Callable[[Any], Any]

_value_adapter: ValueAdapter | None = None


def set_value_adapter(adapter: ValueAdapter) -> None:
    """Install the adapter of values that are not plain numpy ones (the package installs MindSpore's)."""
    global _value_adapter
    _value_adapter = adapter


def value_adapter() -> ValueAdapter | None:
    """The installed adapter of values that are not plain numpy ones, if any."""
    return _value_adapter
