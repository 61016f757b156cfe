"""A published data directory, opened once and read relative to its descriptor.

``OpenedDir.open(path)`` opens the directory (``O_DIRECTORY | O_NOFOLLOW``) and reads its
manifest through that descriptor; every later read (spec, parameter files, training state)
goes through the same descriptor, one path component at a time with ``O_NOFOLLOW``. A saver in
another process may rename the directory (rotation) meanwhile: the reader still reads the
checkpoint it opened, never a mix. If the checkpoint is *deleted* while it is read (pruned),
the read raises ``CheckpointVanished`` and the caller starts over from the name.

No symbolic link is ever followed inside a data directory: xser never writes one, and a
model file is untrusted input.
"""

from __future__ import annotations

import math
import mmap as mmap_module
import errno
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError, Location, did_you_mean
from .checksums import digest_bytes
from .checksums import verify as check_digest
from .formats import get_format
from .formats.npy import header_from_bytes as npy_header_from_bytes
from .formats.npy import map_fd
from .dtypes import storage_of
from .disk.dirhandle import O_DIR, O_FILE, CheckpointVanished, DirHandle, MissingDir
from .fsutil import file_size, mappable, require_regular
from .disk.lock import pin as pin_dir
from .manifest import MANIFEST, Block, Manifest, ParamEntry, parse_manifest
from .batched import Done, fill_span, read_many, span_mismatch, stop

__all__ = ["CheckpointVanished", "DirHandle", "MissingDir", "OpenedDir", "check_rows", "gather", "stop"]
_Done = Done  # (the name other modules knew it by)
if TYPE_CHECKING:
    from concurrent.futures import Future

_VERIFY_LOCK = threading.Lock()
MAX_MANIFEST = 256 << 20  # bytes; a manifest larger than this is refused before it is read


