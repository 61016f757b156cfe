"""A checkpoint being written to an object store: its own prefix, a local spool, upload threads (``RemoteStaging``).

``stage_remote`` makes one; the write step (``write.write(..., sink=staging)``) hands each finished file to it,
and it uploads the file on threads of its own (or copies it on the server when its bytes equal the previous
checkpoint's); ``finish_remote`` writes the manifest last. ``commit.commit`` then publishes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import attrs

from ..checksums import DEFAULT_CHECKSUM, digest_bytes
from ..manifest import MANIFEST, render_manifest
from ..spool import spool_dir
from ..stores.base import Store
from ..write import WriteResult
from .commit import data_root, prefix_name
from .opened import RemoteDir

__all__ = ["RemoteStaging", "entry_of", "finish_remote", "stage_remote"]


@attrs.define
class RemoteStaging:
    """A checkpoint being written under its own prefix (``dir``) of the model's data root."""

    store: Any
    spec_path: str
    seq: int
    id: str
    path: str  # the prefix URL
    spool: str  # a local directory the writers fill, one file at a time, before each is uploaded
    manifest: dict = attrs.field(factory=dict)
    manifest_bytes: bytes = b""
    written: int = 0
    linked: int = 0
    uploads: int = 2  # files uploaded at once (``start``): the save's writer threads
    _uploader: ThreadPoolExecutor | None = None
    _pending: set[Future] = attrs.field(factory=set)  # uploads not finished (finished ones leave at once)
    _failed: list[BaseException] = attrs.field(factory=list)
    _slots: threading.Semaphore | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    @property
    def dir(self) -> str:
        return prefix_name(self.seq, self.id)

    # -- the write step's sink (``write.write(..., sink=)``)

    def linker(self, rel: str) -> Any:
        store = self.store
        dst = store.join(self.path, rel)

        def link(source: Any, src_rel: str, _spool_path: str) -> bool:
            if isinstance(source, RemoteDir) and source.store is store:
                store.copy(source.where(src_rel), dst)  # server-side: no byte passes through this process
                return True
            return False

        return link

    def start(self, uploads: int) -> None:
        """Upload on ``uploads`` threads of their own: a writer hands its finished file over and writes the next one
        while it is uploaded, so ``uploads`` requests stay in flight. At most ``uploads`` files wait or upload at once
        (a writer with one more waits): the spool holds at most ``uploads`` + the writers' files."""
        self.uploads = max(1, uploads)
        self._uploader = ThreadPoolExecutor(self.uploads, thread_name_prefix="xser-upload")
        self._slots = threading.Semaphore(self.uploads)

    def done(self, rel: str, path: str, result: WriteResult) -> None:
        if result.linked and not os.path.exists(path):
            return  # copied on the server
        if self._uploader is None:
            self._upload(rel, path)
            return
        self._raise_failed()
        assert self._slots is not None
        self._slots.acquire()
        try:
            fut = self._uploader.submit(self._upload, rel, path)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._finished)

    def _finished(self, fut: Future) -> None:
        """An upload ended: it leaves the pending set (so every check costs O(1), not O(files)), its failure is kept."""
        with self._lock:
            self._pending.discard(fut)
            if not fut.cancelled() and fut.exception() is not None:
                self._failed.append(fut.exception())  # type: ignore[arg-type]
        assert self._slots is not None
        self._slots.release()

    def _upload(self, rel: str, path: str) -> None:
        try:
            self.store.put_file(path, self.store.join(self.path, rel))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _raise_failed(self) -> None:
        with self._lock:
            failed = self._failed[0] if self._failed else None
        if failed is not None:
            raise failed

    def _in_flight(self) -> list[Future]:
        with self._lock:
            return list(self._pending)

    def flush(self) -> None:
        """Wait for every upload; the first failure is raised once none is running."""
        wait(self._in_flight())
        self._raise_failed()

    def stop(self) -> None:
        """Wait for the uploads in flight (none starts after) and end the upload threads."""
        if self._uploader is not None:
            pending = self._in_flight()
            for fut in pending:
                fut.cancel()
            wait(pending)
            self._uploader.shutdown(wait=True)
            self._uploader = None

    def discard(self) -> None:
        self.stop()  # no upload lands after the prefix is removed
        shutil.rmtree(self.spool, ignore_errors=True)
        with contextlib.suppress(Exception):  # best effort: the next commit removes what is left
            self.store.delete_prefix(self.path)


@contextlib.contextmanager
def stage_remote(store: Store, spec_path: str, seq: int, id: str) -> Iterator[RemoteStaging]:
    """A new checkpoint prefix numbered ``seq`` and a local spool directory; both removed if the block fails."""
    spool = spool_dir("spool")
    staging = RemoteStaging(store, spec_path, seq, id, store.join(data_root(store, spec_path), prefix_name(seq, id)), spool)
    try:
        yield staging
    except BaseException as e:
        if getattr(e, "keep_prefix", False):  # a commit whose outcome is unknown: the clean-up decides later
            shutil.rmtree(spool, ignore_errors=True)
        else:
            staging.discard()
        raise
    staging.stop()
    shutil.rmtree(spool, ignore_errors=True)


def finish_remote(staging: RemoteStaging, manifest: dict, written: int, linked: int) -> None:
    """Write the checkpoint's manifest, the last object under its prefix (after every upload has finished)."""
    staging.flush()
    text = render_manifest(manifest).encode("utf-8")
    staging.store.put(staging.store.join(staging.path, MANIFEST), text, create_only=False)
    staging.manifest, staging.manifest_bytes = manifest, text
    staging.written, staging.linked = written, linked


def entry_of(staging: RemoteStaging) -> tuple[str, int, tuple[str, str]]:
    return staging.dir, len(staging.manifest_bytes), (DEFAULT_CHECKSUM, digest_bytes(staging.manifest_bytes))
