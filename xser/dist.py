"""Coordinators: how the processes of one job save one checkpoint together (``docs/distributed.md``).

A coordinator knows its ``rank`` and ``world_size`` and moves small Python values (plans, sizes, checksums,
outcomes; never array bytes) between rank 0 and the others, each transfer with a deadline. ``Local()`` is a
world of one (the default). ``TorchDistributed()`` runs over ``torch.distributed``'s key-value store under
a prefix of its own, so its messages never interleave with the trainer's collectives (NCCL or gloo), and
rank 0 hears from each rank on its own: a rank that raised, died or hangs is known by its number.

Saves and loads run in *rounds* (``round_``): every rank does its part of a phase, rank 0 gathers what each
rank made (or the error it raised, as text: exceptions are never pickled), decides, and broadcasts the
decision or the failure; every rank then returns the decision or raises. So all ranks leave a round
together, and a failure anywhere becomes, on every rank, a ``CheckpointError`` that names the failed rank
and the phase. A rank that does not answer within ``timeout`` seconds counts as failed; after that (or
after a rank died) the coordinator is unusable, and says so: make a new one once the job has restarted.
"""

from __future__ import annotations

import contextlib
import contextvars
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from .errors import CheckpointError, XserError

__all__ = ["DEFAULT_TIMEOUT", "Coordinator", "Local", "RankFailure", "TorchDistributed", "current", "round_", "rows", "turns", "using"]

T = TypeVar("T")

#: seconds a rank waits for another in one phase of a save before it names it as failed
DEFAULT_TIMEOUT = 60.0



class RankFailure(CheckpointError):
    """Another rank of the job failed (raised, died, or did not answer in time) in a phase of a save or load."""


class Coordinator(Protocol):
    """What the save pipeline needs of a group of processes. ``gather`` and ``broadcast`` never raise for
    another rank's failure: ``gather`` gives rank 0 ``("failed", reason)`` in that rank's place, and
    ``broadcast`` raises ``RankFailure`` on a rank that hears nothing from rank 0 in time."""

    rank: int
    world_size: int
    timeout: float

    def gather(self, value: Any, what: str) -> list[Any] | None:
        """Rank 0: every rank's ``value`` in rank order (``("failed", reason)`` for a rank that died or timed out);
        other ranks: None."""
        ...

    def broadcast(self, value: Any, what: str) -> Any:
        """Rank 0 sends ``value``; every rank returns it."""
        ...

    def claim(self, what: str) -> None:
        """Rank 0, once every rank answered and before it makes a decision that cannot be undone (publishing): raise
        ``RankFailure`` if a rank has given up waiting for it. A rank whose ``broadcast`` times out after the claim waits
        once more. (Optional: ``round_`` skips it on a coordinator without it.)"""
        ...


class Local:
    """A world of one process: rank 0 of 1. Rounds cost nothing."""

    rank = 0
    world_size = 1
    timeout = DEFAULT_TIMEOUT

    def gather(self, value: Any, what: str) -> list[Any] | None:
        return [value]

    def broadcast(self, value: Any, what: str) -> Any:
        return value

    def claim(self, what: str) -> None:
        pass

    def __repr__(self) -> str:
        return "xser.dist.Local()"


