"""The write step: every piece of a plan into the staging directory, on N threads.

One writer per payload kind, in the table ``WRITERS``. Each returns a ``WriteResult`` (size,
checksum, written or linked). Writers only create new files inside the staging directory;
published files are never modified (unchanged ones are hard-linked, which is why sharing them
between checkpoints is safe). With ``durable`` each file is fsynced by its writer, so fsyncs
run in parallel too.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import numpy as np

from ..errors import DataError, Location
from .checksums import CHECKSUMS, DEFAULT_CHECKSUM, digest_bytes
from .checksums import verify as check_digest
from .formats import FORMATS
from .formats.npy import NPY, header_for
from .layout import TMP_MARK
from .fsutil import fsync_file, os_error
from .payloads import Bundle, FromFile, Lazy, Stream
from .plan import Piece, Plan
from .pool import run_all
from .progress import advance, progress

__all__ = ["READ_ONLY", "WRITERS", "Linker", "Sink", "WriteResult", "link_or_copy", "put_array", "read_only", "write"]

#: link(source directory, file of it, destination path) -> True if the destination now holds that file's bytes
Linker = Callable[[Any, str, str], bool]


class Sink(Protocol):
    """Where a write step's files go after a writer made them in the spool directory (``objects.commit``)."""

    def linker(self, rel: str) -> Linker: ...

    def done(self, rel: str, path: str, result: WriteResult) -> None: ...


@attrs.frozen
class WriteResult:
    rel: str
    bytes: int
    checksum: tuple[str, str]
    linked: bool
    spans: dict | None = None  # a file holding several tensors: key -> (offset, length)


