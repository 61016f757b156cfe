"""The ranks of the multi-process tests (``test_dist.py``).

Two ways to run it:

- ``python dist_child.py RANK WORLD PORT SCENARIO PATH [JSON ARGS]``: one rank of one job, by hand. Start it once per
  rank (``for r in 0 1; do python tests/dist_child.py $r 2 29511 save /tmp/d/m.yaml '{"steps": [1, 2, 3]}' & done``),
  then load at any world size (``... $r 3 29512 load /tmp/d/m.yaml``) or alone (WORLD 0: ``xser.dist.Local``, no
  torch.distributed). Prints one JSON line (``{"rank", "ok", "error", ...}``).
- ``python dist_child.py serve RANK``: a worker of ``test_dist.py``'s pool. It imports torch once, then reads
  *phases* from stdin, one JSON line each (``{"phase", "wait", "cases": [{"id", "world", "port", "scenario",
  "path", "args", "store"}, ...]}``). For every case this rank takes part in (rank < world; WORLD 0 or 1: rank 0
  only) it forks a child that joins that case's job on its own port and runs the scenario; the cases of a phase
  run at once. It prints one JSON line per case (the child's result, or how the child ended: ``"killed"`` by a
  signal, or ``"hung"`` and killed once the phase's ``wait`` seconds passed), then ``{"done": phase}``.

The model (``Mixed``) holds every kind of state: rows of ``W`` (each rank its share), a replicated ``b``, a hash
table ``emb`` with a slot, sharded by id with RecIS's rule, and per-rank training state; its values are a function
of the global row, id and step, so any rank at any world size knows what it must read.

Faults (``args["fault"]``, on the last save of a ``save``/``xsave`` scenario, on ``fault["rank"]`` only):
``{"kind": "kill", "at": STEP}`` SIGKILLs the rank just before that step of ``distributed.HOOK``
("planned", "written", "finished", "acknowledged", "publishing"; "start": before the save is called);
``{"kind": "kill", "call": K}`` just before its K-th filesystem-changing call between "planned" and "written"
(its block writes; ``crash_child.arm``), and reports ``calls`` when the writes made fewer;
``{"kind": "raise", "at": STEP, "unpicklable": bool}``; ``{"kind": "sleep", "at": STEP, "seconds": S}``;
``{"kind": "bad-training"}``: a training dict that is not JSON data (the save's snapshot raises).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import xser  # noqa: E402
import xser.dist  # noqa: E402

ROWS, COLS, BUCKETS, IDS = 11, 3, 12, 40

#: the rows (``held``) and id buckets (``slice``) a rank declares instead of its share (refusal tests)
OVERRIDE: dict = {}
#: what a rank adds to its training dict (a fault puts something there that is not JSON data)
TRAINING: dict = {}


def w_rows(step: int, a: int, b: int) -> np.ndarray:
    return (np.arange(a, b, dtype=np.float32)[:, None] * 10 + np.arange(COLS, dtype=np.float32) + step * 1000)


def every_id() -> np.ndarray:
    return np.concatenate([np.arange(0, IDS * 7, 7), -np.arange(1, 20, 3)]).astype(np.int64)


def table_ids(c, buckets: int = BUCKETS, buckets_held: tuple | None = None) -> np.ndarray:
    """The ids this rank holds: those of its id slice among 0..IDS*7 step 7, and some negative ones."""
    sl = xser.IdSlice(*(buckets_held or xser.dist.rows(buckets, c)), buckets)
    return np.sort(every_id()[sl.mask(every_id())])


def t_rows(step: int, ids: np.ndarray) -> np.ndarray:
    return ids.astype(np.float32)[:, None] * np.array([1, -1, 0.5, 2], np.float32) + step


@xser.serializable(tag="!DistHead")
class Head:
    def __attrs_post_init__(self):
        self.v = xser.params(self).add("v", (2,))


@xser.serializable(tag="!DistMixed")
class Mixed:
    rows: int = ROWS
    cols: int = COLS
    buckets: int = BUCKETS
    head: Any = None  # a child component (Head) on a rank whose model differs

    def __attrs_post_init__(self):
        p = xser.params(self)
        held = OVERRIDE.get("held")
        self.W = p.add("W", (self.rows, self.cols), rows=tuple(held) if held else xser.dist.rows(self.rows))
        self.b = p.add("b", (self.cols,))
        sl = OVERRIDE.get("slice")
        self.emb = p.add_table("emb", 4, slots=("m",), slice=xser.IdSlice(*(sl or xser.dist.rows(self.buckets)), self.buckets))


@xser.serializable(tag="!DistOther")
class Other(Mixed):
    pass


def fill(m: Mixed, c, step: int, rows: int = ROWS, buckets: int = BUCKETS, b_delta: float = 0.0) -> None:
    a, b = OVERRIDE.get("held") or xser.dist.rows(rows, c)
    m.W[...] = w_rows(step, a, b)
    m.b[...] = np.arange(COLS, dtype=np.float32) + step + b_delta
    ids = table_ids(c, buckets, OVERRIDE.get("slice"))
    m.emb.get(ids, insert=True)
    m.emb.set(ids, t_rows(step, ids))
    m.emb.set(ids, -t_rows(step, ids), slot="m")


def check(m: Mixed, c, step: int, rows: int = ROWS, buckets: int = BUCKETS) -> list[str]:
    """What differs from step ``step``'s values at this rank's share."""
    a, b = xser.dist.rows(rows, c)
    problems = []
    if m.W.shape != (b - a, COLS) or not np.array_equal(m.W, w_rows(step, a, b)):
        problems.append(f"W rows {a}:{b} differ (shape {m.W.shape})")
    if not np.array_equal(m.b, np.arange(COLS, dtype=np.float32) + step):
        problems.append("b differs")
    ids = table_ids(c, buckets)
    if not np.array_equal(m.emb.ids, ids):
        problems.append(f"emb ids {m.emb.ids.tolist()} != {ids.tolist()}")
    elif ids.size and (not np.array_equal(m.emb.get(ids), t_rows(step, ids)) or not np.array_equal(m.emb.get(ids, slot="m"), -t_rows(step, ids))):
        problems.append("emb rows differ")
    return problems


# ---------------------------------------------------------------- the job


def coordinator(rank: int, world: int, port: int, timeout: float, store: str = "rank0"):
    """``Local()`` for WORLD 0; else join the gloo job. ``store``: "rank0" (``init_method=tcp://``: rank 0 holds the
    job's store, as with ``mp.spawn``) or "launcher" (another process holds it, as torchrun's agent does)."""
    if world == 0:
        return xser.dist.Local()
    import datetime

    import torch.distributed as dist

    limit = datetime.timedelta(seconds=60)
    if store == "launcher":
        s = dist.TCPStore("127.0.0.1", port, world, False, timeout=limit)
        dist.init_process_group("gloo", store=s, rank=rank, world_size=world, timeout=limit)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=limit)
    return xser.dist.TorchDistributed(timeout=timeout)


def host_store(port: int, world: int) -> None:
    """The launcher's store (a process of its own, as torchrun's agent): serves until killed."""
    import datetime

    import torch.distributed as dist

    _store = dist.TCPStore("127.0.0.1", port, world, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
    while True:
        time.sleep(60)


def leave(rank: int, world: int) -> None:
    """Before the process exits: every rank waits (a few seconds at most) until every other rank is done with the job,
    so that no rank finds the store gone (rank 0 holds it with ``init_method=tcp://``) or a gloo connection closed
    while it still reads the last outcome or still joins the job."""
    if world < 2:
        return
    import datetime

    import torch.distributed as dist

    try:
        s = dist.distributed_c10d._get_default_store()
        s.set(f"dist_child/left/{rank}", "1")
        s.wait([f"dist_child/left/{r}" for r in range(world) if r != rank], datetime.timedelta(seconds=3))
    except Exception:  # noqa: BLE001 - a rank that died or hangs, or the store gone: leave anyway
        pass


class Unpicklable(Exception):
    """An exception that pickle cannot carry: it holds a lock, and refuses to be reduced."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lock = threading.Lock()

    def __reduce__(self):
        raise TypeError("cannot pickle an Unpicklable")


def arm_fault(fault: dict | None, rank: int, out: dict) -> None:
    """Install ``fault`` (see the module's doc) on this rank if it is the rank named."""
    from xser.checkpoints import distributed

    distributed.HOOK = None
    if not fault or fault.get("rank") != rank:
        return
    kind, at = fault["kind"], fault.get("at")
    if kind == "bad-training":
        TRAINING["bad"] = {1, 2}  # not JSON data: the snapshot of the save refuses it
        return
    if kind == "kill" and "call" in fault:
        import crash_child

        undo: list = []

        def record(obj, name, value):
            undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        count: list = []

        def hook(name: str) -> None:
            if name == "planned":
                count.append(crash_child.arm(fault["call"], None, record))
            elif name == "written" and count:
                for obj, attr, value in reversed(undo):
                    setattr(obj, attr, value)
                out["calls"] = count[0][0]  # the kill did not land: the writes made fewer calls

        distributed.HOOK = hook
        return

    def act() -> None:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "sleep":
            time.sleep(fault.get("seconds", 30))
        elif kind == "raise":
            text = f"boom on rank {rank}"
            raise Unpicklable(text) if fault.get("unpicklable") else ValueError(text)
        else:
            raise SystemExit(f"unknown fault {kind}")

    if at == "start":
        act()
    else:
        distributed.HOOK = lambda name: act() if name == at else None


# ---------------------------------------------------------------- scenarios


def scenario_save(c, rank: int, path: str, args: dict, out: dict) -> None:
    """Save ``args["steps"]`` (default [1]) in turn; the fault, if any, on the last. ``api``: "saver" (the default) a
    CheckpointSaver; "xsave" ``xser.save``; "async" ``saver.save(blocking=False)``, every array of the model changed in
    place as soon as it returns, then ``.result()``; "async-close" the same without ``.result()`` (the end of the
    ``with`` block waits). ``resume``: first load the newest checkpoint (its values checked against step ``resume``).
    ``ranks``: per-rank changes (``held``, ``slice``: see OVERRIDE; ``extra``: a child component; ``cls`` "Other";
    ``b``: added to the replicated b; ``step``: added to the step; ``path``). ``seconds``: how long the last save took
    to return or raise (to close the saver, with "async-close")."""
    rows, buckets = args.get("rows", ROWS), args.get("buckets", BUCKETS)
    mine = args.get("ranks", {}).get(str(rank), {})
    OVERRIDE.clear()
    OVERRIDE.update({k: v for k, v in mine.items() if k in ("held", "slice")})
    path = mine.get("path", path)
    if args.get("resume") is not None:
        m = xser.load(path, coordinator=c)
        out["problems"] = check(m, c, args["resume"], rows, buckets)
    else:
        with xser.dist.using(c):
            m = (Other if mine.get("cls") == "Other" else Mixed)(rows, COLS, buckets, Head() if mine.get("extra") else None)
    steps, api, state = args.get("steps", [1]), args.get("api", "saver"), args.get("state", True)
    out["reports"] = []
    t0 = [0.0]

    def one(save, step: int, last: bool) -> None:
        fill(m, c, step, rows, buckets, mine.get("b", 0.0))
        step += mine.get("step", 0)
        if last:
            arm_fault(args.get("fault"), rank, out)
            t0[0] = time.monotonic()
        report = save(step)
        if api.startswith("async"):
            fill(m, c, step + 500, rows, buckets)  # changed in place at once: none of it may reach the checkpoint
            report = report.result() if api == "async" else None
        if last:
            out["seconds"] = round(time.monotonic() - t0[0], 3)
        out["reports"].append([report.written, list(report.removed_steps)] if report is not None else None)

    try:
        if api == "xsave":
            for i, step in enumerate(steps):
                one(lambda s: xser.save(m, path, training={"rank": rank, "step": s, **TRAINING}, threads=args.get("threads", 2),
                                        coordinator=c), step, i == len(steps) - 1)
            return
        with xser.CheckpointSaver(path, keep=args.get("keep", 2), restart=args.get("restart", False),
                                  threads=args.get("threads", 2), coordinator=c) as saver:
            for i, step in enumerate(steps):
                one(lambda s: saver.save(m, step=s, training={"rank": rank, "step": s, **TRAINING}, blocking=not api.startswith("async"),
                                         training_state={"rng": np.full(3, rank * 100 + s, np.int64)} if state else None),
                    step, i == len(steps) - 1)
    finally:
        if t0[0] and "seconds" not in out:
            out["seconds"] = round(time.monotonic() - t0[0], 3)


def scenario_load(c, rank: int, path: str, args: dict, out: dict) -> None:
    """Load the newest checkpoint; check this rank's share against its step (or ``args["step"]``: xser.save has none)."""
    m = xser.load(path, coordinator=c)
    step = args.get("step", xser.checkpoints(path)[0].step)
    out["problems"] = check(m, c, step, args.get("rows", ROWS), args.get("buckets", BUCKETS))
    out["step"] = step
    out["shapes"] = [list(m.W.shape), int(m.emb.ids.size)]
    if args.get("state"):  # this rank's own training state, None at another world size (rank_state="drop")
        state = xser.load_training_state(path, coordinator=c, rank_state="drop")
        out["state"] = None if state is None else state["rng"].tolist()


SCENARIOS = {"save": scenario_save, "load": scenario_load}


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {getattr(e, 'message', None) or str(e)}"


def run_case(rank: int, case: dict) -> dict:
    """This rank's part of one case: join its job, run its scenario; the result (never raises)."""
    world, args = case["world"], case.get("args", {})
    out: dict = {"rank": rank, "case": case.get("id"), "ok": True}
    try:
        c = coordinator(rank, world, case.get("port", 0), args.get("timeout", 20), case.get("store", "rank0"))
    except Exception as e:  # noqa: BLE001 - reported
        out.update(ok=False, error=f"joining the job: {describe(e)}")
        return out
    try:
        SCENARIOS[case["scenario"]](c, rank, case["path"], args, out)
    except Exception as e:  # noqa: BLE001 - the test compares the message
        out.update(ok=False, error=describe(e))
    return out


# ---------------------------------------------------------------- the pool worker


def serve(rank: int) -> None:
    """Run the phases read from stdin (see the module's doc)."""
    import tempfile

    import torch.distributed  # noqa: F401 - once, before any fork

    import crash_child  # noqa: F401 - the same, for kills at a filesystem call
    # ``import xser`` is lazy: what the ranks' saves and loads use is imported here, before any fork, by one save and
    # load of a small model with no coordinator (the YAML emitter and parser, the saver, the readers), or each forked
    # rank would import it inside its first timed round (seconds on a loaded machine, past the tests' short timeouts)
    import xser.checkpoints.distributed  # noqa: F401
    import xser.checkpoints.rank_state  # noqa: F401
    import xser.tools.ranks  # noqa: F401
    import xser.tools.reader  # noqa: F401

    with tempfile.TemporaryDirectory() as warm:
        with xser.CheckpointSaver(os.path.join(warm, "m.yaml"), keep=2) as s:
            s.save(Head(), step=1)
        xser.load(os.path.join(warm, "m.yaml"))
        xser.read_params(os.path.join(warm, "m.yaml"))
        xser.CheckpointReader(os.path.join(warm, "m.yaml")).close()

    print(json.dumps({"ready": rank}), flush=True)
    hosts: list[int] = []  # the stores of the last phase's jobs: they serve until every rank's phase is over

    def stop_hosts() -> None:
        for pid in hosts:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        hosts.clear()

    for line in sys.stdin:
        stop_hosts()  # every rank is done with the last phase: the test sent the next one
        phase = json.loads(line)
        results: dict = {}
        with tempfile.TemporaryDirectory(prefix=f"xser-dist-{rank}-") as tmp:
            kids: dict[int, dict] = {}
            for case in phase["cases"]:
                if rank == 0 and case.get("store") == "launcher" and case["world"] > 0:
                    pid = os.fork()
                    if pid == 0:
                        _child(lambda: host_store(case["port"], case["world"]))
                    hosts.append(pid)
                if rank < max(case["world"], 1):
                    pid = os.fork()
                    if pid == 0:
                        _child(lambda: _case_child(rank, case, os.path.join(tmp, f"{case['id']}.json")))
                    kids[pid] = case
            deadline = time.monotonic() + phase.get("wait", 60)
            hung: set[int] = set()
            while kids:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    if time.monotonic() > deadline:
                        for k in kids:
                            if k not in hung:
                                hung.add(k)
                                os.kill(k, signal.SIGKILL)
                    time.sleep(0.01)
                    continue
                case = kids.pop(pid, None)
                if case is None:  # a store host that ended (it could not serve): nothing to stop later
                    hosts.remove(pid)
                    continue
                file = os.path.join(tmp, f"{case['id']}.json")
                if os.path.exists(file):
                    with open(file) as f:
                        got = json.load(f)
                else:
                    got = {"rank": rank, "case": case["id"], "ok": False}
                if pid in hung:
                    got["ended"] = "hung"
                elif os.WIFSIGNALED(status):
                    got["ended"] = f"killed by signal {os.WTERMSIG(status)}"
                elif os.WEXITSTATUS(status) != 0:
                    got["ended"] = f"exit status {os.WEXITSTATUS(status)}"
                results[case["id"]] = got
        for got in results.values():
            print(json.dumps(got), flush=True)
        print(json.dumps({"done": phase["phase"]}), flush=True)
    stop_hosts()


def _child(fn) -> None:
    """In a forked child: run ``fn``, then leave at once (no teardown of the parent's state)."""
    code = 0
    try:
        os.dup2(2, 1)  # the parent's stdout is the protocol: stray prints go to stderr
        fn()
    except BaseException as e:  # noqa: BLE001 - the parent reports the exit status
        print(f"dist_child: {describe(e)}", file=sys.stderr, flush=True)
        code = 3
    os._exit(code)


def _case_child(rank: int, case: dict, file: str) -> None:
    out = run_case(rank, case)
    with open(file + ".tmp", "w") as f:
        json.dump(out, f)
    os.rename(file + ".tmp", file)
    leave(rank, case["world"])


def main() -> None:
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
        return
    rank, world, port, scenario, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    args = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
    out = run_case(rank, {"world": world, "port": port, "scenario": scenario, "path": path, "args": args})
    print(json.dumps(out), flush=True)
    leave(rank, world)
    os._exit(0)  # no atexit teardown of the process group: a dead peer must not make the exit hang


if __name__ == "__main__":
    main()
