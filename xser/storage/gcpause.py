"""The cyclic garbage collector paused while a save or a load runs on the main thread (``options(..., collect=False)``).

A checkpoint of many arrays makes hundreds of thousands of small objects at once (the manifest's decoded JSON and
its checked entries, the plan, the rendered entries), none of them garbage: each allocation burst sets off the
collector's generations, and its full collections walk every object the process holds (the model's arrays
included) again and again. Measured on 65,536 entries: the manifest check took 2-4x as long with the collector on.

The collector is one per process, so the pause is taken only on the main thread, where a call cannot overlap
another of its own: saves and loads on other threads (a server reading from a pool, an async save's background
thread) run with the collector as it is, so no chain of overlapping calls keeps it off. Reference counting frees
what a paused call drops as usual; cyclic garbage made meanwhile waits until the pause ends. Pauses nest; the
collector runs again when the outermost ends, and only if it ran when it began (a caller's own ``gc.disable()``
before the call is left as it is). A process forked inside a pause runs with the collector as it was before it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_state = [0, False, 0]  # [pauses in progress, whether the collector ran before the first, fork generation]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection while the block runs on the main thread (see the module's docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state[0] == 0:
        _state[1] = gc.isenabled()
        gc.disable()
    _state[0] += 1
    generation = _state[2]
    try:
        yield
    finally:
        if generation == _state[2]:  # (a forked child's pauses ended at the fork)
            _state[0] -= 1
            if _state[0] == 0 and _state[1]:
                gc.enable()


def _after_fork_in_child() -> None:
    if _state[0] and _state[1]:
        gc.enable()
    _state[0], _state[1], _state[2] = 0, False, _state[2] + 1


os.register_at_fork(after_in_child=_after_fork_in_child)
