"""Scale benchmark: save, load, lazy load and average at several sizes and array counts, time and peak RSS.

Each cell (model bytes x number of float32 arrays) runs in a fresh child process, with the default save settings:

- build: one component holding ``arrays`` parameters of equal size (``model`` bytes in all);
- save: ``xser.save`` (durable, the default) of that model to a new path, three times through a
  ``CheckpointSaver`` (keep=3; the second and third with every value changed, so nothing is linked);
  the first save is timed;
- load: ``xser.read_params`` (eager: every array read into memory);
- lazy: ``xser.read_params(mmap=True)`` and one pass over every value (every page touched);
- average: ``xser.tools.average.average`` of the three checkpoints into a new model.

Peak RSS is the child's VmHWM growth over its RSS just before the step (the high-water mark is reset with
``/proc/self/clear_refs``); for the save it is the growth above the model the process already holds, for the loads
the growth above the process without the model (the arrays it returns are the model: 1.0x is the floor).
Printed: seconds, seconds per GiB, microseconds per array, each step's peak memory as a multiple of the model bytes
(the save's: the model it holds plus the growth; the loads': the growth, which holds the model they return; the
average's: the growth alone, bounded by its memory budget), and the largest of those peaks minus the model, in MiB
(the constant).

    python benchmarks/bench_scale.py [--mib 256,1024,4096] [--arrays 64,4096,65536] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, sys, time
import numpy as np
import xser, xser.tools.average

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

def reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss("VmRSS:")

@xser.serializable(tag="!ScaleBlob")
class Blob:
    n: int
    size: int
    def __attrs_post_init__(self):
        p = xser.params(self)
        for i in range(self.n):
            setattr(self, f"p{{i}}", p.add(f"p{{i}}", (self.size,), init="zeros"))

root, total, n = {root!r}, {total}, {n}
out = {{}}
warm = np.ones(total * 2, np.uint8); del warm
t = time.perf_counter()
m = Blob(n, total // 4 // n)
for i in range(n):
    getattr(m, f"p{{i}}")[...] = i
out["build"] = time.perf_counter() - t
path = os.path.join(root, "m.yaml")
base = reset()
t = time.perf_counter()
with xser.CheckpointSaver(path, keep=3) as s:
    s.save(m, step=1)
    out["save"] = time.perf_counter() - t
    out["save_rss"] = rss("VmHWM:") - base
    for step in (2, 3):
        for i in range(n):
            getattr(m, f"p{{i}}")[...] = i + step
        s.save(m, step=step)
del m, s
import gc; gc.collect()
base = reset()
t = time.perf_counter()
got = xser.read_params(path)
out["load"] = time.perf_counter() - t
out["load_rss"] = rss("VmHWM:") - base
del got; gc.collect()
base = reset()
t = time.perf_counter()
got = xser.read_params(path, mmap=True)
out["open"] = time.perf_counter() - t
acc = 0.0
for ps in got.values():
    for a in ps.values():
        acc += float(a[::1024].sum())
out["lazy"] = time.perf_counter() - t
out["lazy_rss"] = rss("VmHWM:") - base
del got, ps, a; gc.collect()
base = reset()
t = time.perf_counter()
xser.tools.average.average(path, os.path.join(root, "avg.yaml"), last=3)
out["average"] = time.perf_counter() - t
out["average_rss"] = rss("VmHWM:") - base
print(json.dumps(out))
"""


def cell(root: str, mib: int, n: int) -> dict:
    d = tempfile.mkdtemp(dir=root)
    try:
        code = CHILD.format(root=d, total=mib << 20, n=n)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise SystemExit(f"cell {mib} MiB x {n} failed:\n{res.stderr}")
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", default="256,1024,4096")
    ap.add_argument("--arrays", default="64,4096,65536")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    import numpy as np

    import xser

    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}, numpy {np.__version__}, xser {xser.__version__}")
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        print("| model | arrays | save s | s/GiB | us/array | save peak / model | load s | load peak / model | "
              "lazy s (open) | lazy peak / model | average of 3 s | average RSS / model | constant (max RSS - model), MiB |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for mib in (int(x) for x in args.mib.split(",")):
            for n in (int(x) for x in args.arrays.split(",")):
                r = cell(root, mib, n)
                model = mib << 20
                worst = max(r["save_rss"], r["load_rss"] - model, r["lazy_rss"] - model)
                print(f"| {mib} MiB | {n} | {r['save']:.2f} | {r['save'] / (mib / 1024):.2f} | {r['save'] / n * 1e6:.0f} | "
                      f"{(model + r['save_rss']) / model:.3f} | {r['load']:.2f} | {r['load_rss'] / model:.3f} | "
                      f"{r['lazy']:.2f} ({r['open']:.3f}) | {r['lazy_rss'] / model:.3f} | {r['average']:.2f} | "
                      f"{r['average_rss'] / model:.3f} | {worst / 2**20:.0f} |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
