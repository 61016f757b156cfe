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
import json
import os
import queue
import re
import shutil

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
from dist_child import BUCKETS, COLS, ROWS, every_id  # noqa: E402
from helpers import free_ports  # noqa: E402

#: seconds a rank waits for another in the failure tests (xser.dist.TorchDistributed(timeout=))
TIMEOUT = 3.0
#: what a surviving rank may take beyond the timeout to raise: the save's work before the failed round, on a
#: loaded two-core machine running several jobs at once (a clean CI run once measured 11.3 s against 2 x 3 + 3)
SLACK = 6.0


# ---------------------------------------------------------------- the launcher


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


#: id: (world size, api, steps, rows of W, hash buckets, training_state saved); "small": rank 2 of 3 holds no row of W and an
#: empty id slice
MODELS = {
    "by2": (2, "saver", [1, 2, 3, 4], ROWS, BUCKETS, True),
    "by3": (3, "saver", [1, 2, 3], ROWS, BUCKETS, True),
    "x2": (2, "xsave", [5, 6], ROWS, BUCKETS, False),
    "x3": (3, "xsave", [7], ROWS, BUCKETS, False),
    "small": (3, "saver", [1], 2, 2, False),
    "async3": (3, "async", [1, 2, 3], ROWS, BUCKETS, True),  # every array changed in place as soon as save() returns
}


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    """MODELS saved (CheckpointSaver with keep=2, or xser.save), then loaded alone (no torch.distributed) and at world
    sizes 1, 2 and 3."""
    d = tmp_path_factory.mktemp("saved")
    saves = pool.run([case(m, w, d / m / "m.yaml", api=api, steps=steps, keep=2, rows=rows, buckets=buckets, state=state)
                      for m, (w, api, steps, rows, buckets, state) in MODELS.items()])
    loads = pool.run([case(f"{m}-{n}", n, d / m / "m.yaml", "load", step=steps[-1], rows=rows, buckets=buckets, state=state)
                      for m, (_, _, steps, rows, buckets, state) in MODELS.items() for n in (0, 1, 2, 3)])
    return d, saves, loads


class _Rank:
    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size = rank, world


def share(rank: int, world: int, rows: int = ROWS, buckets: int = BUCKETS) -> tuple[tuple[int, int], tuple[int, int], int]:
    """A rank's rows of W, its id buckets and how many of the test's ids fall in them."""
    c = _Rank(rank, world)
    sl = xser.dist.rows(buckets, c)
    return xser.dist.rows(rows, c), sl, int(xser.IdSlice(*sl, buckets).mask(every_id()).sum())


@pytest.mark.parametrize("model", list(MODELS))
def test_one_checkpoint_with_every_rank_part(saved, model):
    """One commit: one checkpoint (two with keep=2), with the world size, W's blocks tiling its rows in rank order, the
    table's parts from every rank with their id slices, and each rank's training state."""
    d, saves, _ = saved
    world, api, steps, rows, buckets, state = MODELS[model]
    step = steps[-1]
    oks(saves[model])
    path = d / model / "m.yaml"
    assert leftovers(path) == []
    xsave = api == "xsave"
    assert [c.step for c in xser.checkpoints(path)] == ([None] if xsave else steps[::-1][:2])
    m = manifest(path)
    assert m["world_size"] == world and m["step"] == (None if xsave else step)
    sub = m["subcollections"][next(iter(m["subcollections"]))]
    shares = [share(r, world, rows, buckets) for r in range(world)]
    assert [(b["start"], b["shape"]) for b in sub["W"]["blocks"]] == [([a, 0], [b - a, COLS]) for (a, b), _, _ in shares if b > a]
    assert sub["W"]["shape"] == [rows, COLS] and len(sub["b"]["blocks"]) == 1
    counts = [n for _, _, n in shares]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    assert sub["emb@id"]["attrs"]["xser"]["slices"] == [[a, b, buckets, offsets[r], counts[r]] for r, (_, (a, b), _) in enumerate(shares)]
    for part in ("emb@id", "emb@embedding", "emb@m"):
        assert [b["start"][0] for b in sub[part]["blocks"]] == [offsets[r] for r in range(world) if counts[r]], part
        assert sub[part]["shape"][0] == len(every_id())
    assert [r["training"] for r in m["ranks"]] == [{"rank": r, "step": step} for r in range(world)]
    for r in range(world):
        if state:
            assert state_of(path, r).tolist() == [r * 100 + step] * 3
        else:
            assert "training_state" not in m["ranks"][r]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("world", [0, 1, 2, 3])
