"""Crash consistency on object stores: a save killed immediately before each request to the store.

``remote_crash_child.py`` runs each operation (``xser.save`` over a model, ``CheckpointSaver`` rotation
that drops a checkpoint, ``restart=True``, ``write_new_model`` through ``convert`` and ``avg``) in a
forked child whose ``FsspecStore.on_request`` hook SIGKILLs it just before request N, for N in turn,
and checks after each kill (docs/format.md section 6.1): every checkpoint loads bit-exact as the old
state, or as the new one exactly when commit record N+1 exists; every object of the newest record is
there; the next save succeeds and leaves only what its record names.

Stores: ``file://`` (fsspec's LocalFileSystem; it outlives the killed process) and S3 on the moto
server of the test session (the children connect to it with the storage_options). ``memory://`` is
one process's memory, so a killed process takes it along. The default run kills before every request
that changes the store on ``file://`` (a kill before a read leaves the store as the kill before the
next change does) and before a sample of them during a rotation on S3 (moto answers slowly: a few
seconds a kill with the checks); ``pytest -m campaign`` kills before every request
of every operation on both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fsspec")

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_crash_child.py")
OPS = ["save", "rotate", "restart", "convert", "avg"]
SUMMARY: list[dict] = []


def kill_campaign(tmp_path, url: str, options: dict, ops: list[str], sample: str) -> list[dict]:
    spool = tmp_path / "spool"
    spool.mkdir()
    env = {**os.environ, "TMPDIR": str(spool), "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(CHILD)), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, CHILD, url, json.dumps(options), ",".join(ops), sample], capture_output=True,
                          text=True, timeout=1800, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert [r["op"] for r in reports] == ops
    for r in reports:
        SUMMARY.append({"store": url.partition("://")[0], "sample": sample, **{k: r.get(k) for k in ("op", "requests", "kills", "spools_left", "seconds")}})
        print(f"{url.partition('://')[0]} {r['op']}: {r.get('requests')} requests, {r.get('kills')} kills ({sample}), "
              f"{len(r['problems'])} problems")
    problems = {r["op"]: r["problems"][:5] for r in reports if r["problems"]}
    assert problems == {}
    for r in reports:
        assert r["completed"] == [r["requests"] + 1], r  # every chosen N was killed; N = requests + 1 completes
        assert r["kills"] >= (r["requests"] if sample == "all" else 5), r
    return reports


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield
    if SUMMARY:
        print("\nremote kill tests:", json.dumps(SUMMARY))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_file_url(tmp_path):
    """file://: a kill before every request that changes the store, every operation."""
    kill_campaign(tmp_path, (tmp_path / "store").as_uri(), {}, OPS, "writes")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_s3(tmp_path, s3_url):
    """S3 (moto): a rotation (keep=2 drops a checkpoint), killed before every fifth request that changes the store,
    before the commit and after it, and before each of the last three requests."""
    prefix, options = s3_url
    kill_campaign(tmp_path, prefix, options, ["rotate"], "writes:5")


