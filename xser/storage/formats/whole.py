"""Row ranges and streamed chunks for formats whose files are decoded whole (text records, user readers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

__all__ = ["DecodedWhole"]


class DecodedWhole:
    """Mixin: ``read_rows`` and ``chunks`` from ``read`` (the whole file is decoded, then cut)."""

    def read_rows(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: Any) -> np.ndarray:
        return self.read(f, where, dtype, shape, size, mmap=False, verify=verify)[rows[0] : rows[1]]

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, verify: Any = None) -> Iterator[np.ndarray]:
        flat = self.read(f, where, dtype, shape, size, mmap=False, verify=verify).reshape(-1)
        for start in range(0, flat.size, max(1, elements)):
            yield flat[start : start + elements]
