"""Readers in other processes get the checkpoint they ask for, whole, while a saver rotates and prunes.

A writer process saves again and again with ``keep=K`` (every save prunes one checkpoint and shifts
the others); checkpoint ``s`` holds ``s`` in every array, its training state and its records. Reader
processes meanwhile read with every reader xser has (``load``, ``load(mmap=True)``, ``read_params``
with and without ``rows=``, ``load_training_state``, ``resume``, ``CheckpointReader``, ``inspect``,
``avg``/``convert``/``ensemble`` of it, ``!LoadSerialized`` of it, ``checkpoints()``), asking for
``checkpoint=k`` for every ``k < K``, ``"last"`` and ``"best"``. Those exist at every moment, so every
attempt must succeed with one whole checkpoint (``race_child.py`` says what is checked): zero failures.

The default run takes a few seconds; ``pytest -m campaign tests/test_race.py`` runs the long campaign
(every K from 1 to 4, packed and unpacked, a minute each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "race_child.py")
KINDS = ("load", "load_mmap", "read_params", "training_state", "resume", "reader", "inspect", "avg", "convert", "ensemble",
         "load_serialized", "listing")


def race(tmp_path, *, keep: int, shards: int, seconds: float, readers: int, min_attempts: int) -> tuple[dict, int]:
    """(reads per kind, saves made while the readers read)."""
    path = str(tmp_path / "m.yaml")
    saves = -1
    writer = subprocess.Popen([sys.executable, CHILD, "writer", path, str(seconds + 30), str(keep), str(shards)],
                              stdout=subprocess.PIPE, text=True)
    try:
        while (first := int(writer.stdout.readline() or 10**9)) <= keep:  # every checkpoint asked for exists before readers start
            pass
        groups = [",".join(KINDS[i::readers]) for i in range(readers)]
        procs = []
        for i, kinds in enumerate(groups):
            out = tmp_path / f"out{i}"
            out.mkdir()
            procs.append(subprocess.Popen([sys.executable, CHILD, "reader", kinds, path, str(seconds), str(out), str(keep)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        report = {}
        for p in procs:
            out, err = p.communicate(timeout=seconds + 300)
            assert p.returncode == 0, err[-3000:]
            report.update(json.loads(out.strip().splitlines()[-1]))
        assert writer.poll() is None, "the writer stopped while the readers read"
        saves = xser.checkpoints(path)[0].step - first
    finally:
        writer.kill()
        writer.communicate()
    failures = {kind: rep["failures"][:3] for kind, rep in report.items() if rep["failures"]}
    assert failures == {}, (saves, {k: len(r["failures"]) for k, r in report.items()}, failures)
    attempts = {kind: rep["attempts"] for kind, rep in report.items()}
    assert sorted(attempts) == sorted(KINDS)
    assert min(attempts.values()) >= min_attempts, attempts  # the readers really ran while the writer rotated
    assert saves >= 10, saves  # ... and the writer really rotated while they read (a reader never starves it)
    return attempts, saves


def test_readers_get_whole_checkpoints(tmp_path):
    """Every reader, every selection, zero failures while a saver rotates keep=3 (a few seconds)."""
    attempts, saves = race(tmp_path, keep=3, shards=0, seconds=4.0, readers=3, min_attempts=3)
    print(f"{sum(attempts.values())} reads during {saves} saves, 0 failures: {attempts}")


@pytest.mark.campaign
@pytest.mark.parametrize("shards", [0, 2], ids=["unpacked", "packed"])
@pytest.mark.parametrize("keep", [1, 2, 3, 4])
def test_campaign(tmp_path, keep, shards):
    """The long campaign: a minute per configuration, four reader processes."""
    attempts, saves = race(tmp_path, keep=keep, shards=shards, seconds=60.0, readers=4, min_attempts=50)
    print(f"keep={keep} shards={shards}: {sum(attempts.values())} reads during {saves} saves, 0 failures: {attempts}")


# ---------------------------------------------------------------- the two mechanisms, one moment at a time

import threading  # noqa: E402

import numpy as np  # noqa: E402

import xser  # noqa: E402
from components import Linear  # noqa: E402


def _saved(path, steps, keep=3):
    lin = Linear(4, 4)
    saver = xser.CheckpointSaver(path, keep=keep, durable=False)
    for s in steps:
        lin.W[...] = s
        lin.b[...] = s
        saver.save(lin, step=s)
    return lin, saver


def test_a_reader_waits_for_a_rotation_half_done(tmp_path, monkeypatch):
    """Stopped inside a rotation (the oldest dropped, the others not yet shifted), a saver holds the listing lock:
    a reader of checkpoint 2 (in another thread) waits, then gets the new checkpoint 2 whole, never "no checkpoint 2"."""
    from xser.storage.disk import slots as publish

    path = str(tmp_path / "m.yaml")
    lin, saver = _saved(path, [1, 2, 3])
    got: list = []
    real = publish.to_trash

    def half_done(d, base):
        trash = real(d, base)
        reader = threading.Thread(target=lambda: got.append(xser.read_params(path, checkpoint=2)))
        reader.start()
        reader.join(0.5)
        got.append(reader.is_alive())  # still waiting for the rotation
        got.append(reader)
        return trash

    monkeypatch.setattr(publish, "to_trash", half_done)
    lin.W[...] = lin.b[...] = 4
    saver.save(lin, step=4)
    saver.close()
    waiting, reader = got[0], got[1]
    reader.join(10)
    (sub,) = got[2].values()
    assert waiting is True
    assert {float(v) for a in sub.values() for v in np.unique(a)} == {2.0}  # the new checkpoint 2: step 2
    assert [c.step for c in xser.checkpoints(path)] == [4, 3, 2]


def test_a_pruned_checkpoint_stays_whole_while_it_is_read(tmp_path):
    """A CheckpointReader on checkpoint 2 while three saves prune it: it reads it whole to the end; the saver leaves
    it under its trash name, and the first save after the reader closes removes it."""
    from xser.storage.disk.trash import drain
    from xser.tools.reader import CheckpointReader

    path = str(tmp_path / "m.yaml")
    lin, saver = _saved(path, [1, 2, 3])
    with CheckpointReader(path, checkpoint=2) as r:
        for s in (4, 5, 6):
            lin.W[...] = lin.b[...] = s
            saver.save(lin, step=s)
        assert [c.step for c in xser.checkpoints(path)] == [6, 5, 4]
        drain()  # (the saver's deleter thread: done with the checkpoints no reader holds)
        trash = sorted(n for n in os.listdir(tmp_path) if ".old-" in n)
        assert len(trash) == 1 and trash[0].startswith("m.yaml.data.old-")
        assert {float(v) for n in r.tensor_names() for v in np.unique(r.read_tensor(n))} == {1.0}
    lin.W[...] = lin.b[...] = 7
    saver.save(lin, step=7)
    saver.close()
    assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data", "m.yaml.data.1", "m.yaml.data.2"]


def test_the_newest_replaced_by_save_stays_whole_while_mapped(tmp_path):
    """xser.save exchanges .data out while a reader holds it open: the old one stays (at its temporary name)
    until the reader is done; the reader's arrays are the old ones, whole."""
    from xser.tools.reader import CheckpointReader

    path = str(tmp_path / "m.yaml")
    lin = Linear(4, 4)
    lin.W[...] = lin.b[...] = 1
    xser.save(lin, path, durable=False)
    with CheckpointReader(path) as r:
        lin.W[...] = lin.b[...] = 2
        xser.save(lin, path, durable=False)
        assert {float(v) for n in r.tensor_names() for v in np.unique(r.read_tensor(n))} == {1.0}
        assert len([n for n in os.listdir(tmp_path) if ".data.tmp-" in n]) == 1
    xser.save(lin, path, durable=False)
    assert sorted(os.listdir(tmp_path)) == ["m.yaml", "m.yaml.data"]
    assert {float(v) for a in xser.read_params(path).values() for x in a.values() for v in np.unique(x)} == {2.0}


def test_a_directory_removed_while_opened_is_missing_not_damaged(tmp_path, monkeypatch):
    """A checkpoint deleted between the reader's open and its manifest read is a directory that moved (the
    reader lists again), never "manifest.json is missing"."""
    import shutil

    from xser.storage import opened

    path = str(tmp_path / "m.yaml")
    _saved(path, [1, 2]).__getitem__(1).close()

    def deleted_first(fd):
        shutil.rmtree(path + ".data.1")  # a saver pruned it after the open, before the pin
        return True

    monkeypatch.setattr(opened, "pin_dir", deleted_first)
    with pytest.raises(opened.MissingDir) as info:
        opened.OpenedDir.open(path + ".data.1")
    assert str(info.value) == f"{path}.data.1: the checkpoint was removed while it was opened"
