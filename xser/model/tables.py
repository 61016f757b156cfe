"""Hash-table parameters: rows of a fixed shape keyed by int64 ids, growing during training.

A table holds its rows in insertion order (they never move, so growing is amortised O(new rows))
and a sorted index of its ids (binary search for lookups). On disk it is an id array plus one
array per part, rows in id order: ``<table>@id`` (int64), ``<table>@embedding`` and
``<table>@<slot>`` per optimizer slot. Parameter names cannot hold ``@``, so the parts of a table
are known from their names alone, without the component's class.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DataError, Location, RegistryError, shape_str
from ..storage.dtypes import dtype_problem, resolve
from .names import NAME_RE, _shape

__all__ = ["SEP", "HashTable", "IdSlice", "Run", "may_hold", "one_run", "part_of", "runs", "select"]

SEP = "@"
VALUE = "embedding"
ID = "id"
SLOT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def part_of(name: str) -> tuple[str, str] | None:
    """``("emb", "id")`` for a manifest entry ``emb@id``; None for a plain parameter."""
    table, sep, part = name.partition(SEP)
    return (table, part) if sep else None


class IdSlice:
    """RecIS's resharding rule: the ids with ``id % size`` (as uint64) in ``[begin, end)``."""

    def __init__(self, begin: int, end: int, size: int) -> None:
        if not (isinstance(size, int) and size >= 1 and 0 <= begin <= end <= size):
            raise DataError(f"IdSlice needs 0 <= begin <= end <= size and size >= 1, got ({begin}, {end}, {size})")
        self.begin, self.end, self.size = int(begin), int(end), int(size)

    def mask(self, ids: np.ndarray) -> np.ndarray:
        r = ids.view(np.uint64) % np.uint64(self.size)
        return (r >= np.uint64(self.begin)) & (r < np.uint64(self.end))

    def __repr__(self) -> str:
        return f"IdSlice({self.begin}, {self.end}, {self.size})"


def select(which: Any, ids: np.ndarray) -> np.ndarray:
    """The mask of ``ids`` a partial load keeps: an ``IdSlice`` or a collection of ids."""
    if isinstance(which, IdSlice):
        return which.mask(ids)
    wanted = np.unique(np.asarray(which, dtype=np.int64).reshape(-1))
    return np.isin(ids, wanted)


def may_hold(saved: IdSlice, which: Any) -> bool:
    """Whether ids of the saved slice ``saved`` can be among those ``which`` asks for (an ``IdSlice`` of any size, or
    ids), exactly: ``id % g`` is the same for both sizes when ``g`` is their greatest common divisor, so a saved slice
    can hold wanted ids only if some residue mod ``g`` of its buckets is one of the wanted buckets'."""
    if saved.begin >= saved.end:
        return False
    if not isinstance(which, IdSlice):
        wanted = np.unique(np.asarray(which, dtype=np.int64).reshape(-1))
        return bool(saved.mask(wanted).any())
    if which.begin >= which.end:
        return False
    g = math.gcd(saved.size, which.size)
    if saved.end - saved.begin >= g or which.end - which.begin >= g:
        return True  # one of them meets every residue mod g
    mine = np.arange(saved.begin, saved.end, dtype=np.int64) % g
    theirs = np.arange(which.begin, which.end, dtype=np.int64) % g
    return bool(np.isin(mine, theirs).any())


class Run:
    """Rows ``[first, stop)`` of a saved table, sorted by id: the ids of one rank's ``slice`` (None: a table saved by one
    process, one run of every row)."""

    __slots__ = ("first", "stop", "slice")

    def __init__(self, first: int, stop: int, slice: IdSlice | None) -> None:
        self.first, self.stop, self.slice = first, stop, slice

    def __repr__(self) -> str:
        return f"Run({self.first}, {self.stop}, {self.slice})"


def runs(ids_entry: Any, where: Location | None = None) -> list[Run]:
    """The sorted runs of a saved table, from its ``@id`` entry: one per saving rank of a table saved by several
    (the manifest's ``attrs: {"xser": {"slices": [[begin, end, size, first row, rows], ...]}}``, in row order,
    tiling the rows), else one run of every row. A ``slices`` attribute that does not tile the rows is a
    ``DataError``: loads skip runs by it, so it must be right."""
    n = int(ids_entry.shape[0])
    got = (ids_entry.attrs or {}).get("xser", {}).get("slices") if isinstance(ids_entry.attrs, dict) else None
    if got is None:
        return [Run(0, n, None)]
    out, at = [], 0
    try:
        for s in got:
            begin, end, size, first, count = (int(v) for v in s)
            if len(s) != 5 or first != at or count < 0 or any(not isinstance(v, int) or isinstance(v, bool) for v in s):
                raise ValueError
            out.append(Run(first, first + count, IdSlice(begin, end, size)))
            at = first + count
        if at != n:
            raise ValueError
    except (TypeError, ValueError, DataError):
        raise DataError(f"{ids_entry.subcol}/{ids_entry.name}: attrs.xser.slices must be [[begin, end, size, first row, rows], "
                        f"...] tiling its {n} rows in order, got {got!r}", where) from None
    return out


