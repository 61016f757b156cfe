"""The ``raw`` format: a 1-D uint8 array written as its bytes, nothing else. Resource files
(a tokenizer model, a vocabulary) are stored this way, so the stored file is the file itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location
from ..checksums import digest_bytes
from .whole import check_file

__all__ = ["RAW"]


class RawFormat:
    name = "raw"
    suffix = ""
    exact = True  # the bytes are the array

    def digest(self, array: np.ndarray) -> tuple[int, str]:
        """(size, xxh3_64) of the file this array becomes: for linking an unchanged file from the previous checkpoint."""
        data = np.ascontiguousarray(array).data
        return array.nbytes, digest_bytes(data)

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        if options:
            raise DataError(f"format 'raw' takes no options, got {sorted(options)}", Location(path))
        if array.dtype != np.uint8 or array.ndim != 1:
            raise DataError(f"format 'raw' stores 1-D uint8 arrays (a file's bytes), got {array.dtype} {array.shape}", Location(path))
        data = np.ascontiguousarray(array).tobytes()
        with open(path, "xb") as f:
            f.write(data)
        return len(data), known[1] if known is not None else digest_bytes(data)

    def _check(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, verify: Any) -> None:
        if np.dtype(dtype) != np.uint8 or len(shape) != 1 or shape[0] != size:
            raise DataError(f"format 'raw' holds a file's bytes, the manifest says {dtype} {tuple(shape)} in {size} bytes", Location(where))
        check_file(f, where, size, verify)

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        self._check(f, where, dtype, shape, size, verify)
        f.seek(0)
        return np.frombuffer(f.read(size), np.uint8).copy() if size else np.empty(0, np.uint8)

    def read_rows(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: Any) -> np.ndarray:
        return self.read(f, where, dtype, shape, size, mmap=False, verify=verify)[rows[0] : rows[1]]

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, verify: Any = None) -> Iterator[np.ndarray]:
        self._check(f, where, dtype, shape, size, verify)
        f.seek(0)
        while True:
            piece = f.read(max(1, elements))
            if not piece:
                return
            yield np.frombuffer(piece, np.uint8)


RAW = RawFormat()