def _write_array(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    arr = piece.payload
    fmt = FORMATS[piece.format]
    known = None
    if piece.link is not None:
        source, block = piece.link
        known = fmt.digest(arr)
        if block.checksum == (DEFAULT_CHECKSUM, known[1]) and block.bytes == known[0]:
            if link(source, block.file, path):
                return WriteResult(piece.rel, known[0], (DEFAULT_CHECKSUM, known[1]), True)
    if piece.format == "npy":
        size, digest = fmt.write(path, arr, known)
    else:
        try:
            size, digest = fmt.write(path, arr, None, **piece.options)
        except DataError:
            raise
        except (ValueError, ArithmeticError, TypeError) as e:  # a codec that cannot represent a value
            raise DataError(f"format {piece.format!r} cannot store this array: {e}{_limits(fmt)}", Location(path)) from None
        exact = getattr(fmt, "exact", False) or (hasattr(fmt, "exact_for") and fmt.exact_for(arr, piece.options))
        if not _lossy_on_purpose(piece.options) and not exact:
            _check_round_trip(fmt, path, arr, size, piece.format)
    if durable:
        fsync_file(path)
    return WriteResult(piece.rel, size, (DEFAULT_CHECKSUM, digest), False)


def _lossy_on_purpose(options: dict) -> bool:
    """Options that ask for fewer digits or fewer values (DiSMEC++'s precision and threshold) are the caller's choice."""
    return options.get("precision") is not None or bool(options.get("threshold"))


def _shown(v: np.generic) -> str:
    """A value for a message, the same whatever numpy's repr: the number, and its bits where the number hides them."""
    x = v.item()
    if isinstance(x, float) and (x != x or x == 0.0):
        bits = int(np.asarray(v).reshape(1).view(f"u{v.dtype.itemsize}")[0])
        return f"{x!r} (bits 0x{bits:0{2 * v.dtype.itemsize}x})"
    return repr(x)


def _limits(fmt: Any) -> str:
    limits = getattr(fmt, "limits", "")
    return f" ({fmt.name} stores {limits})" if limits else ""


def _check_round_trip(fmt: Any, path: str, arr: np.ndarray, size: int, name: str) -> None:
    """Formats other than npy are read back at once: a value they cannot store exactly is refused now, not lost."""
    try:
        with open(path, "rb") as f:
            back = fmt.read(f, path, arr.dtype, arr.shape, size, mmap=False, verify=None)
    except DataError as e:
        raise DataError(f"format {name!r} cannot store this array: reading it back fails ({e.message}){_limits(fmt)}", Location(path)) from None
    a, b = np.ascontiguousarray(arr), np.ascontiguousarray(back)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise DataError(f"format {name!r} read back {b.dtype} {b.shape}, saved {a.dtype} {a.shape}{_limits(fmt)}", Location(path))
    if a.size == 0:
        return
    fa, fb = a.reshape(-1).view(np.uint8).reshape(a.size, -1), b.reshape(-1).view(np.uint8).reshape(b.size, -1)
    diff = np.flatnonzero((fa != fb).any(axis=1))
    if diff.size:
        i = int(diff[0])
        index = tuple(int(x) for x in np.unravel_index(i, a.shape)) if a.shape else ()
        raise DataError(
            f"format {name!r} cannot store this array exactly: element {index} is {_shown(a.reshape(-1)[i])} "
            f"and would read back as {_shown(b.reshape(-1)[i])}{_limits(fmt)}",
            Location(path),
        )


def _write_stream(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    s: Stream = piece.payload
    size, digest = NPY.write_stream(path, header_for(s.dtype, s.shape, s.fortran), s.chunks())
    if durable:
        fsync_file(path)
    return WriteResult(piece.rel, size, (DEFAULT_CHECKSUM, digest), False)


def _write_lazy(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    """Make the array now (a device-to-host copy), write it, and let it go before the next one."""
    arr = piece.payload.take()
    return _write_array(path, attrs.evolve(piece, payload=arr), durable, link)


def _write_bundle(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    """Several arrays in one file; linked to the previous checkpoint's file when the bytes are the same."""
    b: Bundle = piece.payload
    fmt = FORMATS[piece.format]
    known = None
    planned = fmt.layout(b.arrays, b.metadata, path)  # header, order and spans: worked out once
    if piece.link is not None and all(isinstance(a, np.ndarray) for a in b.arrays.values()):
        source, block = piece.link
        known = fmt.digest_bundle(b.arrays, b.metadata, planned)
        if block.checksum == (DEFAULT_CHECKSUM, known[1]) and block.bytes == known[0] and link(source, block.file, path):
            return WriteResult(piece.rel, known[0], (DEFAULT_CHECKSUM, known[1]), True, planned[2])
    size, digest = fmt.write_bundle(path, b.arrays, b.metadata, known, planned)
    if durable:
        fsync_file(path)
    return WriteResult(piece.rel, size, (DEFAULT_CHECKSUM, digest), False, planned[2])


def _link_file(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    f: FromFile = piece.payload
    if getattr(f.source, "store", None) is not None:  # an object on a store (RemoteDir): never read twice
        linked = _copy_object(f, path, link)
    else:
        if f.verify:
            f.source.verify_file(f.rel, f.bytes, f.checksum)
        linked = link_or_copy(f.source, f.rel, path, link)
    if durable and not linked:
        fsync_file(path)
    return WriteResult(piece.rel, f.bytes, f.checksum, linked)


def _write_bytes(path: str, piece: Piece, durable: bool, link: Linker) -> WriteResult:
    data: bytes = piece.payload
    digest = digest_bytes(data)
    if piece.link is not None:
        source, block = piece.link
        if block.checksum == (DEFAULT_CHECKSUM, digest) and block.bytes == len(data) and link(source, block.file, path):
            return WriteResult(piece.rel, len(data), (DEFAULT_CHECKSUM, digest), True)
    with open(path, "xb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    return WriteResult(piece.rel, len(data), (DEFAULT_CHECKSUM, digest), False)


#: payload type -> writer(path, piece, durable, link) -> WriteResult
WRITERS: dict[type, Callable[[str, Piece, bool, Linker], WriteResult]] = {
    np.ndarray: _write_array,
    np.memmap: _write_array,
    Stream: _write_stream,
    Lazy: _write_lazy,
    Bundle: _write_bundle,
    FromFile: _link_file,
    bytes: _write_bytes,
}


READ_ONLY = 0o444


def read_only(path: str) -> None:
    """Published files are never modified: make that the file's mode too (a hard link shares it)."""
    if os.stat(path).st_mode & 0o777 != READ_ONLY:
        os.chmod(path, READ_ONLY)


def _link(source: Any, rel: str, dst: str) -> bool:
    """Hard-link ``rel`` of an opened directory to ``dst`` (no symbolic link followed); False if impossible."""
    head, _, leaf = rel.rpartition("/")
    dir_fd = source.fd
    opened = None
    try:
        if head:
            opened = dir_fd = os.open(head, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0), dir_fd=source.fd)
        os.link(leaf, dst, src_dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        if opened is not None:
            os.close(opened)


def link_or_copy(source: Any, rel: str, dst: str, link: Linker | None = None) -> bool:
    """Hard-link a published file (or ``link`` it: a server-side copy on an object store); copy it where links are
    impossible. True if linked."""
    if (link or _link)(source, rel, dst):
        return True
    with source.open_file(rel) as src, open(dst, "xb") as out:
        shutil.copyfileobj(src, out, 8 << 20)
    return False


def _copy_object(f: FromFile, dst: str, link: Linker) -> bool:
    """A published object of a checkpoint on a store to ``dst``. On the same store it is copied on the server
    (``link``): no byte is read here, and its size and checksum are the source manifest's (the object is immutable,
    and that manifest was checked against its commit record). Otherwise it is copied through this process in
    ranged reads, checked against the manifest as it streams (``verify``): read once, never twice. True if linked."""
    if link(f.source, f.rel, dst):
        return True
    h = CHECKSUMS[f.checksum[0]]() if f.verify else None
    size = 0
    with f.source.open_file(f.rel) as src, open(dst, "xb") as out:
        while chunk := src.read(8 << 20):
            if h is not None:
                h.update(chunk)
            out.write(chunk)
            size += len(chunk)
    if h is not None:
        where = f.source.where(f.rel)
        if size != f.bytes:
            raise DataError(f"file has {size} bytes, manifest says {f.bytes} (truncated or replaced?)", Location(where))
        check_digest(f.checksum, h.hexdigest(), where)
    return False


def write(staging: str, plan: Plan, *, durable: bool, threads: int = 2, sink: Sink | None = None,
          make_dirs: bool = True) -> list[WriteResult]:
    """Write every piece of ``plan`` into the (existing, empty) directory ``staging``.

    ``sink``: where each written file goes next (an object store: ``staging`` is then a local spool directory,
    and the sink uploads each file as soon as it is complete, and removes it); None keeps the files in
    ``staging`` (read-only)."""
    for d in plan.dirs if make_dirs else ():  # (several ranks writing into one directory: rank 0 makes them first)
        try:
            os.mkdir(os.path.join(staging, d))
        except OSError as e:
            raise os_error(e, "cannot write data directory", staging) from None

    def one(piece: Piece) -> WriteResult:
        path = os.path.join(staging, piece.rel)
        writer = WRITERS.get(type(piece.payload))
        if writer is None:
            raise DataError(f"cannot save a {type(piece.payload).__name__} (numpy arrays only)", Location(path))
        try:
            if sink is None:
                result = writer(path, piece, durable, _link)
                read_only(path)
            else:
                result = writer(path, piece, False, sink.linker(piece.rel))
                sink.done(piece.rel, path, result)
            advance(_nbytes(piece.payload))
            return result
        except OSError as e:
            raise os_error(e, "cannot write data directory", path) from None

    with progress(sum(_nbytes(p.payload) for p in plan.pieces), "saving"):
        return run_all(one, list(plan.pieces), threads)


def _nbytes(payload: Any) -> int:
    """The bytes a piece puts on disk, for the progress bar (a linked file counts its size: linking may copy)."""
    if isinstance(payload, (bytes, bytearray)):
        return len(payload)
    if isinstance(payload, FromFile):
        return int(payload.bytes)
    if isinstance(payload, Bundle):
        return sum(_nbytes(a) for a in payload.arrays.values())
    if isinstance(payload, (Stream, Lazy)) or hasattr(payload, "blocks"):
        if hasattr(payload, "blocks"):
            return sum(_nbytes(b) for b in payload.blocks)
        return int(np.prod(payload.shape, dtype=np.int64)) * np.dtype(payload.dtype).itemsize
    return int(getattr(payload, "nbytes", 0))


def put_array(store: Any, path: str, array: np.ndarray, *, durable: bool = True) -> tuple[int, str]:
    """Write ``array`` as a new ``.npy`` file or object at ``path`` of ``store``, whole or not at all: on a local disk
    through a temporary file (fsynced with ``durable``) renamed into place, on an object store through a local spool
    file uploaded in one ``put_file``. Returns (bytes, xxh3_64 hex digest)."""
    local = store.local_path(path) if not store.remote else None
    target = local if local is not None else None
    spool = f"{target}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}" if target is not None else None
    if spool is None:
        fd, spool = tempfile.mkstemp(prefix="xser-array-", suffix=".npy")
        os.close(fd)
        os.unlink(spool)
    try:
        size, digest = NPY.write(spool, array)
        if target is not None:
            if durable:
                fsync_file(spool)
            os.rename(spool, target)
        else:
            store.put_file(spool, path)
    except OSError as e:
        raise os_error(e, "cannot write block", path) from None
    finally:
        if os.path.lexists(spool):
            os.unlink(spool)
    return size, digest