def test_loaded_at_any_world_size(saved, model, world):
    """Saved by 2 -> loaded by 1, 2, 3 and alone; saved by 3 -> by 1, 2, 3 and alone: each rank holds exactly its rows and
    its ids, with the values of the newest step."""
    d, _, loads = saved
    got = loads[f"{model}-{world}"]
    oks(got)
    saved_by, _, steps, rows, buckets, state = MODELS[model]
    for r, res in enumerate(got):
        (a, b), _, ids = share(r, max(world, 1), rows, buckets)
        assert res["shapes"] == [[b - a, COLS], ids]
        if state:  # each rank its own training state; none at another world size (rank_state="drop")
            assert res["state"] == ([r * 100 + steps[-1]] * 3 if world == saved_by else None)


@pytest.mark.parametrize("model", ["by2", "by3", "small"])
def test_loaded_by_this_process(saved, model):
    """The test's own process, which never joined a job, loads the whole model (xser.dist.Local)."""
    from dist_child import check

    d, _, _ = saved
    _, _, steps, rows, buckets, _ = MODELS[model]
    m = xser.load(d / model / "m.yaml")
    assert check(m, xser.dist.Local(), steps[-1], rows, buckets) == []


def test_rotation_removes_each_old_checkpoint_once(saved):
    """keep=2 over four steps: steps 3 and 4 each remove one (1, then 2); two checkpoints and no leftovers remain."""
    d, saves, _ = saved
    for res in saves["by2"]:
        assert [r[1] for r in res["reports"]] == [[], [], [1], [2]]
    for res in saves["by3"] + saves["async3"]:
        assert [r[1] for r in res["reports"]] == [[], [], [1]]
    assert sorted(os.listdir(d / "by2")) == ["m.yaml", "m.yaml.data", "m.yaml.data.1"]
    assert sorted(os.listdir(d / "x2")) == ["m.yaml", "m.yaml.data"]  # xser.save replaced the newest checkpoint


# ---------------------------------------------------------------- failures: nothing published, every rank raises

G, W = f"{TIMEOUT * 0.8:g}", f"{TIMEOUT:g}"  # how long rank 0 waits for a rank, and a rank for rank 0
LATE = "(it died, hangs, or is slower than the timeout)"
GONE = r"RankFailure: the job's store is unreachable while {} \(rank 0 died, or the launcher that holds the store\): .+"


GAVE_UP = "RankFailure: rank {} gave up waiting for rank 0 while {}: rank 0 was slower than the timeout (%s s)" % W
UNKNOWN = (f"RankFailure: rank 0 began to commit while publishing and did not finish within {2 * TIMEOUT:g} s (it died or "
           "hangs): the checkpoint may or may not have been published")


NOT_JSON = "training must be JSON data (dicts, lists, str, numbers, bool, None): Object of type set is not JSON serializable"


def late(rank: int, phase: str) -> str:
    return f"RankFailure: rank {rank} did not answer within {G if rank else W} s while {phase} {LATE}"


