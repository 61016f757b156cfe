"""Names and shapes a component may declare (shared by parameters and hash tables)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import RegistryError

__all__ = ["NAME_RE", "_shape"]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,99}")


def _shape(shape: Any, where: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise RegistryError(f"{where}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in out) or any(isinstance(s, bool) for s in shape):
        raise RegistryError(f"{where}: shape must be a tuple of non-negative ints, got {shape!r}")
    return out


def _held_rows(rows: Any, shape: tuple[int, ...], where: str) -> tuple[int, int]:
    """``add(..., rows=(start, stop))`` checked against the declared shape."""
    ok = isinstance(rows, (tuple, list)) and len(rows) == 2 and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in rows)
    if not ok or not shape or not 0 <= int(rows[0]) <= int(rows[1]) <= shape[0]:
        n = shape[0] if shape else "no"
        raise RegistryError(f"{where}: rows must be (start, stop) with 0 <= start <= stop <= {n} (the declared rows), got {rows!r}")
    return int(rows[0]), int(rows[1])
