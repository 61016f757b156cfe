"""Checkpoint averaging: the elementwise (weighted) mean of a model's checkpoints, streamed.

Works on any saved model without its component classes: the spec text is copied as it is
(same subcollection names, so the result is a drop-in replacement) and only the data is
computed. Memory stays bounded by a chunk budget whatever the array sizes: every array is
read in chunks of elements from each checkpoint, accumulated in a wider float, cast back
and written, then the next chunk.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from .checkpointing import Checkpoint, _listing, write_new_model
from .commit import Stream, from_entry
from .errors import CheckpointError, DataError, Location, did_you_mean, shape_str
from .formats.npy import read_header
from .spec import read
from .store import DataDir, ParamEntry, pool

__all__ = ["AverageReport", "average", "select"]

#: Bytes of working buffers for all concurrent arrays together.
MEMORY_BUDGET = 64 << 20
#: Elements per chunk: small enough to stay in the CPU cache (measured best at 2**18 here).
CHUNK_ELEMENTS = 1 << 18


@attrs.frozen
class AverageReport:
    out: str
    checkpoints: tuple[Checkpoint, ...]
    weights: tuple[float, ...]
    averaged: tuple[str, ...]  # "subcollection/param" of the averaged arrays
    copied: tuple[str, ...]  # not floating point: copied from the newest selected checkpoint
    notes: tuple[str, ...] = ()


def select(
    path: str,
    *,
    last: int | None = None,
    indices: Sequence[int] | None = None,
    best: int | None = None,
    metric: str | None = None,
    mode: str = "max",
) -> list[Checkpoint]:
    """The checkpoints to use, newest first: all, the last N, given indices, or the best N by a metric."""
    ckpts = [ck for ck, _ in _listing(path)]
    where = Location(path)
    if not ckpts:
        raise CheckpointError("the model has no checkpoints (no .data directory with a valid manifest)", where)
    chosen = sum(x is not None for x in (last, indices, best))
    if chosen > 1:
        raise CheckpointError("choose one of last, checkpoints and best", where)
    if metric is not None and best is None:
        raise CheckpointError("metric is only used with best", where)
    if last is not None:
        if last < 1:
            raise CheckpointError(f"last must be >= 1, got {last}", where)
        return ckpts[:last]
    if indices is not None:
        if not indices:
            raise CheckpointError("the selection is empty", where)
        bad = [i for i in indices if not 0 <= i < len(ckpts)]
        if bad:
            raise CheckpointError(f"no checkpoint {bad[0]}: the model has {len(ckpts)} (0 to {len(ckpts) - 1})", where)
        if len(set(indices)) != len(indices):
            raise CheckpointError(f"checkpoint {_first_dup(indices)} is selected twice", where)
        return [ckpts[i] for i in sorted(indices)]
    if best is not None:
        if best < 1:
            raise CheckpointError(f"best must be >= 1, got {best}", where)
        if metric is None:
            raise CheckpointError("best needs a metric", where)
        if mode not in ("max", "min"):
            raise CheckpointError(f"mode must be 'max' or 'min', got {mode!r}", where)
        known = sorted({m for c in ckpts for m in c.metrics})
        scored = [c for c in ckpts if isinstance(c.metrics.get(metric), (int, float))]
        if not scored:
            hint = did_you_mean(metric, known)
            raise CheckpointError(
                f"no checkpoint records metric {metric!r} (recorded: {', '.join(known) or 'none'}){hint}", where
            )
        sign = -1 if mode == "max" else 1
        top = sorted(scored, key=lambda c: (sign * c.metrics[metric], c.index))[:best]
        return sorted(top, key=lambda c: c.index)
    return ckpts


def _first_dup(xs: Sequence[int]) -> int:
    seen: set[int] = set()
    for x in xs:
        if x in seen:
            return x
        seen.add(x)
    return xs[0]


def _weights(weights: Sequence[float] | None, n: int, where: Location) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * n
    ws = tuple(float(w) for w in weights)
    if len(ws) != n:
        raise CheckpointError(f"{len(ws)} weights for {n} selected checkpoints", where)
    if not all(math.isfinite(w) for w in ws):
        raise CheckpointError(f"weights must be finite numbers, got {list(ws)}", where)
    if sum(ws) == 0:
        raise CheckpointError(f"weights sum to zero: {list(ws)}", where)
    return ws


def _accumulator(dtype: np.dtype, accumulate: str) -> np.dtype:
    base = np.dtype(accumulate)
    if dtype.kind == "c":
        base = np.result_type(base, np.complex64)
    acc = np.result_type(dtype.newbyteorder("="), base)
    # float64 data: sum in extended precision where the platform has it, so that the mean of
    # identical checkpoints is exactly the checkpoint
    if acc == np.float64 and dtype.itemsize == 8 and np.finfo(np.longdouble).nmant > 52:
        acc = np.dtype(np.longdouble)
    return acc


def _check_same(ref: DataDir, other: DataDir, ref_ck: Checkpoint, ck: Checkpoint) -> None:
    a, b = ref.subcollections, other.subcollections
    for sub in sorted(set(a) | set(b)):
        if sub not in b or sub not in a:
            have, lack = (ref_ck, ck) if sub in a else (ck, ref_ck)
            raise CheckpointError(
                f"subcollection {sub} is in {have.path} but not in {lack.path}", Location(ck.path)
            )
        for name in sorted(set(a[sub]) | set(b[sub])):
            x, y = a[sub].get(name), b[sub].get(name)
            if x is None or y is None:
                have, lack = (ref_ck, ck) if y is None else (ck, ref_ck)
                raise CheckpointError(f"{sub}: param {name!r} is in {have.path} but not in {lack.path}", Location(ck.path))
            if x.shape != y.shape or x.dtype != y.dtype:
                raise CheckpointError(
                    f"{sub}: param {name!r} is {shape_str(x.shape)} {x.dtype} in {ref_ck.path}, "
                    f"{shape_str(y.shape)} {y.dtype} in {ck.path}",
                    Location(ck.path),
                )


def _data_offsets(dirs: list[DataDir], entries: list[ParamEntry]) -> tuple[list[int], bool]:
    offsets, orders = [], set()
    for d, e in zip(dirs, entries):
        path = d.file_path(e.blocks[0].file)
        with open(path, "rb") as f:
            shape, fortran, dtype, offset = read_header(f, path)
        if tuple(shape) != e.shape or dtype != e.dtype:
            raise DataError(f"header says {shape_str(shape)} {dtype}, manifest says {shape_str(e.shape)} {e.dtype}", Location(path))
        offsets.append(offset)
        orders.add(fortran)
    if len(orders) > 1:
        raise DataError(
            f"param {entries[0].name!r} of {entries[0].subcol} is stored in C order in some checkpoints and "
            "Fortran order in others; re-save them in one order",
            Location(dirs[0].path),
        )
    return offsets, orders.pop()


class _Source:
    """One checkpoint's ``.npy`` file, read chunk by chunk into a caller's buffer.

    Plain reads into a small reused buffer, not memory maps: mapped pages count toward the
    process's RSS, and dropping them again (``madvise``) costs more than the copy it saves
    (measured: 3.5x the floor with maps, 1.4x with reads; benchmarks/RESULTS.md).
    """

    def __init__(self, path: str, offset: int, dtype: np.dtype, size: int) -> None:
        self.path, self.offset, self.dtype = path, offset, dtype
        self.file = open(path, "rb")
        actual = os.fstat(self.file.fileno()).st_size
        if actual < offset + size * dtype.itemsize:
            self.file.close()
            raise DataError(f"file has {actual} bytes, its header promises {offset + size * dtype.itemsize}", Location(path))

    def elements(self, start: int, count: int, raw: np.ndarray) -> np.ndarray:
        buf = raw[: count * self.dtype.itemsize]
        self.file.seek(self.offset + start * self.dtype.itemsize)
        got = self.file.readinto(buf)
        if got != buf.nbytes:
            raise DataError(f"file ended early ({got} of {buf.nbytes} bytes at element {start})", Location(self.path))
        return buf.view(self.dtype)

    def close(self) -> None:
        self.file.close()


def _blocked(entries: list[ParamEntry]) -> bool:
    return any(len(e.blocks) > 1 or e.blocks[0].start is not None for e in entries)


def _mean_stream_by_rows(dirs, entries, weights, accumulate, chunk_elems, progress) -> Stream:
    """The same mean for parameters stored in blocks: read row ranges through ``DataDir.read``."""
    e0 = entries[0]
    dtype = e0.dtype
    acc_dtype = _accumulator(dtype, accumulate)
    row = int(np.prod(e0.shape[1:], dtype=np.int64)) or 1
    step = max(1, chunk_elems // row)
    total = sum(weights)

    def chunks():
        wts = [np.dtype(acc_dtype.char.lower() if acc_dtype.kind == "c" else acc_dtype).type(w) for w in weights]
        for first in range(0, e0.shape[0], step):
            stop = min(e0.shape[0], first + step)
            acc = None
            for d, e, w in zip(dirs, entries, wts):
                part = d.read(e, rows=(first, stop)).astype(acc_dtype)
                acc = part * w if acc is None else acc + part * w
            acc /= total
            if progress is not None:
                progress(acc.size * dtype.itemsize * len(dirs))
            yield np.ascontiguousarray(acc.astype(dtype)).reshape(-1).view(np.uint8)

    return Stream(dtype, e0.shape, False, chunks)


def _mean_stream(dirs, entries, weights, accumulate, chunk_elems, progress) -> Stream:
    if _blocked(entries) and entries[0].shape:
        return _mean_stream_by_rows(dirs, entries, weights, accumulate, chunk_elems, progress)
    e0 = entries[0]
    dtype, size = e0.dtype, int(np.prod(e0.shape, dtype=np.int64))
    offsets, fortran = _data_offsets(dirs, entries)
    files = [d.file_path(e.blocks[0].file) for d, e in zip(dirs, entries)]
    acc_dtype = _accumulator(dtype, accumulate)
    total = sum(weights)
    unit = all(w == 1.0 for w in weights)

    # complex numbers are averaged as pairs of reals: multiplying or dividing by a complex
    # weight would turn inf into nan and lose the sign of -0.0
    acc_real = np.dtype(acc_dtype.char.lower()) if acc_dtype.kind == "c" else acc_dtype

    def parts(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind != "c":
            return a
        return a.view(np.dtype(a.dtype.byteorder + "f" + str(a.dtype.itemsize // 2)))

    def chunks():
        wts = [acc_real.type(w) for w in weights]  # a Python float would make numpy compute in the data's precision
        n = max(1, min(chunk_elems, size))
        acc = np.empty(n, acc_dtype)
        tmp = np.empty(n, acc_dtype) if not unit else None
        out = np.empty(n, dtype)
        raw = np.empty(n * dtype.itemsize, np.uint8)
        sources = [_Source(f, off, dtype, size) for f, off in zip(files, offsets)]
        try:
            for start in range(0, size, n):
                m = min(n, size - start)
                a = parts(acc[:m])
                for i, (src_file, w) in enumerate(zip(sources, wts)):
                    src = parts(src_file.elements(start, m, raw))
                    if i == 0:  # start from the first checkpoint itself: keeps -0.0, inf and nan exact
                        np.copyto(a, src) if unit else np.multiply(src, w, out=a)
                    elif unit:
                        np.add(a, src, out=a)
                    else:
                        t = parts(tmp[:m])
                        np.multiply(src, w, out=t)
                        np.add(a, t, out=a)
                if total != 1.0:
                    np.divide(a, acc_real.type(total), out=a)
                np.copyto(out[:m], acc[:m], casting="unsafe")
                if progress is not None:
                    progress(m * dtype.itemsize * len(files))
                yield out[:m].view(np.uint8)
        finally:
            for src_file in sources:
                src_file.close()

    return Stream(dtype, e0.shape, fortran, chunks)


def average(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    last: int | None = None,
    checkpoints: Sequence[int] | None = None,
    best: int | None = None,
    metric: str | None = None,
    mode: str = "max",
    weights: Sequence[float] | None = None,
    accumulate: str = "float64",
    durable: bool = True,
    force: bool = False,
    progress: Callable[[int], Callable[[int], None] | None] | None = None,
    memory_budget: int = MEMORY_BUDGET,
) -> AverageReport:
    """Write a new model at ``out`` whose parameters are the mean of ``path``'s selected checkpoints.

    Floating-point arrays are accumulated in ``accumulate`` precision (float64 by default, wider
    for wider data) and cast back to their dtype; other arrays (step counters, masks) are copied
    from the newest selected checkpoint. ``progress(total_bytes)`` is called once the
    checkpoints are chosen and may return ``update(nbytes)``, called as data is read.
    """
    path, out = os.fspath(path), os.fspath(out)
    where = Location(path)
    if accumulate not in ("float64", "float32"):
        raise CheckpointError(f"accumulate must be 'float64' or 'float32', got {accumulate!r}", where)
    if os.path.realpath(path) == os.path.realpath(out):
        raise CheckpointError("the output is the input model; choose another --out", Location(out))
    spec_doc = read(path)
    if not (isinstance(spec_doc.tree, dict) and "xser_format" in spec_doc.tree):
        raise CheckpointError("not a saved xser model (no xser_format key)", where)
    chosen = select(path, last=last, indices=checkpoints, best=best, metric=metric, mode=mode)
    ws = _weights(weights, len(chosen), where)
    dirs = [DataDir.open(c.path) for c in chosen]
    for d, c in zip(dirs[1:], chosen[1:]):
        _check_same(dirs[0], d, chosen[0], c)
    newest = dirs[0]
    if progress is not None:  # the bytes that will be read: the floating arrays of every selected checkpoint
        total = sum(
            e.nbytes for d in dirs for ps in d.subcollections.values() for e in ps.values()
            if e.dtype.kind in "fc" and e.dtype.fields is None
        )
        progress = progress(total)
    workers = max(1, pool()._max_workers)
    arrays: dict[str, dict[str, tuple[Any, bool]]] = {}
    averaged, copied = [], []
    for sub, params in newest.subcollections.items():
        arrays[sub] = {}
        for name, e0 in params.items():
            entries = [d.subcollections[sub][name] for d in dirs]
            if e0.dtype.kind in "fc" and e0.dtype.fields is None:
                per_elem = 2 * _accumulator(e0.dtype, accumulate).itemsize + 2 * e0.dtype.itemsize
                chunk = max(1, min(CHUNK_ELEMENTS, memory_budget // workers // per_elem))
                arrays[sub][name] = (_mean_stream(dirs, entries, ws, accumulate, chunk, progress), e0.trainable)
                averaged.append(f"{sub}/{name}")
            else:
                arrays[sub][name] = (from_entry(newest, e0), e0.trainable)
                copied.append(f"{sub}/{name}")
    notes = []
    if len(chosen) == 1:
        notes.append("only one checkpoint selected: the average is a copy of it")
    if copied:
        notes.append(f"{len(copied)} non-floating-point arrays copied from the newest selected checkpoint")
    meta = {
        "training": {
            "averaged_from": [
                {"checkpoint": os.path.basename(c.path), "step": c.step, "weight": w} for c, w in zip(chosen, ws)
            ],
            "accumulate": accumulate,
        },
        "custom": newest.meta.get("custom") or {},
    }
    with open(path, encoding="utf-8") as f:
        spec_text = f.read()
    write_new_model(out, arrays, spec_text, meta, durable=durable, force=force)
    return AverageReport(out, tuple(chosen), ws, tuple(averaged), tuple(copied), tuple(notes))
