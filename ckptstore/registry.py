"""Registries of the pluggable parts: store kinds, byte sources and byte sinks, found, not listed.

A pluggable part declares itself in its own module, as a module-level object under an agreed
name (``KIND`` in a module of :mod:`ckptstore.store.kinds`, ``BYTE_SOURCE``/``BYTE_SINK`` in a
module of :mod:`ckptstore.io`); a :class:`Registry` finds the built-in ones by importing every
module of its package (no hand-written list to edit), then those another distribution names
under its entry-point group (``ckptstore.store_kinds``, ``ckptstore.byte_sources``,
``ckptstore.byte_sinks``); a lookup by name asks the package's modules already imported
before importing the others. Adding a part is therefore one new file. Discovery runs on first use,
not at import time, so importing ckptstore stays cheap and no module has to import its plugins.

An entry point that cannot be loaded, or a declaration of the wrong type or reusing a name
already taken, is skipped with a :class:`RuntimeWarning` that says which (a broken plugin does
not break the built-in kinds; a built-in module that fails to import is a bug and raises); the
built-in ones are registered first and so keep their names.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class _Selectable(Protocol):
    """What ``importlib.metadata.entry_points()`` returns: ``EntryPoints`` from Python 3.12 on,
    ``SelectableGroups`` before; both select a group."""

    def select(self, *, group: str) -> importlib.metadata.EntryPoints: ...


#: Every installed distribution's entry points, read once per ``sys.path`` for all registries
#: (reading them scans each distribution's metadata: a few milliseconds in a fresh process, paid
#: by every rank).
_ENTRY_POINTS: dict[tuple[str, ...], _Selectable] = {}


def _entry_points(group: str) -> importlib.metadata.EntryPoints:
    """The entry points of ``group``, from one reading per ``sys.path`` (until a registry reloads)."""
    key = tuple(sys.path)
    if key not in _ENTRY_POINTS:
        _ENTRY_POINTS[key] = importlib.metadata.entry_points()
    return _ENTRY_POINTS[key].select(group=group)


class Registry(Generic[T]):
    """Declarations of type ``cls``, by name: a package's modules' ``attribute``, then entry points."""

    def __init__(self, what: str, cls: type[T], package: str, attribute: str, group: str,
                 names: Callable[[T], Iterable[str]]) -> None:
        self.what, self.cls, self.package, self.attribute, self.group = what, cls, package, attribute, group
        self._names = names
        self._builtins: dict[str, T] | None = None
        self._found: dict[str, T] | None = None
        self._lock = threading.RLock()
        self._discovering = False
        self._imported: dict[str, T] = {}

    def entries(self) -> dict[str, T]:
        """Every declaration by each of its names: built-in ones (in module-name order), then plugins."""
        return self._discovered(plugins=True)

    def builtins(self) -> dict[str, T]:
        """The declarations of the package's own modules, by name (no entry point is read)."""
        return self._discovered(plugins=False)

    def get(self, name: str) -> T | None:
        """The declaration registered as ``name``, or ``None``."""
        # A plugin cannot take a built-in's name, so a built-in is found without reading every
        # installed distribution's entry points (a few milliseconds per registry in a fresh process,
        # which every rank's first open of a local store paid three times).
        # Nor are the package's other modules imported when one already imported declares it (the
        # local file source, which ``import ckptstore`` loads): importing and listing them all cost
        # a fresh process ~2.5 ms at its first open of a local path.
        found = self._imported.get(name)
        if found is None and self._builtins is None:
            found = self._imported_now().get(name)
        if found is None:
            found = self._discovered(plugins=False).get(name)
        return found if found is not None else self.entries().get(name)

    def _imported_now(self) -> dict[str, T]:
        """The declarations of the package's modules imported so far (nothing is imported here):
        what discovery would find in them, as built-ins are registered before any plugin."""
        prefix = self.package + "."
        found: dict[str, T] = {}
        for module_name, module in sorted(list(sys.modules.items()), key=lambda kv: kv[0]):
            if module_name.startswith(prefix) and "." not in module_name[len(prefix):]:
                declared = getattr(module, self.attribute, None)
                if isinstance(declared, self.cls):
                    for n in self._names(declared):
                        found.setdefault(n, declared)
        with self._lock:
            self._imported = found
        return found

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self.entries())

    def reload(self) -> None:
        """Forget what was found; the next lookup discovers again (after a plugin was installed)."""
        with self._lock:
            self._builtins = self._found = None
            self._imported = {}
            _ENTRY_POINTS.clear()

    def _discovered(self, *, plugins: bool) -> dict[str, T]:
        """The built-in declarations, with the plugins' when ``plugins``; discovered on first use."""
        with self._lock:
            if self._builtins is None or (plugins and self._found is None):
                if self._discovering:  # a declaring module asked while being imported: it would wait forever
                    raise RuntimeError(f"a module declaring a {self.what} looked the {self.what}s up while it was "
                                       "being imported; look them up when called, not at import time")
                self._discovering = True
                try:
                    if self._builtins is None:
                        self._builtins = self._discover_builtins()
                    if plugins:
                        self._found = self._discover_plugins(dict(self._builtins))
                finally:
                    self._discovering = False
            found = self._found if plugins else self._builtins
            assert found is not None  # discovered just above, under the lock
            return found

    def _discover_builtins(self) -> dict[str, T]:
        found: dict[str, T] = {}
        package = importlib.import_module(self.package)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            module = importlib.import_module(f"{self.package}.{info.name}")
            declared = getattr(module, self.attribute, None)
            if declared is not None:
                self._add(found, declared, f"{module.__name__}.{self.attribute}")
        return found

    def _discover_plugins(self, found: dict[str, T]) -> dict[str, T]:
        for ep in sorted(_entry_points(self.group), key=lambda e: e.name):
            try:
                declared = ep.load()
            except Exception as e:  # a broken plugin must not break the built-in parts
                warnings.warn(f"ckptstore: the {self.what} {ep.value!r} (entry point {ep.name!r} of group "
                              f"{self.group!r}) could not be loaded and is ignored: {e}", RuntimeWarning, stacklevel=3)
                continue
            self._add(found, declared, f"{ep.value} (entry point {ep.name!r} of group {self.group!r})")
        return found

    def _add(self, found: dict[str, T], declared: object, where: str) -> None:
        if not isinstance(declared, self.cls):
            warnings.warn(f"ckptstore: {where} is a {type(declared).__name__}, not a {self.cls.__name__}; the "
                          f"{self.what} is ignored", RuntimeWarning, stacklevel=4)
            return
        for name in self._names(declared):
            if name in found:
                warnings.warn(f"ckptstore: {where} declares the {self.what} {name!r}, which is taken already; it is "
                              "ignored under that name", RuntimeWarning, stacklevel=4)
                continue
            found[name] = declared
