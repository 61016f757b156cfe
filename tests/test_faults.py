"""Faults of the commit protocol: failing filesystem calls, full disks, damaged checkpoints, locks.

The fault injection fails each filesystem-changing call of each operation in turn (as a full
disk or a permission problem would), in-process: the operation must raise an ``XserError``
(never a raw ``OSError``), leave the old or the new state, keep no lock, and the next save
must work and leave nothing behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import crash_child as cc
import xser
from components import Linear
from xser.storage.disk.lock import ModelLock


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
@pytest.mark.parametrize("op", ["save", "rotate", "restart", "partial", "avg", "import"])
def test_every_call_failing(tmp_path, monkeypatch, op, code):
    """Whichever call fails, the error is an XserError, the state whole, the lock free, the next save clean."""
    setup, run = cc.OPS[op]
    template, work = tmp_path / "template", tmp_path / "work"
    template.mkdir()
    setup(str(template))
    old = cc.fingerprint(f"{template}/m.yaml")
    shutil.copytree(template, work)
    run(str(work))
    new = cc.fingerprint(f"{work}/m.yaml")
    limit = 1
    while True:
        shutil.rmtree(work)
        shutil.copytree(template, work)

        def fail(code=code):
            raise OSError(code, os.strerror(code), "injected")

        with monkeypatch.context() as m:
            cc.arm(limit, fail, m.setattr)
            try:
                run(str(work))
                finished = True
            except xser.XserError:
                finished = False
        if finished and limit > 60:
            break
        got = cc.fingerprint(f"{work}/m.yaml")
        assert got in (old, new), f"call {limit}: {str(got)[:300]}"
        ModelLock(f"{work}/m.yaml").acquire().release()  # the failed operation holds no lock
        if got[0] == "model":
            xser.save(xser.load(f"{work}/m.yaml"), f"{work}/m.yaml")
            assert cc.fingerprint(f"{work}/m.yaml") == got and cc.leftovers(str(work)) == []
        limit += 1


CHILD_FSIZE = textwrap.dedent("""
    import os, resource, signal, sys
    sys.path.insert(0, {tests!r})
    import numpy as np, components, xser
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    lin = components.Linear(512, 512)
    path = {path!r}
    xser.save(components.Linear(2, 2), path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # a disk that is full after 100 kB per file
    try:
        xser.save(lin, path)
        print("saved")
    except xser.XserError as e:
        print("refused", type(e).__name__, e)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is freed
    with xser.CheckpointSaver(path, keep=2, restart=True) as s:
        s.save(lin, step=1)
    print("saved after", xser.load(path).W.shape)
""")


def test_full_disk_does_not_keep_the_lock(tmp_path):
    """A write that the OS refuses (a file size limit, as a full disk) is a clean error; after space is freed the next save works."""
    path = str(tmp_path / "m.yaml")
    code = CHILD_FSIZE.format(tests=os.path.dirname(__file__), path=path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused DataError") and lines[0].endswith("W.npy: cannot write data directory: File too large"), lines
    assert lines[1] == "saved after (512, 512)"
    assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]


class TestDamaged:
    def test_damaged_newest_is_set_aside_not_deleted(self, tmp_path):
        """xser.save over a .data whose manifest is damaged moves it aside (and says so) instead of deleting it."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        xser.save(lin, path)
        Path(path + ".data/manifest.json").write_text("{ damaged")
        with pytest.raises(xser.DataError, match="corrupt manifest"):
            xser.load(path)
        xser.save(lin, path)
        aside = [n for n in os.listdir(tmp_path) if ".damaged-" in n]
        assert len(aside) == 1 and (tmp_path / aside[0] / "manifest.json").read_text() == "{ damaged"
        assert np.array_equal(xser.load(path).W, lin.W)

    def test_save_keeps_older_checkpoints_after_a_gap(self, tmp_path):
        """After a crash left no .data (only .data.1), xser.save fills slot 0 and keeps the valid older checkpoint."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        with xser.CheckpointSaver(path, keep=3) as saver:
            for step in (1, 2):
                lin.W[...] = step
                saver.save(lin, step=step)
        shutil.rmtree(path + ".data")
        lin.W[...] = 7
        xser.save(lin, path)
        assert [c.step for c in xser.checkpoints(path)] == [None, 1]

    def test_newer_format_in_the_listing(self, tmp_path):
        """A checkpoint written by a newer xser is an error naming its version, never silently skipped."""
        path = str(tmp_path / "m.yaml")
        lin = Linear(2, 3)
        with xser.CheckpointSaver(path, keep=3) as saver:
            for step in (1, 2, 3):
                lin.W[...] = step
                saver.save(lin, step=step)
        mp = Path(path + ".data.1/manifest.json")
        m = json.loads(mp.read_text())
        m["format_version"] = 7
        mp.write_text(json.dumps(m))
        expected = f"{path}.data.1: checkpoint m.yaml.data.1 was written by a newer xser (format_version 7); upgrade xser to read or save this model"
        for call in (lambda: xser.checkpoints(path), lambda: xser.load(path, checkpoint=1), lambda: xser.load(path, checkpoint=2)):
            with pytest.raises(xser.CheckpointError) as info:
                call()
            assert str(info.value) == expected
        with pytest.raises(xser.CheckpointError, match="format_version 7"):
            with xser.CheckpointSaver(path, keep=3) as saver:
                saver.save(lin, step=4)
        assert m["format_version"] == json.loads(mp.read_text())["format_version"]  # untouched


def fsynced_dirs(monkeypatch) -> list[str]:
    seen = []
    real = os.fsync

    def record(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(target):
            seen.append(target)
        return real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return seen


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_durable_save_syncs_the_parent_of_every_new_directory(tmp_path, monkeypatch):
    """Saving into directories that do not exist yet fsyncs each one's parent, and the data directory's parent."""
    seen = fsynced_dirs(monkeypatch)
    xser.save(Linear(2, 2), tmp_path / "a" / "b" / "m.yaml")
    for d in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        assert str(d) in seen, (d, seen)


LOCK_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import components, xser
    saver = xser.CheckpointSaver({path!r}, keep=2)
    pid = os.fork()
    if pid == 0:  # a DataLoader-like worker that outlives its parent; it runs Python only after xser's fork hook
        print(os.getpid(), flush=True)
        time.sleep(30)
        os._exit(0)
    time.sleep(30)
""")


def test_lock_is_not_inherited_by_forked_workers(tmp_path):
    """A saver killed while a forked worker lives leaves no lock behind: the worker never held it."""
    path = str(tmp_path / "m.yaml")
    proc = subprocess.Popen([sys.executable, "-c", LOCK_CHILD.format(tests=os.path.dirname(__file__), path=path)],
                            stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with xser.CheckpointSaver(path, keep=2) as saver:  # the worker is still alive
            saver.save(Linear(2, 2), step=1)
        os.kill(worker, 0)  # (it really was)
    finally:
        os.kill(worker, signal.SIGKILL)
        proc.stdout.close()
