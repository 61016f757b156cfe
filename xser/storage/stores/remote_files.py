"""The file objects of ``FsspecStore``: ``RemoteFile`` (ranged reads) and the streamed writers."""

from __future__ import annotations

import abc
import io
from collections.abc import Callable
from typing import Any

from ...errors import DataError, Location

__all__ = ["MemoryWriter", "RemoteFile", "Writer", "read_limited"]


def read_limited(store: Any, url: str, what: str, limit: int) -> bytes:
    """``store.read_bytes(url, what, limit=limit)``: one GET of at most ``limit`` + 1 bytes; a HEAD only to say why
    that failed (missing, not a file, larger than ``limit``)."""
    try:
        data = store._call("read", url, store.fs.cat_file, store._path(url), start=0, end=limit + 1)
        if len(data) <= limit:
            return data
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        pass
    try:
        info = store._info(url, "read")
    except FileNotFoundError:
        raise store._missing(url, what) from None
    if info.get("type") == "directory":
        raise DataError(f"{what} is not a file", Location(url))
    if int(info.get("size") or 0) > limit:
        raise DataError(f"{what} is larger than {limit} bytes", Location(url))
    try:  # replaced between the two requests: read what is there now, never more than the limit + 1
        data = store._call("read", url, store.fs.cat_file, store._path(url), start=0, end=limit + 1)
    except (FileNotFoundError, IsADirectoryError):
        raise store._missing(url, what) from None
    if len(data) > limit:
        raise DataError(f"{what} is larger than {limit} bytes", Location(url))
    return data


class RemoteFile:
    """An object open for reading: every read is one ranged GET of exactly the bytes asked for
    (``cat_file(path, start, end)``), no read-ahead, unless ``head`` says otherwise. ``fileno()`` is unsupported.

    ``size``: from one ``info`` (HEAD) when the store opened the object without a known size, else the size the
    caller knows (a checkpoint's manifest): no request to open, and every read that reaches the end asks for one
    byte more, so that an object of another size is a ``DataError`` ("file has N bytes, manifest says M") on the
    first read that can tell, instead of a short read.
    ``head``: the first read from offset 0 fetches at least this many bytes (up to the size) and keeps them; reads
    inside them are served from memory. Readers of a whole file pass its size (one GET for the file), readers of a
    few rows a few KiB (the format's header and the rows then cost two GETs and no more than the header's bytes).
    ``missing``: makes the error for an object that is gone (a checkpoint removed while read), else ``DataError``.
    ``pread(n, offset)`` reads without the shared position (threads read one container at once).
    """

    def __init__(self, store: Any, url: str, size: int, what: str = "file", *, known: bool = False, head: int = 0,
                 missing: Callable[[], BaseException] | None = None) -> None:
        self._store = store
        self._path = store._path(url)
        self._what = what
        self._known = known
        self._head = head
        self._cache: memoryview | None = None
        self._missing_error = missing
        self.name = url
        self.size = size
        self._pos = 0
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _fetch(self, start: int, n: int) -> bytes:
        """Bytes ``start:start+n`` (``n`` > 0, inside the size): one ranged GET."""
        end = start + n
        ask = end + 1 if self._known and end >= self.size else end  # one byte past a known end: a longer object shows
        try:
            data = self._store._call("read", self.name, self._store.fs.cat_file, self._path, start=start, end=ask)
        except FileNotFoundError:
            raise (self._missing_error() if self._missing_error is not None else self._store._missing(self.name, self._what)) from None
        if self._known and len(data) != n:
            have = f"more than {self.size}" if len(data) > n else str(start + len(data))
            raise DataError(f"file has {have} bytes, manifest says {self.size} (truncated or replaced?)", Location(self.name))
        return data

    def _read_at(self, pos: int, m: memoryview) -> int:
        """Fill ``m`` from ``pos`` (clipped to the size): from the kept head, then one GET for the rest."""
        n = min(len(m), self.size - pos)
        if n <= 0:
            return 0
        if self._cache is None and self._head and pos == 0 and n < self._head:  # a small first read: keep the head
            self._cache = memoryview(self._fetch(0, min(self.size, max(n, self._head))))
        got = 0
        cache = self._cache
        if cache is not None and pos < len(cache):
            got = min(n, len(cache) - pos)
            m[:got] = cache[pos : pos + got]
        if got < n:
            data = self._fetch(pos + got, n - got)
            m[got : got + len(data)] = data
            got += len(data)
        return got

    def read(self, n: int = -1) -> bytes:
        self._check()
        if n is None or n < 0 or self._pos + n > self.size:
            n = self.size - self._pos
        if n <= 0:
            return b""
        cache = self._cache
        if (self._pos >= len(cache)) if cache is not None else not (self._head and self._pos == 0 and n < self._head):
            data = self._fetch(self._pos, n)  # nothing kept to read from or to keep: no copy
        else:
            buf = bytearray(n)
            data = bytes(buf[: self._read_at(self._pos, memoryview(buf))])
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        self._check()
        got = self._read_at(self._pos, memoryview(b).cast("B"))
        self._pos += got
        return got

    def pread(self, n: int, offset: int) -> bytes:
        """``n`` bytes from ``offset`` (fewer at the end), without moving the position."""
        self._check()
        buf = bytearray(max(0, min(n, self.size - offset)))
        return bytes(buf[: self._read_at(offset, memoryview(buf))]) if buf else b""

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
        self._cache = None

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Publishing(io.RawIOBase):
    """A writer whose object appears only when it is closed without an error: a ``with`` block that raises, or a
    writer dropped unclosed, discards what was written (``discard``)."""

    @abc.abstractmethod
    def discard(self) -> None:
        """Drop what was written: no object appears."""

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:  # never publish what was not closed on purpose
        if not self.closed:
            self.discard()


class Writer(_Publishing):
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



class MemoryWriter(_Publishing):
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

