"""Async saves (``CheckpointSaver.save(..., blocking=False)``): the snapshot on the caller's thread, the rest behind it.

``HostBuffer.isolate`` copies every array of a snapshot (parameters, tables, training state; device tensors
copied off the device) into host arrays that the saver keeps and reuses from one save to the next while the
shapes stay the same, so a change to the model made after ``save()`` returns never reaches that checkpoint
and host memory does not grow with the number of saves. The plan, write, finish and publish steps then run
on one background thread (``PendingSave``); they spend their time writing and hashing large buffers, which
release the GIL. One save is pending at a time: the next save, ``close()`` and the end of a ``with`` block
wait for it.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import attrs
import numpy as np

from ..errors import CheckpointError
from ..storage.payloads import Lazy, identity
from .common import SaveReport
from .snapshot import Snapshot

__all__ = ["HostBuffer", "PendingSave"]


class HostBuffer:
    """The host arrays of one saver's async snapshots, ``{(place, name): array}``, reused while shapes stay the same."""

    def __init__(self) -> None:
        self.arrays: dict[tuple, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def _copy(self, key: tuple, item: Any, used: set) -> Any:
        if not isinstance(item, (np.ndarray, Lazy)):
            return item  # files of a published checkpoint (never changed in place)
        shape, dtype = tuple(item.shape), np.dtype(item.dtype)
        buf = self.arrays.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            self.arrays.pop(key, None)  # (the old one goes before the new one is made)
            buf = item.alloc() if isinstance(item, Lazy) and item.alloc is not None else np.empty(shape, dtype)
            self.arrays[key] = buf
        used.add(key)
        if isinstance(item, Lazy):
            if item.into is not None:
                item.into(buf)
            else:
                buf[...] = item.take()
        else:
            np.copyto(buf, item, casting="no")
        return buf

    def isolate(self, snap: Snapshot) -> Snapshot:
        """``snap`` with every array replaced by its copy in this buffer; buffers no longer used are let go."""
        used: set = set()
        copies: dict[Any, np.ndarray] = {}  # one tensor under two names: copied once, both names keep sharing it
        arrays: dict = {}
        for sub, items in snap.arrays.items():
            place = snap.layout[sub][0] if sub in snap.layout else sub
            out = {}
            for name, spec in items.items():
                item = spec[0]
                same = identity(item)  # the same memory under two names (tied weights, views of one tensor)
                if same is not None and same in copies:
                    out[name] = (copies[same], *spec[1:])
                    continue
                copy = self._copy(("param", place, name), item, used)
                if same is not None:
                    copies[same] = copy
                out[name] = (copy, *spec[1:])
            arrays[sub] = out
        state = None
        if snap.state_arrays is not None:
            state = {k: self._copy(("state", k), v, used) for k, v in snap.state_arrays.items()}
        for key in set(self.arrays) - used:
            del self.arrays[key]
        return attrs.evolve(snap, arrays=arrays, state_arrays=state)


class PendingSave:
    """An async save in progress. ``result()`` waits and gives its ``SaveReport`` (or raises its error);
    ``done()`` says whether it has finished."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future
        self.seen = False  # its outcome was given to the caller (result() or a later save raised it)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> SaveReport:
        try:
            report = self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise CheckpointError(f"the async save is still running after {timeout:g} s") from None
        except BaseException:
            if self._future.done():  # the save's own error (not the caller's Ctrl-C while it waited)
                self.seen = True
            raise
        self.seen = True
        return report

    def wait(self) -> BaseException | None:
        """Wait for it; its error, if it failed and nobody has seen that yet. An interruption of the wait itself
        (``KeyboardInterrupt``, ``SystemExit``) is raised, and the save is still pending."""
        try:
            self._future.result()
        except BaseException as e:
            if not self._future.done():
                raise
            if not self.seen:
                self.seen = True
                return e
        return None

    def __repr__(self) -> str:
        return f"<PendingSave {'done' if self.done() else 'running'}>"
