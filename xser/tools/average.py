"""Checkpoint averaging: the elementwise (weighted) mean of a model's checkpoints, streamed.

Works on any saved model without its component classes: the spec text is the newest selected
checkpoint's own (same subcollection names, so the result is a drop-in replacement) and only
the data is computed. Memory stays bounded by a chunk budget whatever the array sizes: every
array is read in chunks of elements from each checkpoint (through its weight format's
streaming reader, so every format works), accumulated in a wider float, cast back and written,
then the next chunk. The checkpoints are chosen from one consistent listing and read through
their opened directories, so a saver rotating them meanwhile cannot make the average mix
checkpoints or count one twice; if one is pruned while it is read, the average starts over.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ..storage.progress import advance
from ..storage.progress import progress as progress_bar
from ..api import retrying
from ..checkpoints.policy import best_n
from ..checkpoints.newmodel import write_new_model
from ..checkpoints.saver import SaveOptions
from ..checkpoints.snapshot import Snapshot
from ..errors import CheckpointError, Location, did_you_mean, shape_str
from ..spec.saved import is_saved
from ..spec import read
from ..checkpoints.snapshot import growing
from ..storage.dtypes import is_averaged, round_into, tag_of
from .average_tables import MISSING, table_streams, tables_of
from .average_small import SmallMeans, _mean_chunk, _real_parts, copied_small, keep_held, small_enough, wide_accumulator
from ..model.tables import one_run
from ..storage.listing import Checkpoint, Scan, scan
from ..storage.opened import OpenedDir
from ..storage.manifest import ParamEntry
from ..storage.payloads import Stream, from_entry
from ..storage.pool import pool
from ..storage.stores import options as storage_context
from .where import is_file, same_path, spec_text as read_spec_text

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
    path: str | Scan,
    *,
    last: int | None = None,
    indices: Sequence[int] | None = None,
    best: int | None = None,
    metric: str | None = None,
    mode: str = "max",
    storage_options: Mapping[str, Any] | None = None,
) -> list[Checkpoint]:
    """The checkpoints to use, newest first: all, the last N, given indices, or the best N by a metric.

    ``best`` uses the same ranking as ``KeepBest`` (``policy.best_n``): checkpoints whose
    metric is missing or NaN are never chosen. Asking for more checkpoints than there are (``last``)
    or than record the metric (``best``) is an error, never a smaller selection without a word.
    """
    if isinstance(path, Scan):
        ckpts, where = path.checkpoints, Location(path.spec_path)
    else:
        with storage_context(storage_options), scan(path) as s:
            ckpts, where = s.checkpoints, Location(os.fspath(path))
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
        if last > len(ckpts):  # never fewer than asked without a word: no selection is the way to say "all"
            n = len(ckpts)
            raise CheckpointError(f"asked for the last {last} checkpoints, but the model has {n}; choose at most {n}, "
                                  f"or no selection to average all {n}", where)
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
        top = best_n(ckpts, best, metric, mode)
        if not top:
            known = sorted({m for c in ckpts for m in c.metrics})
            hint = did_you_mean(metric, known)
            raise CheckpointError(
                f"no checkpoint records metric {metric!r} as a number (recorded: {', '.join(known) or 'none'}){hint}", where
            )
        if len(top) < best:
            raise CheckpointError(f"asked for the best {best} checkpoints by {metric!r}, but only {len(top)} record it "
                                  f"as a number; choose at most {len(top)}", where)
        return [ckpts[i] for i in top]
    return ckpts


def _first_dup(xs: Sequence[int]) -> int:
    seen: set[int] = set()
    for x in xs:
        if x in seen:
            return x
        seen.add(x)
    return xs[0]


def _weights(weights: Sequence[float] | None, n: int, where: Location, accumulate: str = "float64") -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * n
    ws = tuple(float(w) for w in weights)
    if len(ws) != n:
        raise CheckpointError(f"{len(ws)} weights for {n} selected checkpoints", where)
    if not all(math.isfinite(w) for w in ws):
        raise CheckpointError(f"weights must be finite numbers, got {list(ws)}", where)
    if any(w < 0 for w in ws):  # a negative weight is no mean: it extrapolates away from a checkpoint
        raise CheckpointError(f"weights must not be negative, got {list(ws)}", where)
    if sum(ws) == 0:
        raise CheckpointError(f"weights sum to zero: {list(ws)}", where)
    # every weight, and their sum, a finite non-zero number in the accumulator (a sum that overflows would divide
    # every mean into NaN or 0; a weight that rounds to 0 or inf in float32 is not the weight asked for)
    acc = np.dtype(accumulate).type
    with np.errstate(over="ignore", under="ignore"):
        bad = [w for w in ws if w and not (math.isfinite(acc(w)) and acc(w) != 0)]
        if bad or not math.isfinite(acc(sum(ws))):
            what = f"weight {bad[0]!r} is" if bad else f"the weights' sum {sum(ws)!r} is"
            raise CheckpointError(f"{what} out of {accumulate}'s range: {list(ws)}", where)
    return ws


def _accumulator(dtype: np.dtype, accumulate: str) -> np.dtype:
    base = np.dtype(accumulate)
    if tag_of(dtype) is not None:  # bfloat16, float8: never in their own precision
        return base
    if dtype.kind == "c":
        base = np.result_type(base, np.complex64)
    acc = np.result_type(dtype.newbyteorder("="), base)
    # float64 data: sum in extended precision where the platform has it, so that the mean of
    # identical checkpoints is exactly the checkpoint
    if acc == np.float64 and dtype.itemsize == 8 and np.finfo(np.longdouble).nmant > 52:
        acc = np.dtype(np.longdouble)
    return acc


def _check_same(ref: OpenedDir, other: OpenedDir, ref_ck: Checkpoint, ck: Checkpoint) -> None:
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
            if growing(name, x.shape) != growing(name, y.shape) or x.dtype != y.dtype:
                raise CheckpointError(
                    f"{sub}: param {name!r} is {shape_str(x.shape)} {x.dtype} in {ref_ck.path}, "
                    f"{shape_str(y.shape)} {y.dtype} in {ck.path}",
                    Location(ck.path),
                )


def _exact(pieces: Iterator[np.ndarray], n: int, total: int, where: str) -> Iterator[np.ndarray]:
    """Re-cut a stream of flat pieces into pieces of exactly ``n`` elements (the last may be shorter).

    Pieces that already have the right size pass through without a copy (``.npy`` files read
    with the same chunk size do); others (text formats' row bands) are gathered in one buffer.
    """
    buf: np.ndarray | None = None
    fill = 0
    done = 0
    for piece in pieces:
        want = min(n, total - done)
        if fill == 0 and piece.size == want:
            done += want
            yield piece
            continue
        pos = 0
        while pos < piece.size:
            want = min(n, total - done)
            if buf is None:
                buf = np.empty(n, piece.dtype)
            take = min(want - fill, piece.size - pos)
            buf[fill : fill + take] = piece[pos : pos + take]
            fill += take
            pos += take
            if fill == want:
                done += want
                fill = 0
                yield buf[:want]
    if done != total or fill:
        raise CheckpointError(f"the file gave {done + fill} elements, {total} expected", Location(where))


def _mean_stream(dirs: list[OpenedDir], entries: list[ParamEntry], weights, accumulate, chunk_elems, progress, verify=True) -> Stream:
    e0 = entries[0]
    dtype, size = e0.dtype, math.prod(e0.shape)
    acc_dtype = _accumulator(dtype, accumulate)
    total = sum(weights)
    unit = all(w == 1.0 for w in weights)

    acc_real = np.dtype(acc_dtype.char.lower()) if acc_dtype.kind == "c" else acc_dtype
    fused = dtype.kind == "f" and tag_of(dtype) is None  # round_into is a plain cast for these
    wide = wide_accumulator(dtype, acc_real, weights)

    def chunks():
        wts = [acc_real.type(w) for w in weights]  # a Python float would make numpy compute in the data's precision
        n = max(1, min(chunk_elems, size))
        acc = np.empty(n, acc_dtype)
        tmp = np.empty(n, acc_dtype) if not unit else None
        out = np.empty(n, dtype)
        conv = np.empty(n, acc_dtype) if tag_of(dtype) is not None else None
        raw = np.empty(n * dtype.itemsize, np.uint8)  # shared: each piece is used before the next is read
        raw0 = np.empty(n * dtype.itemsize, np.uint8)  # the first checkpoint's own: its piece is compared with the others
        sources = [
            _exact(d.chunks(e, n, raw0 if i == 0 else raw, verify=verify), n, size, d.where(e.blocks[0].file))
            for i, (d, e) in enumerate(zip(dirs, entries))
        ]
        try:
            for start in range(0, size, n):
                m = min(n, size - start)
                a = _real_parts(acc[:m])
                with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf are averaged like any value
                    keep, first = _mean_chunk(sources, wts, a, _real_parts(tmp[:m]) if tmp is not None else None, unit, conv,
                                              wide)
                    if fused and total != 1.0:  # divided in the accumulator's precision, rounded once as it is stored
                        np.divide(a, acc_real.type(total), out=out[:m], dtype=acc_dtype, casting="unsafe")
                    else:
                        if total != 1.0:
                            np.divide(a, acc_real.type(total), out=a)
                        round_into(out[:m], acc[:m])
                keep_held(out[:m], keep, first)
                advance(m * dtype.itemsize * len(sources))
                if progress is not None:
                    progress(m * dtype.itemsize * len(sources))
                yield out[:m].view(np.uint8)
        finally:
            for src_iter in sources:
                src_iter.close()

    return Stream(dtype, e0.shape, False, chunks)


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
    missing: str = "present",
    drop_slots: bool = False,
    durable: bool = True,
    force: bool = False,
    progress: Callable[[int], Callable[[int], None] | None] | None = None,
    memory_budget: int = MEMORY_BUDGET,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> AverageReport:
    """Write a new model at ``out`` whose parameters are the mean of ``path``'s selected checkpoints.

    Floating-point arrays are accumulated in ``accumulate`` precision (float64 by default, wider
    for wider data) and cast back to their dtype; other arrays (step counters, masks) are copied
    from the newest selected checkpoint. ``progress(total_bytes)`` is called once the
    checkpoints are chosen and may return ``update(nbytes)``, called as data is read.

    ``path`` and ``out`` may be local paths or URLs (``s3://...``, any fsspec protocol), in any mix;
    ``storage_options`` go to the filesystem of every URL. A remote checkpoint is read in chunks
    (ranged GETs), so memory stays bounded as locally.
    """
    with storage_context(storage_options):
        return _average_paths(os.fspath(path), os.fspath(out), last=last, checkpoints=checkpoints, best=best, metric=metric,
                              mode=mode, weights=weights, accumulate=accumulate, missing=missing, drop_slots=drop_slots,
                              durable=durable, force=force, progress=progress, memory_budget=memory_budget, verify=verify)


def _average_paths(path: str, out: str, *, last, checkpoints, best, metric, mode, weights, accumulate, missing, drop_slots,
                   durable, force, progress, memory_budget, verify) -> AverageReport:
    where = Location(path)
    if accumulate not in ("float64", "float32"):
        raise CheckpointError(f"accumulate must be 'float64' or 'float32', got {accumulate!r}", where)
    if missing not in MISSING:
        raise CheckpointError(f"missing must be {' or '.join(map(repr, MISSING))}, got {missing!r}", where)
    if same_path(path, out):
        raise CheckpointError("the output is the input model; choose another --out", Location(out))
    if is_file(path) and not is_saved(read(path)):
        raise CheckpointError("not a saved xser model (no xser_format key)", where)

    def once() -> AverageReport:
        with scan(path) as s:
            chosen = select(s, last=last, indices=checkpoints, best=best, metric=metric, mode=mode)
            by_path = {c.path: d for c, d in s.listed}
            return _average(path, out, chosen, [by_path[c.path] for c in chosen], weights=weights, accumulate=accumulate,
                            durable=durable, force=force, progress=progress, memory_budget=memory_budget, verify=verify,
                            missing=missing, drop_slots=drop_slots)

    return retrying(path, once)


def _average(path: str, out: str, chosen: list[Checkpoint], dirs: list[OpenedDir], *, weights, accumulate, durable, force,
             progress, memory_budget, verify, missing="present", drop_slots=False) -> AverageReport:
    where = Location(path)
    ws = _weights(weights, len(chosen), where, accumulate)
    for d, c in zip(dirs[1:], chosen[1:]):
        _check_same(dirs[0], d, chosen[0], c)
    newest = dirs[0]
    # the bytes that will be read (the floating arrays of every selected checkpoint) and written
    total = sum(e.nbytes for d in dirs for ps in d.subcollections.values() for e in ps.values() if is_averaged(e.dtype))
    if progress is not None:
        progress = progress(total)
    total += sum(e.nbytes for ps in newest.subcollections.values() for e in ps.values())
    workers = max(1, pool()._max_workers)
    arrays: dict[str, dict[str, tuple[Any, bool]]] = {}
    averaged, copied = [], []
    small: dict[np.dtype, list] = {}  # dtype -> [chunk, [(sub, name, entries), ...]]: the small arrays, in save order
    for sub, params in newest.subcollections.items():
        arrays[sub] = {}
        for table, parts in tables_of(params).items():  # aligned by id, streamed
            streams = table_streams(dirs, [tables_of(d.subcollections[sub])[table] for d in dirs], ws, accumulate=accumulate,
                                    missing=missing, drop_slots=drop_slots, verify=verify, where=f"{sub}/{table}")
            for part, stream in streams.items():
                arrays[sub][f"{table}@{part}"] = (stream, parts[part].trainable, one_run(parts[part].attrs))
                if part != "id":  # the ids are the union of the checkpoints' ids
                    (averaged if is_averaged(parts[part].dtype) else copied).append(f"{sub}/{table}@{part}")
        for name, e0 in params.items():
            if "@" in name:
                continue
            entries = [d.subcollections[sub][name] for d in dirs]
            if is_averaged(e0.dtype):
                per_elem = (3 if tag_of(e0.dtype) else 2) * _accumulator(e0.dtype, accumulate).itemsize + 2 * e0.dtype.itemsize
                chunk = max(1, min(CHUNK_ELEMENTS, memory_budget // workers // per_elem))
                if small_enough(e0, entries, chunk):  # packed like a save packs it, averaged with its neighbours (SmallMeans)
                    small.setdefault(e0.dtype, [chunk, []])[1].append((sub, name, entries))
                    arrays[sub][name] = None
                else:
                    arrays[sub][name] = (_mean_stream(dirs, entries, ws, accumulate, chunk, progress, verify), e0.trainable, e0.attrs)
                averaged.append(f"{sub}/{name}")
            else:
                copy = copied_small(newest, e0, verify) if e0.whole and e0.blocks[0].key is not None else None
                arrays[sub][name] = (copy or from_entry(newest, e0, verify=verify), e0.trainable, e0.attrs)
                copied.append(f"{sub}/{name}")
    for dtype, (chunk, members) in small.items():
        means = SmallMeans(dirs, [m[2] for m in members], ws, _accumulator(dtype, accumulate), chunk, progress, verify,
                           keep=2 * workers + 2)
        for (sub, name, entries), lazy in zip(members, means.lazies()):
            arrays[sub][name] = (lazy, entries[0].trainable, entries[0].attrs)
    notes = []
    if len(chosen) == 1:
        notes.append("only one checkpoint selected: the average is a copy of it")
    if copied:
        notes.append(f"{len(copied)} non-floating-point arrays copied from the newest selected checkpoint")
    meta = {
        "training": {
            "averaged_from": [
                {"checkpoint": os.path.basename(c.path), "id": c.id, "step": c.step, "weight": w} for c, w in zip(chosen, ws)
            ],
            "accumulate": accumulate,
            **({"tables": {"missing": missing, "drop_slots": drop_slots}} if any(tables_of(p) for p in newest.subcollections.values()) else {}),
        },
        "custom": newest.meta.get("custom") or {},
    }
    spec_text = newest.spec_text()
    if spec_text is None:  # format_version 1: the top-level file is the spec
        spec_text = read_spec_text(path)
    with progress_bar(total, "averaging"):
        write_new_model(out, [Snapshot(spec_text, arrays, meta)], SaveOptions(durable), force=force)
    return AverageReport(out, tuple(chosen), ws, tuple(averaged), tuple(copied), tuple(notes))
