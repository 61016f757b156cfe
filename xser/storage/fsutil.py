"""Small filesystem steps with the durability rules of a save: fsync files, directories, parents."""

from __future__ import annotations

import errno
import io
import ctypes
import sys
import os
import stat
import threading
from typing import Any, BinaryIO

from ..errors import DataError, Location

__all__ = [
    "O_READ", "file_size", "refuse_special", "fsync_dir", "fsync_file", "makedirs_durable", "sync_files", "syncfs", "syncfs_usable", "fs_type", "libc_function", "mappable", "open_regular", "os_error", "pread_into",
    "read_regular", "require_regular", "to_devnull",
]

# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused after the open); no effect on regular files
O_READ = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def require_regular(fd: int, where: str, what: str, cls: type = DataError) -> os.stat_result:
    """The ``fstat`` of ``fd``, which must be a regular file: a FIFO, socket, device or directory is
    refused (``cls``, naming ``what`` and its kind). The one check every reader of an untrusted path uses."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise cls(f"{what} is not a regular file ({_kind(st.st_mode)}: never read, as it could block forever)", Location(where))
    return st


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_regular(path: str, what: str, cls: type = DataError, *, dir_fd: int | None = None, flags: int = 0) -> BinaryIO:
    """Open ``path`` for reading without waiting (a FIFO never blocks the open) and refuse anything but a
    regular file (``require_regular``). ``flags`` adds open flags (``O_NOFOLLOW``); OS errors propagate."""
    try:
        fd = os.open(path, O_READ | flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError:  # a socket cannot be opened at all (ENXIO): say what it is rather than the OS's riddle
        try:
            st = os.stat(path, dir_fd=dir_fd, follow_symlinks=not flags & getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise cls(f"{what} is not a regular file ({_kind(st.st_mode)}: never read, as it could block forever)",
                      Location(path)) from None
        raise
    try:
        require_regular(fd, path, what, cls)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def refuse_special(path: str, what: str, cls: type = DataError) -> None:
    """Refuse a FIFO, socket, device or directory at ``path`` (or named by a link there) before it is replaced; nothing
    there, a dangling link or a regular file is fine."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        with open_regular(path, what, cls):
            pass  # raises: the one refusal of special files, with its wording


def read_regular(path: str, what: str, *, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file (``open_regular``: a FIFO never blocks), as ``DataError``s naming
    ``what``: missing, unreadable, not a regular file, or (``limit``) larger than ``limit`` bytes."""
    try:
        with open_regular(path, what) as f:
            if limit is not None and os.fstat(f.fileno()).st_size > limit:
                raise DataError(f"{what} is larger than {limit} bytes", Location(path))
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{what} not found", Location(path)) from None
    except OSError as e:
        raise os_error(e, f"cannot read {what}", path) from None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def libc_function(name: str, argtypes: list) -> Any:
    """A function of Linux's C library (``renameat2``, ``syncfs``) with its argument types, or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = libc_function("syncfs", [ctypes.c_int])


#: local filesystems whose syncfs waits for every file's data and metadata and (Linux >= 5.8) reports writeback errors
SYNCFS_TYPES = frozenset({"ext4", "xfs", "btrfs", "tmpfs", "f2fs"})


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    except (ValueError, AttributeError):
        return False
    return got >= (major, minor)


def fs_type(path: str) -> str | None:
    """The type of the filesystem mounted where ``path`` is (Linux's /proc/self/mountinfo), or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real, best, kind = os.path.realpath(path), "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, right.split()[0] if right.split() else None
    return kind


def syncfs_usable(directory: str) -> bool:
    """One ``syncfs`` makes every file in ``directory`` durable, with errors reported: Linux >= 5.8 (before, syncfs
    returned 0 after writeback errors) and a local filesystem of ``SYNCFS_TYPES`` (a FUSE or network mount may not
    pass it on to where the data lives)."""
    return _SYNCFS is not None and _kernel_at_least(5, 8) and fs_type(directory) in SYNCFS_TYPES


def syncfs(directory: str) -> bool:
    """One ``syncfs`` of the filesystem that holds ``directory`` (every file's data and metadata, directories
    included, made durable); False, having done nothing, where it is not usable (``syncfs_usable``) or the filesystem
    refuses it. A writeback error is an ``OSError``."""
    if not syncfs_usable(directory):
        return False
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if _SYNCFS(fd) == 0:
            return True
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
            raise OSError(err, os.strerror(err), directory)
        return False
    finally:
        os.close(fd)


def sync_files(directory: str, paths: list[str]) -> None:
    """Make the files ``paths`` (inside ``directory``) durable: with one ``syncfs`` of the filesystem that holds
    ``directory`` where it is usable (``syncfs_usable``: one call instead of one fsync per file, and a rank of a
    distributed save writes thousands), else an fsync of each file. A writeback error is an ``OSError`` either way.
    (``syncfs`` also waits for other processes' dirty data on that filesystem.)"""
    if syncfs(directory):
        return
    for path in paths:
        fsync_file(path)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str, *, durable: bool) -> None:
    """``os.makedirs(path, exist_ok=True)``; with ``durable``, fsync the parent of every directory it creates."""
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.isdir(p):
        if os.path.lexists(p):
            raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a directory", p)
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue
        if durable:
            fsync_dir(os.path.dirname(d))


def os_error(e: OSError, what: str, where: str, cls: type = DataError) -> Exception:
    """An ``OSError`` as an xser error: what failed, the OS's reason, the file it names."""
    reason = e.strerror or str(e)
    return cls(f"{what}: {reason}", Location(e.filename if isinstance(e.filename, str) else where))


# -- files of any store: a local file has a descriptor; a remote one (``stores.remote.RemoteFile``) has ``size``
# and answers every read with a ranged GET


def mappable(f: Any) -> bool:
    """Whether ``f`` is a local file with a descriptor (so it can be mapped and ``pread``)."""
    try:
        f.fileno()
        return True
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        return False


def file_size(f: Any) -> int:
    """The size in bytes of an open file of any store (``fstat`` for a local one)."""
    size = getattr(f, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    return os.fstat(f.fileno()).st_size


def pread_into(f: Any, view: Any, offset: int) -> int:
    """Fill the writable byte view ``view`` from ``offset`` of ``f`` (positional on a local file, seek + readinto
    elsewhere); returns the bytes read (fewer only at the end of the file)."""
    got = 0
    if mappable(f):
        fd = f.fileno()
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n <= 0:
                break
            got += n
        return got
    pread = getattr(f, "pread", None)
    if pread is not None:  # a remote file: one ranged GET, no shared position (threads read one container at once)
        data = pread(len(view), offset)
        memoryview(view).cast("B")[: len(data)] = data
        return len(data)
    with _SEEK_LOCK:
        f.seek(offset)
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    return got


_SEEK_LOCK = threading.Lock()


def to_devnull(fd: int) -> None:
    """Point descriptor ``fd`` (stdout after a broken pipe) at the null device: later writes and the interpreter's
    last flush go nowhere."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
