"""Averaging hash tables: rows aligned by id over checkpoints that hold different ids, streamed.

Each checkpoint's table is read a band of rows at a time (ids and the part being averaged). A
k-way merge emits, band by band, every id up to the smallest "last id read" among the
checkpoints still being read: those ids are complete. The result holds the union of ids; each
row is the weighted mean over the checkpoints that hold the id (``missing="present"``) or over
all of them with absent rows counted as zeros (``missing="zero"``). Memory: one band per
checkpoint plus the merged band, whatever the table's size. Non-floating tables take each row
from the newest checkpoint that holds its id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import CheckpointError, Location, shape_str
from ..model.tables import runs
from ..storage.dtypes import is_averaged, round_into
from ..storage.payloads import Stream
from .average_small import _real_parts, canonical_nans, element_bits, same_bits, unit_width, zero_padding

__all__ = ["BAND_ROWS", "MISSING", "table_streams", "tables_of"]

BAND_ROWS = 1 << 15
MISSING = ("present", "zero")


def tables_of(params: dict) -> dict[str, dict[str, Any]]:
    """``{table: {part: entry}}`` of a subcollection's manifest entries (``emb@id``, ``emb@embedding``, ...)."""
    out: dict[str, dict[str, Any]] = {}
    for name, e in params.items():
        table, sep, part = name.partition("@")
        if sep:
            out.setdefault(table, {})[part] = e
    return out


def _bands(d: Any, ids_e: Any, part_e: Any | None, band: int, verify: bool) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """A checkpoint's table in id order, a band at a time. A table saved by several ranks is one sorted run per rank
    (``tables.runs``): the runs are merged, a band of each at a time."""
    rs = [r for r in runs(ids_e, Location(getattr(d, "path", ""))) if r.stop > r.first]
    if len(rs) <= 1:
        yield from _run(d, ids_e, part_e, rs[0].first if rs else 0, rs[0].stop if rs else 0, band, verify)
        return
    for group in _groups([_run(d, ids_e, part_e, r.first, r.stop, band, verify) for r in rs]):
        ids = np.concatenate([g[0] for g in group])
        order = np.argsort(ids, kind="stable")
        rows = None if part_e is None else np.concatenate([g[1] for g in group if g[1] is not None])[order]
        if ids.size:
            yield ids[order], rows


def _run(d: Any, ids_e: Any, part_e: Any | None, first: int, stop: int, band: int, verify: bool) -> Iterator[tuple]:
    for a in range(first, stop, band):
        b = min(stop, a + band)
        ids = d.read(ids_e, rows=(a, b), verify=verify)
        yield ids, (d.read(part_e, rows=(a, b), verify=verify) if part_e is not None else None)


def _merge(dirs: list, tables: list[dict], part: str | None, band: int, verify: bool) -> Iterator[list[tuple]]:
    """Complete groups: for each step, ``[(ids, rows or None) per checkpoint]`` holding every id <= the bound."""
    return _groups([_bands(d, t["id"], t.get(part) if part else None, band, verify) for d, t in zip(dirs, tables)])


def _groups(its: list[Iterator[tuple]]) -> Iterator[list[tuple]]:
    """A k-way merge of sorted streams of ``(ids, rows or None)`` bands: each group holds, from every stream, its ids up
    to the smallest last id read among the streams still going (so every id up to there is complete)."""
    bufs: list[tuple[np.ndarray, Any] | None] = [_next(it) for it in its]
    while True:
        live = [b for b in bufs if b is not None]
        if not live:
            return
        bound = min(int(b[0][-1]) for b in live)
        group = []
        for i, b in enumerate(bufs):
            if b is None:
                group.append((np.empty(0, np.int64), None))
                continue
            k = int(np.searchsorted(b[0], bound, side="right"))
            group.append((b[0][:k], None if b[1] is None else b[1][:k]))
            rest = (b[0][k:], None if b[1] is None else b[1][k:])
            if rest[0].size == 0:
                bufs[i] = _next(its[i])
            else:
                bufs[i] = rest
        yield group


def _next(it: Iterator[tuple]) -> tuple | None:
    """The next band of a stream that is not empty (None at its end)."""
    for b in it:
        if b[0].size:
            return b
    return None


def _union(group: list[tuple]) -> np.ndarray:
    return np.unique(np.concatenate([g[0] for g in group])) if group else np.empty(0, np.int64)


def _count(dirs: list, tables: list[dict], band: int, verify: bool) -> int:
    return sum(_union(g).size for g in _merge(dirs, tables, None, band, verify))