#: id: (world, fault, {rank: the error it raises (a regular expression when it starts with "re:")}, options)
#: options: store ("rank0": init_method=tcp://, rank 0 holds the job's store; "launcher": another process holds it, as
#: torchrun's agent), api ("saver" or "xsave"), small (W with 2 rows, 2 buckets: rank 2 of 3 holds nothing)
FAILURES = {
    # a rank SIGKILLed before, during and after its block writes, and between the manifest's fsync and publication
    "kill1-before-writes": (2, {"rank": 1, "kind": "kill", "at": "planned"}, {0: late(1, "writing its blocks")}, {}),
    "kill1-during-writes": (2, {"rank": 1, "kind": "kill", "call": 5}, {0: late(1, "writing its blocks")}, {}),
    "kill1-after-writes": (2, {"rank": 1, "kind": "kill", "at": "written"}, {0: late(1, "writing its blocks")}, {}),
    "kill1-before-publication": (2, {"rank": 1, "kind": "kill", "at": "acknowledged"}, {0: late(1, "publishing")}, {}),
    "kill0-before-writes": (2, {"rank": 0, "kind": "kill", "at": "planned"},
                            {1: "re:" + GONE.format("(planning the save|writing its blocks)")}, {}),
    "kill0-during-writes": (2, {"rank": 0, "kind": "kill", "call": 7},
                            {1: "re:" + GONE.format("(planning the save|writing its blocks)")}, {}),
    "kill0-after-writes": (2, {"rank": 0, "kind": "kill", "at": "written"},
                           {1: "re:" + GONE.format("(planning the save|writing its blocks)")}, {}),
    "kill0-after-manifest": (2, {"rank": 0, "kind": "kill", "at": "finished"}, {1: "re:" + GONE.format("writing its blocks")}, {}),
    "kill0-before-acknowledging": (2, {"rank": 0, "kind": "kill", "at": "acknowledged"},
                                   {1: "re:" + GONE.format("(writing its blocks|publishing)")}, {}),
    "kill0-before-publication": (2, {"rank": 0, "kind": "kill", "at": "publishing"}, {1: "re:" + GONE.format("publishing")}, {}),
    "kill0-before-writes-launcher": (2, {"rank": 0, "kind": "kill", "at": "planned"}, {1: late(0, "writing its blocks")},
                                     {"store": "launcher"}),
    "kill0-after-manifest-launcher": (2, {"rank": 0, "kind": "kill", "at": "finished"}, {1: late(0, "writing its blocks")},
                                      {"store": "launcher"}),
    "kill0-before-publication-launcher": (2, {"rank": 0, "kind": "kill", "at": "publishing"}, {1: UNKNOWN},
                                          {"store": "launcher"}),
    "kill2-of-3-after-writes": (3, {"rank": 2, "kind": "kill", "at": "written"},
                                {0: late(2, "writing its blocks"), 1: late(2, "writing its blocks")}, {}),
    "kill1-xsave": (2, {"rank": 1, "kind": "kill", "at": "written"}, {0: late(1, "writing its blocks")}, {"api": "xsave"}),
    "async-kill1-during-writes": (2, {"rank": 1, "kind": "kill", "call": 5}, {0: late(1, "writing its blocks")}, {"api": "async"}),
    "async-kill0-after-manifest": (2, {"rank": 0, "kind": "kill", "at": "finished"}, {1: "re:" + GONE.format("writing its blocks")},
                                   {"api": "async"}),
    "async-raise1-seen-at-close": (2, {"rank": 1, "kind": "raise", "at": "written"},
                                   {0: "RankFailure: rank 1 failed while writing its blocks: ValueError: boom on rank 1",
                                    1: "ValueError: boom on rank 1"}, {"api": "async-close"}),
    "kill0-xsave-after-manifest": (2, {"rank": 0, "kind": "kill", "at": "finished"}, {1: "re:" + GONE.format("writing its blocks")},
                                   {"api": "xsave"}),
    # a rank that raises an exception that cannot be pickled
    "unpicklable2-of-3": (3, {"rank": 2, "kind": "raise", "at": "written", "unpicklable": True},
                          {0: "RankFailure: rank 2 failed while writing its blocks: Unpicklable: boom on rank 2",
                           1: "RankFailure: rank 2 failed while writing its blocks: Unpicklable: boom on rank 2",
                           2: "Unpicklable: boom on rank 2"}, {}),
    "unpicklable0-deciding": (2, {"rank": 0, "kind": "raise", "at": "finished", "unpicklable": True},
                              {0: "Unpicklable: boom on rank 0",
                               1: "RankFailure: rank 0 failed while writing its blocks: Unpicklable: boom on rank 0"}, {}),
    # a rank whose save fails before the first round (its snapshot refuses the training dict)
    "bad-training1": (2, {"rank": 1, "kind": "bad-training"},
                      {0: f"RankFailure: rank 1 failed while planning the save: DataError: {NOT_JSON}",
                       1: f"DataError: {NOT_JSON}"}, {}),
    # a rank with no blocks (3 ranks over W with 2 rows and 2 buckets: rank 2 holds no rows and an empty id slice)
    "kill2-no-blocks": (3, {"rank": 2, "kind": "kill", "at": "written"},
                        {0: late(2, "writing its blocks"), 1: late(2, "writing its blocks")}, {"small": True}),
    # a rank that sleeps past the timeout
    "sleep1-before-saving": (2, {"rank": 1, "kind": "sleep", "at": "start", "seconds": TIMEOUT + 1.5},
                             {0: late(1, "planning the save")}, {}),
    "sleep1-writing": (2, {"rank": 1, "kind": "sleep", "at": "planned", "seconds": TIMEOUT + 1.5},
                       {0: late(1, "writing its blocks")}, {}),
    "sleep0-writing": (2, {"rank": 0, "kind": "sleep", "at": "planned", "seconds": TIMEOUT + 1.5},
                       {0: late(1, "publishing"), 1: late(0, "writing its blocks")}, {"store": "launcher"}),
    "sleep0-before-acknowledging": (2, {"rank": 0, "kind": "sleep", "at": "acknowledged", "seconds": TIMEOUT + 1.5},
                                    {0: GAVE_UP.format(1, "publishing"), 1: late(0, "publishing")}, {"store": "launcher"}),
    # rank 0 is past the point of no return (it began to publish) when rank 1's wait ends: rank 1 waits once more
    "sleep0-publishing": (2, {"rank": 0, "kind": "sleep", "at": "publishing", "seconds": TIMEOUT + 1.5}, {0: None, 1: None}, {}),
}


