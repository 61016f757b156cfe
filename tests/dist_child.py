"""One rank of a multi-process test (``test_dist.py``): ``python dist_child.py RANK WORLD PORT SCENARIO PATH [ARGS]``.

Joins a gloo job over ``tcp://127.0.0.1:PORT``, makes a ``xser.dist.TorchDistributed`` coordinator, runs the
scenario and prints one JSON line (``{"rank", "ok", "error", ...}``). With WORLD == 0 it runs alone, without
torch.distributed (``xser.dist.Local``). The model (``Mixed``) holds every kind of state: rows of ``W`` (each
rank its share), a replicated ``b``, a hash table sharded by id with RecIS's rule, and per-rank training state;
its values are a function of the global row, id and step, so any rank at any world size knows what it must read.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import xser  # noqa: E402
import xser.dist  # noqa: E402

ROWS, COLS, BUCKETS, IDS = 11, 3, 12, 40


def w_rows(step: int, a: int, b: int) -> np.ndarray:
    return (np.arange(a, b, dtype=np.float32)[:, None] * 10 + np.arange(COLS, dtype=np.float32) + step * 1000)


def table_ids(c) -> np.ndarray:
    """The ids this rank holds: those of its id slice among 0..IDS*7 step 7, and some negative ones."""
    every = np.concatenate([np.arange(0, IDS * 7, 7), -np.arange(1, 20, 3)]).astype(np.int64)
    sl = xser.IdSlice(*xser.dist.rows(BUCKETS, c), BUCKETS)
    return np.sort(every[sl.mask(every)])


def t_rows(step: int, ids: np.ndarray) -> np.ndarray:
    return ids.astype(np.float32)[:, None] * np.array([1, -1, 0.5, 2], np.float32) + step


@xser.serializable
class Mixed:
    def __init__(self, rows: int = ROWS, cols: int = COLS, buckets: int = BUCKETS):
        p = xser.params(self)
        self.W = p.add("W", (rows, cols), rows=xser.dist.rows(rows))
        self.b = p.add("b", (cols,))
        self.emb = p.add_table("emb", 4, slots=("m",), slice=xser.IdSlice(*xser.dist.rows(buckets), buckets))


def fill(m: Mixed, c, step: int) -> None:
    a, b = xser.dist.rows(ROWS, c)
    m.W[...] = w_rows(step, a, b)
    m.b[...] = np.arange(COLS, dtype=np.float32) + step
    ids = table_ids(c)
    m.emb.get(ids, insert=True)
    m.emb.set(ids, t_rows(step, ids))
    m.emb.set(ids, -t_rows(step, ids), slot="m")


def check(m: Mixed, c, step: int) -> list[str]:
    """What differs from step ``step``'s values at this rank's share."""
    a, b = xser.dist.rows(ROWS, c)
    problems = []
    if not np.array_equal(m.W, w_rows(step, a, b)):
        problems.append(f"W rows {a}:{b} differ")
    if not np.array_equal(m.b, np.arange(COLS, dtype=np.float32) + step):
        problems.append("b differs")
    ids = table_ids(c)
    if not np.array_equal(m.emb.ids, ids):
        problems.append(f"emb ids {m.emb.ids.tolist()} != {ids.tolist()}")
    elif ids.size and (not np.array_equal(m.emb.get(ids), t_rows(step, ids)) or not np.array_equal(m.emb.get(ids, slot="m"), -t_rows(step, ids))):
        problems.append("emb rows differ")
    return problems


def coordinator(rank: int, world: int, port: int, timeout: float):
    if world == 0:
        return xser.dist.Local()
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    return xser.dist.TorchDistributed(timeout=timeout)


def kill_at(where: str | None, rank: int) -> None:
    """``where`` is "RANK:STEP": SIGKILL that rank just before that step of the save."""
    if not where:
        return
    who, step = where.split(":")
    if int(who) != rank:
        return
    from xser.checkpoints import distributed

    def hook(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    distributed.HOOK = hook


def main() -> None:
    rank, world, port, scenario, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    args = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
    c = coordinator(rank, world, port, args.get("timeout", 20))
    out: dict = {"rank": rank, "ok": True}
    t0 = time.monotonic()
    try:
        if scenario == "save":  # save steps 1..n with a CheckpointSaver; the last with a kill or failure if asked
            with xser.dist.using(c):
                m = Mixed()
            with xser.CheckpointSaver(path, keep=args.get("keep", 2), coordinator=c) as saver:
                for step in range(1, args.get("steps", 1) + 1):
                    fill(m, c, step)
                    last = step == args.get("steps", 1)
                    if last:
                        kill_at(args.get("kill"), rank)
                        if args.get("raise") == rank:
                            def boom(name: str) -> None:
                                if name == args.get("at", "planned"):
                                    raise ValueError(f"boom on rank {rank}")
                            from xser.checkpoints import distributed
                            distributed.HOOK = boom
                        if args.get("sleep") == rank:
                            time.sleep(args.get("seconds", 30))
                    report = saver.save(m, step=step, training={"rank": rank, "step": step},
                                        training_state={"rng": np.full(3, rank * 100 + step, np.int64)})
                    out["report"] = [report.path, report.written, list(report.removed_steps)]
        elif scenario == "load":
            m = xser.load(path, coordinator=c)
            step = xser.checkpoints(path)[0].step
            out["problems"] = check(m, c, step)
            out["step"] = step
        elif scenario == "xsave":
            with xser.dist.using(c):
                m = Mixed()
            fill(m, c, args.get("step", 1))
            xser.save(m, path, coordinator=c)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    except Exception as e:  # noqa: BLE001 - the test compares the message
        out.update(ok=False, error=f"{type(e).__name__}: {getattr(e, 'message', str(e))}")
    out["seconds"] = round(time.monotonic() - t0, 3)
    print(json.dumps(out), flush=True)
    os._exit(0)  # no atexit teardown of the process group: a dead peer must not make the exit hang


if __name__ == "__main__":
    main()
