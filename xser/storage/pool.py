"""The thread pools: one for file I/O, one for compute helpers that file tasks wait on.

numpy copies, ``readinto`` and the hashes release the GIL, so two cores read or write two files
at once. A task on the I/O pool may wait for compute tasks (the text formatter does); they run on
the second pool so that a full I/O pool can never wait on itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["cpu_pool", "pool", "run_all"]

T = TypeVar("T")
R = TypeVar("R")

_POOL: ThreadPoolExecutor | None = None
_CPU: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _reset_after_fork() -> None:
    global _POOL, _CPU, _LOCK
    _POOL = _CPU = None  # a forked child has none of the parent's threads
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _get(name: str, workers: int, prefix: str) -> ThreadPoolExecutor:
    with _LOCK:
        ex = globals()[name]
        if ex is None:
            ex = globals()[name] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
        return ex


def pool() -> ThreadPoolExecutor:
    """The shared pool for file I/O, made on first use (at most 8 threads, at least 2)."""
    ex = _POOL
    return ex if ex is not None else _get("_POOL", max(2, min(8, os.cpu_count() or 2)), "xser-io")


def cpu_pool() -> ThreadPoolExecutor:
    """Threads for compute helpers (formatting text) that I/O tasks submit to and wait on."""
    return _get("_CPU", max(2, min(4, os.cpu_count() or 2)), "xser-cpu")


def run_all(fn: Callable[[T], R], items: list[T], threads: int) -> list[R]:
    """``fn(item)`` for every item on the I/O pool, at most ``threads`` at a time, results in order.

    The first failure stops what has not started and is raised once the running calls finish
    (nothing is left writing behind the caller's back).
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    results: list[Any] = [None] * len(items)
    todo = iter(enumerate(items))
    running: dict[Future, int] = {}
    error: BaseException | None = None
    ex = pool()

    def submit() -> bool:
        nxt = next(todo, None)
        if nxt is None:
            return False
        running[ex.submit(fn, nxt[1])] = nxt[0]
        return True

    for _ in range(threads):
        if not submit():
            break
    while running:
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for fut in done:
            i = running.pop(fut)
            try:
                results[i] = fut.result()
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the others finish
                if error is None:
                    error = e
            if error is None:
                submit()
    if error is not None:
        raise error
    return results