def _template(small: bool) -> dict:
    return {"rows": 2, "buckets": 2, "state": False} if small else {}





@pytest.fixture(scope="module")
def failures(pool, tmp_path_factory):
    """Each case of FAILURES on a copy of a model saved by its world size (steps 1 and 2, keep=2): a job that resumes it
    and saves step 3 with the fault; then a fresh job that resumes the newest checkpoint and saves the next step."""
    d = tmp_path_factory.mktemp("failures")
    kinds = sorted({(w, bool(o.get("small"))) for w, _, _, o in FAILURES.values()})
    made = pool.run([case(f"t{w}{'s' if small else ''}", w, d / f"t{w}{'s' if small else ''}/m.yaml", steps=[1, 2],
                          **_template(small)) for w, small in kinds])
    for res in made.values():
        oks(res)
    before, cases = {}, []
    for id, (world, fault, _, o) in FAILURES.items():
        t = f"t{world}{'s' if o.get('small') else ''}"
        shutil.copytree(d / t, d / id, symlinks=True)
        before[id] = fingerprint(d / id / "m.yaml")
        cases.append(case(id, world, d / id / "m.yaml", store=o.get("store", "rank0"), api=o.get("api", "saver"), steps=[3],
                          resume=2, timeout=TIMEOUT, fault=fault, **_template(bool(o.get("small")))))
    failed = pool.run(cases)
    after = {id: (fingerprint(d / id / "m.yaml"), leftovers(d / id / "m.yaml")) for id in FAILURES}
    again = []
    for id, (world, _, expect, o) in FAILURES.items():
        newest = xser.checkpoints(d / id / "m.yaml")[0].step
        again.append(case(id, world, d / id / "m.yaml", api=o.get("api", "saver"), steps=[newest + 1], resume=newest,
                          **_template(bool(o.get("small")))))
    recovered = pool.run(again)
    return d, before, failed, after, recovered


def _matches(expected: str | None, got: dict) -> bool:
    if expected is None:
        return got["ok"] and "ended" not in got
    if got["ok"] or "ended" in got:
        return False
    if expected.startswith("re:"):
        return re.fullmatch(expected[3:], got["error"]) is not None
    return got["error"] == expected


