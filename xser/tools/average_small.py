"""The mean of one chunk (``_mean_chunk``), and of many small arrays at once (thousands of small tensors, packed).

Each small floating-point array (one that fits in one of the average's chunks and that a save packs) becomes a
``Lazy`` payload, so the planner packs the averaged model as a save of the same model would be, and the container
writer asks for the arrays one after the other. The arrays of one dtype are cut, in save order, into batches of at
most one chunk of elements; the first array of a batch asked for computes the whole batch: every checkpoint's bytes of
its arrays read back to back (``OpenedDir.read_into``: one ``pread`` per run of neighbouring tensors of a container,
each container's checksum checked once), summed and divided in single passes over the batch, with the same
operations, in the same order and precision, as the chunk loop of ``average._mean_stream``. Every element is
computed alone (``_mean_chunk``: an element every checkpoint holds bit for bit is given back as it is, any other NaN is
numpy's NaN), so the result of an array is the same bits as when it is averaged alone. Memory: a few batches (each at most one chunk) held for the
writer threads, recomputed if asked for again after they were let go.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..storage.dtypes import round_into, tag_of
from ..storage.manifest import ParamEntry
from ..storage.opened import OpenedDir
from ..storage.payloads import Lazy
from ..storage.plan import PACK_BELOW, _packable
from ..storage.progress import advance

__all__ = ["SmallMeans", "copied_small", "small_enough"]

#: arrays per batch, at most (the per-array bookkeeping of a batch is a few numpy arrays of this length)
BATCH_ARRAYS = 8192


def _mean_chunk(
    sources: list, wts: list, a: np.ndarray, t: np.ndarray | None, unit: bool, conv: np.ndarray | None, wide: bool,
) -> tuple[np.ndarray | None, np.ndarray]:
    """Sum the next piece of every checkpoint into ``a`` (weighted unless ``unit``), every NaN of the sum made numpy's
    NaN; return the elements every checkpoint holds bit for bit (a bool mask over ``a``'s elements, the real parts of
    complex numbers, or None for none), which the caller gives back as they were saved after rounding, and the first
    checkpoint's bits. Element by element, so the result of an element never depends on its neighbours, the batch or
    the chunk. With a ``wide`` accumulator an element held by every checkpoint averages to itself unless it is NaN, so
    only the NaNs of the first checkpoint are compared."""
    keep: np.ndarray | None = None
    first = None
    src0 = None
    for i, (src_iter, w) in enumerate(zip(sources, wts)):
        piece = next(src_iter)
        bits = piece.view(np.uint8)
        if i == 0:
            first = bits
            if not wide:
                keep = np.ones(a.size, bool)
        elif keep is not None:
            keep &= same_bits(_units(bits, a.size), _units(first, a.size))
        src = _real_parts(piece)
        if conv is not None:  # an extension dtype: widened exactly before any arithmetic
            np.copyto(conv[: src.size], src, casting="unsafe")
            src = conv[: src.size]
        if i == 0 and wide and _may_hold_nan(src):  # (bfloat16, float8: tested widened, in ``conv``)
            keep = np.isnan(src)
        # dtype= fixes the loop to the accumulator's precision: numpy 1's value-based casting would otherwise
        # multiply a float32 piece by a float64 scalar weight in float32
        if i == 0:  # start from the first checkpoint itself: keeps -0.0, inf and nan exact
            if unit and len(sources) > 1 and conv is None:
                src0 = src  # its buffer is the first checkpoint's own (never ``conv``, which the next one reuses)
            else:
                np.copyto(a, src) if unit else np.multiply(src, w, out=a, dtype=a.dtype)
        elif src0 is not None:  # widened and added in one pass: the same sum as a copy, then an add
            np.add(src0, src, out=a, dtype=a.dtype)
            src0 = None
        elif unit:
            np.add(a, src, out=a, dtype=a.dtype)
        else:
            np.multiply(src, w, out=t, dtype=t.dtype)
            np.add(a, t, out=a, dtype=a.dtype)
    canonical_nans(a)
    if keep is not None and not keep.any():
        keep = None
    return keep, first


def _may_hold_nan(a: np.ndarray) -> bool:
    """Whether ``a`` may hold a NaN, in one pass that allocates nothing: its sum is NaN if any value is (or inf
    meets -inf)."""
    with np.errstate(all="ignore"):
        return bool(np.isnan(np.add.reduce(a, axis=None)))


#: bytes of a long double that hold its value (x87 extended precision: 10 of 12 or 16; the rest is padding whose
#: bits are whatever the memory held)
_LONG_BYTES = 10 if np.finfo(np.longdouble).nmant == 63 else np.dtype(np.longdouble).itemsize


def _units(bits: np.ndarray, n: int) -> np.ndarray:
    """``bits`` (uint8) as ``n`` comparable elements: unsigned integers of the element's width, or (long double) rows
    of bytes, one per element."""
    k = bits.size // n if n else 1
    if k in (1, 2, 4, 8):
        return bits.view(np.dtype(f"u{k}"))
    return bits.reshape(n, k)


def _real_size(dtype: np.dtype) -> int:
    """The bytes of one of ``dtype``'s real numbers (a complex number's part)."""
    return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


def unit_width(dtype: np.dtype) -> int:
    """The second dimension of ``_units`` of ``dtype``'s numbers: 1 (unsigned integers), or a long double's bytes."""
    k = _real_size(dtype)
    return 1 if k in (1, 2, 4, 8) else k


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element by element, whether two ``_units`` (or the same shaped as ``n x unit_width``) hold the same value bits
    (a long double's padding ignored)."""
    if a.ndim == 1:
        return a == b
    if a.shape[1] == 1:
        return (a == b)[:, 0]
    return (a[:, :_LONG_BYTES] == b[:, :_LONG_BYTES]).all(axis=1)


