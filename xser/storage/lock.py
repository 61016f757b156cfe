"""The model lock: an exclusive ``flock`` on ``<model>.lock`` while a saver works.

The kernel drops the lock when its holder dies, so a killed saver never blocks the next run.
The lock is never inherited: the descriptor is close-on-exec, and a forked child (a DataLoader
worker) closes its copy at once, so the lock cannot outlive the process that took it. The file
is removed on release; a process that locked a file which was removed meanwhile notices
(another inode) and tries again.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from ..errors import CheckpointError, Location
from .fsutil import makedirs_durable

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["ModelLock"]

_HELD: weakref.WeakSet = weakref.WeakSet()


def _close_in_child() -> None:
    for lock in list(_HELD):
        lock._forget()


os.register_at_fork(after_in_child=_close_in_child)


class ModelLock:
    def __init__(self, spec_path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(spec_path)) + ".lock"
        self._fd: int | None = None
        self._pid = 0

    def acquire(self) -> ModelLock:
        try:
            makedirs_durable(os.path.dirname(self.path), durable=True)  # rare: only directories it creates
        except OSError as e:
            raise CheckpointError(f"cannot create the model's directory: {e.strerror or e}", Location(e.filename or self.path)) from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as e:
                raise CheckpointError(f"cannot create lock file: {e.strerror or e}", Location(self.path)) from None
            if fcntl is None:  # pragma: no cover - no flock on this platform
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                try:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
                finally:
                    os.close(fd)
                if holder == str(os.getpid()) or any(h.path == self.path and h.held for h in _HELD):
                    raise CheckpointError(
                        "this process already has a CheckpointSaver on this model: use that one, or close() it "
                        "(or leave its with block) before making another",
                        Location(self.path),
                    ) from None
                raise CheckpointError(
                    f"another process (pid {holder}) is saving this model; wait for it or save elsewhere",
                    Location(self.path),
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the file was removed by its previous holder: lock the new one
        try:  # the holder's pid, for the message above; a full disk must not keep the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self._fd = fd
        self._pid = os.getpid()
        _HELD.add(self)
        return self

    def release(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.unlink(self.path)
            except OSError:
                pass
            os.close(self._fd)  # closing drops the flock
        self._fd = None
        _HELD.discard(self)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptor; the parent keeps the lock."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> ModelLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
