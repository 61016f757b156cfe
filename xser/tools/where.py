"""Where the tools' inputs and outputs are: local paths or URLs, asked through the byte stores.

Local paths keep the answers ``os.path`` gives (so local messages stay as they were); a URL
(``s3://``, ``memory://``, any fsspec protocol) is asked through its store, with the
``storage_options`` of the public call in progress (``stores.options``).
"""

from __future__ import annotations

import os

from ..storage.stores import is_url, store_for

__all__ = ["is_dir", "is_file", "join", "same_path", "spec_text"]


def is_dir(path: str) -> bool:
    """A local directory, or a URL prefix that holds objects."""
    return store_for(path).isdir(path)


def is_file(path: str) -> bool:
    """A local file, or an object at the URL."""
    return store_for(path).is_file(path)


def join(base: str, *parts: str) -> str:
    return store_for(base).join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def same_path(a: str, b: str) -> bool:
    """Whether two paths name one file: the real paths of local ones; URLs as written (one trailing slash aside)."""
    if is_url(a) or is_url(b):
        return is_url(a) and is_url(b) and a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def spec_text(path: str) -> str:
    """The text of the spec file at ``path`` (a local file or an object), as UTF-8."""
    from ..spec import read_text

    return read_text(path)
