"""Small filesystem steps with the durability rules of a save: fsync files, directories, parents."""

from __future__ import annotations

import errno
import os

from ..errors import DataError, Location

__all__ = ["fsync_dir", "fsync_file", "makedirs_durable", "os_error"]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
