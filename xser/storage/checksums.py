"""Checksums: one table of algorithms, one way to hash while writing, one way to verify.

xser writes XXH3-64 (``xxhsum -H3``); readers also accept CRC-32, which other tools can write
with the standard library alone. Both release the GIL, so hashing overlaps I/O on other threads.
"""

from __future__ import annotations

import zlib
from typing import Any, BinaryIO

import xxhash

from ..errors import DataError, Location

__all__ = ["CHECKSUMS", "DEFAULT_CHECKSUM", "HashingWriter", "digest_bytes", "digest_stream", "verify"]


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


#: Checksum algorithms a manifest may name; xser writes the default.
CHECKSUMS = {"xxh3_64": xxhash.xxh3_64, "crc32": _Crc32}
DEFAULT_CHECKSUM = "xxh3_64"
_READ_CHUNK = 8 << 20


def digest_bytes(data: Any, algo: str = DEFAULT_CHECKSUM) -> str:
    h = CHECKSUMS[algo]()
    h.update(data)
    return h.hexdigest()


def digest_stream(f: BinaryIO, algo: str = DEFAULT_CHECKSUM) -> tuple[int, str]:
    """(bytes, hex digest) of what is left in an open binary file."""
    h = CHECKSUMS[algo]()
    size = 0
    while chunk := f.read(_READ_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return size, h.hexdigest()


def verify(expected: tuple[str, str], got: str, where: str) -> None:
    """Raise a ``DataError`` naming both digests when they differ."""
    if got != expected[1]:
        raise DataError(f"checksum mismatch: {expected[0]} {got} on disk, {expected[1]} in manifest", Location(where))


class HashingWriter:
    """A new file written chunk by chunk, hashed while the chunk is still in the CPU cache."""

    def __init__(self, path: str, *, hash: bool = True) -> None:
        self.path = path
        self._f = open(path, "xb")
        self._h = CHECKSUMS[DEFAULT_CHECKSUM]() if hash else None
        self.size = 0

    def write(self, chunk: Any) -> None:
        if self._h is not None:
            self._h.update(chunk)
        self._f.write(chunk)
        self.size += chunk.nbytes if hasattr(chunk, "nbytes") else len(chunk)

    def fileno(self) -> int:
        return self._f.fileno()

    def hexdigest(self) -> str:
        assert self._h is not None
        return self._h.hexdigest()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()
