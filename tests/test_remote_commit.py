"""The commit step on an object store when answers are lost, listings fail, savers stall or the store has no
conditional writes: a record never names a missing object, and a committed checkpoint is never deleted.

Each case makes the store misbehave at one request (``FsspecStore`` methods patched for one call) on ``memory://``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("fsspec")

import xser  # noqa: E402
from components import Linear  # noqa: E402
from xser.errors import Location, StorageError  # noqa: E402
from xser.storage.stores import store_for  # noqa: E402
from xser.storage.stores.local import AlreadyExists  # noqa: E402
from xser.storage.stores.remote import FsspecStore  # noqa: E402

TIMEOUT = StorageError("cannot read: failed after 4 attempts: timeout")


def linear(value: float) -> Linear:
    lin = Linear(3, 2)
    lin.W[...] = value
    lin.b[...] = value
    return lin


def objects(url: str) -> list[str]:
    base = url.rsplit("/", 1)[0]
    return sorted(k[len(url):] for k in store_for(url).list(base) if k.startswith(url + ".data/0"))


def test_a_lost_reply_then_an_unreadable_record_keeps_the_checkpoint(memory_url, monkeypatch):
    """The create is applied, its answer lost (the retry finds the name taken), and the record cannot be read back:
    the save cannot tell whether it committed, says so, and keeps its objects; the record names them, so the model
    loads the new state, and the next save goes on."""
    url = f"{memory_url}/m.yaml"
    lin = linear(1.0)
    xser.save(lin, url)
    real_put, real_read = FsspecStore.put, FsspecStore.read_bytes
    state = {"armed": True, "fail_read": False}

    def put(self, path, data, *, create_only=False, durable=True):
        if create_only and "/commits/" in path and state["armed"]:
            state["armed"] = False
            real_put(self, path, data, create_only=True, durable=durable)
            state["fail_read"] = True
            raise AlreadyExists("the object exists already (another writer was first)", Location(path))
        return real_put(self, path, data, create_only=create_only, durable=durable)

    def read_bytes(self, path, what, *, limit=None):
        if state["fail_read"] and "/commits/" in path:
            state["fail_read"] = False
            raise StorageError("cannot read: failed after 4 attempts: timeout", Location(path))
        return real_read(self, path, what, limit=limit)

    monkeypatch.setattr(FsspecStore, "put", put)
    monkeypatch.setattr(FsspecStore, "read_bytes", read_bytes)
    lin.W[...] = 2.0
    with pytest.raises(xser.CheckpointError) as e:
        xser.save(lin, url)
    assert str(e.value) == (f"{url}: commit 2 exists but could not be read back to tell whether it is this save's; this "
                            "save's objects are kept (the next save or listing tells)")
    assert np.all(xser.load(url).W == 2.0)
    lin.W[...] = 3.0
    xser.save(lin, url)
    assert np.all(xser.load(url).W == 3.0)
    assert len({k.split("/")[1] for k in objects(url)}) == 1


def test_a_stalled_saver_that_cannot_list_does_not_clean_up(memory_url, monkeypatch):
    """A saver stalls before its commit while another commits 2..5 (their clean-up deletes record 2); it then creates
    record 2 and cannot list the records to see it is stale: an error, and nothing of the newest record is deleted."""
    url = f"{memory_url}/m.yaml"
    lin = linear(1.0)
    xser.save(lin, url)
    go, stalled = threading.Event(), threading.Event()
    real_put, real_list = FsspecStore.put, FsspecStore.listdir
    fail = {"list": False}

    def put(self, path, data, *, create_only=False, durable=True):
        if create_only and "commits/" in path and threading.current_thread().name == "stalled":
            stalled.set()
            go.wait(30)
            real_put(self, path, data, create_only=True, durable=durable)
            fail["list"] = True
            return
        return real_put(self, path, data, create_only=create_only, durable=durable)

    def listdir(self, path):
        if fail["list"] and threading.current_thread().name == "stalled" and path.endswith("/commits"):
            fail["list"] = False
            raise StorageError("cannot list: failed after 4 attempts: timeout", Location(path))
        return real_list(self, path)

    monkeypatch.setattr(FsspecStore, "put", put)
    monkeypatch.setattr(FsspecStore, "listdir", listdir)
    out: dict = {}

    def stalled_save():
        try:
            xser.save(linear(9.0), url)
        except Exception as e:  # noqa: BLE001 (the test looks at it)
            out["error"] = e

    t = threading.Thread(target=stalled_save, name="stalled")
    t.start()
    assert stalled.wait(30)
    with xser.CheckpointSaver(url, keep=5) as saver:
        for step in (2, 3, 4, 5):
            lin.W[...] = step
            saver.save(lin, step=step)
    go.set()
    t.join(60)
    assert isinstance(out.get("error"), StorageError)
    assert [c.step for c in xser.checkpoints(url)] == [5, 4, 3, 2, None]
    assert np.all(xser.load(url, checkpoint=3).W == 2.0)


def test_a_saver_whose_commit_outcome_was_unknown_goes_on(memory_url, monkeypatch):
    """The create is applied but fails as far as the saver can tell, and the read-back fails too: that save raises;
    the checkpoint is committed, and the saver's next save recognises its own commit and goes on."""
    url = f"{memory_url}/m.yaml"
    lin = linear(1.0)
    real_put, real_read = FsspecStore.put, FsspecStore.read_bytes
    state = {"armed": False, "fail_read": False}

    def put(self, path, data, *, create_only=False, durable=True):
        if create_only and "commits/" in path and state["armed"]:
            state["armed"] = False
            real_put(self, path, data, create_only=True, durable=durable)
            state["fail_read"] = True
            raise StorageError("cannot write: failed after 4 attempts: timeout", Location(path))
        return real_put(self, path, data, create_only=create_only, durable=durable)

    def read_bytes(self, path, what, *, limit=None):
        if state["fail_read"] and "commits/" in path:
            state["fail_read"] = False
            raise StorageError("cannot read: failed after 4 attempts: timeout", Location(path))
        return real_read(self, path, what, limit=limit)

    monkeypatch.setattr(FsspecStore, "put", put)
    monkeypatch.setattr(FsspecStore, "read_bytes", read_bytes)
    with xser.CheckpointSaver(url, keep=3) as saver:
        saver.save(lin, step=1)
        state["armed"] = True
        with pytest.raises(StorageError):
            saver.save(lin, step=2)
        assert [c.step for c in xser.checkpoints(url)] == [2, 1]
        saver.save(lin, step=3)
    assert [c.step for c in xser.checkpoints(url)] == [3, 2, 1]