@pytest.mark.parametrize("id", list(FAILURES))
def test_failed_rank_publishes_nothing(failures, id):
    """Nothing is published: every checkpoint loads as before, bit for bit; every surviving rank raises within the timeout,
    naming the failed rank and the phase; the failed rank is gone (killed), raised, or slept through it. Rank 0, if it
    survived, removed the staging directory."""
    d, before, failed, after, _ = failures
    world, fault, expect, o = FAILURES[id]
    got = failed[id]
    shown = json.dumps(got, indent=1)
    for r, e in expect.items():
        assert _matches(e, got[r]), f"rank {r}: expected {e!r}\n{shown}"
    published = all(e is None for e in expect.values())
    fp, left = after[id]
    if published:
        assert [c[0] for c in fp.values()] == [3, 2] and fp[1] == before[id][0], shown
        return
    assert fp == before[id], shown
    if fault["kind"] == "kill":
        assert got[fault["rank"]].get("ended") == "killed by signal 9", shown
    if fault["rank"] != 0:
        assert left == [], shown
    for r in expect:  # the survivors: within the timeout (plus what the save did before the failed round)
        if r != fault["rank"]:
            assert got[r]["seconds"] < (2 * TIMEOUT if expect[r] == UNKNOWN else TIMEOUT) + SLACK, shown


@pytest.mark.parametrize("id", list(FAILURES))
def test_next_save_after_a_failure(failures, id):
    """A fresh job on the same path resumes the newest checkpoint (its values exact) and saves the next step; nothing of
    the failed save is left over."""
    d, _, _, _, recovered = failures
    oks(recovered[id])
    path = d / id / "m.yaml"
    assert leftovers(path) == []
    steps = [c.step for c in xser.checkpoints(path)]
    if FAILURES[id][3].get("api") == "xsave":  # xser.save replaced the newest checkpoint
        assert steps == [None, 1]
    else:
        assert steps == [3, 2] or (steps == [4, 3] and all(e is None for e in FAILURES[id][2].values()))


# ---------------------------------------------------------------- refusals: the ranks' parts do not make one model

TAIL = "make them equal, or declare each rank's rows with add(..., rows=)"
ONE = ("param 'W' holds rows 0:5 of its 11 (add(..., rows=)): a save by one process needs every row; save with "
       "coordinator=xser.dist.TorchDistributed() on every rank")

#: id: (world, per-rank changes, options, the error of rank 0 (the other ranks raise it after "rank 0 failed while
#: planning the save: "); "<dir>" is the case's directory, "Mixed.NAME" a subcollection's name
REFUSALS = {
    "replicated-differs": (3, {"2": {"b": 0.5}}, {},
                           f"CheckpointError: Mixed.NAME/b: the ranks hold different values of this replicated parameter "
                           f"(rank 0, 1; rank 2 agree); {TAIL}"),
    "replicated-differs-xsave": (2, {"0": {"b": 0.5}}, {"api": "xsave"},
                                 f"CheckpointError: Mixed.NAME/b: the ranks hold different values of this replicated "
                                 f"parameter (rank 0; rank 1 agree); {TAIL}"),
    "rows-gap": (2, {"0": {"held": [0, 5]}, "1": {"held": [6, 11]}}, {},
                 "CheckpointError: Mixed.NAME/W: rows 5:6 are held by no rank (rank 0 holds 0:5, rank 1 holds 6:11)"),
    "rows-gap-at-the-end": (3, {"2": {"held": [8, 10]}}, {},
                            "CheckpointError: Mixed.NAME/W: rows 10:11 are held by no rank (rank 0 holds 0:4, rank 1 holds "
                            "4:8, rank 2 holds 8:10)"),
    "rows-overlap": (2, {"0": {"held": [0, 7]}, "1": {"held": [5, 11]}}, {},
                     "CheckpointError: Mixed.NAME/W: rows 5:7 are held by rank 0 and rank 1 (rank 0 holds 0:7, rank 1 "
                     "holds 5:11)"),
    "ids-overlap": (2, {"0": {"slice": [0, 7]}, "1": {"slice": [6, 12]}}, {},
                    "CheckpointError: Mixed.NAME/emb: id buckets 6:7 are held by rank 0 and rank 1 (rank 0 holds 0:7, "
                    "rank 1 holds 6:12)"),
    "ids-gap": (3, {"1": {"slice": [4, 7]}}, {},
                "CheckpointError: Mixed.NAME/emb: id buckets 7:8 are held by no rank (rank 0 holds 0:4, rank 1 holds 4:7, "
                "rank 2 holds 8:12)"),
    "component-extra": (2, {"1": {"extra": True}}, {},
                        "CheckpointError: rank 1's model has components at head that rank 0's has not: every rank must "
                        "save the same model"),
    "component-class": (2, {"1": {"cls": "Other"}}, {},
                        "CheckpointError: the component at the root is a !DistMixed on rank 0 and a !DistOther on rank 1"),
    "steps-differ": (2, {"1": {"step": 1}}, {}, "CheckpointError: the ranks save different steps: rank 0: 1, rank 1: 2"),
    "paths-differ": (2, {"1": {"path": "<dir>/other.yaml"}}, {},
                     "CheckpointError: rank 1 saves to <dir>/other.yaml, rank 0 to <dir>/m.yaml: every rank must name "
                     "the same model"),
    "one-process-rows": (0, {"0": {"held": [0, 5]}}, {}, f"DataError: {ONE}"),
    "one-process-rows-xsave": (0, {"0": {"held": [0, 5]}}, {"api": "xsave"}, f"DataError: {ONE}"),
    "one-process-slice": (0, {"0": {"slice": [0, 6]}}, {},
                          "DataError: table 'emb' holds the ids of IdSlice(0, 6, 12) only (add_table(..., slice=)): a save "
                          "by one process needs every id bucket; save with coordinator=xser.dist.TorchDistributed() on every "
                          "rank"),
}


