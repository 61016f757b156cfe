"""The file objects of ``FsspecStore``: ``RemoteFile`` (ranged reads) and the streamed writers."""

from __future__ import annotations

import io
from typing import Any

__all__ = ["MemoryWriter", "RemoteFile", "Writer"]


class RemoteFile:
    """An object open for reading: ``size`` from one ``info`` (HEAD); every read is one ranged GET of exactly
    the bytes asked for (``cat_file(path, start, end)``), no read-ahead. ``fileno()`` is unsupported."""

    def __init__(self, store: Any, url: str, size: int, what: str = "file") -> None:
        self._store = store
        self._path = store._path(url)
        self._what = what
        self.name = url
        self.size = size
        self._pos = 0
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def read(self, n: int = -1) -> bytes:
        self._check()
        if n is None or n < 0 or self._pos + n > self.size:
            n = self.size - self._pos
        if n <= 0:
            return b""
        start = self._pos
        try:
            data = self._store._call("read", self.name, self._store.fs.cat_file, self._path, start=start, end=start + n)
        except FileNotFoundError:
            raise self._store._missing(self.name, self._what) from None
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        m = memoryview(b).cast("B")
        data = self.read(len(m))
        m[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self._check()
        if whence == 0:
            pos = offset
        elif whence == 1:
            pos = self._pos + offset
        elif whence == 2:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        raise io.UnsupportedOperation(f"{self.name} is remote: it has no file descriptor")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Writer(io.RawIOBase):
    """A streamed upload (``fs.open(path, 'wb')``) that publishes the object on ``close()`` and discards it
    when the ``with`` block raises. Its requests pass through the store's funnel (not retried: a part
    already buffered cannot be replayed)."""

    def __init__(self, store: Any, url: str, f: Any, *, commit: bool) -> None:
        self._store = store
        self._f = f
        self._commit = commit
        self.name = url

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("I/O operation on closed file")
        n = len(memoryview(b).cast("B"))
        self._store._call("write", self.name, self._f.write, b, retry=False)
        return n

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._store._call("write", self.name, self._close, retry=False)
        finally:
            super().close()

    def _close(self) -> None:
        self._f.close()
        if self._commit:
            self._f.commit()

    def discard(self) -> None:
        """Throw the upload away: the object never appears."""
        if self.closed:
            return
        try:
            self._f.discard()
        except Exception:
            pass
        try:
            self._f.closed = True
        except Exception:
            pass
        super().close()

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:  # never publish what was not closed on purpose
        if not self.closed:
            self.discard()


class MemoryWriter(io.RawIOBase):
    """memory:// has no streaming upload: the bytes gather here and appear at ``close()``."""

    def __init__(self, store: Any, url: str) -> None:
        self._store = store
        self._buf = io.BytesIO()
        self.name = url

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._buf.write(b)

    def tell(self) -> int:
        return self._buf.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._store.put(self.name, self._buf.getvalue())
        finally:
            self._buf = io.BytesIO()
            super().close()

    def discard(self) -> None:
        self._buf = io.BytesIO()
        super().close()

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:  # never publish what was not closed on purpose
        if not self.closed:
            self.discard()
