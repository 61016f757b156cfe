"""A directory held open by a descriptor; files are opened relative to it, one component at a time.

``DirHandle`` is the base of ``OpenedDir`` (a data directory with its manifest) and is used on
its own for directories without a manifest (a partial save's blocks). It never follows a
symbolic link, opens only regular files (a FIFO is refused, not waited for), and tells a
directory that was deleted under its reader (``CheckpointVanished``) from a file that is missing.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any, BinaryIO

from ...errors import CheckpointError, DataError, Location
from ..checksums import digest_stream
from ..checksums import verify as check_digest
from ..fsutil import O_READ, require_regular
from ..layout import OLD_MARK, TMP_MARK

__all__ = ["CheckpointVanished", "DirHandle", "MissingDir", "O_DIR", "O_FILE"]

O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO planted in a data directory must not wait for a writer (it is then refused)
O_FILE = O_READ | getattr(os, "O_NOFOLLOW", 0)

class CheckpointVanished(CheckpointError):
    """The checkpoint being read was deleted (pruned by a saver); start over from its name."""


class MissingDir(DataError):
    """No directory at that name (yet, or any more: a saver may be moving it)."""


class DirHandle:
    """A directory held open by a descriptor; files are opened relative to it, no link followed."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        st = os.fstat(fd)
        self.ino = (st.st_dev, st.st_ino)
        self._subdirs: dict[str, int] = {}  # first path component -> its descriptor (opened once)
        self._lock = threading.Lock()

    @classmethod
    def open_dir(cls, path: str | os.PathLike) -> DirHandle:
        path = os.fspath(path)
        try:
            return cls(path, os.open(path, O_DIR))
        except OSError as e:
            raise DataError(f"cannot open directory: {e.strerror or e}", Location(path)) from None

    def close(self) -> None:
        with self._lock:
            for d in self._subdirs.values():
                os.close(d)
            self._subdirs.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        for fd in list(getattr(self, "_subdirs", {}).values()) + [getattr(self, "fd", -1)]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def where(self, rel: str) -> str:
        return os.path.join(self.path, rel)

    def open_file(self, rel: str, *, whole: bool = False) -> BinaryIO:
        """Open a file below the directory through its descriptor, no symbolic link followed. ``whole``: the caller
        will read all of it (a hint for remote checkpoints, which then fetch it in fewer requests)."""
        full = self.where(rel)
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
            raise DataError(f"unsafe file name {rel!r} (must be a relative path inside the directory)", Location(full))
        opened: list[int] = []
        try:
            fd = self._subdir(parts[0]) if len(parts) > 1 else self.fd
            for part in parts[1:-1]:
                fd = os.open(part, O_DIR, dir_fd=fd)
                opened.append(fd)
            leaf = os.open(parts[-1], O_FILE, dir_fd=fd)
        except FileNotFoundError:
            self._vanished_or(DataError(f"file {rel!r} named in the manifest is missing", Location(full)))
            raise AssertionError("unreachable") from None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise DataError(f"file {rel!r} is a symbolic link or passes through one (never followed)", Location(full)) from None
            raise DataError(f"cannot open: {e.strerror or e}", Location(full)) from None
        finally:
            for d in opened:
                os.close(d)
        try:
            require_regular(leaf, full, f"file {rel!r}")
            return os.fdopen(leaf, "rb", buffering=0)
        except BaseException:
            os.close(leaf)
            raise

    def _subdir(self, name: str) -> int:
        with self._lock:
            fd = self._subdirs.get(name)
            if fd is None:
                fd = self._subdirs[name] = os.open(name, O_DIR, dir_fd=self.fd)
            return fd

    def verify_file(self, rel: str, size: int, checksum: tuple[str, str]) -> None:
        """Check one file against its size and checksum (read through, nothing kept)."""
        with self.open_file(rel, whole=True) as f:
            got, digest = digest_stream(f, checksum[0])
        if got != size:
            raise DataError(f"file has {got} bytes, manifest says {size} (truncated or replaced?)", Location(self.where(rel)))
        check_digest(checksum, digest, self.where(rel))

    def removed(self) -> bool:
        """True if this directory was deleted, or is being deleted, since it was opened."""
        try:
            if os.fstat(self.fd).st_nlink == 0:
                return True
        except OSError:
            return True
        proc = f"/proc/self/fd/{self.fd}"
        try:  # deleted, or renamed to a trash name (pruned) or a temporary one (exchanged out by xser.save)
            now = os.readlink(proc)
            return now.endswith(" (deleted)") or OLD_MARK in os.path.basename(now) or TMP_MARK in os.path.basename(now)
        except OSError:
            pass
        try:  # no /proc: the directory's name must still lead to it
            st = os.stat(self.path, follow_symlinks=False)
            return (st.st_dev, st.st_ino) != self.ino
        except OSError:
            return True

    def _vanished_or(self, error: DataError) -> None:
        if self.removed():
            raise CheckpointVanished("the checkpoint was removed while it was being read", Location(self.path))
        raise error

