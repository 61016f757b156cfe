"""Row ranges and streamed chunks for formats whose files are decoded whole (text records, user readers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location
from ..fsutil import file_size
from ..checksums import digest_stream
from ..checksums import verify as check_digest

__all__ = ["DecodedWhole", "check_file"]


class DecodedWhole:
    """Mixin: ``read_rows`` and ``chunks`` from ``read`` (the whole file is decoded, then cut)."""

    def read_rows(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: Any) -> np.ndarray:
        return self.read(f, where, dtype, shape, size, mmap=False, verify=verify)[rows[0] : rows[1]]

    def chunks(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, elements: int, verify: Any = None) -> Iterator[np.ndarray]:
        flat = self.read(f, where, dtype, shape, size, mmap=False, verify=verify).reshape(-1)
        for start in range(0, flat.size, max(1, elements)):
            yield flat[start : start + elements]


def check_file(f: BinaryIO, where: str, size: int, verify: Any) -> None:
    """The open file has the manifest's size and (``verify``: an (algorithm, digest) pair) its checksum."""
    actual = file_size(f)
    if actual != size:
        raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(where))
    if verify is not None:
        f.seek(0)
        check_digest(verify, digest_stream(f, verify[0])[1], where)
