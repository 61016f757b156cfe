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
import stat
from typing import Any

import numpy as np

from ..errors import DataError, Location, RegistryError
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
        return os.path.abspath(path)

    def paths(self) -> dict[str, str]:
        """``{name: path}`` of this component's resources as declared (the arrays hold their bytes)."""
        return {n[len(PREFIX):]: n for n in self._sub.names() if n.startswith(PREFIX)}


def _read(path: str, what: str) -> np.ndarray:
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{what}: cannot read the file: {e.strerror or e}", Location(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{what}: not a regular file", Location(path))
    if st.st_size > MAX_BYTES:
        raise DataError(f"{what}: {st.st_size} bytes, more than the {MAX_BYTES} a resource may have", Location(path))
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8).copy()


def resources(owner: Any) -> Resources:
    """The resource files of a component (declare them in ``__attrs_post_init__``)."""
    return Resources(owner)
