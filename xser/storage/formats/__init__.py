"""Weight formats: one reader/writer pair per format, in the table ``FORMATS``.

Every format reads from an open file (``read``, ``read_rows`` and ``chunks``, a streamed reader
of consecutive elements for tools such as averaging), so tools never parse a format themselves.
Part of the storage layer: imports only ``xser.errors`` and the storage modules beside it.

A format writes one array (or one block of an array) to one file and reads it back. The
manifest records each file's format, so loading never needs to be told. Packages can add
formats with ``xser.register_format`` or through the entry-point group ``xser.formats``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from ...errors import DataError, Location, RegistryError
from ..checksums import DEFAULT_CHECKSUM, digest_stream
from .npy import NPY, Format
from .raw import RAW
from .safetensors import SAFETENSORS
from .whole import DecodedWhole, check_file

__all__ = ["DEFAULT_CHECKSUM", "FORMATS", "Format", "get_format", "register_format"]



class _Table(dict):
    """The format table; the text formats join it on first use (``FORMATS["dense-text"]`` or ``get_format``), so a
    reader of npy and safetensors files never imports the text codecs."""

    def __missing__(self, name: str) -> Any:
        _load_text()
        if name in self:
            return self[name]
        raise KeyError(name)


FORMATS: dict[str, Any] = _Table({NPY.name: NPY, SAFETENSORS.name: SAFETENSORS, RAW.name: RAW})
_TEXT_LOADED = False


def _load_text() -> None:
    global _TEXT_LOADED
    if not _TEXT_LOADED:
        _TEXT_LOADED = True
        from .text import DENSE_TEXT, SPARSE_TEXT

        for fmt in (DENSE_TEXT, SPARSE_TEXT):
            FORMATS.setdefault(fmt.name, fmt)
_ENTRY_POINTS_LOADED = False


def _fd_path(f: BinaryIO, where: str) -> str:
    """A name that opens this very file (Linux: /proc/self/fd/N), for readers that want a path."""
    proc = f"/proc/self/fd/{f.fileno()}"
    return proc if os.path.exists(proc) else where


class UserFormat(DecodedWhole):
    """A format given as two functions: ``writer(path, array)`` and ``reader(path, dtype, shape) -> array``.

    The reader is handed a path that names the already opened file (``/proc/self/fd/N`` on
    Linux), so it reads the checkpoint the loader opened even while a saver renames directories.
    """

    def __init__(self, name: str, reader: Callable, writer: Callable, suffix: str) -> None:
        self.name, self.reader, self.writer, self.suffix = name, reader, writer, suffix

    def write(self, path: str, array: np.ndarray, known: Any = None, **options: Any) -> tuple[int, str]:
        if options:
            raise DataError(f"format {self.name!r} takes no options, got {sorted(options)}", Location(path))
        self.writer(path, array)
        with open(path, "rb") as f:
            return digest_stream(f)

    def read(self, f: BinaryIO, where: str, dtype: np.dtype, shape: tuple, size: int, *, mmap: bool, verify: Any) -> np.ndarray:
        check_file(f, where, size, verify)
        try:
            out = np.asarray(self.reader(_fd_path(f, where), dtype, tuple(shape)))
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"format {self.name!r} could not read the file: {type(e).__name__}: {e}", Location(where)) from e
        if out.shape != tuple(shape) or out.dtype != dtype:
            raise DataError(
                f"format {self.name!r} read {out.dtype} {tuple(out.shape)}, the manifest says {dtype} {tuple(shape)}", Location(where)
            )
        return out


def register_format(name: str, reader: Callable, writer: Callable, *, suffix: str = ".bin") -> None:
    """Add a weight format: ``writer(path, array)`` writes a new file, ``reader(path, dtype, shape)`` reads it.

    xser computes sizes and checksums itself and checks what the reader returns against the
    manifest. A name already taken by a different format is a ``RegistryError``.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise RegistryError(f"format name must be a non-empty string without '/', got {name!r}")
    _load_text()
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
        _load_text()
    if name not in FORMATS:
        _load_external()
    if name not in FORMATS:
        _load_entry_points()
    return FORMATS.get(name)
