"""Distributed save/load benchmark (issue 22): xser against PyTorch DCP, 2 ranks on gloo, same run.

Each rank holds its rows of N global float32 arrays (``--mib`` MiB per rank, 512 by default; the
arrays are 1024 columns wide and row-sharded evenly, 32 arrays and again 2,048). Every measurement
("cell") runs in fresh processes launched by this script (``init_process_group("gloo",
init_method="tcp://127.0.0.1:<free port>")``, ``OMP_NUM_THREADS=1`` as torchrun sets it), so peak RSS
and allocator state start clean; sides alternate which goes first in each repeat, and ``os.sync()``
runs (untimed) before each cell so that no other cell's dirty pages are written during it.

Anchor (PyTorch DCP, default options): the state dict is one ``DTensor`` per array, ``Shard(0)`` on a
CPU ``DeviceMesh``, so each rank writes its own rows. ``FileSystemWriter`` defaults: one file per rank
(``thread_count=1``), each file fsynced (``sync_files=True``); rank 0 writes ``.metadata.tmp``, fsyncs
it and renames it to ``.metadata`` (no directory fsync). ``dcp.async_save`` (thread executor, the
default ``DefaultStager``: a synchronous copy of every tensor to fresh CPU memory on the caller's
thread, then ``save`` in a background thread). Loads go into freshly allocated (``empty``) DTensors.

xser: a component holding this rank's rows (``p.add(..., rows=xser.dist.rows(R))``),
``CheckpointSaver(..., coordinator=xser.dist.TorchDistributed())``: ``save`` (durable by default),
``save(blocking=False)`` and ``.result()``, ``xser.load(..., coordinator=)``. The saver is made (model
lock, leftovers cleaned) before the timed part, as DCP has nothing to open.

Cells, per layout and repeat:

- ``save``: 2 ranks; a durable save (time, peak RSS over the rank's baseline), then a load at the
  same world size into new memory (time, checked against the data).
- ``async``: 2 ranks; two async saves one after the other (xser allocates its host buffer in the first and
  reuses it in the second; DCP stages into fresh memory each time): the time each blocks the caller, the time
  until its future is done (durable commit); peak RSS over the baseline across both.
- ``reshard``: 3 ranks load the 2-rank checkpoint of ``save``; bytes read per rank (``rchar`` of
  /proc/self/io around the load: bytes returned by read calls, whether or not from the page cache)
  against the bytes the rank owns.

Times are the slowest rank's (the call returns on every rank only when the collective step is done).
Peak RSS is ``VmHWM`` after ``malloc_trim(0)`` and ``clear_refs`` (5), minus the rank's ``VmRSS`` right after them, with the
state allocated and one small warm-up save and load of the kind the cell times already done (lazy imports and first-call
costs are not timed).

    python benchmarks/bench_dist.py [--mib 512] [--arrays 32,2048] [--repeats 1] [--only dcp|xser] [--dir /tmp]
    python benchmarks/bench_dist.py --mib 64 --repeats 1          # a smoke run (also --scale 64)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLS = 1024

# ----------------------------------------------------------------------------------------------
# helpers shared by the parent and the ranks


def proc_field(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise KeyError(field)


def rss() -> int:
    return proc_field("/proc/self/status", "VmRSS:") * 1024


def hwm() -> int:
    return proc_field("/proc/self/status", "VmHWM:") * 1024


def reset_hwm() -> int:
    """Give freed heap memory back (so that a step cannot reuse it unseen), reset the peak RSS to the current
    RSS, and return the current RSS (the baseline)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss()


def rchar() -> int:
    return proc_field("/proc/self/io", "rchar:")


