"""Progress bars for long operations: tqdm on a terminal, nothing otherwise.

An operation that knows how many bytes it will move opens ``progress(total, desc)``; code anywhere
below it (writer threads, reader threads) calls ``advance(n)``. A bar appears only for the
outermost operation, only on a terminal (stderr is a TTY), and only when the operation is large
enough to take more than a moment (``MIN_BYTES``). ``XSER_PROGRESS=0`` turns bars off, ``=1`` shows
them even without a terminal. tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["MIN_BYTES", "advance", "progress"]

#: below this an operation takes well under a couple of seconds: no bar
MIN_BYTES = 256 << 20

_lock = threading.Lock()
_current: list[Callable[[int], object]] = []  # the outermost operation's bar (reader and writer threads report to it)
_depth = 0


def _wanted(total: int) -> bool:
    setting = os.environ.get("XSER_PROGRESS", "")
    if setting == "0":
        return False
    if setting == "1":
        return True
    return total >= MIN_BYTES and sys.stderr.isatty()


@contextlib.contextmanager
def progress(total: int, desc: str) -> Iterator[None]:
    """A bar of ``total`` bytes for the operation inside (nested operations report to the outer bar)."""
    global _depth
    with _lock:
        _depth += 1
        outer = _depth == 1
    bar = None
    try:
        if outer and _wanted(total):
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency; a broken install shows no bar
                tqdm = None
            if tqdm is not None:
                bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False, file=sys.stderr)
                with _lock:
                    _current.append(bar.update)
        yield
    finally:
        with _lock:
            _depth -= 1
            if bar is not None:
                _current.remove(bar.update)
        if bar is not None:
            bar.close()


def advance(n: int) -> None:
    """``n`` more bytes done (no-op without a bar)."""
    if _current:
        with _lock:
            for update in _current:
                update(n)