def table_streams(dirs: list, tables: list[dict], weights: tuple, *, accumulate: str, missing: str, drop_slots: bool,
                  verify: bool, where: str, band: int | None = None) -> dict[str, Stream]:
    """``{part: Stream}`` of the averaged table (``id``, ``embedding``, slots unless dropped); ``band`` rows are read
    from each checkpoint at a time (default ``BAND_ROWS``)."""
    band = band or BAND_ROWS
    t0 = tables[0]
    for t in tables[1:]:
        if set(t) != set(t0):
            raise CheckpointError(f"{where}: the table's parts differ between checkpoints: {sorted(t0)} and {sorted(t)}", Location(where))
        for p, e in t.items():
            if e.dtype != t0[p].dtype or e.shape[1:] != t0[p].shape[1:]:
                raise CheckpointError(f"{where}: part {p!r} is rows of {shape_str(e.shape[1:])} {e.dtype} in one checkpoint, "
                                      f"{shape_str(t0[p].shape[1:])} {t0[p].dtype} in another", Location(where))
    if verify:  # each file checked once, streamed (a band read with verify would read its whole file each time)
        for d, t in zip(dirs, tables):
            for e in t.values():
                for b in e.blocks:
                    d.verify_once(b)
        verify = False
    total = _count(dirs, tables, band, verify)
    parts = [p for p in t0 if p != "id" and not (drop_slots and p != "embedding")]

    def ids_chunks():
        for g in _merge(dirs, tables, None, band, verify):
            yield _union(g).view(np.uint8)

    out = {"id": Stream(np.dtype(np.int64), (total,), False, ids_chunks)}
    for p in parts:
        out[p] = Stream(t0[p].dtype, (total,) + t0[p].shape[1:], False, _part_chunks(dirs, tables, p, weights, accumulate, missing, band, verify))
    return out


def _part_chunks(dirs, tables, part, weights, accumulate, missing, band, verify):
    e0 = tables[0][part]
    dtype, row = e0.dtype, e0.shape[1:]
    averaged = is_averaged(dtype)
    acc_t = np.dtype(accumulate) if dtype.kind != "c" else np.dtype(np.complex128)

    def chunks():
        for g in _merge(dirs, tables, part, band, verify):
            union = _union(g)
            out = np.empty((union.size,) + row, dtype)
            if averaged:
                acc = np.zeros((union.size,) + row, acc_t)
                cnt = np.zeros(union.size, np.float64)
                # ``out`` holds, until the mean is rounded into it, the bits of each element in the first checkpoint
                # that holds its id; ``held``: every other one that holds it has the same (and, with missing="zero",
                # every checkpoint holds it): those elements are given back as they are
                per_row = int(np.prod(row, dtype=np.int64))
                nel = per_row * (2 if dtype.kind == "c" else 1)
                width = unit_width(dtype)  # 1, or a long double's bytes
                first = element_bits(out).reshape(union.size, nel, width)
                held = np.ones(first.shape[:2], bool)
                seen = np.zeros(union.size, np.int64)
                for (ids, rows), w in zip(g, weights):
                    if ids.size:
                        idx = np.searchsorted(union, ids)
                        with np.errstate(invalid="ignore", over="ignore"):
                            t = rows.astype(acc_t).reshape(ids.size, per_row)
                            _real_parts(t)[...] *= w  # complex numbers as pairs of reals: inf * (w + 0j) is NaN
                            acc[idx] += t.reshape(rows.shape)
                            del t
                        cnt[idx] += w
                        bits = element_bits(rows).reshape(ids.size, nel, width)
                        new = seen[idx] == 0
                        first[idx[new]] = bits[new]
                        old = idx[~new]
                        held[old] &= same_bits(bits[~new].reshape(-1, width), first[old].reshape(-1, width)).reshape(old.size, nel)
                        seen[idx] += 1
                if missing != "present":
                    held &= (seen == len(g))[:, None]
                # (a mask of every dimension: numpy's flat path, not index arrays of 16 bytes an element)
                flat = first[:, :, 0] if width == 1 else first
                kept = flat[held] if held.any() else None
                denom = cnt if missing == "present" else np.full(union.size, float(sum(weights)))
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    a = _real_parts(acc.reshape(union.size, per_row))
                    a /= denom.astype(a.dtype)[:, None]
                    canonical_nans(a)
                round_into(out, acc)
                if kept is not None:
                    flat[held] = kept
                zero_padding(first.reshape(-1, width))
            else:  # copied: the newest checkpoint that holds the id
                filled = np.zeros(union.size, bool)
                for ids, rows in g:
                    if ids.size:
                        idx = np.searchsorted(union, ids)
                        new = ~filled[idx]
                        out[idx[new]] = rows[new]
                        filled[idx] = True
            yield out.reshape(-1).view(np.uint8) if out.size else np.empty(0, np.uint8)

    return chunks
