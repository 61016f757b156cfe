"""``LocalStore``: the byte store of this machine's filesystem (paths, not URLs).

Reads refuse special files (a FIFO never blocks: ``fsutil.open_regular``); whole-object writes are
a temporary file + ``os.replace`` with fsync of the file and its directory (``durable``); a
``create_only`` write links the temporary file to its name, which fails if the name exists (atomic).
The checkpoint commit protocol of a local disk (directory descriptors, exchange rename, file locks)
lives above this in ``disk/`` (``commit.py``, ``slots.py``, ``lock.py``), unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

from ...errors import DataError, Location, StorageError
from ..fsutil import fsync_dir, makedirs_durable, open_regular, os_error, read_regular
from ..layout import temp_name

__all__ = ["LOCAL", "LocalStore", "AlreadyExists"]


class AlreadyExists(StorageError):
    """``put(..., create_only=True)`` found the object there already (another writer was first)."""


class LocalFile:
    """A local file open for reading, with its ``size`` (``fileno()`` works: it can be mapped)."""

    def __init__(self, f: BinaryIO, name: str) -> None:
        self._f = f
        self.name = name
        self.size = os.fstat(f.fileno()).st_size

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def readinto(self, b: Any) -> int:
        return self._f.readinto(b)  # type: ignore[attr-defined]

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalStore:
    scheme = ""
    conditional = True
    remote = False

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def parent(self, path: str) -> str:
        return os.path.dirname(os.path.abspath(path))

    def basename(self, path: str) -> str:
        return os.path.basename(path)

    def local_path(self, path: str) -> str | None:
        return path

    # -- reading

    def open_read(self, path: str, what: str, *, size: int | None = None, head: int = 0,
                  missing: Callable[[], BaseException] | None = None) -> LocalFile:
        """The file open for reading (``size`` and ``head`` are hints for remote stores: a local file has its size,
        and its reads are cheap); ``missing`` makes the error for a missing file."""
        try:
            f = open_regular(path, what)
        except FileNotFoundError:
            raise (missing() if missing is not None else DataError(f"{what} not found", Location(path))) from None
        except OSError as e:
            raise os_error(e, f"cannot read {what}", path) from None
        return LocalFile(f, path)

    def read_bytes(self, path: str, what: str, *, limit: int | None = None) -> bytes:
        return read_regular(path, what, limit=limit)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with self.open_read(path, "file") as f:
            return os.pread(f.fileno(), max(0, end - start), start)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        with self.open_read(path, "file") as f:
            return [os.pread(f.fileno(), max(0, e - s), s) for s, e in ranges]

    def size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        """A regular file (following links), as ``os.path.isfile``."""
        return os.path.isfile(path)

    def list(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        if os.path.isfile(prefix):
            return {prefix: os.path.getsize(prefix)}
        for root, dirs, files in os.walk(prefix):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    out[full] = os.lstat(full).st_size
                except OSError:
                    pass
        return out

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise os_error(e, "cannot list directory", path, StorageError) from None

    # -- writing

    def put(self, path: str, data: bytes, *, create_only: bool = False, durable: bool = True) -> None:
        parent = self.parent(path)
        tmp = temp_name(path)
        try:
            makedirs_durable(parent, durable=durable)
            with open(tmp, "xb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            if create_only:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise AlreadyExists("the object exists already (another writer was first)", Location(path)) from None
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
            if durable:
                fsync_dir(parent)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise os_error(e, "cannot write file", path, StorageError) from None

    def put_file(self, local: str, path: str) -> None:
        try:
            makedirs_durable(self.parent(path), durable=False)
            import shutil

            shutil.copyfile(local, path)
        except OSError as e:
            raise os_error(e, "cannot write file", path, StorageError) from None

    def open_write(self, path: str) -> BinaryIO:
        try:
            makedirs_durable(self.parent(path), durable=False)
            return open(path, "xb")
        except OSError as e:
            raise os_error(e, "cannot write file", path, StorageError) from None

    def copy(self, src: str, dst: str) -> None:
        try:
            makedirs_durable(self.parent(dst), durable=False)
            try:
                os.link(src, dst, follow_symlinks=False)
            except OSError:
                import shutil

                shutil.copyfile(src, dst, follow_symlinks=False)
        except OSError as e:
            raise os_error(e, "cannot copy file", dst, StorageError) from None

    def delete(self, paths: Iterable[str]) -> None:
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                import shutil

                shutil.rmtree(p, ignore_errors=True)
            except OSError as e:
                raise os_error(e, "cannot remove file", p, StorageError) from None

    def delete_prefix(self, prefix: str) -> None:
        if os.path.isdir(prefix) and not os.path.islink(prefix):
            import shutil  # (here and above: on use, readers never need it)

            shutil.rmtree(prefix, ignore_errors=True)
        else:
            self.delete([prefix])


LOCAL = LocalStore()
