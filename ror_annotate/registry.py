"""One registry mechanism for every pluggable part of ror_annotate.

Each kind of plug-in (judges, trace formats, sampling strategies, MoE families, presets,
crosswalks, aggregation methods, ...) is one :class:`Registry`. Built-ins register themselves
where they are defined (a decorator or a call); third-party packages add entries through the
entry-point group ``ror_annotate.<kind>`` (``[project.entry-points."ror_annotate.judges"]``), loaded
lazily on the first look-up. The policy for a duplicate name is the same everywhere: a second
registration under a taken name is a :class:`~ror_annotate.errors.ConfigError` unless
``replace=True`` is passed (modelled on spaCy's ``catalogue``, without its global namespace).

Example
-------
>>> from ror_annotate.registry import Registry
>>> colours = Registry("colours")
>>> @colours.register("red")
... def red() -> str:
...     return "#f00"
>>> colours.get("red")()
'#f00'
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from importlib import import_module
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Generic, TypeVar, overload

from .errors import ConfigError

T = TypeVar("T")

#: Every registry made by :class:`Registry`, by kind (for ``ror plugins`` and the contents test).
REGISTRIES: dict[str, "Registry[Any]"] = {}


class Registry(Generic[T]):
    """A named table of plug-ins of one kind.

    Parameters
    ----------
    kind : str
        Plural noun naming the kind (``"judges"``); the entry-point group is ``ror_annotate.<kind>``.
    builtin_modules : dict of str to str, optional
        ``{name: module}`` for built-ins registered by importing a module (imported on first use,
        so ``import ror_annotate`` stays light).
    what : str, optional
        Singular noun used in error messages (default: ``kind`` without a trailing ``s``).

    Raises
    ------
    ConfigError
        A second registry of the same kind.
    """

    def __init__(self, kind: str, *, builtin_modules: dict[str, str] | None = None, what: str | None = None) -> None:
        if kind in REGISTRIES:
            raise ConfigError(f"a registry of {kind!r} already exists; use ror_annotate.registry.REGISTRIES[{kind!r}]")
        self.kind = kind
        self.what = what or kind.rstrip("s")
        self.group = f"ror_annotate.{kind}"
        self._entries: dict[str, T] = {}
        self._builtin_modules = dict(builtin_modules or {})
        self._entry_points_loaded = False
        REGISTRIES[kind] = self

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, replace: bool = False) -> T: ...

    def register(self, name: str, obj: Any = None, *, replace: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator that does.

        Raises
        ------
        ConfigError
            ``name`` is empty or already registered and ``replace`` is false.
        """
        if not name or not isinstance(name, str):
            raise ConfigError(f"a {self.what} needs a non-empty name, got {name!r}")

        def add(value: T) -> T:
            if name in self._entries and not replace and self._entries[name] is not value:
                raise ConfigError(f"{self.what} {name!r} is already registered; pass replace=True to replace it")
            self._entries[name] = value
            return value

        if obj is None:
            return add
        return add(obj)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and plug-ins replacing a built-in); a missing name is ignored."""
        self._entries.pop(name, None)

    def _load_builtin(self, name: str) -> None:
        module = self._builtin_modules.get(name)
        if module is not None and name not in self._entries:
            import_module(module)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.group):
            if ep.name not in self._entries:
                self._entries[ep.name] = ep.load()

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises
        ------
        ConfigError
            Unknown name: the message lists the available names and the closest match.
        """
        found = self.find(name)
        if found is None:
            names = self.names()
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown {self.what} {name!r}.{hint} Available: {', '.join(names) or '(none)'}")
        return found

    def find(self, name: str) -> T | None:
        """The entry registered as ``name``, or None (built-ins and entry points are loaded first)."""
        if name not in self._entries:
            self._load_builtin(name)
        if name not in self._entries:
            self._load_entry_points()
        return self._entries.get(name)

    def names(self) -> list[str]:
        """Every name that can be looked up (registered, built-in not yet imported, entry points), sorted."""
        self._load_entry_points()
        return sorted(set(self._entries) | set(self._builtin_modules))

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` for every name (imports built-in modules not yet loaded)."""
        for name in list(self._builtin_modules):
            self._load_builtin(name)
        return [(name, self.get(name)) for name in self.names()]

    def loaded(self) -> "MappingProxyType[str, T]":
        """A live, read-only view of the entries registered so far, in registration order (no
        entry points or built-in modules are loaded: for hot paths and order-sensitive tables)."""
        return MappingProxyType(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} loaded)"


def registry(kind: str) -> Registry[Any]:
    """The registry of ``kind`` (``"judges"``, ``"formats"``, ...).

    Raises
    ------
    ConfigError
        No registry of that kind exists (the message lists the kinds).
    """
    _import_builtin_registries()
    if kind not in REGISTRIES:
        raise ConfigError(f"no registry of {kind!r}; kinds: {', '.join(sorted(REGISTRIES))}")
    return REGISTRIES[kind]


#: Modules that define a registry; importing them creates it (kept here so ``registry(kind)`` finds all).
REGISTRY_MODULES: tuple[str, ...] = (
    "ror_annotate.judge", "ror_annotate.steer.families", "ror_annotate.traces", "ror_annotate.formats", "ror_annotate.review.studies",
    "ror_annotate.crosswalks", "ror_annotate.aggregate", "ror_annotate.steer.engines",
)


def _import_builtin_registries() -> None:
    for module in REGISTRY_MODULES:
        import_module(module)


__all__ = ["REGISTRIES", "REGISTRY_MODULES", "Registry", "registry"]