@pytest.fixture(scope="module")
def refused(pool, tmp_path_factory):
    d = tmp_path_factory.mktemp("refused")
    cases = []
    for id, (world, ranks, o, _) in REFUSALS.items():
        ranks = json.loads(json.dumps(ranks).replace("<dir>", str(d / id)))
        cases.append(case(id, world, d / id / "m.yaml", api=o.get("api", "saver"), ranks=ranks))
    return d, pool.run(cases)


@pytest.mark.parametrize("id", list(REFUSALS))
def test_refused(refused, id):
    """Rank 0 refuses parts that do not make one model, naming the ranks (and rows); every rank raises it, and nothing is
    written: no checkpoint, no leftovers."""
    d, results = refused
    got = results[id]
    world, _, _, expected = REFUSALS[id]
    shown = [re.sub(r"\b(\w+)\.[0-9a-f]{8}\b", r"\1.NAME", r.get("error", "")).replace(str(d / id), "<dir>") for r in got]
    assert shown[0] == expected, json.dumps(got, indent=1)
    text = expected.split(": ", 1)[1]
    assert shown[1:] == [f"RankFailure: rank 0 failed while planning the save: {text}"] * (world - 1)
    assert xser.checkpoints(d / id / "m.yaml") == [] and leftovers(d / id / "m.yaml") == []
    assert not os.path.exists(d / id) or os.listdir(d / id) == []


# ---------------------------------------------------------------- each rank killed at each step of the save

#: the steps of a save (distributed.HOOK) at which each rank can die: before its writes, after them, after the manifest's
#: fsync (rank 0), before it acknowledges the manifest, and before publication (rank 0)
STEPS = {0: ["planned", "written", "finished", "acknowledged", "publishing"], 1: ["planned", "written", "acknowledged"]}
PHASE = {"planned": "writing its blocks", "written": "writing its blocks", "finished": "writing its blocks",
         "acknowledged": "publishing", "publishing": "publishing"}


def survivor_error(world: int, fault: dict, store: str) -> str:
    """The error every surviving rank raises when ``fault`` kills a rank (a regular expression)."""
    r, phase = fault["rank"], PHASE[fault.get("at", "planned")]
    if r == 0 and store == "rank0":  # the store went with rank 0: a rank can be a phase behind
        return GONE.format("(planning the save|writing its blocks|publishing)")
    if r == 0 and fault.get("at") == "publishing":
        return re.escape(UNKNOWN)
    return re.escape(late(r, phase))


