"""The records a parsed manifest is made of: ``Block``, ``ParamEntry``, ``Manifest`` (``manifest.py`` parses and checks).

Immutable records (``errors.Frozen``: equality, hash, repr, no assignment), written out rather than made by attrs
so that a reader of a few arrays never imports attrs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import Frozen

__all__ = ["Block", "Manifest", "ParamEntry"]


class Block(Frozen):
    """One file holding a parameter, or the box ``start``..``start + shape`` of it."""

    __slots__ = ("file", "format", "bytes", "checksum", "start", "shape", "key", "offset", "length")
    file: str
    format: str
    bytes: int
    checksum: tuple[str, str]  # (algorithm, hex digest)
    start: tuple[int, ...] | None  # None: the block is the whole parameter
    shape: tuple[int, ...] | None
    key: str | None  # the tensor's name in a file that holds several (safetensors)
    offset: int | None  # where the tensor's bytes start in that file (packed containers)
    length: int | None  # how many bytes they are

    def __init__(self, file: str, format: str, bytes: int, checksum: tuple[str, str], start: tuple[int, ...] | None = None,
                 shape: tuple[int, ...] | None = None, key: str | None = None, offset: int | None = None,
                 length: int | None = None) -> None:
        set_ = object.__setattr__
        set_(self, "file", file)
        set_(self, "format", format)
        set_(self, "bytes", bytes)
        set_(self, "checksum", checksum)
        set_(self, "start", start)
        set_(self, "shape", shape)
        set_(self, "key", key)
        set_(self, "offset", offset)
        set_(self, "length", length)

    def box(self, full: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.start, self.shape) if self.start is not None else ((0,) * len(full), full)


class ParamEntry(Frozen):
    __slots__ = ("subcol", "name", "dtype", "shape", "trainable", "blocks", "attrs")
    _not_compared = ("attrs",)
    subcol: str
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    trainable: bool
    blocks: tuple[Block, ...]
    attrs: dict  # what a foreign format needs of this array (DyNet's lookup flag, ...)

    def __init__(self, subcol: str, name: str, dtype: np.dtype, shape: tuple[int, ...], trainable: bool,
                 blocks: tuple[Block, ...], attrs: dict | None = None) -> None:
        set_ = object.__setattr__
        set_(self, "subcol", subcol)
        set_(self, "name", name)
        set_(self, "dtype", dtype)
        set_(self, "shape", shape)
        set_(self, "trainable", trainable)
        set_(self, "blocks", blocks)
        set_(self, "attrs", {} if attrs is None else attrs)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def whole(self) -> bool:
        """Stored as one file holding the whole parameter."""
        return len(self.blocks) == 1 and self.blocks[0].start is None


class Manifest(Frozen):
    """A parsed, checked manifest."""

    __slots__ = ("version", "meta", "entries", "spec", "state", "state_entries", "ranks")
    version: int
    meta: dict  # every top-level field except "subcollections" (step, metrics, training, custom, ...)
    entries: dict  # {subcollection: {param: ParamEntry}}
    spec: Block | None  # the checkpoint's own spec file (format_version >= 2)
    state: Any  # the training-state tree with {"$array": key} markers, or None
    state_entries: dict  # {key: ParamEntry}
    #: a checkpoint saved by several ranks: each rank's (training dict, training-state tree or None, {key: ParamEntry})
    ranks: tuple

    def __init__(self, version: int, meta: dict, entries: dict, spec: Block | None = None, state: Any = None,
                 state_entries: dict | None = None, ranks: tuple = ()) -> None:
        set_ = object.__setattr__
        for name, value in (("version", version), ("meta", meta), ("entries", entries), ("spec", spec), ("state", state),
                            ("state_entries", {} if state_entries is None else state_entries), ("ranks", ranks)):
            set_(self, name, value)

    @property
    def id(self) -> str | None:
        return self.meta.get("id")

    @property
    def model(self) -> str | None:
        return self.meta.get("model")
