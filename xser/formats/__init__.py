"""Weight formats: one reader/writer pair per format, in the table ``FORMATS``.

A format writes one array (or one block of an array) to one file and reads it back. The
manifest records each file's format, so loading never needs to be told. Packages can add
formats with ``xser.register_format`` or through the entry-point group ``xser.formats``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DataError, Location, RegistryError
from .npy import NPY, Format
from .text import DENSE_TEXT, SPARSE_TEXT

__all__ = ["FORMATS", "Format", "get_format", "register_format"]

FORMATS: dict[str, Any] = {NPY.name: NPY, DENSE_TEXT.name: DENSE_TEXT, SPARSE_TEXT.name: SPARSE_TEXT}
_ENTRY_POINTS_LOADED = False


class UserFormat:
    """A format given as two functions: ``writer(path, array)`` and ``reader(path, dtype, shape) -> array``."""

    def __init__(self, name: str, reader: Callable, writer: Callable, suffix: str) -> None:
        self.name, self.reader, self.writer, self.suffix = name, reader, writer, suffix

    def write(self, path: str, array: np.ndarray, known: Any = None) -> tuple[int, str]:
        self.writer(path, array)
        return _file_digest(path)

    def read(self, path: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        actual = os.path.getsize(path)
        if actual != size:
            raise DataError(f"file has {actual} bytes, manifest says {size} (truncated or replaced?)", Location(path))
        if verify is not None:
            got = _file_digest(path, verify[0])[1]
            if got != verify[1]:
                raise DataError(f"checksum mismatch: {verify[0]} {got} on disk, {verify[1]} in manifest", Location(path))
        try:
            out = np.asarray(self.reader(path, dtype, tuple(shape)))
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"format {self.name!r} could not read the file: {type(e).__name__}: {e}", Location(path)) from e
        if out.shape != tuple(shape) or out.dtype != dtype:
            raise DataError(
                f"format {self.name!r} read {out.dtype} {tuple(out.shape)}, the manifest says {dtype} {tuple(shape)}", Location(path)
            )
        return out

    def read_rows(self, path: str, dtype: np.dtype, shape: tuple, size: int, rows: tuple[int, int], *, verify: Any) -> np.ndarray:
        return self.read(path, dtype, shape, size, mmap=False, verify=verify)[rows[0] : rows[1]]


def _file_digest(path: str, algo: str | None = None) -> tuple[int, str]:
    from .npy import CHECKSUMS, DEFAULT_CHECKSUM

    h = CHECKSUMS[algo or DEFAULT_CHECKSUM]()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def register_format(name: str, reader: Callable, writer: Callable, *, suffix: str = ".bin") -> None:
    """Add a weight format: ``writer(path, array)`` writes a new file, ``reader(path, dtype, shape)`` reads it.

    xser computes sizes and checksums itself and checks what the reader returns against the
    manifest. A name already taken by a different format is a ``RegistryError``.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise RegistryError(f"format name must be a non-empty string without '/', got {name!r}")
    old = FORMATS.get(name)
    if old is not None and not (isinstance(old, UserFormat) and old.reader is reader and old.writer is writer):
        raise RegistryError(f"format {name!r} is already registered")
    FORMATS[name] = UserFormat(name, reader, writer, suffix)


def _load_entry_points() -> None:
    """Formats that installed packages declare in the entry-point group ``xser.formats``.

    Each entry point names an object with ``reader`` and ``writer`` (and optionally ``suffix``).
    """
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="xser.formats"):
        if ep.name in FORMATS:
            continue
        try:
            obj = ep.load()
            register_format(ep.name, obj.reader, obj.writer, suffix=getattr(obj, "suffix", ".bin"))
        except Exception as e:  # a broken plugin must not break loading of other formats
            FORMATS.pop(ep.name, None)
            raise RegistryError(f"format entry point {ep.name!r} ({ep.value}) failed to load: {e}") from e


_EXTERNAL_LOADED = False


def _load_external() -> None:
    """DyNet text and Angel's formats join the table on first use (they import the interop code)."""
    global _EXTERNAL_LOADED
    if not _EXTERNAL_LOADED:
        _EXTERNAL_LOADED = True
        from .external import EXTERNAL

        for name, fmt in EXTERNAL().items():
            FORMATS.setdefault(name, fmt)


def get_format(name: str) -> Any:
    """The format called ``name`` (entry points are looked at once, when a name is unknown)."""
    if name not in FORMATS:
        _load_external()
    if name not in FORMATS:
        _load_entry_points()
    return FORMATS.get(name)
