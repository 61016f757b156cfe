"""What a save writes, as values: arrays, streams of chunks, published files to link, bytes."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

__all__ = ["Bundle", "FromFile", "FromFiles", "Lazy", "Stream", "identity"]


@attrs.frozen
class FromFile:
    """A published file (a parameter, or one block of it): hard-linked, or copied where links fail.

    ``source`` is an opened directory (anything with ``fd``, ``path`` and ``open_file(rel)``), so
    the file linked is the one that directory held when it was opened, whatever moved since.
    """

    source: Any = attrs.field(eq=False, repr=False)
    rel: str
    dtype: np.dtype
    shape: tuple  # the block's shape
    bytes: int
    checksum: tuple[str, str]
    start: tuple | None = None  # where the block sits in the parameter (None: it is the parameter)
    format: str = "npy"
    verify: bool = False  # check the source's checksum before linking it (tools refuse to copy a corrupt file)
    key: str | None = None  # the tensor's name inside a file holding several (safetensors)


@attrs.frozen
class FromFiles:
    """A parameter stored in several published files (blocks)."""

    dtype: np.dtype
    shape: tuple
    blocks: tuple  # of FromFile, each with its start


@attrs.frozen
class Stream:
    """An ``.npy`` array produced chunk by chunk (``chunks()`` yields bytes-like pieces in memory order)."""

    dtype: np.dtype
    shape: tuple
    fortran: bool
    chunks: Any = attrs.field(eq=False)  # () -> Iterable[bytes-like]


@attrs.frozen
class Bundle:
    """Several arrays in one file (a subcollection's safetensors file): ``{key: array or Lazy}``, filled by the planner."""

    arrays: dict = attrs.field(eq=False)
    metadata: dict | None = None


@attrs.frozen
class Lazy:
    """An array made when its file is written (a device tensor copied to host memory then, one at a time).

    ``take(index)`` gives the array, or the part ``index`` (a tuple of slices) of it; ``key`` names
    the memory it comes from, so a tensor reached under two names is stored once.
    """

    dtype: np.dtype
    shape: tuple
    take: Any = attrs.field(eq=False, repr=False)  # (index: tuple | None = None) -> np.ndarray
    key: Any = None
    #: (out: np.ndarray) -> None: copy the whole array into ``out`` (an async save's host buffer); None: via take()
    into: Any = attrs.field(default=None, eq=False, repr=False)
    #: () -> np.ndarray: a host array to copy it into (pinned memory for a CUDA tensor); None: np.empty
    alloc: Any = attrs.field(default=None, eq=False, repr=False)


def identity(item: Any) -> Any:
    """What memory a payload is (None: unknown or empty): two names holding one tensor are stored once."""
    if isinstance(item, Lazy):
        return item.key
    if isinstance(item, np.ndarray) and item.size:
        base = item.base
        if base is None:  # owns its memory (the usual parameter): named by the object, no address to ask for
            return ("array", id(item), 0, item.shape, item.strides, item.dtype)
        if type(base) is np.ndarray and base.base is None:  # a view of an array that owns its memory: where in it
            at = item.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            return ("array", id(base), at, item.shape, item.strides, item.dtype)
        return ("memory", item.__array_interface__["data"][0], item.shape, item.strides, item.dtype)
    return None


def from_entry(source: Any, entry: Any, *, verify: bool = False) -> FromFile | FromFiles:
    """A published parameter (``ParamEntry`` of an opened directory) as files to link."""
    files = tuple(
        FromFile(source, b.file, entry.dtype, b.box(entry.shape)[1], b.bytes, b.checksum, b.start, b.format, verify, b.key)
        for b in entry.blocks
    )
    if len(files) == 1 and files[0].start is None:
        return files[0]
    return FromFiles(entry.dtype, entry.shape, files)
