"""Readers and savers at the same time on an object store (docs/format.md section 6: "Two savers", "Readers").

- Readers during saves and rotation: a process (``remote_race_child.py``) saves with
  ``CheckpointSaver(keep=K)`` again and again (checkpoint ``s`` holds ``s`` everywhere); reader threads
  meanwhile ``load``, ``read_params`` (with and without ``rows=``), ``load_training_state``, ``resume``
  ``checkpoint=k`` for every ``k < K`` and ``"last"``, and list ``checkpoints()``. Every read is one
  whole checkpoint that agrees with its records, or a ``CheckpointError`` after the retries: never a mix.
- Two savers that start from the same commit record (paced by a barrier before their commits): exactly
  one commits, the other raises ``CheckpointError`` and leaves nothing behind.
- A saver that stalls before its commit while another saves several times (so that the record it would
  create was deleted by the clean-up already) raises too, and deletes nothing the newest record names.

On ``file://`` and on S3 (moto); the two-saver tests on ``memory://`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import components
import xser

pytest.importorskip("fsspec")

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_race_child.py")
KINDS = ("load", "read_params", "training_state", "resume", "listing")


@pytest.fixture(params=["file", "s3"])
def where(request, tmp_path):
    """(URL prefix, storage_options) on file:// and on S3 (moto)."""
    if request.param == "file":
        return (tmp_path / "store").as_uri(), {}
    return request.getfixturevalue("s3_url")


class Mixed(Exception):
    """A read that gave no whole checkpoint, or one that disagrees with its records."""


def value(arrays, what: str) -> float:
    values = set()
    for a in arrays:
        values |= set(np.unique(np.asarray(a)).tolist())
    if len(values) != 1:
        raise Mixed(f"{what}: several values {sorted(values)[:6]}")
    return float(values.pop())


def read_once(kind: str, url: str, options: dict, keep: int, k) -> float:
    """One read of checkpoint ``k``; its step (from its content), after checking it is whole and agrees with its records."""
    if kind == "load":
        m = xser.load(url, checkpoint=k, storage_options=options)
        return value([m.W, m.b], kind)
    if kind == "read_params":
        rows = {"W": (2, 5)} if isinstance(k, int) and k % 2 else None
        (sub,) = xser.read_params(url, checkpoint=k, storage_options=options,
                                  rows=None if rows is None else {f"{SUB[0]}/W": rows["W"]}).values()
        return value(list(sub.values()), kind)
    if kind == "training_state":
        st = xser.load_training_state(url, checkpoint=k, storage_options=options)
        return value([st["m"], np.array(st["step"])], kind)
    if kind == "resume":
        r = xser.resume(url, checkpoint=k, storage_options=options)
        v = value([r.model.W, r.model.b, r.training_state["m"], np.array(r.training_state["step"])], kind)
        if r.step != v or r.checkpoint.step != v or (isinstance(k, int) and r.checkpoint.index != k):
            raise Mixed(f"resume checkpoint={k!r}: records {r.checkpoint} for arrays of step {v}")
        return v
    if kind == "listing":
        steps = [c.step for c in xser.checkpoints(url, storage_options=options)]
        if len(steps) != keep or steps != list(range(steps[0], steps[0] - keep, -1)):
            raise Mixed(f"checkpoints(): steps {steps}")
        return float(steps[k] if isinstance(k, int) else steps[0])
    raise ValueError(kind)


SUB: list[str] = []