class OpenedDir(DirHandle):
    """A data directory held open by a descriptor, with its parsed manifest."""

    def __init__(self, path: str, fd: int, manifest: Manifest) -> None:
        super().__init__(path, fd)
        self.manifest = manifest
        self.index: int | None = None  # its place in the listing it was chosen from (0 = newest), if chosen from one

    # -- opening

    @classmethod
    def open(cls, path: str | os.PathLike, *, pin: bool = True, lazy: bool = False) -> OpenedDir:
        """Open ``path`` and read its manifest; ``DataError`` if it is not a valid data directory.

        ``pin``: share-lock the directory (``lock.pin``) so that no saver deletes it while it is open
        (a saver holding the model lock opens its own checkpoints unpinned). A directory that a saver
        is removing or has renamed away from its slot is ``MissingDir`` (the caller lists again), never
        a "missing manifest". ``lazy``: each parameter's entry is checked when first looked up
        (``manifest.LazyParams``), for readers of a few arrays."""
        path = os.fspath(path)
        try:
            fd = os.open(path, O_DIR)
        except FileNotFoundError:
            raise MissingDir("data directory not found (was the model saved with xser.save?)", Location(path)) from None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise DataError("not a directory (a data directory is never a symbolic link)", Location(path)) from None
            raise DataError(f"cannot open data directory: {e.strerror or e}", Location(path)) from None
        try:
            if pin and not pin_dir(fd):
                raise MissingDir("the checkpoint is being removed by a saver", Location(path))
            try:
                raw = _read_small(fd, MANIFEST, os.path.join(path, MANIFEST))
                if raw is None:
                    raise DataError("manifest.json is missing: not a complete xser data directory", Location(path))
                return cls(path, fd, parse_manifest(raw, os.path.join(path, MANIFEST), lazy=lazy))
            except DataError:
                if _gone(fd, path):  # pruned or replaced since it was opened (before the pin): not a damaged directory
                    raise MissingDir("the checkpoint was removed while it was opened", Location(path)) from None
                raise
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Close the directory and the containers opened through it (maps stay valid for the arrays over them)."""
        with _VERIFY_LOCK:
            held = self.__dict__.pop("_containers", {})
        for f, _ in held.values():
            f.close()
        super().close()

    # -- what the manifest says

    @property
    def meta(self) -> dict:
        return self.manifest.meta

    @property
    def subcollections(self) -> dict[str, dict[str, ParamEntry]]:
        return self.manifest.entries

    @property
    def id(self) -> str | None:
        return self.manifest.id

    def entry(self, subcol: str, name: str) -> ParamEntry:
        return self.subcollections[subcol][name]

    def read_bytes(self, block: Block) -> bytes:
        """A small file (the spec), checked against its block's size and checksum."""
        with self.open_file(block.file, whole=True) as f:
            size = file_size(f)
            if size != block.bytes:
                raise DataError(f"file has {size} bytes, manifest says {block.bytes}", Location(self.where(block.file)))
            data = f.read()
        check_digest(block.checksum, digest_bytes(data, block.checksum[0]), self.where(block.file))
        return data

    def spec_text(self) -> str | None:
        """The checkpoint's own spec (format_version >= 2), or None for older checkpoints."""
        block = self.manifest.spec
        if block is None:
            return None
        data = self.read_bytes(block)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"spec is not UTF-8 ({e.reason} at byte {e.start})", Location(self.where(block.file))) from None

    # -- arrays

    def read(
        self, entry: ParamEntry, *, mmap: bool = False, verify: bool = False, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """The parameter's array, or only ``rows`` (first, stop) of it.

        A row range reads only the blocks that overlap it and, inside each, only the bytes of
        those rows (unless ``verify`` needs the whole file for its checksum). A parameter
        stored in several blocks is assembled in memory (``mmap`` applies to single files).
        """
        if rows is not None:
            first, stop = check_rows(entry, rows)
        elif entry.whole:
            return self._read_block(entry, entry.blocks[0], None, mmap=mmap, verify=verify)
        else:
            first, stop = 0, (entry.shape[0] if entry.shape else 1)
        if not entry.shape:
            return self._read_block(entry, entry.blocks[0], None, mmap=False, verify=verify)
        out = np.empty((stop - first,) + entry.shape[1:], entry.dtype)
        for block in entry.blocks:
            start, bshape = block.box(entry.shape)
            lo, hi = max(first, start[0]), min(stop, start[0] + bshape[0])
            if lo >= hi:
                continue
            part = self._read_block(entry, block, (lo - start[0], hi - start[0]), mmap=False, verify=verify)
            index = (slice(lo - first, hi - first),) + tuple(slice(a, a + n) for a, n in zip(start[1:], bshape[1:]))
            out[index] = part
        return out

    def _read_block(self, entry: ParamEntry, block: Block, rows: tuple[int, int] | None, *, mmap: bool, verify: bool) -> np.ndarray:
        if block.offset is not None and block.format == "safetensors":
            if verify:
                self.verify_once(block)
            return self._read_span(entry, block, rows, mmap)
        fmt = get_format(block.format)
        where = self.where(block.file)
        _, bshape = block.box(entry.shape)
        checksum = block.checksum if verify else None
        kw = {}
        if block.key is not None:  # one tensor of a shared file: the file is verified once, the tensor read by key
            kw["key"] = block.key
            if block.offset is not None:
                kw["span"] = (block.offset, block.length)
            if checksum is not None:
                self.verify_once(block)
                checksum = None
        whole_rows = rows is not None and rows == (0, bshape[0]) if bshape else False
        with self.open_file(block.file, whole=(rows is None or whole_rows) and block.key is None) as f:
            try:
                if rows is None or whole_rows:
                    return fmt.read(f, where, entry.dtype, bshape, block.bytes, mmap=mmap, verify=checksum, **kw)
                return fmt.read_rows(f, where, entry.dtype, bshape, block.bytes, rows, verify=checksum, **kw)
            except OSError as e:
                raise DataError(f"cannot read: {e.strerror or e}", Location(where)) from None

    def chunks(
        self, entry: ParamEntry, elements: int, buffer: np.ndarray | None = None, *, verify: bool = False
    ) -> Iterator[np.ndarray]:
        """The parameter's elements in C order, streamed in flat pieces of at most ``elements``.

        Goes through each block's format (every format has a streaming reader), so tools work
        on every format a checkpoint may hold. Blocked parameters are read as row bands.
        ``verify`` checks each file's checksum as it is read (a mismatch raises before the last piece).
        """
        if entry.whole:
            block = entry.blocks[0]
            fmt = get_format(block.format)
            where = self.where(block.file)
            checksum = block.checksum if verify else None
            with self.open_file(block.file) as f:  # streamed: one GET per piece, nothing kept
                try:
                    if block.format == "npy":
                        yield from fmt.chunks(f, where, entry.dtype, entry.shape, block.bytes, elements, buffer, checksum)
                    elif block.key is not None:
                        if checksum is not None:
                            self.verify_once(block)
                        span = (block.offset, block.length) if block.offset is not None else None
                        yield from fmt.chunks(f, where, entry.dtype, entry.shape, block.bytes, elements, buffer, key=block.key, span=span)
                    elif checksum is not None:
                        yield from fmt.chunks(f, where, entry.dtype, entry.shape, block.bytes, elements, verify=checksum)
                    else:
                        yield from fmt.chunks(f, where, entry.dtype, entry.shape, block.bytes, elements)
                except OSError as e:
                    raise DataError(f"cannot read: {e.strerror or e}", Location(where)) from None
            return
        if verify:  # each block file once, before any of it is used
            for block in entry.blocks:
                if block.key is not None:
                    self.verify_once(block)
                else:
                    self.verify_file(block.file, block.bytes, block.checksum)
        if not entry.shape:
            yield self.read(entry).reshape(-1)
            return
        row = math.prod(entry.shape[1:]) or 1
        step = max(1, elements // row)
        for first in range(0, entry.shape[0], step):
            yield self.read(entry, rows=(first, min(entry.shape[0], first + step))).reshape(-1)

    def _container(self, block: Block) -> tuple[Any, Any]:
        """A file holding many tensors, opened (and its size checked) once for this directory: (file, map or None)."""
        with _VERIFY_LOCK:
            held = self.__dict__.setdefault("_containers", {})
            got = held.get(block.file)
            if got is None:
                f = self.open_file(block.file)
                size = file_size(f)
                if size != block.bytes:
                    f.close()
                    raise DataError(f"file has {size} bytes, manifest says {block.bytes} (truncated or replaced?)",
                                    Location(self.where(block.file)))
                got = held[block.file] = [f, None]
            return got

    def _read_span(self, entry: ParamEntry, block: Block, rows: tuple[int, int] | None, mmap: bool) -> np.ndarray:
        """A tensor of a packed container, at the manifest's offset: one pread into the result, or a view of one map."""
        held = self._container(block)
        start, bshape = block.box(entry.shape)
        where = self.where(block.file)
        stored = entry.dtype.newbyteorder("<") if entry.dtype.byteorder == ">" else entry.dtype
        if block.length != math.prod(bshape) * stored.itemsize:
            raise span_mismatch(block, bshape, entry.dtype, where)
        offset, shape = block.offset, tuple(bshape)
        if rows is not None and shape:
            row = math.prod(shape[1:]) * stored.itemsize
            offset, shape = offset + rows[0] * row, (rows[1] - rows[0],) + shape[1:]
        if mmap and block.length and rows is None and offset % max(1, stored.itemsize) == 0 and mappable(held[0]):
            with _VERIFY_LOCK:
                if held[1] is None:
                    held[1] = mmap_module.mmap(held[0].fileno(), 0, access=mmap_module.ACCESS_COPY)
            out = np.ndarray(shape, stored, buffer=held[1], offset=offset)
        else:
            out = np.empty(shape, stored)
            view = out.reshape(-1).view(np.uint8) if out.size else np.empty(0, np.uint8)
            fill_span(held[0], view, offset, block.key, where)
        return out if stored == entry.dtype else out.astype(entry.dtype)

    def read_into(self, entries: list[ParamEntry], out: np.ndarray, *, verify: bool = False) -> None:
        """The bytes of several whole parameters, back to back in C order, into the flat byte buffer ``out`` (which
        holds exactly their bytes). Tensors of a local packed container that follow each other in the file are read
        in one ``pread`` (the container opened, its size checked and, with ``verify``, its checksum checked once for
        this directory); any other parameter through ``read``."""
        local = type(self)._read_block is OpenedDir._read_block
        at, run = 0, None  # run: [container, file offset, start in out, bytes]

        def flush() -> None:
            if run is not None and run[3]:
                held, offset, start, length = run[0], run[1], run[2], run[3]
                fill_span(held[0], out[start : start + length], offset, run[4], self.where(run[5]))

        for e in entries:
            n = math.prod(e.shape) * e.dtype.itemsize
            b = e.blocks[0]
            if local and e.whole and b.offset is not None and b.format == "safetensors" and e.dtype.byteorder != ">":
                if b.length != n:
                    raise span_mismatch(b, e.shape, e.dtype, self.where(b.file))
                if run is not None and run[5] == b.file and run[1] + run[3] == b.offset:
                    run[3] += n
                else:
                    flush()
                    if verify:
                        self.verify_once(b)
                    run = [self._container(b), b.offset, at, n, b.key, b.file]
            else:
                flush()
                run = None
                a = self.read(e, verify=verify)
                out[at : at + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            at += n
        flush()
        if at != out.size:
            raise ValueError(f"read_into: the parameters hold {at} bytes, the buffer {out.size}")

    def verify_once(self, block: Block) -> None:
        """Check a file several parameters share against its checksum, once for this opened directory."""
        with _VERIFY_LOCK:
            lock = self.__dict__.setdefault("_verifying", {}).setdefault(block.file, threading.Lock())
        with lock:  # readers of other tensors of the file wait for the one check, then trust it
            done = self.__dict__.setdefault("_verified", set())
            if block.file not in done:
                self.verify_file(block.file, block.bytes, block.checksum)
                done.add(block.file)

    def read_many(
        self, entries: Iterable[ParamEntry], *, mmap: bool = False, verify: bool = False, rows: dict | None = None
    ) -> dict[tuple[str, str], Any]:
        """Start reading several parameters at once; returns futures keyed by (subcol, name), in the order given
        (``batched.read_many``: batches on the I/O pool, a packed container's tensors together)."""
        return read_many(self, entries, mmap=mmap, verify=verify, rows=rows, local=type(self)._read_block is OpenedDir._read_block)

    def _map_npy(self, entry: ParamEntry) -> np.ndarray | None:
        """A lazy open's fast path for a whole ``.npy`` file with a plain header: a handful of
        system calls and no file object. None when anything is unusual (the general path then
        reads it and reports precisely)."""
        block = entry.blocks[0]
        sub, _, leaf = block.file.partition("/")
        if not leaf or "/" in leaf or leaf in (".", ".."):
            return None
        try:
            fd = os.open(leaf, O_FILE, dir_fd=self._subdir(sub))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != block.bytes:
                return None
            head = npy_header_from_bytes(os.pread(fd, 512, 0))
            if head is None:
                return None
            shape, fortran, dtype, offset = head
            nbytes = math.prod(shape) * dtype.itemsize
            if dtype != storage_of(entry.dtype) or shape != entry.shape or offset + nbytes != st.st_size or not nbytes:
                return None
            return map_fd(fd, entry.dtype, offset, shape, "F" if fortran else "C")
        finally:
            os.close(fd)

    def check_row_keys(self, rows: dict | None) -> dict:
        """Every key of a ``rows`` mapping must name a parameter ("subcol/param")."""
        rows = dict(rows or {})
        known = [f"{s}/{n}" for s, ps in self.subcollections.items() for n in ps]
        for key in rows:
            sub, _, name = str(key).partition("/")
            if name not in self.subcollections.get(sub, {}):
                raise DataError(f"rows: no parameter {key!r}{did_you_mean(str(key), known)}", Location(self.path))
        return rows

    def read_all(self, *, mmap: bool = False, verify: bool = False, rows: dict | None = None) -> dict[str, dict[str, np.ndarray]]:
        rows = self.check_row_keys(rows)
        futs = self.read_many(
            (e for s in self.subcollections.values() for e in s.values()), mmap=mmap, verify=verify, rows=rows
        )
        return gather(futs, {s: {} for s in self.subcollections})

    def read_state_arrays(self, *, mmap: bool = False, verify: bool = False) -> dict[str, np.ndarray]:
        return {k: self.read(e, mmap=mmap, verify=verify) for k, e in self.manifest.state_entries.items()}


def gather(futs: dict[tuple[str, str], Future], into: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Wait for every future; on the first failure cancel the rest (no read goes on after an error)."""
    try:
        for (sub, name), fut in futs.items():
            into[sub][name] = fut.result()
    except BaseException:
        stop(futs.values())  # nothing reads on after the caller has its error (and may close the directory)
        raise
    return into


def check_rows(entry: ParamEntry, rows: Any) -> tuple[int, int]:
    """Validate a (first, stop) row range against a parameter."""
    where = Location(path=f"{entry.subcol}/{entry.name}")
    if not entry.shape:
        raise DataError("a row range needs a parameter with at least one dimension, this one is a scalar", where)
    try:
        first, stop = (int(x) for x in rows)
    except (TypeError, ValueError):
        raise DataError(f"rows must be (first, stop), got {rows!r}", where) from None
    if not 0 <= first < stop <= entry.shape[0]:
        raise DataError(f"rows ({first}, {stop}) are outside the parameter's {entry.shape[0]} rows", where)
    return first, stop


def _gone(fd: int, path: str) -> bool:
    """Whether the directory open at ``fd`` left its name ``path`` (deleted, or renamed to trash or a temporary)."""
    try:
        if os.fstat(fd).st_nlink == 0:
            return True
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino)


def _read_small(dir_fd: int, name: str, where: str) -> bytes | None:
    """A small file relative to a directory descriptor (None if missing), size-capped."""
    try:
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DataError("manifest.json is a symbolic link (never followed)", Location(where)) from None
        raise DataError(f"cannot read manifest: {e.strerror or e}", Location(where)) from None
    with os.fdopen(fd, "rb") as f:
        size = require_regular(f.fileno(), where, "manifest.json").st_size
        if size > MAX_MANIFEST:
            raise DataError(f"manifest has {size} bytes, more than the {MAX_MANIFEST} this xser reads", Location(where))
        return f.read(size)  # exactly what fstat says (a read of the cap would allocate the cap)
