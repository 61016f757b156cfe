"""Saves from many processes over torch.distributed (gloo on CPU): one checkpoint, one commit, loads at any world size,
and every failure of a rank (killed, raising, hanging, holding nothing) leaves the previous checkpoint whole.

The ranks are processes of a pool (``dist_child.py serve RANK``, three of them, started once for the module: torch is
imported once per rank). Each test hands the pool a *phase*, a list of cases that run at once, each a job of its own
(its own free port, its own model directory): every rank forks a child that joins that job and runs the case's
scenario, and the pool answers one JSON line per rank and case. Every phase has a hard deadline; a rank that hangs is
killed and reported as ``"hung"``. ``pytest -m campaign tests/test_dist.py`` kills each rank at each step and before
each filesystem call of its block writes.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import itertools
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import xser

if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch (pip install 'xser[torch]')", allow_module_level=True)

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_child.py")
sys.path.insert(0, os.path.dirname(CHILD))
from dist_child import BUCKETS, COLS, ROWS, every_id, t_rows, w_rows  # noqa: E402

#: seconds a rank waits for another in the failure tests (xser.dist.TorchDistributed(timeout=))
TIMEOUT = 3.0
#: what a surviving rank may take beyond the timeout to raise: the save's work before the failed round, on a
#: loaded two-core machine running several jobs at once
SLACK = 3.0


# ---------------------------------------------------------------- the launcher


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Pool:
    """``size`` rank processes; ``run(cases)`` runs one phase: ``{case id: [rank 0's result, rank 1's, ...]}``."""

    def __init__(self, size: int, logs: str) -> None:
        self.size, self.logs, self.phase, self.dead = size, logs, 0, None
        self.lines: queue.Queue = queue.Queue()
        self.procs, self.readers = [], []
        for r in range(size):
            err = open(os.path.join(logs, f"rank{r}.err"), "w")
            p = subprocess.Popen([sys.executable, CHILD, "serve", str(r)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True, start_new_session=True)
            err.close()
            self.readers.append(threading.Thread(target=self._read, args=(r, p.stdout), daemon=True))
            self.readers[-1].start()
            self.procs.append(p)

    def _read(self, rank: int, stream) -> None:
        with stream:
            for line in stream:
                self.lines.put((rank, line))
        self.lines.put((rank, None))

    def stderr(self) -> str:
        out = []
        for r in range(self.size):
            with open(os.path.join(self.logs, f"rank{r}.err")) as f:
                out.append(f"--- rank {r} ---\n{f.read()[-3000:]}")
        return "\n".join(out)

    def run(self, cases: list[dict], wait: float = 40) -> dict[str, list[dict]]:
        """Run ``cases`` at once (each: id, world, scenario, path, args, store); ``wait``: seconds before a rank still
        running is killed as hung. The whole phase has a hard deadline beyond that."""
        if self.dead:
            pytest.fail(f"the rank pool is gone: {self.dead}")
        assert len({c["id"] for c in cases}) == len(cases)
        self.phase += 1
        for c, port in zip(cases, free_ports(len(cases))):
            c.setdefault("port", port)
        line = json.dumps({"phase": self.phase, "cases": cases, "wait": wait}) + "\n"
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()
        deadline = time.monotonic() + wait + (120 if self.phase == 1 else 30)  # the first phase imports torch
        got: dict = {c["id"]: [None] * max(c["world"], 1) for c in cases}
        done: set[int] = set()
        while len(done) < self.size:
            try:
                rank, text = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close(f"phase {self.phase} did not end within {wait} + 30 s")
                pytest.fail(f"{self.dead}\n{self.stderr()}")
            if text is None:
                self.close(f"rank {rank} exited")
                pytest.fail(f"{self.dead}\n{self.stderr()}")
            msg = json.loads(text)
            if "done" in msg:
                done.add(rank)
            elif "case" in msg:
                got[msg["case"]][rank] = msg
        return got

    def close(self, why: str = "closed") -> None:
        self.dead = why
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        for t in self.readers:
            t.join(timeout=10)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    p = Pool(3, str(tmp_path_factory.mktemp("ranks")))
    yield p
    p.close()


def case(id: str, world: int, path, scenario: str = "save", store: str = "rank0", **args) -> dict:
    return {"id": id, "world": world, "scenario": scenario, "path": str(path), "args": args, "store": store}


def oks(results: list[dict]) -> None:
    """Every rank of a case succeeded (or the failures, shown)."""
    bad = [r for r in results if not r["ok"] or r.get("problems") or "ended" in r]
    assert not bad, json.dumps(results, indent=1)


# ---------------------------------------------------------------- what is on disk


def manifest(path, slot: int = 0) -> dict:
    with open(f"{path}.data{'' if slot == 0 else f'.{slot}'}/manifest.json") as f:
        return json.load(f)


def leftovers(path) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(f"{glob.escape(str(path))}.*") if re.search(r"\.(tmp|old)-", p))


def fingerprint(path) -> dict:
    """Every checkpoint of the model as loaded, arrays compared by their bytes: step, id, per-rank entries and a hash
    of every array's dtype, shape and bytes."""
    out = {}
    for k, ck in enumerate(xser.checkpoints(path)):
        h = hashlib.sha256()
        for sub, params in sorted(xser.read_params(path, checkpoint=k).items()):
            for name, arr in sorted(params.items()):
                h.update(f"{name} {arr.dtype.str} {arr.shape}".encode())
                h.update(np.ascontiguousarray(arr).tobytes())
        m = manifest(path, k)
        out[k] = (ck.step, m["id"], json.dumps(m.get("ranks")), h.hexdigest())
    return out