def kill_campaign(pool, root, world: int, store: str, sample: str) -> list[str]:
    """Kill each rank of a ``world``-rank save at each of its steps and before each filesystem call of its block writes
    (``sample`` "all"), or before its first and last such call ("ends"); for every kill: nothing published (bit-exact),
    every survivor raises naming the killed rank, within the timeout; the next job's save cleans up. The problems."""
    made = pool.run([case("t", world, root / "t/m.yaml", steps=[1, 2])]
                    + [case(f"probe{r}", world, root / f"probe{r}/m.yaml", steps=[1], fault={"rank": r, "kind": "kill", "call": 10**6})
                       for r in range(world)])
    for res in made.values():
        oks(res)
    calls = {r: made[f"probe{r}"][r]["calls"] for r in range(world)}
    assert all(n >= 5 for n in calls.values()), calls  # each rank's writes: opens, writes, fsyncs, renames of its files
    faults = []
    for r in range(world):
        faults += [{"rank": r, "kind": "kill", "at": s} for s in STEPS[min(r, 1)]]
        ks = range(1, calls[r] + 1) if sample == "all" else sorted({1, calls[r]})
        faults += [{"rank": r, "kind": "kill", "call": k} for k in ks]
    if store == "launcher":
        faults = [f for f in faults if f["rank"] == 0]  # where the store lives matters only when rank 0 dies
    before = fingerprint(root / "t/m.yaml")
    cases = []
    for i, fault in enumerate(faults):
        shutil.copytree(root / "t", root / f"k{i}", symlinks=True)
        cases.append(case(f"k{i}", world, root / f"k{i}/m.yaml", store=store, steps=[3], resume=2, timeout=TIMEOUT, fault=fault))
    problems = []
    for at in range(0, len(cases), 20):  # twenty jobs at once
        got = pool.run(cases[at:at + 20])
        for c in cases[at:at + 20]:
            i, fault = int(c["id"][1:]), c["args"]["fault"]
            res, path, what = got[c["id"]], root / c["id"] / "m.yaml", json.dumps(fault)
            if res[fault["rank"]].get("ended") != "killed by signal 9":
                problems.append(f"{what}: the rank was not killed: {res[fault['rank']]}")
            expected = survivor_error(world, fault, store)
            for r, x in enumerate(res):
                if r != fault["rank"] and (x["ok"] or "ended" in x or not re.fullmatch(expected, x["error"])):
                    problems.append(f"{what}: rank {r}: {x}")
                elif r != fault["rank"] and x["seconds"] > 2 * TIMEOUT + SLACK:
                    problems.append(f"{what}: rank {r} took {x['seconds']} s")
            if fingerprint(path) != before:
                problems.append(f"{what}: the model changed: {fingerprint(path)}")
            if fault["rank"] != 0 and leftovers(path):
                problems.append(f"{what}: rank 0 left {leftovers(path)}")
    again = [case(c["id"], world, c["path"], steps=[3], resume=2) for c in cases]
    for at in range(0, len(again), 20):
        got = pool.run(again[at:at + 20])
        for c in again[at:at + 20]:
            path = root / c["id"] / "m.yaml"
            bad = [x for x in got[c["id"]] if not x["ok"] or x.get("problems")]
            if bad or leftovers(path) or [k.step for k in xser.checkpoints(path)] != [3, 2]:
                problems.append(f"{c['args']}: the next save: {bad} {leftovers(path)} {xser.checkpoints(path)}")
    return problems


def test_kill_each_rank_at_each_step(pool, tmp_path):
    """3 ranks: each killed at each step of its save, and before its first and its last filesystem call while writing."""
    assert kill_campaign(pool, tmp_path, 3, "rank0", "ends") == []


@pytest.mark.campaign
@pytest.mark.parametrize("world, store", [(2, "rank0"), (2, "launcher"), (3, "rank0"), (3, "launcher")])
def test_kill_campaign(pool, tmp_path, world, store):
    """Each rank killed at each step and before each filesystem call of its block writes."""
    assert kill_campaign(pool, tmp_path, world, store, "all") == []