def test_without_conditional_writes_the_overwritten_saver_loses(memory_url, monkeypatch):
    """On a store whose create is check-then-write, a saver whose record another overwrote between its check and its
    write raises (it reads its record back); the model is the other saver's, whole."""
    url = f"{memory_url}/m.yaml"
    xser.save(linear(1.0), url)
    monkeypatch.setattr(store_for(url), "conditional", False)
    b_checked, a_wrote, b_wrote = threading.Event(), threading.Event(), threading.Event()
    real = FsspecStore._put_memory

    def put_memory(self, p, data, create_only):
        me = threading.current_thread().name
        if "commits/" in p and create_only:
            there = self.fs.exists(p)
            if me == "B":
                b_checked.set()
                a_wrote.wait(10)
            if there:
                raise FileExistsError(p)
            self.fs.pipe_file(p, data)
            if me == "A":
                a_wrote.set()
                b_wrote.wait(10)
            if me == "B":
                b_wrote.set()
            return None
        return real(self, p, data, create_only)

    monkeypatch.setattr(FsspecStore, "_put_memory", put_memory)
    out: dict = {}

    def run(name, value):
        if name == "A":
            b_checked.wait(10)
        try:
            xser.save(linear(value), url)
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = e

    threads = [threading.Thread(target=run, args=("B", 3.0), name="B"), threading.Thread(target=run, args=("A", 2.0), name="A")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out["B"] is None and isinstance(out["A"], xser.CheckpointError)
    assert np.all(xser.load(url).W == 3.0)


def test_a_checkpoint_missing_under_the_newest_record_is_left_out_and_healed(memory_url, caplog):
    """A checkpoint of the newest record deleted by hand (no newer record explains it): listed without it, with a
    warning; the next save commits a record without it."""
    url = f"{memory_url}/m.yaml"
    lin = linear(1.0)
    with xser.CheckpointSaver(url, keep=3) as saver:
        for step in (1, 2, 3):
            lin.W[...] = step
            saver.save(lin, step=step)
    second = sorted({k.split("/")[1] for k in objects(url)})[1]
    store_for(url).delete_prefix(f"{url}.data/{second}")
    assert [c.step for c in xser.checkpoints(url)] == [3, 1]
    assert f"checkpoint {url}.data/{second} named by commit record 3 cannot be read" in caplog.text
    with xser.CheckpointSaver(url, keep=3) as saver:
        lin.W[...] = 4
        saver.save(lin, step=4)
    assert [c.step for c in xser.checkpoints(url)] == [4, 3, 1]
