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


def test_overlapping_pauses_in_two_threads():
    inside, leave = threading.Event(), threading.Event()

    def other():
        with gcpause.paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with gcpause.paused():
        pass
    assert not gc.isenabled()  # the other thread's pause is still on
    leave.set()
    t.join(10)
    assert gc.isenabled()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python >= 3.12
def test_a_process_forked_during_a_pause_collects():
    """A child forked while another thread's save has the collector paused (a DataLoader's workers started during an
    async save) runs with the collector on."""
    inside, leave = threading.Event(), threading.Event()

    def saver():
        with gcpause.paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=saver)
    t.start()
    inside.wait(10)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            with gcpause.paused():
                pass
            os.write(w, b"1" if gc.isenabled() else b"0")
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
    finally:
        leave.set()
        t.join(10)
    assert got == b"1"
    assert gc.isenabled()
