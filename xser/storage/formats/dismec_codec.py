"""DiSMEC++'s weight files as bytes: DenseTXT and SparseTXT text (``%.{P}g``, as C++ ``ostream`` writes a float
after ``precision(P)``), DenseNPY (DiSMEC++'s own ``.npy`` header), and ``save_model``'s file naming. Layouts in
``docs/research/formats.md`` section 1; used by ``interop.dismec``."""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["dense_text", "dismec_npy", "g", "lost_values", "save_model_files", "sparse_text"]


def g(x: float, precision: int) -> str:
    """C++ ``ostream << float`` with ``precision(P)``: printf ``%.{P}g``."""
    return format(float(x), f".{precision}g")


#: values per batch of ``%`` formatting (one format string for many values)
BATCH_VALUES = 1 << 16


def dense_text(rows: np.ndarray, precision: int) -> bytes:
    """Rows of ``%.{P}g`` values separated by spaces, a newline after each: one ``%`` over a format string of a
    batch of rows (Python's ``%`` and ``format`` print a float alike), several times faster than value by value."""
    r, c = rows.shape
    if not c:
        return b"\n" * r
    line = " ".join([f"%.{precision}g"] * c) + "\n"
    step = max(1, BATCH_VALUES // c)
    out = []
    for start in range(0, r, step):
        part = rows[start : start + step]
        out.append(((line * part.shape[0]) % tuple(part.astype(np.float64).ravel().tolist())).encode("ascii"))
    return b"".join(out)


def sparse_text(rows: np.ndarray, precision: int, culling: float) -> bytes:
    """``j:%.{P}g `` for each value whose magnitude exceeds ``culling``, a newline after each row; batched like
    ``dense_text`` (column and value of each kept entry side by side in one tuple)."""
    r, c = rows.shape
    token = f"%d:%.{precision}g "
    out = []
    step = max(1, BATCH_VALUES // max(1, c))
    for start in range(0, r, step):
        part = np.asarray(rows[start : start + step], np.float64)
        with np.errstate(invalid="ignore"):
            keep = np.abs(part) > culling
        counts = np.count_nonzero(keep, axis=1).tolist()
        ri, ci = np.nonzero(keep)
        pairs = np.empty((ci.size, 2))
        pairs[:, 0] = ci
        pairs[:, 1] = part[ri, ci]
        fmt = "".join(token * n + "\n" for n in counts)
        out.append((fmt % tuple(pairs.ravel().tolist())).encode("ascii"))
    return b"".join(out)


def dismec_npy(rows: np.ndarray) -> bytes:
    """DiSMEC++'s own .npy: version 3.0, double-quoted keys, 1 to 64 spaces of padding."""
    d = '{"descr": "<f4", "fortran_order": False, "shape": (%d, %d)}' % rows.shape
    pad = 64 - (13 + len(d)) % 64
    header = (d + " " * pad + "\n").encode("latin-1")
    return b"\x93NUMPY\x03\x00" + struct.pack("<I", len(header)) + header + rows.astype("<f4").tobytes()


def save_model_files(base: str, labels: int, split_files: int) -> list[tuple[int, int, str]]:
    """``(first, count, file name)`` of the weight files DiSMEC++'s ``io::model::save_model`` writes (model-io.cpp):
    with fewer labels than ``split_files``, one file ``<base>.weights``; otherwise ``N = std::round(labels /
    (double) split_files)`` files named ``<base>.weights-K-of-N`` (K from 1; so ``-1-of-1`` when N is 1), file K
    holding labels ``[(K-1) split, K split)`` and the last one the rest."""
    if labels < split_files:
        return [(0, labels, f"{base}.weights")]
    x = labels / split_files  # a double, as in C++; std::round: halves away from zero
    n = int(x) + (x - int(x) >= 0.5)
    out = []
    for sub in range(n):
        first = sub * split_files
        end = min(labels if sub == n - 1 else (sub + 1) * split_files, labels)
        out.append((first, end - first, f"{base}.weights-{sub + 1}-of-{n}"))
    return out


def lost_values(rows: np.ndarray, precision: int, written: np.ndarray) -> tuple[int, int, int, str] | None:
    """How many of the ``written`` float32 values ``%.{precision}g`` changes, and the first one (row, column, its
    text); None if none."""
    at = np.argwhere(written)
    texts = [g(v, precision) for v in rows[written].tolist()]
    back = np.array(texts, dtype=np.float64).astype(np.float32) if texts else np.empty(0, np.float32)
    changed = np.flatnonzero(back != rows[written])
    if not changed.size:
        return None
    i = int(changed[0])
    return int(changed.size), int(at[i][0]), int(at[i][1]), texts[i]