def zero_padding(units: np.ndarray) -> None:
    """Zero the padding of ``_units`` that are long doubles (rows of bytes), so that the bytes written (and their
    checksum) never depend on what the memory held; nothing for other units."""
    if units.ndim == 2 and units.shape[1] > _LONG_BYTES:
        units[:, _LONG_BYTES:] = 0


def element_bits(a: np.ndarray) -> np.ndarray:
    """The bits of ``a``'s numbers (the real and imaginary parts of complex ones apart), one comparable element each."""
    real = np.ascontiguousarray(_real_parts(a)).reshape(-1)
    return _units(real.view(np.uint8), real.size)


def canonical_nans(a: np.ndarray) -> None:
    """Every NaN of ``a`` (a real floating-point accumulator, in place) becomes numpy's NaN. The sign and payload of
    an addition of two NaNs are those of whichever operand the CPU's instruction takes first, and numpy's SIMD loops
    order the operands differently in the body and the tail of a loop: so a NaN's bits would depend on its place."""
    if not _may_hold_nan(a):
        return
    nans = np.isnan(a)
    if nans.any():
        np.copyto(a, np.nan, where=nans)


def keep_held(out: np.ndarray, keep: np.ndarray | None, first: np.ndarray) -> None:
    """Give back, bit for bit, the elements of ``out`` every checkpoint holds the same (``_mean_chunk``'s ``keep``),
    and zero a long double's padding."""
    n = out.size * (2 if out.dtype.kind == "c" else 1)
    dst = _units(out.reshape(-1).view(np.uint8), n)
    if keep is not None:
        np.copyto(dst, _units(first, n), where=keep if dst.ndim == 1 else keep[:, None])
    zero_padding(dst)


def wide_accumulator(dtype: np.dtype, acc_real: np.dtype, weights) -> bool:
    """Whether an element every checkpoint holds, other than a NaN, averages back to itself exactly: data of 24
    significand bits or fewer summed in float64 or wider (29 bits to spare for the roundings), with weights that keep
    every product a normal float64 (none zero: inf times 0 is NaN; none below 2**-400 or above 2**400)."""
    return _real_size(dtype) <= 4 and acc_real.itemsize >= 8 and all(2.0**-400 <= w <= 2.0**400 for w in weights)


