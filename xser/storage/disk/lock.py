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

from ...errors import CheckpointError, Location
from ..fsutil import makedirs_durable

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["ListingLock", "ModelLock", "claim", "pin"]

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
                st = os.fstat(fd)
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
            st = os.fstat(fd)
            try:
                same = os.stat(self.path).st_ino == st.st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the file was removed by its previous holder: lock the new one
        try:  # the holder's pid, for the message above; a full disk must not keep the lock
            if st.st_size:  # (left by a killed holder; truncating an empty file would make ext4 flush it on close)
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


# ---------------------------------------------------------------- readers and rotations
#
# Two more locks, both ``flock``s that the kernel drops when their holder dies (so a killed saver never
# blocks a reader), and both released in a forked child at once:
#
# - the *listing lock*, on the directory that holds the model: a saver holds it exclusively while it
#   renames slots (a rotation, a replacement, setting a damaged slot aside), a reader shares it while it
#   lists the slots and opens them. A reader therefore never lists a rotation half done (a slot missing
#   for a moment, or one checkpoint at two names); it waits for the renames (microseconds), not the save.
# - a *pin* on each checkpoint directory a reader opened (shared, never waited for): a saver deletes a
#   pruned or replaced checkpoint only if it can lock it exclusively at once; otherwise it leaves it under
#   its trash name, and a later save removes it once no reader has it open. So a reader reads the
#   checkpoint it opened whole, however long it takes, while the saver goes on.

_LISTING: set[int] = set()  # descriptors of listing locks held by this process (closed in a forked child)
_WAIT = 10.0  # seconds a reader waits for a rotation's renames before listing without the lock


def _drop_listing_locks_in_child() -> None:
    for fd in list(_LISTING):
        try:
            os.close(fd)
        except OSError:
            pass
    _LISTING.clear()


os.register_at_fork(after_in_child=_drop_listing_locks_in_child)


class ListingLock:
    """The listing lock of the model at ``spec_path`` (see above): ``exclusive`` for a saver's renames.

    Where the directory cannot be locked (no ``flock``, a file system without it) the lock is a no-op and
    readers rely on their own check that nothing moved while they listed."""

    def __init__(self, spec_path: str | os.PathLike, *, exclusive: bool) -> None:
        self.dir = os.path.dirname(os.path.abspath(os.fspath(spec_path)))
        self.exclusive = exclusive
        self._fd: int | None = None

    def __enter__(self) -> ListingLock:
        if fcntl is None:  # pragma: no cover - not on POSIX
            return self
        try:
            fd = os.open(self.dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return self  # no directory yet (nothing to list) or no access: nothing to lock
        try:  # readers hold it for microseconds, a saver for its renames: a wait is short (unless a holder is stopped)
            _poll(fd, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return self
        self._fd = fd
        _LISTING.add(fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            _LISTING.discard(self._fd)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _poll(fd: int, op: int) -> None:
    """Take ``op`` on ``fd``, waiting at most ``_WAIT`` seconds (then ``TimeoutError``)."""
    import time

    deadline = time.monotonic() + _WAIT
    pause = 0.0002
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


def _try_flock(fd: int, *, exclusive: bool) -> bool:
    """``flock`` at once or never: False if another holder is in the way; True where locking is unsupported."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def pin(fd: int) -> bool:
    """Share-lock an opened checkpoint directory so no saver deletes it while it is read; False if a saver is
    deleting it right now (the reader starts over). Where locking is unsupported the directory is read unpinned."""
    return _try_flock(fd, exclusive=False)


def claim(fd: int) -> bool:
    """Lock a directory to delete it, at once or never: False if a reader has it pinned."""
    return _try_flock(fd, exclusive=True)
