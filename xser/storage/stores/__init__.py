"""Byte stores, the bottom of the storage layer: ``store_for(path)`` picks one by the path.

A local path (anything that is not a URL) gets ``LocalStore``; a URL (``scheme://...``) gets an
``FsspecStore`` over the fsspec filesystem of its scheme, built with ``storage_options``. fsspec and
its backends are an optional extra (``pip install 'xser[remote]'``) imported only here, on the first
URL: ``import xser`` never imports them. A URL whose scheme is unknown, or whose package is missing,
is an ``XserError`` that names what to install: nothing is ever written to a local folder named after
the scheme. Imports only ``xser.errors`` and the storage modules (fsspec lazily, for URLs).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..gcpause import paused
from .base import ReadFile, Store
from .local import LOCAL, LocalStore

__all__ = ["LOCAL", "LocalStore", "ReadFile", "Store", "beside", "is_url", "options", "parent_of", "store_for"]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` (``s3://b/k``, ``memory://x``, ``file:///tmp/x``); False for local paths."""
    return isinstance(path, str) and _URL.match(path) is not None


def parent_of(path: str) -> str:
    """The folder that holds ``path``: ``s3://b/run`` for ``s3://b/run/m.yaml``; an absolute local directory otherwise."""
    if is_url(path):
        head, _, _ = path.rstrip("/").rpartition("/")
        return head + "/" if head.endswith(":/") else head  # the root of a bucket-less store: "memory://"
    return os.path.dirname(os.path.abspath(path))


def beside(path: str, rel: str) -> str:
    """``rel`` (a relative name, ``/``-separated) in the folder of ``path``; a URL or absolute ``rel`` as it is."""
    if is_url(rel) or os.path.isabs(rel):
        return rel
    if is_url(path):
        base = parent_of(path)
        parts = "/".join(p for p in rel.split("/") if p not in ("", "."))
        return base + parts if base.endswith("/") else f"{base}/{parts}"
    return os.path.join(parent_of(path), rel)


#: the ``storage_options`` of the public call in progress (``options``): every store that call opens for a URL uses
#: them, down to the reads on the I/O threads (which get the store, not the options)
_OPTIONS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("xser_storage_options", default=None)


@contextlib.contextmanager
def options(storage_options: Mapping[str, Any] | None, *, collect: bool = True) -> Iterator[None]:
    """The ``storage_options`` a public function was given, for every URL it opens while the block runs.
    ``collect=False``: the cyclic garbage collector is paused meanwhile (``gcpause``: saves and loads)."""
    if not collect:
        with paused(), options(storage_options):
            yield
        return
    if storage_options is not None and not isinstance(storage_options, Mapping):
        from ...errors import StorageError

        raise StorageError(f"storage_options must be a mapping of option names to values, got {type(storage_options).__name__}")
    token = _OPTIONS.set(dict(storage_options) if storage_options is not None else _OPTIONS.get())
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def store_for(path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Store:
    """The store that holds ``path``: ``LOCAL`` for local paths, an ``FsspecStore`` for URLs (with
    ``storage_options``, else those of the public call in progress)."""
    if not isinstance(path, str):
        path = os.fspath(path)
    if not is_url(path):
        if storage_options:
            from ...errors import Location, StorageError

            raise StorageError("storage_options apply to URLs (s3://, gs://, ...), not to a local path", Location(path))
        return LOCAL
    from .remote import fsspec_store

    return fsspec_store(path, dict(storage_options if storage_options is not None else (_OPTIONS.get() or {})))
