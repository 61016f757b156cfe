"""Row ranges and streamed chunks for formats whose files are decoded whole (text records, user readers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location
from ..fsutil import file_size
from ..checksums import digest_bytes, digest_stream
from ..checksums import verify as check_digest

__all__ = ["DecodedWhole", "check_file", "load_checked", "load_checked_array"]


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


def load_checked(f: BinaryIO, where: str, size: int, verify: Any) -> bytes:
    """A whole open file, after checking its size against the manifest (and its checksum if asked)."""
    actual = file_size(f)
    if actual != size:
        raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(where))
    f.seek(0)
    data = f.read()
    if verify is not None:
        check_digest(verify, digest_bytes(data, verify[0]), where)
    return data


def load_checked_array(f: BinaryIO, where: str, size: int, verify: Any) -> np.ndarray:
    """``load_checked`` into a writable uint8 array (read straight into it)."""
    actual = file_size(f)
    if actual != size:
        raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(where))
    f.seek(0)
    out = np.empty(size, np.uint8)
    view, got = memoryview(out), 0
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            raise DataError(f"file ends after {got} of its {size} bytes (truncated while read?)", Location(where))
        got += n
    if verify is not None:
        check_digest(verify, digest_bytes(out, verify[0]), where)
    return out