@pytest.mark.campaign
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("store", ["file", "s3"])
def test_kill_campaign(tmp_path, request, store):
    """Every request of every operation, on file:// and S3."""
    if store == "file":
        url, options = (tmp_path / "store").as_uri(), {}
    else:
        url, options = request.getfixturevalue("s3_url")
    kill_campaign(tmp_path, url, options, OPS, "all")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reads_what_its_parent_saved(s3_url):
    """The store of a URL is made again in a forked child (s3fs filesystems are bound to their process's event loop):
    a DataLoader-style worker forked after the parent read or saved reads the model too."""
    import numpy as np

    import components
    import xser

    prefix, options = s3_url
    m = components.Linear(3, 2)
    m.W[...] = 5
    xser.save(m, f"{prefix}/m.yaml", storage_options=options)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            got = xser.load(f"{prefix}/m.yaml", storage_options=options)
            code = 0 if np.array_equal(got.W, m.W) else 2
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            print(f"child failed: {type(e).__name__}: {e}", file=sys.stderr)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_failed_request_at_each_point_of_a_save(kind, tmp_path, request, monkeypatch):
    """A store failure (access denied) at request N of a rotation, for every N in turn, in this process: the save raises
    the StorageError with the URL; no commit record names a missing object; the model is the old or (record N+1
    exists) the new state; the failed save's own prefix is gone; the next save leaves only what its record names."""
    import remote_crash_child as c

    import xser
    from xser.storage import stores
    from xser.storage.objects import commit as objects
    from xser.storage.stores.remote import FsspecStore

    url = request.getfixturevalue("memory_url") if kind == "memory" else (tmp_path / "store").as_uri()
    root = c.Root(url, {})
    template = f"{url}/template"
    c.setup_rotate(template)
    old = c.fingerprint(f"{template}/m.yaml")
    before, _ = objects.latest(stores.store_for(url), f"{template}/m.yaml")
    real = FsspecStore._call
    count, fail_at = [0], [0]

    def call(self, op, u, fn, *a, **kw):
        count[0] += 1
        if count[0] == fail_at[0]:
            def fn(*a, **kw):
                raise PermissionError(13, "injected")
        return real(self, op, u, fn, *a, **kw)

    monkeypatch.setattr(FsspecStore, "_call", call)
    problems, failures, n = [], 0, 0
    new = None
    while True:
        n += 1
        work = f"{url}/w{n}"
        root.copy(template, work)
        u = f"{work}/m.yaml"
        count[0], fail_at[0] = 0, n
        try:
            c.op_rotate(work)
            fail_at[0] = 0
            new = c.fingerprint(u)
            break
        except xser.XserError as e:
            fail_at[0] = 0
            failures += 1
            if type(e) is not xser.StorageError or f"{url}/w{n}/" not in str(e) or "access denied" not in str(e):
                problems.append(f"request {n}: {type(e).__name__}: {e}")
        seq, _ = objects.latest(stores.store_for(u), u)
        got = c.fingerprint(u)
        if got[0] != "model":
            problems.append(f"request {n}: the newest record names what is missing: {got}")
        elif seq == before and got != old:
            problems.append(f"request {n}: no new record, and not the old state")
        if seq == before and objects.pending(stores.store_for(u), u, seq):
            problems.append(f"request {n}: the failed save left its prefix {objects.pending(stores.store_for(u), u, seq)}")
        xser.save(xser.load(u), u)
        for p in c.leftovers(root, work, {"m.yaml", "m.yaml.data"}):
            problems.append(f"request {n}, after the next save: {p}")
    assert problems == []
    assert new[0] == "model" and new != old and failures == n - 1 >= 20


def test_commit_whose_answer_is_lost(memory_url, monkeypatch):
    """The commit record's create is applied but its answer is lost (a timeout), and the retry finds the name taken:
    the record is this save's own, so the save succeeds and keeps its checkpoint (it must not delete what its record
    names)."""
    import components
    import xser
    from xser.storage.stores.remote import FsspecStore

    url = f"{memory_url}/m.yaml"
    xser.save(components.Linear(3, 2), url)
    real = FsspecStore._call
    lost = []

    def call(self, op, u, fn, *a, **kw):
        if op == "write" and "/commits/" in u and not lost:
            def fn(*a2, real_fn=fn, **kw2):
                real_fn(*a2, **kw2)
                lost.append(u)
                raise ConnectionResetError("the answer was lost")
        return real(self, op, u, fn, *a, **kw)

    monkeypatch.setattr(FsspecStore, "_call", call)
    m = components.Linear(3, 2)
    m.W[...] = 4
    xser.save(m, url)
    monkeypatch.undo()
    assert lost and float(xser.load(url, verify=True).W[0, 0]) == 4.0
