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


def dense_text(rows: np.ndarray, precision: int) -> bytes:
    return "".join(" ".join(g(v, precision) for v in row) + "\n" for row in rows.tolist()).encode("ascii")


def sparse_text(rows: np.ndarray, precision: int, culling: float) -> bytes:
    lines = []
    for row in rows.tolist():
        lines.append("".join(f"{j}:{g(v, precision)} " for j, v in enumerate(row) if abs(v) > culling) + "\n")
    return "".join(lines).encode("ascii")


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
