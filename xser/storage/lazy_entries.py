"""A manifest's parameter entries checked one by one, when first looked up (``parse_manifest(..., lazy=True)``).

A reader of a few arrays of a large checkpoint (``xser.CheckpointReader``, ``xser.read_params(names=...)``) pays for
the entries it reads, not for all of them: the manifest's JSON is decoded whole (as safetensors decodes its
header), its top level is checked as always, parameter names are checked at once, and each entry goes through the
same check as an eagerly parsed manifest's (``manifest._entry``: dtype, shape, blocks and their tiling, file names
confined to the directory), with the same messages, before any byte of its array is read. Iterating over every entry
checks every entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["LazyParams"]


class LazyParams(Mapping):
    """One subcollection's ``{param: ParamEntry}``, each entry checked (``entry(sub, name, raw, mpath)``) when it is
    first looked up, then kept. ``bad(message, mpath)`` makes the error for a parameter name that cannot be one."""

    __slots__ = ("_sub", "_raw", "_mpath", "_entry", "_done")

    def __init__(self, sub: str, raw: dict, mpath: str, entry: Callable[..., Any], bad: Callable[[str, str], Exception]) -> None:
        for name in raw:  # (JSON keys are strings)
            if not name or "/" in name:
                raise bad(f"{sub}/{name}: parameter names are non-empty strings without '/'", mpath)
        self._sub, self._raw, self._mpath, self._entry, self._done = sub, raw, mpath, entry, {}

    def __getitem__(self, name: str) -> Any:
        got = self._done.get(name)
        if got is None:
            got = self._done[name] = self._entry(self._sub, name, self._raw[name], self._mpath)
        return got

    def __contains__(self, name: object) -> bool:
        return name in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)
