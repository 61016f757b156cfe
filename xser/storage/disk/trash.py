"""Deleting the checkpoints a ``CheckpointSaver`` replaced or pruned on a background thread, after its save returned.

A checkpoint a save replaces or prunes is first renamed to a trash name (``.old-*`` or ``.tmp-*``), which no
listing shows: from then on it is not part of the model, whatever happens to it. Deleting it takes a rmdir per
directory and an unlink per file, which a filesystem may make slow (on ext4 a file whose blocks were fsynced frees
them on unlink: ~2 ms a file on a VM disk; a durable save of 10 small files spent more time deleting the old
checkpoint than writing the new one). So a ``CheckpointSaver`` hands it to one deleter thread and returns; its
next save's work overlaps the deletion.

- A process killed before the deletion leaves the trash name; the next save of the model removes it
  (``commit.remove_leftovers``), as it removes anything an interrupted save left. Trash this process is deleting is
  skipped there (``pending``), not deleted twice.
- A reader that still has the checkpoint open keeps it, as before (``commit.discard``).
- At most ``MAX_PENDING`` deletions wait: a save that would queue more waits for one to finish (disk use stays
  bounded when saves come faster than deletions).
- ``drain()`` waits for every deletion: ``CheckpointSaver.close()`` (and the end of its ``with`` block) calls it
  before it lets the model lock go, and so does the interpreter's exit. A forked child starts with none pending
  (the parent's thread deletes them).
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from collections.abc import Callable, Iterable

__all__ = ["MAX_PENDING", "defer", "drain", "pending"]

#: deletions queued or running at once: a save that would queue more waits (the one of the save before it overlaps
#: the next save's work; disk use stays within one extra checkpoint or two)
MAX_PENDING = 2

_cond = threading.Condition()
_queue: collections.deque = collections.deque()
_pending: set[str] = set()  # absolute paths queued or being deleted
_thread: threading.Thread | None = None


def pending(path: str) -> bool:
    """Whether this process's deleter has ``path`` queued or is deleting it."""
    with _cond:
        return os.path.abspath(path) in _pending


def defer(paths: Iterable[str | None], delete: Callable[[str], object]) -> None:
    """Delete each path with ``delete(path)`` on the deleter thread (after the caller returns)."""
    global _thread
    with _cond:
        for p in paths:
            if p is None:
                continue
            while len(_pending) >= MAX_PENDING:
                _cond.wait()
            full = os.path.abspath(p)
            _pending.add(full)
            _queue.append((full, delete))
            _cond.notify_all()
        if _thread is None and _queue:
            _thread = threading.Thread(target=_run, name="xser-trash", daemon=True)
            _thread.start()


def _run() -> None:
    while True:
        with _cond:
            while not _queue:
                _cond.wait()
            path, delete = _queue.popleft()
        try:
            delete(path)
        except Exception:  # noqa: BLE001 - a trash name left behind is removed by the next save
            pass
        finally:
            with _cond:
                _pending.discard(path)
                _cond.notify_all()


def drain() -> None:
    """Wait until every deletion handed to the deleter is done."""
    with _cond:
        while _pending:
            _cond.wait()


def _reset_after_fork() -> None:
    global _cond, _thread
    _cond = threading.Condition()
    _queue.clear()
    _pending.clear()
    _thread = None


os.register_at_fork(after_in_child=_reset_after_fork)
atexit.register(drain)
