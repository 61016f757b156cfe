"""The cyclic garbage collector paused while a save or a load runs (``options(..., collect=False)``).

A checkpoint of many arrays makes hundreds of thousands of small objects at once (the manifest's decoded JSON and
its checked entries, the plan, the rendered entries), none of them garbage: each allocation burst sets off the
collector's generations, and its full collections walk every object the process holds (the model's arrays
included) again and again. Measured on 65,536 entries: the manifest check took 2-4x as long with the collector on.
Reference counting frees what these calls drop as usual; cyclic garbage made meanwhile (by any thread) waits until
the outermost pause ends. Pauses nest and may overlap across threads: the collector runs again when the last one
ends, and only if it ran before the first one began (a caller's own ``gc.disable()`` is left as it is).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_LOCK = threading.Lock()
_state = [0, False]  # [pauses in progress, whether the collector ran before the first]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection while the block runs (see the module's docstring)."""
    with _LOCK:
        if _state[0] == 0:
            _state[1] = gc.isenabled()
            gc.disable()
        _state[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _state[0] -= 1
            if _state[0] == 0 and _state[1]:
                gc.enable()


def _after_fork_in_child() -> None:
    """A process forked while another thread's save or load had the collector paused (a DataLoader starting its
    workers during an async save) holds none of those pauses: the collector runs there as it ran before them."""
    global _LOCK
    _LOCK = threading.Lock()
    if _state[0] and _state[1]:
        gc.enable()
    _state[0], _state[1] = 0, False


os.register_at_fork(after_in_child=_after_fork_in_child)