def reader(url: str, options: dict, keep: int, end: float, turn0: int, report: dict) -> None:
    newest: dict = {}
    selections = [*range(keep), "last"]
    turn = turn0
    while time.time() < end:
        kind = KINDS[turn % len(KINDS)]
        k = selections[(turn // len(KINDS)) % len(selections)]
        turn += 1
        rep = report.setdefault(kind, {"reads": 0, "gave_up": 0, "failures": []})
        rep["reads"] += 1
        try:
            v = read_once(kind, url, options, keep, k)
            if v < newest.get((kind, k), 0):  # the k-th newest never goes back in time
                raise Mixed(f"checkpoint={k!r} gave step {v} after step {newest[(kind, k)]}")
            newest[(kind, k)] = v
        except xser.CheckpointError as e:  # allowed: the checkpoints kept changing for every retry
            rep["gave_up"] += 1
            rep.setdefault("gave_up_errors", []).append(str(e)[-300:])
        except Exception as e:  # noqa: BLE001 - every other failure is reported, whatever it is
            rep["failures"].append(f"checkpoint={k!r}: {type(e).__name__}: {str(e)[-600:]}")


@pytest.mark.parametrize("keep", [2])
def test_readers_during_rotation(where, keep):
    """Zero mixed reads, zero failures, while a process saves and rotates (a few seconds)."""
    prefix, options = where
    url = f"{prefix}/race/m.yaml"
    seconds = 4.0 if prefix.startswith("file:") else 6.0
    writer = subprocess.Popen([sys.executable, CHILD, url, json.dumps(options), str(seconds + 60), str(keep)],
                              stdout=subprocess.PIPE, text=True)
    try:
        while int(writer.stdout.readline() or 10**9) < keep:  # every checkpoint asked for exists before readers start
            pass
        SUB[:] = [next(iter(xser.read_params(url, storage_options=options)))]
        first = xser.checkpoints(url, storage_options=options)[0].step
        reports: list[dict] = [{} for _ in range(3)]
        end = time.time() + seconds
        threads = [threading.Thread(target=reader, args=(url, options, keep, end, i, reports[i])) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert writer.poll() is None, "the writer stopped while the readers read"
        saves = xser.checkpoints(url, storage_options=options)[0].step - first
    finally:
        writer.kill()
        writer.communicate()
    total = {kind: {"reads": sum(r.get(kind, {}).get("reads", 0) for r in reports),
                    "gave_up": sum(r.get(kind, {}).get("gave_up", 0) for r in reports),
                    "failures": [f for r in reports for f in r.get(kind, {}).get("failures", [])]} for kind in KINDS}
    print(f"\n{prefix.partition(':')[0]}: {sum(t['reads'] for t in total.values())} reads during {saves} saves (keep={keep}): "
          f"{json.dumps({k: (t['reads'], t['gave_up']) for k, t in total.items()})}")
    assert {k: t["failures"][:3] for k, t in total.items() if t["failures"]} == {}
    assert all(t["reads"] >= 2 for t in total.values()), total  # every kind really ran while the writer rotated
    assert saves >= 3, saves  # ... and the writer really rotated while they read
    gave_up = sum(t["gave_up"] for t in total.values())
    assert gave_up <= sum(t["reads"] for t in total.values()) // 4, total  # giving up is rare, not the rule


# ---------------------------------------------------------------- two savers


def lin(value: float) -> components.Linear:
    m = components.Linear(3, 2)
    m.W[...] = value
    m.b[...] = value
    return m


def data_names(url: str, options: dict) -> list[str]:
    """The names under the model's data root: checkpoint prefixes and ``commits``."""
    from xser.storage.stores import store_for

    store = store_for(url, options)
    return sorted(store.basename(n) for n in store.listdir(url + ".data"))


def records(url: str, options: dict) -> list[int]:
    from xser.storage.stores import store_for

    store = store_for(url, options)
    return sorted(int(store.basename(n)[:20]) for n in store.listdir(url + ".data/commits"))


def leftovers_after_next_save(url: str, options: dict) -> list[str]:
    """Save once more, then what the data root holds beyond the newest record's checkpoints and records."""
    from xser.storage.objects.commit import KEEP_RECORDS, latest
    from xser.storage.stores import store_for

    xser.save(xser.load(url, storage_options=options), url, storage_options=options)
    seq, rec = latest(store_for(url, options), url)
    names = data_names(url, options)
    extra = sorted(set(names) - {"commits"} - {c["dir"] for c in rec["checkpoints"]})
    nums = records(url, options)
    if len(nums) > KEEP_RECORDS or nums[-1] != seq:
        extra.append(f"records {nums} after commit {seq}")
    return extra


@pytest.fixture(params=["file", "memory", "s3"])
def saver_where(request, tmp_path):
    if request.param == "file":
        return (tmp_path / "store").as_uri(), {}
    if request.param == "memory":
        return request.getfixturevalue("memory_url"), {}
    return request.getfixturevalue("s3_url")


def run_paced(monkeypatch, savers: dict, pace) -> dict:
    """Run each ``savers[name]()`` in a thread named ``name``; ``pace(name)`` runs in it just before its commit.
    Returns {name: None or the exception}."""
    import importlib

    remote = importlib.import_module("xser.checkpoints.remote")  # (xser.checkpoints is also the listing function)
    real = remote.commit

    def commit(*a, **kw):
        pace(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(remote, "commit", commit)
    out: dict = {}

    def run(name, fn):
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001 - returned to the test
            out[name] = e

    threads = [threading.Thread(target=run, args=(n, f), name=n) for n, f in savers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def both_then_b():
    """A pace for two savers "a" and "b": both have planned the same next commit before either commits; "b" then
    waits a little, because moto's conditional PUT checks and writes in two steps (moto/s3/responses.py: get_object,
    then put_object), so two PUTs in the same instant can both pass its check (never on S3 itself)."""
    barrier = threading.Barrier(2, timeout=60)

    def pace(name):
        barrier.wait()
        if name == "b":
            time.sleep(0.3)
    return pace


def test_two_savers_one_commits(saver_where, monkeypatch):
    """Two savers from the same record: one commit; the other raises and leaves nothing behind."""
    prefix, options = saver_where
    url = f"{prefix}/two/m.yaml"
    xser.save(lin(1.0), url, storage_options=options)
    out = run_paced(monkeypatch, {"a": lambda: xser.save(lin(2.0), url, storage_options=options),
                                  "b": lambda: xser.save(lin(3.0), url, storage_options=options)}, both_then_b())
    failed = [n for n, e in out.items() if e is not None]
    assert len(failed) == 1, out
    (loser,) = failed
    err = out[loser]
    assert type(err) is xser.CheckpointError
    assert str(err) == (f"{url}: another process saved this model meanwhile (commit 2 exists); this save was not "
                        "committed and its objects are removed")
    monkeypatch.undo()
    assert records(url, options) == [1, 2]
    (ck,) = xser.checkpoints(url, storage_options=options)
    assert len([n for n in data_names(url, options) if n != "commits"]) == 1  # the loser's prefix is gone
    winner_value = 2.0 if loser == "b" else 3.0
    assert float(xser.load(url, storage_options=options).W[0, 0]) == winner_value
    assert leftovers_after_next_save(url, options) == []


def test_two_checkpoint_savers_rotating(saver_where, monkeypatch):
    """The same with two CheckpointSavers (keep=2) of one run: one commit; the loser's checkpoint is not listed."""
    prefix, options = saver_where
    url = f"{prefix}/two/m.yaml"
    m = lin(0.0)
    with xser.CheckpointSaver(url, keep=2, storage_options=options) as s:
        for step in (1, 2):
            m.W[...] = step
            s.save(m, step=step)
    def save(step):
        def go():
            mm = xser.load(url, storage_options=options)
            mm.W[...] = step
            with xser.CheckpointSaver(url, keep=2, storage_options=options) as s:
                s.save(mm, step=step)
        return go

    out = run_paced(monkeypatch, {"a": save(3), "b": save(4)}, both_then_b())
    assert sorted(type(e).__name__ for e in out.values() if e is not None) == ["CheckpointError"], out
    monkeypatch.undo()
    won = 3 if out["a"] is None else 4
    assert [c.step for c in xser.checkpoints(url, storage_options=options)] == [won, 2]
    assert len([n for n in data_names(url, options) if n != "commits"]) == 2
    assert leftovers_after_next_save(url, options) == []


def test_stalled_saver_after_newer_commits(saver_where, monkeypatch):
    """A saver that stalls before its commit while another saves four times (the records up to the one it would create
    are deleted by then): it must not commit a record below the newest, report success, or delete the newest record's
    checkpoints."""
    prefix, options = saver_where
    url = f"{prefix}/stall/m.yaml"
    m = lin(0.0)
    with xser.CheckpointSaver(url, keep=5, storage_options=options) as s:
        m.W[...] = 1
        s.save(m, step=1)
    arrived, go_on = threading.Event(), threading.Event()

    def pace(name):
        if name == "slow":
            arrived.set()
            assert go_on.wait(120)

    def slow():
        mm = xser.load(url, storage_options=options)
        mm.W[...] = 100
        with xser.CheckpointSaver(url, keep=5, storage_options=options) as s:
            s.save(mm, step=100)

    def fast():
        assert arrived.wait(120)  # the slow saver read record 1 and wrote its checkpoint
        mm = xser.load(url, storage_options=options)
        with xser.CheckpointSaver(url, keep=5, storage_options=options) as s:
            for step in (2, 3, 4, 5):
                mm.W[...] = step
                s.save(mm, step=step)
        go_on.set()

    out = run_paced(monkeypatch, {"slow": slow, "fast": fast}, pace)
    monkeypatch.undo()
    assert out["fast"] is None, out
    assert type(out["slow"]) is xser.CheckpointError, out
    assert [c.step for c in xser.checkpoints(url, storage_options=options)] == [5, 4, 3, 2, 1]
    for k in range(5):  # every checkpoint the newest record names is there, whole
        assert float(xser.load(url, checkpoint=k, storage_options=options).W[0, 0]) == 5 - k
    assert leftovers_after_next_save(url, options) == []


def test_clean_up_deletes_the_manifest_first(saver_where, monkeypatch):
    """A dropped checkpoint loses its manifest before any other object: a reader that finds one of its files gone then
    finds the manifest gone too, and starts over from the newest record (never "a file named in the manifest is
    missing")."""
    from xser.storage.stores.remote import FsspecStore

    prefix, options = saver_where
    url = f"{prefix}/order/m.yaml"
    m = lin(0.0)
    with xser.CheckpointSaver(url, keep=1, storage_options=options) as s:
        s.save(m, step=1)
        (dropped,) = [n for n in data_names(url, options) if n != "commits"]
        deletes: list[str] = []
        monkeypatch.setattr(FsspecStore, "on_request", lambda op, u: deletes.append(u) if op == "delete" else None)
        s.save(m, step=2)
    mine = [u for u in deletes if f"/{dropped}" in u]
    assert mine and mine[0].endswith(f"/{dropped}/manifest.json"), deletes
