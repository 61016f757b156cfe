"""A job of N ranks inside one test process: each rank a thread, talking through a shared board.

``run(n, fn)`` starts ``n`` threads, each with its own ``Threaded`` coordinator (rank r of n) made current by
``xser.dist.using``, runs ``fn(c)`` in each and returns the results in rank order (or raises the first rank's
exception, with every rank's outcome attached as ``.outcomes``). ``Threaded`` satisfies the ``Coordinator``
protocol of ``xser.dist``: ``gather`` to rank 0 and ``broadcast`` from rank 0, each with a deadline, values
copied through pickle as between processes. A save or load from 2 or 3 ranks then runs in one pytest process,
much faster than starting gloo jobs.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import xser.dist
from xser.dist import RankFailure

__all__ = ["Board", "Threaded", "run"]


class Board:
    """The messages of one job: ``(sequence number, kind, rank) -> pickled value``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.msgs: dict[tuple, bytes] = {}

    def put(self, key: tuple, value: Any) -> None:
        with self.cond:
            self.msgs[key] = pickle.dumps(value)
            self.cond.notify_all()

    def take(self, key: tuple, deadline: float) -> tuple[bool, Any]:
        with self.cond:
            while key not in self.msgs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, None
                self.cond.wait(left)
            return True, pickle.loads(self.msgs.pop(key) if key[1] == "g" else self.msgs[key])


class Threaded:
    """Rank ``rank`` of the job on ``board``."""

    def __init__(self, board: Board, rank: int, timeout: float = 20.0) -> None:
        self.board, self.rank, self.world_size, self.timeout = board, rank, board.n, timeout
        self._seq = 0

    def __repr__(self) -> str:
        return f"Threaded(rank={self.rank}, world_size={self.world_size})"

    def gather(self, value: Any, what: str) -> list[Any] | None:
        self._seq += 1
        if self.rank != 0:
            self.board.put((self._seq, "g", self.rank), value)
            return None
        deadline = time.monotonic() + self.timeout * 0.8
        out = [value]
        for r in range(1, self.world_size):
            ok, got = self.board.take((self._seq, "g", r), deadline)
            out.append(got if ok else ("failed", f"rank {r} did not answer within {self.timeout * 0.8:g} s while {what}"))
        return out

    def broadcast(self, value: Any, what: str) -> Any:
        self._seq += 1
        if self.rank == 0:
            self.board.put((self._seq, "b", 0), value)
            return value
        ok, got = self.board.take((self._seq, "b", 0), time.monotonic() + self.timeout)
        if not ok:
            raise RankFailure(f"rank 0 did not answer within {self.timeout:g} s while {what}")
        if isinstance(got, tuple) and got[:1] == ("failed",):
            raise RankFailure(got[1])
        return got


def run(n: int, fn: Callable[[Threaded], Any], *, timeout: float = 20.0) -> list[Any]:
    """``fn(c)`` on each of ``n`` ranks, in threads; the results in rank order. If a rank raised, the lowest such
    rank's exception is raised again here, with ``.outcomes`` (each rank's result or exception) set on it."""
    board = Board(n)
    outcomes: list[Any] = [None] * n
    failed: list[bool] = [False] * n

    def one(r: int) -> None:
        c = Threaded(board, r, timeout)
        try:
            with xser.dist.using(c):
                outcomes[r] = fn(c)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcomes[r], failed[r] = e, True

    threads = [threading.Thread(target=one, args=(r,), name=f"rank{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
        if t.is_alive():
            raise AssertionError(f"{t.name} still runs after {timeout * 3:g} s")
    for r in range(n):
        if failed[r]:
            e = outcomes[r]
            e.outcomes = outcomes
            raise e
    return outcomes
