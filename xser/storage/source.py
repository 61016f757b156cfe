"""Reading other systems' files (the importers' sources) through a byte store.

Every file an importer reads is opened here, on the store its path names (``stores.store_for``): a
local path gets ``LocalStore`` (special files refused, never waited for), a URL an fsspec store whose
reads are ranged GETs. The importers' own messages for a missing file or a special one are kept: the
store's generic "not found" becomes the message the importer gives (``missing``), a local FIFO or
device the importer's wording (``special``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import DataError, Location
from .stores import ReadFile, Store

__all__ = ["open_source", "read_source"]

#: how LocalStore (``fsutil.open_regular``) words the refusal of a FIFO, socket, device or directory
_SPECIAL = " is not a regular file ("


@contextlib.contextmanager
def open_source(store: Store, path: str, what: str, *, missing: str | None = None, special: str | None = None) -> Iterator[ReadFile]:
    """``store.open_read(path, what)``, closed after the block. A file that is not there raises ``DataError(missing)``
    when ``missing`` is given (else the store's "<what> not found"); one that is not a regular file (a local FIFO,
    device, directory) raises ``DataError(special)`` when ``special`` is given (else the store's refusal)."""
    try:
        f = store.open_read(path, what)
    except DataError as e:
        if missing is not None and store.size(path) is None and not store.isdir(path):
            raise DataError(missing, Location(path)) from None
        if special is not None and e.message.startswith(what + _SPECIAL):
            raise DataError(special, Location(path)) from None
        raise
    try:
        yield f
    finally:
        f.close()


def read_source(store: Store, path: str, what: str, *, limit: int | None = None, limit_message: Any = None,
                missing: str | None = None) -> bytes:
    """The whole file (``open_source``). A file larger than ``limit`` bytes is refused before it is read, with
    ``limit_message(size)`` when given, else the store's wording."""
    if limit is None or limit_message is None:
        if missing is None:
            return store.read_bytes(path, what, limit=limit)
    with open_source(store, path, what, missing=missing) as f:
        if limit is not None and f.size > limit:
            if limit_message is not None:
                raise DataError(limit_message(f.size), Location(path))
            raise DataError(f"{what} is larger than {limit} bytes", Location(path))
        return f.read(f.size)
