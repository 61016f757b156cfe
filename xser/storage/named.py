"""A few parameters of an opened checkpoint, by name (``xser.read_params(names=...)``).

Only the entries named are looked up in the manifest (checked one by one when it was opened with ``lazy=True``:
``lazy_entries``) and read; one array is read in the caller's thread, several on the I/O pool.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError, Location, did_you_mean
from .opened import OpenedDir, gather

__all__ = ["read_named"]


def read_named(data: OpenedDir, names: list[str], *, mmap: bool = False, verify: bool = False,
               rows: dict | None = None) -> dict[str, dict[str, Any]]:
    """``{subcollection: {param: array}}`` of the parameters ``names`` ("subcol/param"), each once; an unknown name is
    a ``DataError`` with the nearest known one, as is a ``rows`` key that ``names`` leaves out."""
    rows = rows or {}
    entries = []
    for name in names:
        sub, _, param = str(name).partition("/")
        if param not in data.subcollections.get(sub, ()):
            known = [f"{s}/{n}" for s, ps in data.subcollections.items() for n in ps]
            raise DataError(f"no parameter {name!r}{did_you_mean(str(name), known)}", Location(data.path))
        entries.append(data.subcollections[sub][param])
    extra = sorted(set(rows) - set(names))
    if extra:
        raise DataError(f"rows= names parameters that names= leaves out: {', '.join(extra)}", Location(data.path))
    out: dict[str, dict[str, Any]] = {e.subcol: {} for e in entries}
    if len(entries) == 1:  # one array: read here, no thread
        e = entries[0]
        out[e.subcol][e.name] = data.read(e, mmap=mmap, verify=verify, rows=rows.get(f"{e.subcol}/{e.name}"))
        return out
    return gather(data.read_many(entries, mmap=mmap, verify=verify, rows=rows), out)
