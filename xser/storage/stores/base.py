"""The byte-store interface: the few verbs every read and write of xser goes through.

A store is chosen by the path (``stores.store_for``): ``LocalStore`` for paths on this machine,
``FsspecStore`` for URLs (``s3://``, ``gs://``, ``hdfs://``, ``memory://``, ``file://``, any fsspec
protocol). Paths are given whole (the URL or the local path the user wrote), so every error names
what the user wrote. Above the stores sit the codecs (``formats/``), the manifest and the two commit
protocols: directories renamed into slots on a local disk (``disk/``), commit records on an
object store (``objects/``).

Shaped after PyTorch DCP's ``FileSystemBase`` (one writer over a local and an fsspec filesystem) and
fsspec's ``AbstractFileSystem`` (``cat_file`` with ranges, ``pipe_file`` with ``mode="create"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO, Protocol, runtime_checkable

__all__ = ["ReadFile", "Store"]


@runtime_checkable
class ReadFile(Protocol):
    """A file open for reading: ``read``/``readinto``/``seek``/``tell``/``close``, and its ``size`` in bytes.

    A local file also has ``fileno()`` (so it can be mapped); a remote one raises
    ``io.UnsupportedOperation`` there, and every read is a ranged GET of the bytes asked for."""

    name: str
    size: int

    def read(self, n: int = -1) -> bytes: ...

    def readinto(self, b: Any) -> int: ...

    def seek(self, offset: int, whence: int = 0) -> int: ...

    def tell(self) -> int: ...

    def close(self) -> None: ...

    def fileno(self) -> int: ...


class Store(Protocol):
    """Where bytes live. Every verb takes whole paths (a local path, or a URL of this store's scheme).

    Errors: a missing object is ``DataError("<what> not found")`` from the readers; a failure of the
    store itself (network, permission, missing bucket, credentials) is ``StorageError`` naming the
    operation and the path. ``put(..., create_only=True)`` raises ``AlreadyExists`` when the object
    exists: atomically where ``conditional`` is True (local disk: ``O_EXCL``/link; S3: ``If-None-Match``;
    memory), as check-then-write elsewhere (documented in docs/format.md)."""

    scheme: str  # "" for local paths, else the URL scheme ("s3", "memory", ...)
    conditional: bool  # put(create_only=True) is atomic against other writers
    remote: bool  # an object store (no rename, no directories, no locks): the commit-record protocol applies

    # -- names
    def join(self, base: str, *parts: str) -> str: ...

    def parent(self, path: str) -> str: ...

    def basename(self, path: str) -> str: ...

    # -- reading
    def open_read(self, path: str, what: str, *, size: int | None = None, head: int = 0,
                  missing: Callable[[], BaseException] | None = None) -> ReadFile:
        """``path`` open for reading. ``size``: the caller knows it (a manifest's; a remote store then makes no request
        to open, and an object of another size is a ``DataError`` at the read that reaches its end); ``head``: the first
        small read from the start fetches this many bytes and keeps them (remote; ``RemoteFile``); ``missing()`` makes
        the error for a missing file."""

    def read_bytes(self, path: str, what: str, *, limit: int | None = None) -> bytes: ...

    def read_range(self, path: str, start: int, end: int) -> bytes: ...

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...

    def size(self, path: str) -> int | None: ...

    def exists(self, path: str) -> bool: ...

    def isdir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def list(self, prefix: str) -> dict[str, int]: ...

    def listdir(self, path: str) -> list[str]: ...

    # -- writing (new objects only: a published object is never modified)
    def put(self, path: str, data: bytes, *, create_only: bool = False, durable: bool = True) -> None: ...

    def put_file(self, local: str, path: str) -> None: ...

    def open_write(self, path: str) -> BinaryIO: ...

    def copy(self, src: str, dst: str) -> None: ...

    def delete(self, paths: Iterable[str]) -> None: ...

    def delete_prefix(self, prefix: str) -> None: ...

    def local_path(self, path: str) -> str | None: ...