def even_rows(total: int, rank: int, world: int) -> tuple[int, int]:
    """torch's Shard(0) split: ceil-sized chunks, the last ones shorter (or empty)."""
    chunk = -(-total // world)
    start = min(rank * chunk, total)
    return start, min(start + chunk, total)


def fill(a: np.ndarray, i: int, start: int) -> None:
    """Rows ``start:start+len(a)`` of global array ``i``: distinct, deterministic values, cheap to make."""
    rows, cols = a.shape
    step = max(1, (1 << 22) // max(cols, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        g = (np.arange(start + r0, start + r1, dtype=np.int64)[:, None] * cols + np.arange(cols, dtype=np.int64)[None, :])
        a[r0:r1] = ((g * 2654435761 + i * 40503) % 16777213).astype(np.float32)


def check(a: np.ndarray, i: int, start: int, what: str) -> None:
    want = np.empty_like(a)
    fill(want, i, start)
    if not np.array_equal(a, want):
        raise AssertionError(f"{what}: array {i} rows from {start} differ from what was saved")


def warm(nbytes: int) -> None:
    """Touch as much fresh memory as a step may allocate, then free it (see bench_save_load.warm)."""
    if nbytes:
        buf = np.ones(nbytes, dtype=np.uint8)
        del buf


# ----------------------------------------------------------------------------------------------
# the ranks


def rank_main(cfg: dict) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = cfg["rank"], cfg["world"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=cfg["timeout"]))
    try:
        side = DcpSide(cfg) if cfg["side"] == "dcp" else XserSide(cfg)
        side.warm_up(cfg["op"])
        out = {"rank": rank}
        if cfg["op"] == "save":
            state = side.make_state()
            out["state_bytes"] = side.state_bytes(state)
            gc.collect()
            warm(out["state_bytes"])
            dist.barrier()
            side.open()
            base = reset_hwm()
            t = time.perf_counter()
            side.save(state)
            out["save_s"] = time.perf_counter() - t
            out["save_rss"] = hwm() - base
            side.close()
            del state
            gc.collect()
            warm(out["state_bytes"])
            dist.barrier()
            t = time.perf_counter()
            loaded = side.load()
            out["load_s"] = time.perf_counter() - t
            side.verify(loaded)
        elif cfg["op"] == "async":
            state = side.make_state()
            out["state_bytes"] = side.state_bytes(state)
            gc.collect()
            warm(2 * out["state_bytes"])
            dist.barrier()
            side.open()
            base = reset_hwm()
            for k, suffix in ((1, ""), (2, "2")):  # the first save allocates the host buffer, the second reuses it
                dist.barrier()
                t = time.perf_counter()
                handle = side.async_save(state, k)
                out["block" + suffix + "_s"] = time.perf_counter() - t
                side.wait(handle)
                out["commit" + suffix + "_s"] = time.perf_counter() - t
            out["async_rss"] = hwm() - base  # over both saves
            side.close()
        elif cfg["op"] == "reshard":
            gc.collect()
            warm(cfg["warm_bytes"])
            dist.barrier()
            r0 = rchar()
            t = time.perf_counter()
            loaded = side.load()
            out["load_s"] = time.perf_counter() - t
            out["rchar"] = rchar() - r0
            out["owned"] = side.owned_bytes(loaded)
            side.verify(loaded)
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


class DcpSide:
    def __init__(self, cfg):
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh

        self.torch, self.dcp, self.cfg = torch, dcp, cfg
        self.rank, self.world = cfg["rank"], cfg["world"]
        self.mesh = init_device_mesh("cpu", (self.world,))

    def warm_up(self, op):
        """A small save and load of the kind the cell times (imports and first calls are not timed)."""
        d = os.path.join(self.cfg["scratch"], "warm-dcp")
        sd = self._empty_state(4, 8 * self.world, 4)
        if op == "async":
            self.dcp.async_save(sd, checkpoint_id=d).result()
        else:
            self.dcp.save(sd, checkpoint_id=d)
        self.dcp.load(sd, checkpoint_id=d)

    def _empty_state(self, n, rows, cols):
        from torch.distributed.tensor import Shard, empty

        return {f"w{i}": empty(rows, cols, dtype=self.torch.float32, device_mesh=self.mesh, placements=[Shard(0)])
                for i in range(n)}

    def make_state(self):
        c = self.cfg
        sd = self._empty_state(c["n"], c["rows"], c["cols"])
        for i, t in enumerate(sd.values()):
            start, _ = even_rows(c["rows"], self.rank, self.world)
            fill(t.to_local().numpy(), i, start)
        return sd

    @staticmethod
    def state_bytes(sd):
        return sum(t.to_local().nbytes for t in sd.values())

    owned_bytes = state_bytes

    def save(self, sd):
        self.dcp.save(sd, checkpoint_id=self.cfg["path"])

    def open(self):
        pass

    close = open

    def async_save(self, sd, step):
        return self.dcp.async_save(sd, checkpoint_id=os.path.join(self.cfg["path"], f"step-{step}"))

    @staticmethod
    def wait(fut):
        fut.result()

    def load(self):
        c = self.cfg
        sd = self._empty_state(c["n"], c["rows"], c["cols"])
        self.dcp.load(sd, checkpoint_id=c["path"])
        return sd

    def verify(self, sd):
        c = self.cfg
        start, _ = even_rows(c["rows"], self.rank, self.world)
        for i in sorted({0, c["n"] // 2, c["n"] - 1}):
            check(sd[f"w{i}"].to_local().numpy(), i, start, "dcp.load")


class XserSide:
    def __init__(self, cfg):
        import xser
        import xser.dist

        self.xser, self.cfg = xser, cfg
        self.rank, self.world = cfg["rank"], cfg["world"]
        self.coord = xser.dist.TorchDistributed(timeout=cfg["timeout"])
        self.Shards = shards_class()

    def _model(self, n, rows, cols):
        with self.xser.dist.using(self.coord):
            return self.Shards(n=n, rows=rows, cols=cols)

    def warm_up(self, op):
        d = os.path.join(self.cfg["scratch"], "warm-xser", "m.yaml")
        m = self._model(4, 8 * self.world, 4)
        with self.xser.CheckpointSaver(d, keep=2, coordinator=self.coord) as s:
            if op == "async":
                s.save(m, step=1, blocking=False).result()
            else:
                s.save(m, step=1)
        self.xser.load(d, coordinator=self.coord)

    def make_state(self):
        c = self.cfg
        m = self._model(c["n"], c["rows"], c["cols"])
        for i, a in enumerate(m.ws):
            fill(a, i, m.start)
        return m

    @staticmethod
    def state_bytes(m):
        return sum(a.nbytes for a in m.ws)

    owned_bytes = state_bytes

    def open(self):
        self._saver = self.xser.CheckpointSaver(self.cfg["path"], keep=2, coordinator=self.coord,
                                                shards=self.cfg.get("xser_shards"))

    def close(self):
        self._saver.close()

    def save(self, m):
        self._saver.save(m, step=1)

    def async_save(self, m, step):
        return self._saver.save(m, step=step, blocking=False)

    @staticmethod
    def wait(h):
        h.result()

    def load(self):
        return self.xser.load(self.cfg["path"], coordinator=self.coord)

    def verify(self, m):
        c = self.cfg
        for i in sorted({0, c["n"] // 2, c["n"] - 1}):
            check(m.ws[i], i, m.start, "xser.load")


_SHARDS = None


def shards_class():
    """The benchmark's component, registered once per process: this rank's rows of ``n`` global arrays."""
    global _SHARDS
    if _SHARDS is None:
        import xser
        import xser.dist

        @xser.serializable(tag="!BenchDistShards")
        class Shards:
            n: int = 32
            rows: int = 8
            cols: int = COLS

            def __attrs_post_init__(self):
                p = xser.params(self)
                r = xser.dist.rows(self.rows)
                self.start = r[0]
                self.ws = [p.add(f"w{i}", (self.rows, self.cols), rows=r) for i in range(self.n)]

        _SHARDS = Shards
    return _SHARDS


# ----------------------------------------------------------------------------------------------
# the parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg: dict, world: int, timeout: float) -> list[dict]:
    """Run one cell in ``world`` fresh processes; return each rank's result (rank order)."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT, HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    procs = []
    for r in range(world):
        c = dict(cfg, rank=r, world=world, port=port)
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-cfg", json.dumps(c)]
        if cfg.get("profile"):  # py-spy's collapsed stacks of each rank, for a look at where the time goes
            out = os.path.join(cfg["profile"], f"{cfg['side']}-{cfg['op']}-{cfg['n']}-rank{r}.txt")
            cmd = [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--format", "raw", "--rate", "200",
                   "--threads", "--nonblocking", "-o", out, "--"] + cmd
        procs.append(subprocess.Popen(cmd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE))
    deadline = time.monotonic() + timeout
    outs, failed = [], []
    for r, p in enumerate(procs):
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            so, se = p.communicate()
            failed.append(f"rank {r}: timed out after {timeout:.0f} s\n{se[-3000:]}")
            continue
        if p.returncode != 0:
            failed.append(f"rank {r}: exit {p.returncode}\n{se[-3000:]}")
        else:
            outs.append(json.loads([ln for ln in so.splitlines() if ln.startswith("{")][-1]))
    if failed:
        raise RuntimeError(f"cell {cfg['side']} {cfg['op']} failed:\n" + "\n".join(failed))
    return outs


def machine_header() -> str:
    import torch

    mem = proc_field("/proc/meminfo", "MemTotal:") / 2**20
    return (f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cpus, "
            f"{mem:.0f} GiB, python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
            f"load average {os.getloadavg()[0]:.1f}")


def run_layout(args, n: int, root: str, sides: list[str], cells: list[str]) -> dict:
    per_rank = args.mib * (1 << 20)
    rows_per_rank = max(1, per_rank // (n * COLS * 4))
    rows = 2 * rows_per_rank
    res: dict = {}

    def rec(key, value):
        res.setdefault(key, []).append(value)

    def cell(side, op, path, world, **extra):
        base = dict(side=side, n=n, rows=rows, cols=COLS, timeout=args.timeout, scratch=path + "-warm",
                    path=path if side == "dcp" else os.path.join(path, "m.yaml"), op=op, profile=args.profile, xser_shards=args.xser_shards, **extra)
        os.sync()
        t = time.perf_counter()
        outs = launch(base, world, args.timeout + 120)
        shown = {k: round(max(o[k] for o in outs), 4) for k in outs[0] if k != "rank"}
        print(f"#     {side} {op}: {shown} ({time.perf_counter() - t:.0f} s with startup)", flush=True)
        shutil.rmtree(path + "-warm", ignore_errors=True)
        return outs

    for rep in range(args.repeats):
        order = sides if rep % 2 == 0 else sides[::-1]
        if "save" in cells or "reshard" in cells:
            for side in order:
                path = os.path.join(root, f"{side}-{n}-{rep}")
                outs = cell(side, "save", path, 2)
                rec((side, "state_bytes"), max(o["state_bytes"] for o in outs))
                rec((side, "save_s"), max(o["save_s"] for o in outs))
                rec((side, "save_rss"), max(o["save_rss"] / o["state_bytes"] for o in outs))
                rec((side, "load_s"), max(o["load_s"] for o in outs))
                if "reshard" in cells:
                    outs = cell(side, "reshard", path, 3, warm_bytes=per_rank)
                    rec((side, "reshard_s"), max(o["load_s"] for o in outs))
                    rec((side, "reshard_read"), max(o["rchar"] / o["owned"] for o in outs if o["owned"]))
                    rec((side, "reshard_ranks"), [(o["rchar"], o["owned"]) for o in outs])
                shutil.rmtree(path, ignore_errors=True)
        if "async" in cells:
            for side in order[::-1]:
                path = os.path.join(root, f"{side}-{n}-{rep}-async")
                outs = cell(side, "async", path, 2)
                rec((side, "state_bytes"), max(o["state_bytes"] for o in outs))
                rec((side, "block_s"), max(o["block_s"] for o in outs))
                rec((side, "commit_s"), max(o["commit_s"] for o in outs))
                rec((side, "block2_s"), max(o["block2_s"] for o in outs))
                rec((side, "commit2_s"), max(o["commit2_s"] for o in outs))
                rec((side, "async_rss"), max(o["async_rss"] / o["state_bytes"] for o in outs))
                shutil.rmtree(path, ignore_errors=True)
        print(f"#   {n} arrays, repeat {rep + 1}/{args.repeats} done", flush=True)
    return res


def report(n: int, rows: int, res: dict, sides: list[str]) -> None:
    med = {k: (statistics.median(v) if not isinstance(v[0], list) else v[-1]) for k, v in res.items()}
    state = med[(sides[0], "state_bytes")]
    print(f"\n### {n} arrays of {rows}x{COLS} float32 (global), {state / 2**20:.0f} MiB per rank, 2 ranks\n")
    names = {"dcp": "DCP", "xser": "xser"}
    print("| measure | " + " | ".join(names[s] for s in sides) + " |")
    print("|---|" + "---|" * len(sides))
    rows_ = [("durable save, s", "save_s", "{:.3f}"),
             ("peak RSS over baseline during the save / state", "save_rss", "{:.3f}"),
             ("first async save: time the caller is blocked, s", "block_s", "{:.3f}"),
             ("first async save: time to durable commit, s", "commit_s", "{:.3f}"),
             ("second async save (xser reuses its buffer): blocked, s", "block2_s", "{:.3f}"),
             ("second async save: time to durable commit, s", "commit2_s", "{:.3f}"),
             ("two async saves: peak RSS over baseline / state", "async_rss", "{:.3f}"),
             ("load, same world size (2), s", "load_s", "{:.3f}"),
             ("resharded load 2 -> 3, s", "reshard_s", "{:.3f}"),
             ("resharded load 2 -> 3: bytes read / bytes owned (worst rank)", "reshard_read", "{:.3f}")]
    for label, key, fmt in rows_:
        if all((s, key) in med for s in sides):
            print(f"| {label} | " + " | ".join(fmt.format(med[(s, key)]) for s in sides) + " |")
    for s in sides:
        if (s, "reshard_ranks") in med:
            per = ", ".join(f"rank {i}: {rc / 2**20:.1f} of {ow / 2**20:.1f} MiB"
                            for i, (rc, ow) in enumerate(med[(s, "reshard_ranks")]))
            print(f"\n{names[s]} resharded load, bytes read of bytes owned (last repeat): {per}")
    if "xser" not in sides:
        return
    print("\n| ratio | value | target | met |")
    print("|---|---|---|---|")

    def line(label, a, b, target):
        if a not in med or (b is not None and b not in med):
            return
        value = med[a] / (med[b] if b else 1.0)
        print(f"| {label} | {value:.3f} | <= {target} | {'met' if value <= target else '**MISSED**'} |")

    X, D = "xser", "dcp"
    line("durable save: xser / dcp.save", (X, "save_s"), (D, "save_s"), 1.0)
    for which, sfx in (("first", ""), ("second", "2")):
        line(f"{which} save(blocking=False) blocked / xser blocking save", (X, f"block{sfx}_s"), (X, "save_s"), 0.25)
        line(f"{which} save(blocking=False) blocked / dcp.async_save blocked", (X, f"block{sfx}_s"), (D, f"block{sfx}_s"), 0.5)
        line(f"{which} async save, time to durable commit: xser / dcp.async_save", (X, f"commit{sfx}_s"), (D, f"commit{sfx}_s"), 1.0)
    line("peak RSS over baseline / state, blocking save", (X, "save_rss"), None, 1.1)
    line("peak RSS over baseline / state, two async saves", (X, "async_rss"), None, 1.1)
    line("load, same world size: xser / dcp.load", (X, "load_s"), (D, "load_s"), 1.0)
    line("resharded 2 -> 3: bytes read / bytes owned, worst rank", (X, "reshard_read"), None, 1.05)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", "--scale", type=int, default=512, help="state per rank, MiB (default 512)")
    ap.add_argument("--arrays", default="32,2048", help="numbers of global arrays, comma-separated")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", choices=["dcp", "xser"], default=None)
    ap.add_argument("--cells", default="save,reshard,async", help="which cells (save,reshard,async; reshard needs save)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per cell (and the ranks' collectives)")
    ap.add_argument("--dir", default="/tmp", help="where the checkpoints go (default /tmp)")
    ap.add_argument("--xser-shards", type=int, default=None,
                    help="CheckpointSaver(shards=N) on the xser side: packed files instead of one per array (default: none)")
    ap.add_argument("--profile", default=None, help="a directory: py-spy records each rank there (collapsed stacks)")
    ap.add_argument("--rank-cfg", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_cfg:
        print(json.dumps(rank_main(json.loads(args.rank_cfg))), flush=True)
        return
    sides = [args.only] if args.only else ["dcp", "xser"]
    root = tempfile.mkdtemp(prefix="xser-distbench-", dir=args.dir)
    print(machine_header())
    if "xser" in sides:
        import xser

        print(f"# xser {xser.__version__} from {os.path.dirname(xser.__file__)}")
    if args.xser_shards:
        print(f"# xser side: CheckpointSaver(shards={args.xser_shards})")
    print(f"# 2 ranks on gloo (3 for the resharded load), {args.mib} MiB per rank, arrays {args.arrays}, "
          f"{args.repeats} repeat(s), medians; dir {root}")
    t0 = time.perf_counter()
    try:
        results = []
        for n in [int(x) for x in args.arrays.split(",")]:
            res = run_layout(args, n, root, sides, args.cells.split(","))
            results.append((n, 2 * max(1, args.mib * (1 << 20) // (n * COLS * 4)), res))
        for n, rows, res in results:
            report(n, rows, res, sides)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n# {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