def state_of(path, rank: int, slot: int = 0) -> np.ndarray:
    m = manifest(path, slot)
    entry = m["ranks"][rank]["training_state"]["arrays"]["0"]["blocks"][0]["file"]
    return np.load(f"{path}.data{'' if slot == 0 else f'.{slot}'}/{entry}")


# ---------------------------------------------------------------- saved once, loaded at any world size


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    """Models saved by 2 and 3 ranks (CheckpointSaver, keep=2, four steps; xser.save), then loaded at world sizes
    1, 2 and 3 and alone (no torch.distributed)."""
    d = tmp_path_factory.mktemp("saved")
    saves = pool.run([
        case("by2", 2, d / "by2/m.yaml", steps=[1, 2, 3, 4], keep=2),
        case("by3", 3, d / "by3/m.yaml", steps=[1, 2, 3], keep=2),
        case("x2", 2, d / "x2/m.yaml", api="xsave", steps=[5, 6]),
        case("x3", 3, d / "x3/m.yaml", api="xsave", steps=[7]),
    ])
    steps = {"by2": 4, "by3": 3, "x2": 6, "x3": 7}
    loads = pool.run([case(f"{m}-{n}", n, d / m / "m.yaml", "load", step=s) for m, s in steps.items() for n in (0, 1, 2, 3)])
    return d, saves, loads


@pytest.mark.parametrize("model, world, step", [("by2", 2, 4), ("by3", 3, 3), ("x2", 2, 6), ("x3", 3, 7)])
def test_one_checkpoint_with_every_rank_part(saved, model, world, step):
    """One commit: one checkpoint (two with keep=2), with the world size, W's blocks tiling its rows in rank order, the
    table's parts from every rank with their id slices, and each rank's training state."""
    d, saves, _ = saved
    oks(saves[model])
    path = d / model / "m.yaml"
    assert leftovers(path) == []
    xsave = model.startswith("x")
    assert [c.step for c in xser.checkpoints(path)] == ([None] if xsave else [step, step - 1])
    m = manifest(path)
    assert m["world_size"] == world and m["step"] == (None if xsave else step)
    sub = m["subcollections"][next(iter(m["subcollections"]))]
    shares = [xser.dist.rows(ROWS, _Rank(r, world)) for r in range(world)]
    assert [(b["start"], b["shape"]) for b in sub["W"]["blocks"]] == [([a, 0], [b - a, COLS]) for a, b in shares]
    assert sub["W"]["shape"] == [ROWS, COLS] and len(sub["b"]["blocks"]) == 1
    buckets = [xser.dist.rows(BUCKETS, _Rank(r, world)) for r in range(world)]
    counts = [int(xser.IdSlice(a, b, BUCKETS).mask(every_id()).sum()) for a, b in buckets]
    offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
    assert sub["emb@id"]["attrs"]["xser"]["slices"] == [[a, b, BUCKETS, offsets[r], counts[r]] for r, (a, b) in enumerate(buckets)]
    for part in ("emb@id", "emb@embedding", "emb@m"):
        assert [b["start"][0] for b in sub[part]["blocks"]] == offsets[:-1], part
        assert sub[part]["shape"][0] == len(every_id())
    assert [r["training"] for r in m["ranks"]] == [{"rank": r, "step": step} for r in range(world)]
    for r in range(world):
        if xsave:
            assert "training_state" not in m["ranks"][r]
        else:
            assert state_of(path, r).tolist() == [r * 100 + step] * 3


class _Rank:
    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size = rank, world


@pytest.mark.parametrize("model", ["by2", "by3", "x2", "x3"])
@pytest.mark.parametrize("world", [0, 1, 2, 3])
def test_loaded_at_any_world_size(saved, model, world):
    """Saved by 2 -> loaded by 1, 2, 3 and alone; saved by 3 -> by 1, 2, 3 and alone: each rank holds exactly its rows and
    its ids, with the values of the newest step."""
    d, _, loads = saved
    got = loads[f"{model}-{world}"]
    oks(got)
    n = max(world, 1)
    for r, res in enumerate(got):
        a, b = xser.dist.rows(ROWS, _Rank(r, n))
        ids = int(xser.IdSlice(*xser.dist.rows(BUCKETS, _Rank(r, n)), BUCKETS).mask(every_id()).sum())
        assert res["shapes"] == [[b - a, COLS], ids]


def test_rotation_removes_each_old_checkpoint_once(saved):
    """keep=2 over four steps: steps 3 and 4 each remove one (1, then 2); two checkpoints and no leftovers remain."""
    d, saves, _ = saved
    for res in saves["by2"]:
        assert [r[1] for r in res["reports"]] == [[], [], [1], [2]]
    for res in saves["by3"]:
        assert [r[1] for r in res["reports"]] == [[], [], [1]]
    assert sorted(os.listdir(d / "by2")) == ["m.yaml", "m.yaml.data", "m.yaml.data.1"]
    assert sorted(os.listdir(d / "x2")) == ["m.yaml", "m.yaml.data"]  # xser.save replaced the newest checkpoint