def _real_parts(a: np.ndarray) -> np.ndarray:
    """Complex numbers are averaged as pairs of reals: multiplying or dividing by a complex weight
    would turn inf into nan and lose the sign of -0.0."""
    if a.dtype.kind != "c":
        return a
    return a.view(np.dtype(a.dtype.byteorder + "f" + str(a.dtype.itemsize // 2)))


def small_enough(e0: ParamEntry, entries: list[ParamEntry], chunk: int) -> bool:
    """Whether an averaged array is one a save packs (``plan.PACK_BELOW``) and fits one chunk: averaged in batches."""
    size = math.prod(e0.shape)
    return (size <= chunk and size * e0.dtype.itemsize < PACK_BELOW and _packable(e0.dtype)
            and all(e.shape == e0.shape for e in entries))


def copied_small(newest: OpenedDir, e: ParamEntry, verify: bool) -> Lazy | None:
    """A small array of a container copied from the newest checkpoint (not floating point), as a ``Lazy`` the planner
    packs with the averaged ones (None: not one a save packs). Its bytes are read when the writer asks for them."""
    if math.prod(e.shape) * e.dtype.itemsize >= PACK_BELOW or not _packable(e.dtype):
        return None
    return Lazy(e.dtype, tuple(e.shape), functools.partial(_read_copy, newest, e, verify))


def _read_copy(d: OpenedDir, e: ParamEntry, verify: bool, index: tuple | None = None) -> np.ndarray:
    a = d.read(e, verify=verify)
    return a if index is None else a[index]


class SmallMeans:
    """The means of many small arrays of one dtype, computed batch by batch as the writer asks for them."""

    def __init__(self, dirs: list[OpenedDir], entries: list[list[ParamEntry]], weights: tuple[float, ...],
                 acc_dtype: np.dtype, chunk_elems: int, progress: Callable[[int], None] | None, verify: bool,
                 keep: int) -> None:
        """``entries[k]``: the k-th array's entry in each of ``dirs`` (newest first), every one of ``dtype``'s size at
        most ``chunk_elems`` elements; ``keep``: how many computed batches to hold at once."""
        self.dirs, self.entries, self.weights, self.verify, self.progress = dirs, entries, weights, verify, progress
        self.dtype = entries[0][0].dtype
        self.acc_dtype = acc_dtype
        self.keep = max(1, keep)
        self.sizes = [math.prod(e[0].shape) for e in entries]
        self.batch_of: list[int] = []
        self.bounds: list[tuple[int, int]] = []  # (first array, stop) of each batch
        lo, held = 0, 0
        for k, n in enumerate(self.sizes):
            if k > lo and (held + n > chunk_elems or k - lo >= BATCH_ARRAYS):
                self.bounds.append((lo, k))
                lo, held = k, 0
            held += n
            self.batch_of.append(len(self.bounds))
        self.bounds.append((lo, len(self.sizes)))
        self._lock = threading.Lock()
        self._held: OrderedDict[int, list] = OrderedDict()  # batch -> [lock, (out, element offsets) or None]

    def lazies(self) -> list[Lazy]:
        return [Lazy(self.dtype, tuple(e[0].shape), functools.partial(self._take, k)) for k, e in enumerate(self.entries)]

    def _take(self, k: int, index: tuple | None = None) -> np.ndarray:
        b = self.batch_of[k]
        with self._lock:
            slot = self._held.get(b)
            if slot is None:
                slot = self._held[b] = [threading.Lock(), None]
                while len(self._held) > self.keep:
                    self._held.popitem(last=False)
            else:
                self._held.move_to_end(b)
        with slot[0]:
            if slot[1] is None:
                slot[1] = self._compute(b)
        out, starts = slot[1]
        lo = self.bounds[b][0]
        a = out[starts[k - lo] : starts[k - lo] + self.sizes[k]].reshape(self.entries[k][0].shape)
        return a if index is None else a[index]

    def _compute(self, b: int) -> tuple[np.ndarray, list[int]]:
        lo, hi = self.bounds[b]
        dtype, acc_dtype, ws = self.dtype, self.acc_dtype, self.weights
        sizes = self.sizes[lo:hi]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        m = starts[-1]
        out = np.empty(m, dtype)
        if not m:
            return out, starts
        unit = all(w == 1.0 for w in ws)
        total = sum(ws)
        acc_real = np.dtype(acc_dtype.char.lower()) if acc_dtype.kind == "c" else acc_dtype
        wts = [acc_real.type(w) for w in ws]
        fused = dtype.kind == "f" and tag_of(dtype) is None
        acc = np.empty(m, acc_dtype)
        tmp = np.empty(m, acc_dtype) if not unit else None
        conv = np.empty(m, acc_dtype) if tag_of(dtype) is not None else None
        raw0 = np.empty(m * dtype.itemsize, np.uint8)
        raw = np.empty(m * dtype.itemsize, np.uint8) if len(self.dirs) > 1 else None
        batch = self.entries[lo:hi]

        def source(i: int):
            buf = raw0 if i == 0 else raw
            self.dirs[i].read_into([e[i] for e in batch], buf, verify=self.verify)
            yield buf.view(dtype)

        sources = [source(i) for i in range(len(self.dirs))]
        rp = _real_parts
        a = rp(acc)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf are averaged like any value
            keep, first = _mean_chunk(sources, wts, a, rp(tmp) if tmp is not None else None, unit, conv,
                                      wide_accumulator(dtype, acc_real, ws))
            if fused and total != 1.0:  # divided in the accumulator's precision, rounded once as it is stored
                np.divide(a, acc_real.type(total), out=out, dtype=acc_dtype, casting="unsafe")
            else:
                if total != 1.0:
                    np.divide(a, acc_real.type(total), out=a)
                round_into(out, acc)
        keep_held(out, keep, first)
        nbytes = m * dtype.itemsize * len(self.dirs)
        advance(nbytes)
        if self.progress is not None:
            self.progress(nbytes)
        return out, starts
