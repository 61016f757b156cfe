"""``RemoteDir``: one checkpoint on an object store, read like ``OpenedDir`` reads a local directory.

Every object of a checkpoint is immutable (written once under the checkpoint's own prefix), so a
reader never sees a mix: what it reads is either the checkpoint's bytes or missing. Missing means a
saver dropped the checkpoint meanwhile (rotation deletes the objects of dropped checkpoints after the
commit record that drops them): ``CheckpointVanished``, and the caller starts over from the newest
commit record. Row reads are ranged GETs of the rows' bytes. ``mmap=True`` streams each whole ``.npy``
file to the local temporary directory and maps that copy (unlinked at once: the disk space lives as long
as the array), so a large model loads without holding its bytes in memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

import numpy as np

from ...errors import DataError, Location
from ..checksums import digest_bytes
from ..checksums import verify as check_digest
from ..disk.dirhandle import CheckpointVanished, MissingDir
from ..formats import get_format
from ..manifest import MANIFEST, Block, Manifest, ParamEntry, parse_manifest
from ..opened import MAX_MANIFEST, OpenedDir
from ..stores.base import ReadFile, Store

__all__ = ["COPY_CHUNK", "HEADER_READ", "HEAD_READ", "RemoteDir", "WHOLE_READ"]

COPY_CHUNK = 8 << 20  # bytes per ranged GET when an array file is copied to be mapped (mmap=True)
#: a file read whole that is no larger than this comes in one GET (held once more in memory while it is copied)
WHOLE_READ = 32 << 20
#: a larger file read whole: its first GET (the header and the start of the data), then one GET for the rest
HEAD_READ = 1 << 20
#: a file read in part (row ranges): the first read from its start (the header) fetches this many bytes
HEADER_READ = 4096


class RemoteDir(OpenedDir):
    """A checkpoint under ``path`` (a URL prefix) of ``store``, with its parsed manifest."""

    def __init__(self, store: Store, path: str, manifest: Manifest) -> None:  # noqa: D107 (no descriptor: no super().__init__)
        self.store = store
        self.path = path
        self.fd = -1
        self.ino = None
        self._subdirs: dict[str, int] = {}
        self._lock = threading.Lock()
        self.manifest = manifest
        self.index: int | None = None

    @classmethod
    def open_remote(cls, store: Store, path: str, expect: tuple[int, tuple[str, str]] | None = None) -> RemoteDir:
        """Read the manifest under ``path``; ``expect`` = (bytes, checksum) the commit record gives for it.

        A missing manifest is ``MissingDir`` (dropped by a saver since the record was read)."""
        where = store.join(path, MANIFEST)
        if expect is not None and 0 < expect[0] <= MAX_MANIFEST:  # the record gives its size: one GET, no HEAD
            try:
                raw = store.read_range(where, 0, expect[0] + 1)  # a byte more: a longer object shows
            except DataError:
                if store.size(where) is None:
                    raise MissingDir("the checkpoint's manifest is missing (removed by a saver, or never committed)",
                                     Location(where)) from None
                raise
        else:
            size = store.size(where)
            if size is None:
                raise MissingDir("the checkpoint's manifest is missing (removed by a saver, or never committed)", Location(where))
            if size > MAX_MANIFEST:
                raise DataError(f"manifest has {size} bytes, more than the {MAX_MANIFEST} this xser reads", Location(where))
            try:
                raw = store.read_bytes(where, "manifest.json", limit=MAX_MANIFEST)
            except DataError:
                if store.size(where) is None:
                    raise MissingDir("the checkpoint's manifest was removed while it was read", Location(where)) from None
                raise
        if expect is not None:
            if len(raw) != expect[0]:
                have = f"more than {expect[0]}" if len(raw) > expect[0] else str(len(raw))
                raise DataError(f"manifest has {have} bytes, the commit record says {expect[0]}", Location(where))
            check_digest(expect[1], digest_bytes(raw, expect[1][0]), where)
        return cls(store, path, parse_manifest(raw, where))

    def where(self, rel: str) -> str:
        return self.store.join(self.path, rel)

    def open_file(self, rel: str, *, whole: bool = False) -> ReadFile:  # type: ignore[override]
        """``rel`` open for reading: no request when the manifest gives its size; ``whole`` (the caller reads all of
        it): files up to ``WHOLE_READ`` bytes come in one GET, larger ones in two (the first ``HEAD_READ`` bytes, then
        the rest); otherwise the first read from the start fetches ``HEADER_READ`` bytes (a format's header), and
        every later read is a GET of exactly its bytes (row ranges)."""
        full = self.where(rel)
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
            raise DataError(f"unsafe file name {rel!r} (must be a relative path inside the directory)", Location(full))
        size = self._sizes().get(rel)
        head = (size if size is not None and size <= WHOLE_READ else HEAD_READ) if whole else HEADER_READ
        try:
            return self.store.open_read(full, f"file {rel!r}", size=size, head=head, missing=lambda: self._missing(rel))
        except DataError:
            if self.store.size(full) is not None:
                raise
            raise self._missing(rel) from None

    def _missing(self, rel: str) -> DataError:
        """The error for a file of the manifest that is not there: the checkpoint was removed while it was read
        (``CheckpointVanished``), or the file alone is missing."""
        if self.removed():
            return CheckpointVanished("the checkpoint was removed while it was being read", Location(self.path))
        return DataError(f"file {rel!r} named in the manifest is missing", Location(self.where(rel)))

    def _sizes(self) -> dict[str, int]:
        """{file: bytes} of every file the manifest names (a file two blocks give different sizes is left out)."""
        sizes = self.__dict__.get("_file_sizes")
        if sizes is None:
            sizes, bad = {}, set()
            m = self.manifest
            entries = [e for ps in m.entries.values() for e in ps.values()] + list(m.state_entries.values())
            blocks = [b for e in entries for b in e.blocks] + ([m.spec] if m.spec is not None else [])
            for b in blocks:
                if sizes.setdefault(b.file, b.bytes) != b.bytes:
                    bad.add(b.file)
            for f in bad:
                del sizes[f]
            self.__dict__["_file_sizes"] = sizes
        return sizes

    def removed(self) -> bool:
        return self.store.size(self.where(MANIFEST)) is None

    def _map_npy(self, entry: Any) -> None:
        return None  # nothing to map on an object store (``_read_block`` maps a local copy)

    def _read_block(self, entry: ParamEntry, block: Block, rows: tuple[int, int] | None, *, mmap: bool, verify: bool) -> np.ndarray:
        if not (mmap and rows is None and block.format == "npy" and block.key is None and block.offset is None):
            return super()._read_block(entry, block, rows, mmap=mmap, verify=verify)
        where = self.where(block.file)
        fd, local = tempfile.mkstemp(prefix="xser-map-", suffix=".npy")
        try:
            with os.fdopen(fd, "w+b") as copy:
                with self.open_file(block.file) as src:
                    shutil.copyfileobj(src, copy, COPY_CHUNK)  # type: ignore[misc]
                copy.flush()
                os.unlink(local)  # the mapping keeps the copy; nothing is left behind
                copy.seek(0)
                _, bshape = block.box(entry.shape)
                return get_format("npy").read(copy, where, entry.dtype, bshape, block.bytes, mmap=True,
                                              verify=block.checksum if verify else None)
        finally:
            if os.path.lexists(local):
                os.unlink(local)

    def close(self) -> None:
        held = self.__dict__.pop("_containers", {})
        for f, _ in held.values():
            f.close()

    def __del__(self) -> None:
        pass
