"""Reading many parameters at once (``OpenedDir.read_many``): batches on the I/O pool, not one task per parameter.

The whole tensors of a packed container are read by one task per batch (checked against the manifest as
``OpenedDir._read_span`` checks one), with one ``preadv`` per run of adjacent tensors straight into the new arrays;
other parameters are read a few per task. Each parameter gets a ``Future``-like result (``Part``), in the order asked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, Location
from .fsutil import mappable, pread_into
from .manifest import ParamEntry
from .progress import advance

if TYPE_CHECKING:  # (concurrent.futures and the pool are imported by the first read that uses a thread)
    from concurrent.futures import Future

__all__ = ["Done", "Part", "read_many", "stop"]


def read_many(d: Any, entries: Iterable[ParamEntry], *, mmap: bool = False, verify: bool = False, rows: dict | None = None,
              local: bool = True) -> dict[tuple[str, str], Any]:
    """Start reading several parameters at once; returns futures keyed by (subcol, name), in the order given.

    The reads go to the I/O pool in batches, not one task per parameter: the tensors of a packed container
    together (a batch of consecutive tensors is one ``preadv`` into the new arrays), other parameters a few at a
    time. A batch stops at its first error: that parameter's result raises it, as do those after it in the batch.
    """
    out: dict[tuple[str, str], Any] = {}
    rows = rows or {}
    groups: dict[str, list[ParamEntry]] = {}  # packed container -> its whole tensors asked for
    singles: list[tuple[ParamEntry, Any]] = []
    for e in entries:
        r = rows.get(f"{e.subcol}/{e.name}") if rows else None
        key = (e.subcol, e.name)
        if mmap and not verify and r is None:  # mapping is fast: done here, no thread
            try:
                arr = d._map_npy(e) if _quick(e) else None
                out[key] = Done(arr if arr is not None else d.read(e, mmap=True))
            except BaseException as err:
                out[key] = Done(None, err)
            continue
        out[key] = None  # (its place in the order)
        b = e.blocks[0]
        if r is None and not mmap and local and len(e.blocks) == 1 and b.offset is not None and b.start is None \
                and b.format == "safetensors":
            groups.setdefault(b.file, []).append(e)
        else:
            singles.append((e, r))
    from .pool import pool

    ex = pool() if groups or singles else None
    for es in groups.values():
        for batch in _batches(es, 4096):
            fut = ex.submit(_read_packed, d, batch, verify)
            for i, e in enumerate(batch):
                out[(e.subcol, e.name)] = Part(fut, i)
    for batch in _batches(singles, 32):
        fut = ex.submit(_read_each, d, batch, mmap, verify)
        for i, (e, _) in enumerate(batch):
            out[(e.subcol, e.name)] = Part(fut, i)
    return out


def span_mismatch(block: Any, shape: tuple, dtype: np.dtype, where: str) -> DataError:
    """The error for a packed tensor whose manifest length does not hold its shape and dtype."""
    return DataError(f"tensor {block.key!r}: the manifest's {block.length} bytes at {block.offset} do not hold "
                     f"{tuple(shape)} {dtype}", Location(where))


def fill_span(f: Any, view: Any, offset: int, key: str, where: str) -> None:
    """Fill ``view`` from ``offset`` of a packed container; a file that ends first, or fails to read, is a
    ``DataError`` naming the container and the tensor (not the writer that wanted the bytes, in an average)."""
    try:
        got = pread_into(f, view, offset)
    except OSError as err:
        raise DataError(f"cannot read tensor {key!r}: {err.strerror or err}", Location(where)) from None
    if got < len(view):
        raise DataError(f"file ended inside tensor {key!r}", Location(where))


def _read_each(d: Any, batch: list, mmap: bool, verify: bool) -> tuple[list, BaseException | None]:
    """Parameters read one after the other (a batch of ``read_many``): (arrays, the error that stopped it)."""
    got: list = []
    try:
        for e, r in batch:
            arr = d.read(e, mmap=mmap, verify=verify, rows=r)
            advance(int(getattr(arr, "nbytes", 0)))
            got.append(arr)
    except BaseException as err:  # noqa: BLE001 - the parameter's result raises it
        return got, err
    return got, None

def _read_packed(d: Any, batch: list[ParamEntry], verify: bool) -> tuple[list, BaseException | None]:
    """Whole tensors of one packed container, checked against the manifest as ``_read_span`` does, read with one
    ``preadv`` per run of adjacent tensors (at most 1,024 buffers)."""
    got: list = []
    ready = [0]  # how many of ``got`` hold their bytes: only those are results when a read fails
    try:
        block = batch[0].blocks[0]
        if verify:
            d.verify_once(block)
        f = d._container(block)[0]
        if not mappable(f):
            return _read_each(d, [(e, None) for e in batch], False, False)
        fd = f.fileno()
        run: list = []  # (byte view, entry) of adjacent tensors
        at = end = 0

        def flush() -> None:
            if not run:
                return
            try:
                n = os.preadv(fd, [v for v, _ in run], at)
                if n < end - at:  # a short read: the rest buffer by buffer (the end of the file: an error)
                    pos = at
                    for v, e in run:
                        if n >= len(v):
                            n, pos = n - len(v), pos + len(v)
                            continue
                        fill_span(f, v[n:], pos + n, e.blocks[0].key, d.where(block.file))
                        n, pos = 0, pos + len(v)
            except OSError as err:
                raise DataError(f"cannot read tensor {run[0][1].blocks[0].key!r}: {err.strerror or err}",
                                Location(d.where(block.file))) from None
            run.clear()
            ready[0] = len(got)  # every array handed out so far holds its bytes

        total = 0
        for e in batch:
            b = e.blocks[0]
            dtype = e.dtype
            stored = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
            if b.length != math.prod(e.shape) * stored.itemsize:
                raise span_mismatch(b, e.shape, dtype, d.where(block.file))
            arr = np.empty(e.shape, stored)
            if b.length:
                if not run or b.offset != end or len(run) >= 1024:
                    flush()
                    at = end = b.offset
                run.append((arr.reshape(-1).view(np.uint8), e))
                end += b.length
            got.append(arr)
            total += b.length
        flush()
        ready[0] = len(got)
        for i, e in enumerate(batch):
            if got[i].dtype != e.dtype:
                got[i] = got[i].astype(e.dtype)
        advance(total)
    except BaseException as err:  # noqa: BLE001 - the parameter's result raises it (and so do those not yet read)
        return got[: ready[0]], err
    return got, None


def _quick(e: ParamEntry) -> bool:
    return e.whole and e.blocks[0].format == "npy"


def _batches(items: list, most: int) -> Iterator[list]:
    """``items`` in consecutive batches of at most ``most`` items and about 16 MiB (two threads share the work)."""
    batch: list = []
    held = 0
    for item in items:
        batch.append(item)
        held += (item[0] if isinstance(item, tuple) else item).nbytes
        if len(batch) >= most or held >= 16 << 20:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


class Part:
    """One parameter's result of a batch read on the pool: a ``Future``'s interface for it."""

    __slots__ = ("future", "index")

    def __init__(self, future: Future, index: int) -> None:
        self.future, self.index = future, index

    def result(self) -> Any:
        got, error = self.future.result()
        if self.index < len(got):
            return got[self.index]
        raise error  # type: ignore[misc]

    def cancel(self) -> bool:
        return self.future.cancel()

    def done(self) -> bool:
        return self.future.done()


class Done:
    """A finished read, with the part of ``Future``'s interface the callers use (cheaper than a Future)."""

    __slots__ = ("_value", "_error")

    def __init__(self, value: Any, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> bool:
        return False

    def done(self) -> bool:
        return True


def stop(futs: Iterable[Any]) -> None:
    """Cancel the reads that have not started and wait for the running ones (a batch once for all its parts)."""
    from concurrent.futures import Future, wait

    pending = {}
    for f in futs:
        f = f.future if isinstance(f, Part) else f
        if isinstance(f, Future):
            pending[id(f)] = f
    wait([f for f in pending.values() if not f.cancel()])