def one_run(attrs: dict) -> dict:
    """A table part's manifest attributes for a copy whose ids are one sorted run (an average, a merge): without the
    ranks' ``slices`` (which would name runs the copy no longer has)."""
    xs = attrs.get("xser") if isinstance(attrs, dict) else None
    if not isinstance(xs, dict) or "slices" not in xs:
        return attrs
    rest = {k: v for k, v in xs.items() if k != "slices"}
    return {k: v for k, v in attrs.items() if k != "xser"} | ({"xser": rest} if rest else {})


def _ids(ids: Any, where: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise DataError(f"{where}: ids must be integers, got {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise DataError(f"{where}: ids must fit in int64")
    return arr.astype(np.int64, copy=False).reshape(-1)


class HashTable:
    """Rows of shape ``dim`` keyed by int64 ids, with optional slot arrays (optimizer state) of the same rows."""

    def __init__(self, owner: str, name: str, dim: tuple[int, ...], dtype: np.dtype, slots: tuple[str, ...],
                 init: Callable[[tuple, Any], np.ndarray], rng: Any) -> None:
        self.where = f"{owner}: table {name!r}"
        self.name, self.dim, self.dtype = name, dim, dtype
        self._init, self._rng = init, rng
        self._n = 0
        self._ids = np.empty(0, np.int64)  # insertion order
        self._parts = {VALUE: np.empty((0,) + dim, dtype)} | {s: np.empty((0,) + dim, dtype) for s in slots}
        self._sorted = np.empty(0, np.int64)  # the ids, sorted
        self._order = np.empty(0, np.int64)  # row of each sorted id
        #: the ids this process holds (``add_table(..., slice=)``): inserting others is an error, since a save
        #: records each rank's slice and loads at other world sizes read only the ranks whose slice can hold an id
        self.slice: IdSlice | None = None

    # -- reading
    def __len__(self) -> int:
        return self._n

    def __contains__(self, id_: object) -> bool:
        return bool(self._find(_ids([id_], self.where))[0] >= 0)

    @property
    def ids(self) -> np.ndarray:
        """The ids, sorted (a copy)."""
        return self._sorted.copy()

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(p for p in self._parts if p != VALUE)

    def __repr__(self) -> str:
        return f"<HashTable {self.name}: {self._n} rows of {shape_str(self.dim)} {self.dtype}, slots {list(self.slots)}>"

    def _part(self, slot: str | None) -> str:
        part = VALUE if slot is None else slot
        if part not in self._parts:
            raise KeyError(f"{self.where} has no slot {slot!r} (slots: {', '.join(self.slots) or 'none'})")
        return part

    def _find(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        if not self._n or not ids.size:
            return np.full(ids.shape, -1, np.int64)
        j = np.searchsorted(self._sorted, ids)
        jj = np.minimum(j, self._n - 1)
        return np.where(self._sorted[jj] == ids, self._order[jj], -1)

    def get(self, ids: Any, *, slot: str | None = None, insert: bool = False) -> np.ndarray:
        """The rows of ``ids`` (a copy). Absent ids are an error, or inserted with ``init`` rows when ``insert``."""
        ids = _ids(ids, self.where)
        part = self._part(slot)
        rows = self._find(ids)
        if (rows < 0).any():
            if not insert:
                absent = np.unique(ids[rows < 0])
                shown = ", ".join(str(int(i)) for i in absent[:5]) + (f" and {absent.size - 5} more" if absent.size > 5 else "")
                raise DataError(f"{self.where}: ids not in the table: {shown} (get(..., insert=True) adds them)")
            self._insert(np.unique(ids[rows < 0]))
            rows = self._find(ids)
        return self._parts[part][rows]

    # -- writing
    def set(self, ids: Any, rows: Any, *, slot: str | None = None) -> None:
        """Write ``rows`` for ``ids`` (absent ids are inserted; their other parts get ``init`` rows / zeros)."""
        ids = _ids(ids, self.where)
        part = self._part(slot)
        rows = np.asarray(rows)
        if rows.shape != ids.shape + self.dim:
            raise DataError(f"{self.where}: {ids.size} ids need rows of shape {shape_str(ids.shape + self.dim)}, got {shape_str(rows.shape)}")
        where = self._find(ids)
        if (where < 0).any():
            self._insert(np.unique(ids[where < 0]))
            where = self._find(ids)
        self._parts[part][where] = rows

    def remove(self, ids: Any) -> int:
        """Drop the rows of ``ids`` (absent ids are ignored, as a feature eviction needs); returns how many went."""
        rows = self._find(_ids(ids, self.where))
        gone = np.unique(rows[rows >= 0])
        if gone.size:
            keep = np.ones(self._n, bool)
            keep[gone] = False
            self._ids = self._ids[: self._n][keep]
            self._parts = {p: a[: self._n][keep] for p, a in self._parts.items()}
            self._n = int(keep.sum())
            order = np.argsort(self._ids, kind="stable")
            self._sorted, self._order = self._ids[order], order.astype(np.int64)
        return int(gone.size)

    def _grow(self, need: int) -> None:
        cap = self._ids.shape[0]
        if need <= cap:
            return
        cap = max(need, cap * 2, 16)
        self._ids = np.resize(self._ids, cap)
        for p, a in self._parts.items():
            grown = np.empty((cap,) + self.dim, self.dtype)
            grown[: self._n] = a[: self._n]
            self._parts[p] = grown

    def _insert(self, new: np.ndarray) -> None:
        """Append rows for ``new`` (sorted, unique, absent) ids: value rows from ``init``, slot rows zeros."""
        k = new.size
        if self.slice is not None and k:
            out = new[~self.slice.mask(new)]
            if out.size:
                shown = ", ".join(str(int(i)) for i in out[:5]) + (f" and {out.size - 5} more" if out.size > 5 else "")
                raise DataError(f"{self.where}: ids {shown} are outside this process's {self.slice} (id % {self.slice.size} "
                                f"must be in [{self.slice.begin}, {self.slice.end})): route each id to the rank whose slice holds it")
        self._grow(self._n + k)
        rows = np.arange(self._n, self._n + k)
        self._ids[rows] = new
        init = np.asarray(self._init((k,) + self.dim, self._rng))
        if init.shape != (k,) + self.dim:
            raise RegistryError(f"{self.where}: init gave {shape_str(init.shape)}, expected {shape_str((k,) + self.dim)}")
        self._parts[VALUE][rows] = init
        for s in self.slots:
            self._parts[s][rows] = 0
        at = np.searchsorted(self._sorted, new)
        self._sorted = np.insert(self._sorted, at, new)
        self._order = np.insert(self._order, at, rows)
        self._n += k

    # -- saving and loading
    def arrays(self) -> dict[str, np.ndarray]:
        """``{part: array}`` in id order, as saved: ``id``, ``embedding``, then the slots."""
        order = self._order
        out = {ID: self._sorted.copy(), VALUE: self._parts[VALUE][order]}
        for s in self.slots:
            out[s] = self._parts[s][order]
        return out

    def load(self, parts: dict[str, np.ndarray], where: Location | None) -> None:
        """Replace the contents by saved parts (ids unique, every part as long as the ids). The ids of a table saved
        by several ranks are sorted within each rank's block: they are put in order here."""
        ids = parts[ID]
        if ids.ndim != 1 or ids.dtype != np.int64:
            raise DataError(f"table {self.name!r}: ids are {shape_str(ids.shape)} {ids.dtype}, expected 1-D int64", where)
        if ids.size > 1 and not (ids[1:] > ids[:-1]).all():
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            if (ids[1:] == ids[:-1]).any():
                raise DataError(f"table {self.name!r}: ids are not unique (id {int(ids[1:][ids[1:] == ids[:-1]][0])} twice)", where)
            parts = {p: (a if p == ID else np.asarray(a)[order]) for p, a in parts.items()} | {ID: ids}
        for p in self._parts:
            a = parts[p]
            if a.shape != ids.shape + self.dim or a.dtype != self.dtype:
                raise DataError(f"table {self.name!r}: part {p!r} is {shape_str(a.shape)} {a.dtype}, expected "
                                f"{shape_str(ids.shape + self.dim)} {self.dtype}", where)
        self._n = ids.size
        self._ids = ids.copy()
        self._sorted = ids.copy()
        self._order = np.arange(ids.size, dtype=np.int64)
        self._parts = {p: np.array(parts[p], copy=True) for p in self._parts}


def new_table(owner: str, name: Any, dim: Any, *, dtype: Any, slots: Any, init: Any, rng: Any, inits: dict) -> HashTable:
    """A table declared by ``Subcollection.add_table``, its arguments checked."""
    where = f"{owner}: table {name!r}"
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise RegistryError(f"{owner}: table name {name!r} must match {NAME_RE.pattern}")
    dim = _shape(dim, where)
    try:
        dt = resolve(dtype)
    except (TypeError, ImportError) as e:
        raise RegistryError(f"{where}: unknown dtype {dtype!r} ({e})") from None
    why = dtype_problem(dt)
    if why is not None:
        raise RegistryError(f"{where}: {why}")
    slots = check_slots(slots, where)
    if isinstance(init, str):
        fn = inits.get(init)
        if fn is None:
            raise RegistryError(f"{where}: unknown init {init!r} (known: {', '.join(sorted(inits))})")
    elif callable(init):
        fn = init
    else:
        raise RegistryError(f"{where}: init must be a name or a function (shape, rng) -> array")
    return HashTable(owner, name, dim, dt, slots, lambda shape, r: np.asarray(fn(shape, r), dt), rng)


def check_slots(slots: Any, where: str) -> tuple[str, ...]:
    slots = tuple(slots)
    for s in slots:
        if not isinstance(s, str) or not SLOT_RE.fullmatch(s) or s in (ID, VALUE):
            raise RegistryError(f"{where}: slot name {s!r} must match {SLOT_RE.pattern} and not be {ID!r} or {VALUE!r}")
    if len(set(slots)) != len(slots):
        raise RegistryError(f"{where}: slot names repeat: {list(slots)}")
    return slots
