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