class TorchDistributed:
    """The ranks of a ``torch.distributed`` job (or of ``group``), talking through the job's key-value store.

    Create it on every rank after ``torch.distributed.init_process_group`` (any backend; NCCL jobs too), in the
    same order on every rank. Its messages are keys of the job's store under a prefix of its own, so they never
    interleave with the trainer's collectives, and every wait has a deadline that names the rank it waited for
    (``docs/distributed.md`` says why not gloo point-to-point: a gloo timeout closes every connection of its
    context, so the ranks still alive could not be told which rank failed). ``timeout``: seconds one rank
    waits for another in one phase (default 60); rank 0 gives up on a silent rank after 0.8 of it, the others
    on a silent rank 0 after all of it. A phase lasts at most one rank's share of the writes: raise the timeout
    for shares that take longer to write. A rank that gives up on rank 0 says so in the store, and rank 0 then does
    not publish (``claim``); a rank whose wait ends once rank 0 has begun to publish waits one more ``timeout``, and
    if rank 0 dies meanwhile it raises saying that the checkpoint may or may not have been published.
    """

    _made: dict[tuple, int] = {}  # coordinators made in this process, per group: each gets its own key prefix

    def __init__(self, group: Any = None, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            import torch.distributed as dist
        except ImportError:
            raise CheckpointError("xser.dist.TorchDistributed needs torch (pip install 'xser[torch]')") from None
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
            raise CheckpointError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise CheckpointError("torch.distributed is not initialized: call torch.distributed.init_process_group first")
        ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
        if dist.get_rank() not in ranks:
            raise CheckpointError(f"this process (global rank {dist.get_rank()}) is not in the group (ranks {list(ranks)})")
        n = TorchDistributed._made.get(ranks, 0)
        TorchDistributed._made[ranks] = n + 1
        key = "-".join(map(str, ranks)) if len(ranks) <= 16 else f"{ranks[0]}-{len(ranks)}-{hash(ranks) & 0xffffffff:08x}"
        self._store = dist.PrefixStore(f"xser/{key}/{n}/", dist.distributed_c10d._get_default_store())
        self.rank = ranks.index(dist.get_rank())
        self.world_size = len(ranks)
        self.timeout = float(timeout)
        self._seq = 0
        self._broken: str | None = None

    def __repr__(self) -> str:
        return f"xser.dist.TorchDistributed(rank={self.rank}, world_size={self.world_size}, timeout={self.timeout:g})"

    def _check(self) -> None:
        if self._broken is not None:
            raise RankFailure(f"this coordinator is unusable since {self._broken}; once the job restarts, make a new one")

    def _unreachable(self, e: Exception, what: str) -> RankFailure:
        self._broken = "the job's store is unreachable"
        return RankFailure(f"the job's store is unreachable while {what} (rank 0 died, or the launcher that holds the store): "
                           f"{_first_line(e)}")

    def _wait_for(self, keys: dict[int, str], seconds: float, what: str) -> dict[int, Any]:
        """The value of each rank's key, or ``("failed", reason)`` for a rank that set none within ``seconds``.

        Polls with ``check`` and short sleeps rather than one long ``wait``: torch's store client serialises its
        calls, so a long wait here (an async save's background thread) would hold up the trainer's own use of the
        store (a new process group, NCCL's lazy setup) for as long as it waits."""
        deadline = time.monotonic() + seconds
        out: dict[int, Any] = {}
        late: list[int] = []
        pause = 0.0005
        try:
            for r, key in keys.items():
                while not self._store.check([key]):
                    if late or time.monotonic() >= deadline:
                        late.append(r)
                        break
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
                else:
                    out[r] = pickle.loads(self._store.get(key))
        except RuntimeError as e:  # a lost connection (DistNetworkError, DistStoreError are RuntimeErrors)
            raise self._unreachable(e, what) from None
        for r in late:
            out[r] = ("failed", (f"rank {r} did not answer within {seconds:g} s while {what} "
                                 "(it died, hangs, or is slower than the timeout)"))
        if late:
            self._broken = f"rank {', '.join(map(str, late))} did not answer in time"
        return out

    def gather(self, value: Any, what: str) -> list[Any] | None:
        self._check()
        self._seq += 1
        key = f"{self._seq}/g/"
        try:
            if self.rank != 0:
                self._store.set(key + str(self.rank), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
                return None
            # rank 0 gives up on a rank before the others give up on rank 0, so that they hear which rank failed
            got = self._wait_for({r: key + str(r) for r in range(1, self.world_size)}, self.timeout * 0.8, what)
            for r in got:
                self._store.delete_key(key + str(r))
        except RuntimeError as e:
            raise self._unreachable(e, what) from None
        return [value] + [got[r] for r in range(1, self.world_size)]

    def claim(self, what: str) -> None:
        # one key per round, set by whoever comes first: rank 0 ("0") before it decides, or a rank that gave up on it
        try:
            first = self._store.compare_set(f"{self._seq + 1}/c", "", "0").decode()
        except RuntimeError as e:
            raise self._unreachable(e, what) from None
        if first != "0":
            raise RankFailure(f"rank {first} gave up waiting for rank 0 while {what}: rank 0 was slower than the timeout "
                              f"({self.timeout:g} s)")

    def broadcast(self, value: Any, what: str) -> Any:
        self._seq += 1
        key = f"{self._seq}/b"
        if self.rank == 0:  # even when broken: the ranks still there must hear the outcome
            try:
                self._store.set(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
                if self._seq > 2:  # the one before: every rank still there has read it
                    self._store.delete_key(f"{self._seq - 2}/b")
                    self._store.delete_key(f"{self._seq - 2}/c")
            except RuntimeError as e:
                raise self._unreachable(e, what) from None
            return value
        self._check()
        got = self._wait_for({0: key}, self.timeout, what)[0]
        if isinstance(got, tuple) and got[:1] == ("failed",):
            # rank 0 is silent: it commits only if no rank gave up on it first (claim); if it claimed, it is committing
            try:
                first = self._store.compare_set(f"{self._seq}/c", "", str(self.rank)).decode()
            except RuntimeError as e:
                raise self._unreachable(e, what) from None
            if first != "0":
                raise RankFailure(got[1])
            self._broken = None
            got = self._wait_for({0: key}, self.timeout, what)[0]
            if isinstance(got, tuple) and got[:1] == ("failed",):
                self._broken = "rank 0 did not finish deciding in time"
                raise RankFailure(f"rank 0 began to commit while {what} and did not finish within {2 * self.timeout:g} s "
                                  "(it died or hangs): the checkpoint may or may not have been published")
        return got


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:300]


def describe(e: BaseException) -> str:
    """An exception as one line of text (exceptions are never pickled between ranks: some cannot be)."""
    try:
        text = e.message if isinstance(e, XserError) else str(e)
    except Exception:  # a broken __str__ must not hide the failure
        text = "<unprintable>"
    where = getattr(e, "location", None)
    shown = f"{type(e).__name__}: {text}" + (f" ({where})" if where is not None else "")
    return shown[:4000]


def round_(c: Coordinator, what: str, work: Callable[[], Any], decide: Callable[[list[Any]], T] | None = None, *,
           final: bool = False) -> T | None:
    """One round of a distributed step: every rank runs ``work()``; rank 0 runs ``decide(results)`` on the results in
    rank order and every rank returns its value. If ``work`` raised on a rank (that rank raises its own exception
    again), a rank failed or timed out, or ``decide`` raised (rank 0 raises it again): every other rank raises a
    ``RankFailure`` naming the rank and ``what`` (the phase, such as "writing its blocks").

    ``final``: ``decide`` cannot be undone (it publishes). Rank 0 first claims the decision (``claim``): if a rank has
    already given up waiting for rank 0, nothing is decided and every rank raises; a rank whose wait ends after the
    claim waits once more, so that all ranks return the decision, or all raise."""
    mine: Any
    own: BaseException | None = None  # this rank's own exception, raised again once the round is over
    try:
        mine = ("ok", work())
    except Exception as e:
        own, mine = e, ("error", describe(e))
    if c.world_size == 1:
        if own is not None:
            raise own
        return decide([mine[1]]) if decide is not None else None
    try:
        results = c.gather(mine, what)
    except RankFailure as e:  # rank 0's coordinator is unusable: the others must hear it, not wait for the timeout
        if c.rank != 0:
            raise
        c.broadcast(("error", e.message), what)
        raise
    out: Any
    if c.rank == 0:
        assert results is not None
        bad = [(r, v) for r, v in enumerate(results) if v[0] != "ok"]
        try:
            if bad:
                r, v = bad[0]
                text = v[1] if v[0] == "failed" else f"rank {r} failed while {what}: {v[1]}"
                if len(bad) > 1:
                    text += f" (and rank {', '.join(str(r) for r, _ in bad[1:])})"
                raise RankFailure(text)
            if final and getattr(c, "claim", None) is not None:
                c.claim(what)  # no way back from here: unless a rank already gave up on rank 0, it commits
            out = ("ok", decide([v[1] for v in results]) if decide is not None else None)
        except Exception as e:
            if own is None:
                own = e
            # a RankFailure names the rank that failed: the others raise its text as it is; any other error is rank 0's
            out = ("error", e.message if isinstance(e, RankFailure) else f"rank 0 failed while {what}: "
                   + (e.message if isinstance(e, XserError) else describe(e)))
        c.broadcast(out, what)
    else:
        out = c.broadcast(None, what)
    if out[0] != "ok":
        if own is not None:
            raise own
        raise RankFailure(out[1])
    if own is not None:  # cannot happen: a failed rank makes the round fail
        raise own
    return out[1]


class Turns:
    """The order in which saves use one coordinator: each save takes a ticket when the program asks for it (an async
    save on the caller's thread, before it returns) and runs its rounds when its turn comes, so saves through one
    coordinator (two savers, an async save and another save) run one after the other in program order on every
    rank; interleaved, rank 0 could take one save's message for another's."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def ticket(self) -> int:
        with self._cond:
            self._next += 1
            return self._next - 1

    @contextlib.contextmanager
    def turn(self, ticket: int | None = None) -> Iterator[None]:
        """Wait for ``ticket``'s turn (a new ticket if None), hold it for the block, then pass it on."""
        if ticket is None:
            ticket = self.ticket()
        with self._cond:
            self._cond.wait_for(lambda: self._serving == ticket)
        try:
            yield
        finally:
            with self._cond:
                self._serving += 1
                self._cond.notify_all()


def turns(c: Coordinator) -> Turns:
    """The ``Turns`` of coordinator ``c`` (made on first use)."""
    got = getattr(c, "_xser_turns", None)
    if got is None:
        with _TURNS:
            got = getattr(c, "_xser_turns", None)
            if got is None:
                got = Turns()
                c._xser_turns = got  # type: ignore[attr-defined]
    return got


_TURNS = threading.Lock()


# ---------------------------------------------------------------- the coordinator in effect

_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("xser_coordinator", default=None)


def current() -> Coordinator:
    """The coordinator of the enclosing ``xser.load``/``xser.build``/``using`` block; ``Local()`` outside one."""
    c = _CURRENT.get()
    return Local() if c is None else c


@contextlib.contextmanager
def using(c: Coordinator | None) -> Iterator[Coordinator]:
    """Make ``c`` the coordinator that ``current()`` and ``rows()`` see inside the block (None: no change)."""
    if c is None:
        yield current()
        return
    token = _CURRENT.set(c)
    try:
        yield c
    finally:
        _CURRENT.reset(token)


def rows(n: int, coordinator: Coordinator | None = None) -> tuple[int, int]:
    """This rank's share of ``n`` rows (or hash buckets), split evenly in rank order: ``(start, stop)``. The first
    ``n % world_size`` ranks hold one more. For a table: ``xser.IdSlice(*xser.dist.rows(size), size)``."""
    c = coordinator if coordinator is not None else current()
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CheckpointError(f"rows(n): n must be an int >= 0, got {n!r}")
    base, extra = divmod(n, c.world_size)
    start = c.rank * base + min(c.rank, extra)
    return start, start + base + (1 if c.rank < extra else 0)
