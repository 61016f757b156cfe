"""The collector pause of saves and loads (xser.storage.gcpause): nesting, threads, a caller's own gc.disable, fork."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from xser.storage import gcpause


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_nested_pauses_end_with_the_outermost():
    with gcpause.paused():
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_callers_own_disable_is_left_as_it_is():
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()


def test_an_error_inside_ends_the_pause():
    with pytest.raises(KeyError):
        with gcpause.paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_other_threads_never_pause_the_collector():
    """Saves and loads on other threads (a server's pool, an async save's thread) leave the collector on: overlapping
    calls there could otherwise keep it off for good."""
    seen = []

    def other():
        with gcpause.paused():
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=other) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [True, True, True] and gc.isenabled()


def test_a_process_forked_inside_a_pause_collects():
    """A child forked inside a pause runs with the collector on, and the end of the pause it inherited changes
    nothing there."""
    with gcpause.paused():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = gc.isenabled()
            try:
                with gcpause.paused():
                    ok = ok and not gc.isenabled()
            finally:
                pass
            ok = ok and gc.isenabled()
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
        assert not gc.isenabled()
    assert got == b"1" and gc.isenabled()
