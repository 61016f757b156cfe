"""The XserError tree and Location.

Every error xser raises on bad input is an ``XserError`` carrying a ``Location``
(file, line, column, key path) so that messages read like compiler output::

    exp.yaml:12:5: model.encoder.hidden_dim: expected int, got str '256x'
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

__all__ = [
    "key_lists",
    "CheckpointError",
    "DataError",
    "Location",
    "RegistryError",
    "SpecError",
    "StorageError",
    "XserError",
    "did_you_mean",
]


@attrs.frozen
class Location:
    """Where something is: a file, a 1-based line and column, and a dotted key path."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str | None = None

    def with_path(self, path: str | None) -> Location:
        return attrs.evolve(self, path=path)

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
