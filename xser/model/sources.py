"""Where a loaded component's arrays come from: one opened data directory per saved model.

A ``Store`` wraps an opened checkpoint for one build: it prefetches the parameters the spec
names (on the I/O pool), checks each against its declaration when a component asks for it,
remembers what was used (``strict`` loads refuse the rest), and stops prefetching when the
build fails. Each component inlined from a saved model carries its ``_Origin`` (the store it
came from), so two saved models with equal subcollection names cannot swap weights.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import numpy as np

from ..errors import DataError, Location, SpecError, XserError, did_you_mean, shape_str
from .registry import lookup
from .serialize import saved_args
from .tables import IdSlice, may_hold, runs, select
from ..dist import current
from ..spec import parse
from ..spec.saved import check_saved
from ..storage.manifest import SPEC_FILE
from ..storage.opened import OpenedDir, stop

__all__ = ["Store"]


class Store:
    """A data directory being read by one build: prefetching, and what was used."""

    def __init__(self, datadir: OpenedDir, *, mmap: bool, verify: bool, rows: dict | None = None, tables: dict | None = None,
                 missing: str = "error", edited: tuple[str, str] | None = None, copy: bool = False) -> None:
        self.dir = datadir
        #: (top-level file, the checkpoint's own spec) when the spec built was edited by hand: mismatches are SpecErrors
        self.edited = edited
        self.missing = missing  # "init": a declared parameter absent on disk starts from its declared init
        self.initialised: list[str] = []
        self.migrated: dict[str, dict[str, np.ndarray]] = {}
        self.named: dict[str, str] = {}  # subcollection -> where the spec names it (a component built from this store)
        if copy and mmap:
            raise DataError("copy=True reads every array into memory and mmap=True maps them: ask for one of them")
        self.mmap = mmap
        self.verify = verify
        #: an eager load from local files (not ``copy=True``): the subcollections of components whose adapter takes
        #: private copy-on-write maps for eager loads (torch tensors, as safetensors' ``load_file`` gives), read mapped
        self.maps = not mmap and not copy and type(datadir)._read_block is OpenedDir._read_block
        self.private: set[str] = set()
        self.rows = datadir.check_row_keys(rows)
        self.tables = dict(tables or {})  # "sub/table" -> ids or IdSlice: partial loads of hash tables
        self.futures: dict[tuple[str, str], Any] = {}
        self.used: dict[str, set[str]] = {}

    def prefetch(self, names: set[str]) -> None:
        if current().world_size > 1:  # each rank reads only what it declares (add(..., rows=), add_table(..., slice=))
            return
        entries = [e for n in names if n in self.dir.subcollections for e in self.dir.subcollections[n].values()]
        entries = [e for e in entries if (e.subcol, e.name) not in self.futures
                   and f"{e.subcol}/{e.name.partition('@')[0]}" not in self.tables]  # tables= reads some rows: not here
        mapped = [e for e in entries if e.subcol in self.private]
        if mapped:
            entries = [e for e in entries if e.subcol not in self.private]
            self.futures.update(self.dir.read_many(mapped, mmap=True, verify=self.verify, rows=self.rows))
        self.futures.update(self.dir.read_many(entries, mmap=self.mmap, verify=self.verify, rows=self.rows))

    def mark(self, stored: str, tag: str) -> str:
        """A component of class ``tag`` reads the subcollection ``stored``: mapped on an eager load if its adapter
        takes private copy-on-write maps (``maps_eager``: torch modules). Returns ``stored``."""
        if self.maps and stored not in self.private:
            try:
                adapter = lookup(tag).adapter
            except XserError:  # an unknown tag is reported where it is built
                adapter = None
            if getattr(adapter, "maps_eager", False):
                self.private.add(stored)
        return stored

    def mismatch(self, message: str, here: Location, where: Location | None) -> XserError:
        """The error for a spec that does not match the data: a ``DataError`` at the data, or, when the spec is a file
        edited by hand since the save, a ``SpecError`` at the edited component (the data's place in the message)."""
        if self.edited is None:
            return DataError(message + _at(where), here)
        edited, sealed = self.edited
        return SpecError(f"{here}: {message}; {edited} was edited since this checkpoint was saved and no longer matches its "
                         f"data: undo the edit (the spec saved with the data is {sealed})", where or Location(edited))

    def claim(self, stored: str, where: Location | None) -> None:
        if stored not in self.dir.subcollections:
            near = did_you_mean(stored, self.dir.subcollections)
            here = Location(os.path.join(self.dir.path, stored))
            raise self.mismatch(f"subcollection is missing from the data directory{near}", here, where)
        self.used.setdefault(stored, set())

    def fetch(self, stored: str, name: str, shape: tuple, dtype: np.dtype, where: Location | None,
              held: tuple[int, int] | None = None) -> np.ndarray:
        self.claim(stored, where)
        sub = self.dir.subcollections[stored]
        here = Location(os.path.join(self.dir.path, stored))
        entry = sub.get(name)
        if entry is None and self.missing == "init":
            self.initialised.append(f"{stored}/{name}")
            return None
        if entry is None:
            raise self.mismatch(f"param {name!r} is missing on disk (on disk: {', '.join(sub) or 'none'}); a parameter added "
                                "since the save: load(..., missing=\"init\") starts it from its declared init", here, where)
        partial = self.rows.get(f"{stored}/{name}") if held is None else held  # add(..., rows=): only this rank's rows
        if partial is not None and entry.shape[1:] == shape[1:] and entry.shape[:1] == shape[:1]:
            shape = entry.shape  # a row range of a declared shape: checked by the read
        elif entry.shape != shape:
            raise self.mismatch(f"param {name!r}: shape {shape_str(shape)} in spec, {shape_str(entry.shape)} on disk", here,
                                where if self.edited else None)
        if entry.dtype != dtype:
            raise self.mismatch(f"param {name!r}: dtype {dtype} in spec, {entry.dtype} on disk", here, where if self.edited else None)
        self.used.setdefault(stored, set()).add(name)
        fut = self.futures.pop((stored, name), None)
        if fut is not None and (held is None or (tuple(held) == (0, entry.shape[0]) and f"{stored}/{name}" not in self.rows)):
            return fut.result()  # prefetched (a load by one process: add(..., rows=) holds every row)
        if held is not None and held[0] == held[1] and 0 <= held[0] <= entry.shape[0]:
            return np.empty((0,) + tuple(entry.shape[1:]), entry.dtype)  # a rank that holds no rows reads nothing
        return self.dir.read(entry, mmap=self.mmap or stored in self.private, verify=self.verify, rows=partial)

    def migrate(self, stored: str, fn: Any, version: int, tag: str, where: Location | None) -> dict[str, np.ndarray]:
        """The arrays of a subcollection saved by an older version of its class, through its ``migrate_params``."""
        if stored not in self.migrated:
            self.claim(stored, where)
            here = Location(os.path.join(self.dir.path, stored))
            arrays = {n: self.dir.read(e, verify=self.verify) for n, e in self.dir.subcollections[stored].items()}
            self.used.setdefault(stored, set()).update(arrays)
            try:
                out = fn(dict(arrays), version)
            except Exception as e:
                raise DataError(f"{tag}: migrate_params from version {version} failed: {type(e).__name__}: {e}" + _at(where), here) from e
            if not isinstance(out, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in out.items()):
                raise DataError(f"{tag}: migrate_params must return a dict of parameter names to numpy arrays, got "
                                f"{type(out).__name__}" + _at(where), here)
            self.migrated[stored] = out
        return self.migrated[stored]

    def fetch_table(self, stored: str, name: str, parts: tuple, dim: tuple, dtype: np.dtype, where: Location | None,
                    which: Any = None) -> dict:
        """A table's parts (``{"id": ids, "embedding": rows, slot: rows}``), checked against the declaration; only the
        ids a partial load asks for (``tables={"sub/name": ids or IdSlice}``, or ``add_table(..., slice=)``): see
        ``_some_rows``. The ids of a table saved by several ranks come sorted within each rank's run."""
        self.claim(stored, where)
        sub = self.dir.subcollections[stored]
        here = Location(os.path.join(self.dir.path, stored))
        entries = {}
        zero_slots = []
        for part in parts:
            e = sub.get(f"{name}@{part}")
            if e is None and part not in ("id", "embedding") and f"{name}@id" in sub:
                zero_slots.append(part)  # saved without its slots (xser avg --drop-slots): they start at zero
                continue
            if e is None:
                raise self.mismatch(f"table {name!r}: part {part!r} is missing on disk (on disk: {', '.join(sub) or 'none'})", here, where)
            entries[part] = e
        ids_e = entries["id"]
        if ids_e.dtype != np.int64 or len(ids_e.shape) != 1:
            raise DataError(f"table {name!r}: ids are {shape_str(ids_e.shape)} {ids_e.dtype} on disk, expected 1-D int64", here)
        n = ids_e.shape[0]
        for part, e in entries.items():
            if part != "id" and (e.shape != (n,) + dim or e.dtype != dtype):
                raise self.mismatch(f"table {name!r}: part {part!r} is {shape_str(e.shape)} {e.dtype} on disk, declared rows of "
                                    f"{shape_str(dim)} {dtype} for {n} ids", here, where if self.edited else None)
        for part in entries:
            self.used.setdefault(stored, set()).add(f"{name}@{part}")
        which = self.tables.get(f"{stored}/{name}") if which is None else which  # add_table(..., slice=) first
        futs = {p: f for p in entries if (f := self.futures.pop((stored, f"{name}@{p}"), None)) is not None}
        if which is None or (isinstance(which, IdSlice) and which.begin == 0 and which.end == which.size):  # every row
            out = {p: futs[p].result() if p in futs else self.dir.read(e, verify=self.verify) for p, e in entries.items()}
        else:
            stop(futs.values())  # prefetched whole by a load in one process: only some rows are wanted
            out = self._some_rows(ids_e, entries, which, here)
        for p in zero_slots:
            out[p] = np.zeros((out["id"].size,) + dim, dtype)
        return out

    def _some_rows(self, ids_e: Any, entries: dict, which: Any, here: Location) -> dict:
        """The rows of the ids ``which`` asks for. Of a table saved by several ranks, only the runs of the ranks whose id
        slice can hold such ids are read (``tables.may_hold``: exact for a slice of any size); within a run, the ids,
        then each part from its first kept row to its last (a band at a time; never row by row)."""
        if not isinstance(which, IdSlice):
            which = np.unique(np.asarray(which, dtype=np.int64).reshape(-1))
        spans = [(r.first, r.stop) for r in runs(ids_e, here) if r.stop > r.first and (r.slice is None or may_hold(r.slice, which))]
        if self.verify:  # each file once, streamed (a band read with verify would read the whole file each time)
            for e in entries.values():
                for b in e.blocks:
                    start, shape = b.box(e.shape)
                    if any(start[0] < end and first < start[0] + shape[0] for first, end in spans):
                        self.dir.verify_once(b)
        ids_out, keep = [], []
        for first, end in spans:
            ids = self.dir.read(ids_e, rows=(first, end))
            k = np.flatnonzero(select(which, ids))
            ids_out.append(ids[k])
            keep.append(k + first)
        out = {"id": np.concatenate(ids_out) if ids_out else np.empty(0, np.int64)}
        for p, e in entries.items():
            if p != "id":
                rows = out[p] = np.empty((out["id"].size,) + e.shape[1:], e.dtype)
                at = 0
                for k in keep:  # run by run: a band never reaches into a run that was skipped
                    _rows_into(self.dir, e, k, rows[at : at + k.size])
                    at += k.size
        return out

    def cancel(self) -> None:
        """Stop prefetching (a failed load reads nothing more) and wait for reads already running."""
        stop(self.futures.values())
        self.futures.clear()

    def check_all_used(self) -> None:
        unused = sorted(set(self.dir.subcollections) - set(self.used))
        lazy = [u for u in unused if u in self.named]
        if lazy:
            raise DataError(
                f"the component at {self.named[lazy[0]]} ({lazy[0]}) declared no parameters while it was built, but the "
                "checkpoint has them: declare parameters in __attrs_post_init__ (xser.params(self).add(...)), not later "
                "(for example on the first forward), so that loading fills them",
                Location(os.path.join(self.dir.path, lazy[0])),
            )
        if unused:
            raise self.mismatch(
                f"subcollections on disk are not used by the spec: {', '.join(unused)} (load with strict=False to ignore)",
                Location(self.dir.path), None,
            )
        for sub, names in self.used.items():
            extra = sorted(set(self.dir.subcollections[sub]) - names)
            if extra:
                raise DataError(
                    f"params on disk are not declared by the component: {', '.join(extra)} (load with strict=False to ignore)",
                    Location(os.path.join(self.dir.path, sub)),
                )


TABLE_CHUNK_ROWS = 1 << 16


def _rows_into(d: OpenedDir, e: Any, keep: np.ndarray, out: np.ndarray) -> None:
    """Rows ``keep`` (sorted) of a parameter into ``out``, read a band of rows at a time (memory: one band more); a
    band starts at a kept row and ends after one, so rows outside the span of ``keep`` are never read."""
    done = 0
    while done < keep.size:
        first = int(keep[done])
        hi = int(np.searchsorted(keep, first + TABLE_CHUNK_ROWS))
        stop = int(keep[hi - 1]) + 1
        band = d.read(e, rows=(first, stop))
        out[done:hi] = band[keep[done:hi] - first]
        done = hi


def _at(where: Location | None) -> str:
    return f" (needed by the component at {where})" if where is not None else ""


@attrs.frozen
class _Origin:
    store: Store
    stored_name: str | None


class _Source:
    """What ``xser.params`` reads a loaded component's arrays from."""

    def __init__(self, origin: _Origin, where: Location | None, migration: tuple | None = None) -> None:
        self.origin = origin
        self.where = where
        self.migration = migration  # (migrate_params, saved version, tag) for a spec saved by an older class version

    @property
    def fresh(self) -> bool:
        """A component the saved spec gives no subcollection, loaded with missing="init": it starts from its inits."""
        return self.origin.stored_name is None and self.origin.store.missing == "init"

    def claim(self) -> None:
        if self.fresh:
            where = str(self.where) if self.where else "a component"
            if where not in self.origin.store.initialised:
                self.origin.store.initialised.append(f"the component at {where} (no saved parameters)")
            return
        if self.origin.stored_name is None and self.origin.store.edited is not None:
            raise self.origin.store.mismatch("component registers parameters, but its saved spec has no xser_subcol_name",
                                             Location(self.origin.store.dir.path), self.where)
        if self.origin.stored_name is None:
            raise DataError(
                "component registers parameters, but its saved spec has no xser_subcol_name",
                self.where or Location(self.origin.store.dir.path),
            )
        self.origin.store.claim(self.origin.stored_name, self.where)

    def fetch(self, subcol: str, name: str, shape: tuple, dtype: np.dtype, rows: tuple[int, int] | None = None) -> np.ndarray | None:
        """The saved array (None: start from the declared init, with ``missing="init"``); ``rows``: only those."""
        if self.fresh:
            return None
        store, stored = self.origin.store, self.origin.stored_name
        if self.migration is None:
            return store.fetch(stored, name, shape, dtype, self.where, rows)
        fn, version, tag = self.migration
        arrays = store.migrate(stored, fn, version, tag, self.where)
        here = Location(os.path.join(store.dir.path, stored))
        arr = arrays.get(name)
        if arr is None:
            if store.missing == "init":
                store.initialised.append(f"{stored}/{name}")
                return None
            raise DataError(f"param {name!r} is not among the migrated parameters ({', '.join(sorted(arrays)) or 'none'})"
                            + _at(self.where), here)
        if arr.shape != shape or arr.dtype != dtype:
            raise DataError(f"param {name!r}: migrated to {shape_str(arr.shape)} {arr.dtype}, declared {shape_str(shape)} {dtype}"
                            + _at(self.where), here)
        return arr if rows is None else arr[rows[0]:rows[1]]

    @property
    def stored(self) -> str | None:
        """The subcollection name the saved spec gives this component (None: it had none)."""
        return self.origin.stored_name

    def names(self) -> list[str]:
        """The parameters on disk of this component's subcollection (after ``migrate_params``, if it ran)."""
        self.claim()
        if self.fresh:
            return []
        if self.migration is not None:
            fn, version, tag = self.migration
            return list(self.origin.store.migrate(self.origin.stored_name, fn, version, tag, self.where))
        return list(self.origin.store.dir.subcollections[self.origin.stored_name])

    def entry(self, name: str) -> Any:
        """The checkpoint's entry for one of this component's parameters (None: not there, or nothing loaded)."""
        if self.fresh or self.origin.stored_name is None:
            return None
        return self.origin.store.dir.subcollections.get(self.origin.stored_name, {}).get(name)

    def described(self, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
        """Shape and dtype of one of this component's parameters as it will be read (after ``migrate_params``, if it
        runs); None if it is not there."""
        if self.fresh or self.origin.stored_name is None:
            return None
        if self.migration is not None:
            fn, version, tag = self.migration
            arr = self.origin.store.migrate(self.origin.stored_name, fn, version, tag, self.where).get(name)
            return None if arr is None else (tuple(arr.shape), arr.dtype)
        e = self.entry(name)
        return None if e is None else (tuple(e.shape), e.dtype)

    def saved_args(self) -> dict | None:
        """The constructor arguments the checkpoint's own spec gives this component (for messages; None if unknown)."""
        text = self.origin.store.dir.spec_text()
        if text is None or self.origin.stored_name is None:
            return None
        try:
            _, experiment = check_saved(parse(text, os.path.join(self.origin.store.dir.path, SPEC_FILE)))
        except XserError:
            return None
        return saved_args(experiment, self.origin.stored_name)

    def file_of(self, name: str) -> str:
        """The path of the file holding a whole parameter in the checkpoint this component was loaded from."""
        block = self.entry(name).blocks[0]
        return os.path.join(self.origin.store.dir.path, block.file)

    def keep_missing(self, names: list[str]) -> bool:
        """With ``missing="init"``: these parameters absent on disk keep their declared init (recorded); else False."""
        if self.origin.store.missing != "init":
            return False
        self.origin.store.initialised.extend(f"{self.origin.stored_name}/{n}" for n in names)
        return True

    def location(self) -> Location:
        return Location(os.path.join(self.origin.store.dir.path, self.origin.stored_name or ""))

    def needed_by(self) -> str:
        return _at(self.where)

    def mismatch(self, message: str) -> XserError:
        """The error for parameters that do not match the spec (``Store.mismatch``: a ``SpecError`` at a hand edit)."""
        return self.origin.store.mismatch(message, self.location(), self.where)

    def fetch_table(self, subcol: str, name: str, parts: tuple, dim: tuple, dtype: np.dtype, which: Any = None) -> dict | None:
        self.claim()
        if self.fresh:
            return None
        return self.origin.store.fetch_table(self.origin.stored_name, name, parts, dim, dtype, self.where, which)

    def rows_of(self, name: str) -> tuple[int, int] | None:
        """The row range this build loads of a parameter (``load(rows=...)``), if any."""
        rows = self.origin.store.rows.get(f"{self.origin.stored_name}/{name}")
        return None if rows is None else (int(rows[0]), int(rows[1]))
