"""The XserError tree and Location.

Every error xser raises on bad input is an ``XserError`` carrying a ``Location``
(file, line, column, key path) so that messages read like compiler output::

    exp.yaml:12:5: model.encoder.hidden_dim: expected int, got str '256x'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "key_lists",
    "CheckpointError",
    "DataError",
    "Frozen",
    "Location",
    "RegistryError",
    "SpecError",
    "StorageError",
    "XserError",
    "did_you_mean",
]


class Frozen:
    """An immutable record of the fields ``__slots__`` names, as ``attrs.frozen`` makes them (equality and hash over
    the fields, less ``_not_compared``; a repr; no assignment; pickles by its constructor), written out so that the
    modules a reader of a few arrays imports (errors, the manifest, dtypes) need no attrs: each subclass has its own
    ``__init__``, which sets the fields with ``object.__setattr__``."""

    __slots__: tuple[str, ...] = ()
    _not_compared: tuple[str, ...] = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self.__slots__ if f not in self._not_compared)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self.__class__,) + self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self.__slots__)})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (can't set {name!r}); use evolve()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (can't delete {name!r})")

    def __reduce__(self) -> tuple:
        return (type(self), tuple(getattr(self, f) for f in self.__slots__))

    def evolve(self, **changes: Any) -> Any:
        """A copy with ``changes`` (``attrs.evolve``)."""
        values = {f: getattr(self, f) for f in self.__slots__}
        values.update(changes)
        return type(self)(**values)


class Location(Frozen):
    """Where something is: a file, a 1-based line and column, and a dotted key path."""

    __slots__ = ("file", "line", "column", "path")
    file: str | None
    line: int | None
    column: int | None
    path: str | None

    def __init__(self, file: str | None = None, line: int | None = None, column: int | None = None, path: str | None = None) -> None:
        set_ = object.__setattr__
        set_(self, "file", file)
        set_(self, "line", line)
        set_(self, "column", column)
        set_(self, "path", path)

    def with_path(self, path: str | None) -> Location:
        return Location(self.file, self.line, self.column, path)

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            head = self.file
            if self.line is not None:
                head += f":{self.line}"
                if self.column is not None:
                    head += f":{self.column}"
            parts.append(head)
        if self.path:
            parts.append(self.path)
        return ": ".join(parts)


class XserError(Exception):
    """Base of every error xser raises on bad input or bad data."""

    def __init__(self, message: str, location: Location | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(self._render())

    def _render(self) -> str:
        where = str(self.location) if self.location is not None else ""
        return f"{where}: {self.message}" if where else self.message

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):
        return (type(self), (self.message, self.location))


class SpecError(XserError, ValueError):
    """A YAML or spec problem: syntax, unknown tags, bad arguments, bad references."""


class RegistryError(XserError, TypeError):
    """A programmer mistake in a component class (duplicate tag, not serializable, ...)."""


class DataError(XserError):
    """Missing, corrupt or mismatched weights in a data directory."""


class CheckpointError(XserError):
    """A problem with checkpoint rotation or selection."""


class StorageError(XserError):
    """The store itself failed: a network or server error (after retries), a missing bucket, denied access,
    missing credentials, an unknown URL scheme or a missing package. The message names the operation and
    the location the URL or path."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest choice (same letters in another case first), or "".

    The word itself is never proposed: it was just rejected, so a choice equal to it is not the one meant."""
    choices = [c for c in choices if c != word]
    same = [c for c in choices if c.lower() == word.lower()]
    if not same:
        import difflib  # (on use: only an error message needs it)

        same = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    close = same
    return f"; did you mean {close[0]!r}?" if close else ""


def key_lists(missing: Iterable[str], unexpected: Iterable[str], what: str = "") -> str:
    """``missing key(s){what}: "a", "b"; unexpected key(s){what}: "c"`` (either part left out when empty), sorted,
    as ``torch.nn.Module.load_state_dict`` words it."""
    parts = []
    for kind, keys in (("missing", missing), ("unexpected", unexpected)):
        keys = sorted(keys)
        if keys:
            parts.append(f"{kind} key(s){what}: " + ", ".join(f'"{k}"' for k in keys))
    return "; ".join(parts)


def shape_str(shape: Iterable[int]) -> str:
    """Shapes in messages are Python tuples: (6, 4), (3,), ()."""
    return repr(tuple(int(s) for s in shape))
