"""Files a component needs (a tokenizer model, a vocabulary), stored with its parameters.

``xser.resources(self).add(path)`` in ``__attrs_post_init__`` declares one: when the component is
built from a config, the file is read then and saved into the component's subcollection as
``resource.<name>`` (its bytes verbatim, format ``raw``, with a checksum; hard-linked from the
previous checkpoint when unchanged), and ``add`` returns the path given. When the component is
loaded, ``add`` returns the path of the saved copy inside the checkpoint, so a model directory is
complete on its own: XNMT's DyNet backend never copied such files, which broke reloads elsewhere.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import DataError, Location, RegistryError
from ..storage.source import open_source
from ..storage.stores import is_url, store_for
from .names import NAME_RE
from .params import params

__all__ = ["Resources", "resources"]

PREFIX = "resource."
MAX_BYTES = 1 << 30  # a resource is read into memory when the component is built


class Resources:
    """The resource files of one component (``xser.resources(obj)``)."""

    def __init__(self, owner: Any) -> None:
        self._sub = params(owner)

    def add(self, path: str | os.PathLike, *, name: str | None = None) -> str:
        """Declare the file at ``path`` (saved as ``resource.<name>``, name defaulting to its base name); returns the path
        to use: ``path`` itself when built from a config, the checkpoint's copy when loaded."""
        path = os.fspath(path)
        name = name if name is not None else os.path.basename(path)
        pname = PREFIX + name
        if not isinstance(name, str) or not NAME_RE.fullmatch(pname):
            raise RegistryError(f"{self._sub.name}: resource name {name!r} must be a file name of letters, digits, '_', '.', '-'")
        source = self._sub._source
        entry = source.entry(pname) if source is not None and hasattr(source, "entry") else None
        if source is not None and getattr(source, "stored", None) is not None and entry is not None:
            self._sub.add(pname, entry.shape, dtype="uint8", trainable=False, format="raw")
            return source.file_of(pname)
        data = _read(path, f"{self._sub.name}: resource {name!r}")
        if source is not None and getattr(source, "stored", None) is not None:  # loading, and the checkpoint lacks it
            if not source.keep_missing([pname]):
                raise DataError(f"resource {name!r} is not in the checkpoint (added to the class since the save?); "
                                'load(..., missing="init") reads it from the path given', source.location())
        self._sub._source, keep = None, self._sub._source  # the bytes come from the file, not from the checkpoint
        try:
            self._sub.add(pname, (data.size,), dtype="uint8", trainable=False, format="raw", init=data)
        finally:
            self._sub._source = keep
        return path if is_url(path) else os.path.abspath(path)

    def paths(self) -> dict[str, str]:
        """``{name: path}`` of this component's resources as declared (the arrays hold their bytes)."""
        return {n[len(PREFIX):]: n for n in self._sub.names() if n.startswith(PREFIX)}


def _read(path: str, what: str) -> np.ndarray:
    """The file's bytes, through the store its path names (a local file, or a URL: ``s3://``, ``memory://``, ...)."""
    store = store_for(path)
    try:
        with open_source(store, path, "the file", missing=f"{what}: cannot read the file: No such file or directory",
                         special=f"{what}: not a regular file") as f:
            size = f.size
            if size > MAX_BYTES:
                raise DataError(f"{what}: {size} bytes, more than the {MAX_BYTES} a resource may have", Location(path))
            out = np.empty(size, np.uint8)
            got = 0
            while got < size:
                n = f.readinto(memoryview(out)[got:])
                if not n:
                    raise DataError(f"{what}: the file ended after {got} of its {size} bytes (changed while read?)", Location(path))
                got += n
            return out
    except DataError as e:
        if e.message.startswith(what):
            raise
        raise DataError(f"{what}: {e.message}", e.location) from None


def resources(owner: Any) -> Resources:
    """The resource files of a component (declare them in ``__attrs_post_init__``)."""
    return Resources(owner)
