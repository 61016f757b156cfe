"""Averaging benchmark: xser avg against the field's way and against the memory-bound floor.

Five checkpoints of a 1 GiB model (64 float32 arrays), hot page cache. Each side runs in its own
child process so that its peak RSS (VmHWM) can be read; baseline is the child's RSS after its
imports. Sides:

- xser: ``xser.tools.average.average`` (streams chunks, float64 accumulator, writes a new model), and
  the same with ``accumulate="float32"``.
- reference, as fairseq/OpenNMT scripts do it: load each checkpoint whole, sum into float64
  copies of the first, divide, cast back, then ``np.save`` each array.
- floor (issue 23's): reading the inputs and writing the output with plain numpy, the same bytes and no
  arithmetic: every checkpoint's array copied out of its memory map, then ``np.save`` of one array per
  output array (page cache, like xser's non-durable output). Target: xser at most 1.2x this.
- strict floor: the same with every input read (``readinto``) into one reused buffer: no fresh memory.
- add floor (the older one): one pass that only adds the memory-mapped arrays, one array at a time (no output).

    python benchmarks/bench_average.py [--mib 1024] [--arrays 64] [--checkpoints 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, sys, time
import numpy as np
sys.path.insert(0, {here!r})

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
import xser, xser.tools.average
from bench_save_load import Blob
base = rss("VmRSS:")
side, model, out, n = {side!r}, {model!r}, {out!r}, {n}
warm = np.ones({warm}, np.uint8); del warm
open("/proc/self/clear_refs", "w").write("5")
base = rss("VmRSS:")
t = time.perf_counter()
if side == "xser":
    xser.tools.average.average(model, out, durable=False)
elif side == "xser durable":
    xser.tools.average.average(model, out, durable=True)
elif side == "np.save + fsync loop":  # the same bytes as the average's output, written durably
    arrays = xser.read_params(model)
    t = time.perf_counter()
    os.makedirs(out)
    for s_, ps in arrays.items():
        for k, a in ps.items():
            with open(os.path.join(out, f"{{s_}}-{{k}}.npy"), "wb") as f:
                np.save(f, a)
                f.flush()
                os.fsync(f.fileno())
    fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
elif side == "xser float32":
    xser.tools.average.average(model, out, durable=False, accumulate="float32")
elif side == "reference":
    paths = [c.path for c in xser.checkpoints(model)]
    acc = None
    for p in paths:
        arrays = xser.read_params(model, checkpoint=paths.index(p))
        if acc is None:
            acc = {{s: {{k: a.astype(np.float64) for k, a in ps.items()}} for s, ps in arrays.items()}}
        else:
            for s, ps in arrays.items():
                for k, a in ps.items():
                    acc[s][k] += a
        del arrays
    os.makedirs(out)
    for s, ps in acc.items():
        for k, a in ps.items():
            np.save(os.path.join(out, f"{{s}}-{{k}}.npy"), (a / len(paths)).astype(np.float32))
elif side in ("floor", "strict floor"):  # np.load of every input file (or readinto one reused buffer), np.save
    dirs = [c.path for c in xser.checkpoints(model)]
    names = [(s_, k) for s_, ps in xser.read_params(model, mmap=True).items() for k in ps]
    t = time.perf_counter()
    os.makedirs(out)
    buf = None
    for s_, k in names:
        for d in dirs:
            fn = os.path.join(d, s_, k + ".npy")
            if side == "floor":
                a = np.load(fn)
            else:
                with open(fn, "rb") as f:
                    np.lib.format.read_magic(f)
                    shape, _, dt = np.lib.format.read_array_header_1_0(f)
                    if buf is None or buf.nbytes < np.prod(shape) * dt.itemsize:
                        buf = np.empty(int(np.prod(shape)) * dt.itemsize, np.uint8)
                    a = buf[: int(np.prod(shape)) * dt.itemsize].view(dt).reshape(shape)
                    f.readinto(memoryview(a.view(np.uint8).reshape(-1)))
        np.save(os.path.join(out, f"{{s_}}-{{k}}.npy"), a)
        del a
else:
    datas = [xser.read_params(model, checkpoint=c.index, mmap=True) for c in xser.checkpoints(model)]
    for s in datas[0]:
        for k in datas[0][s]:
            acc = np.array(datas[0][s][k])
            for d in datas[1:]:
                acc += d[s][k]
            del acc
elapsed = time.perf_counter() - t
print(json.dumps({{"seconds": elapsed, "peak_above_base": rss("VmHWM:") - base}}))
"""


def child(side: str, model: str, out: str, n: int, warm: int) -> dict:
    code = CHILD.format(here=HERE, side=side, model=model, out=out, n=n, warm=warm)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    if r.returncode != 0:
        raise SystemExit(f"{side} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--arrays", type=int, default=64)
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    import xser
    from bench_save_load import Blob, machine_header

    root = tempfile.mkdtemp(prefix="xser-avgbench-", dir=args.dir)
    try:
        n = args.arrays
        cols = 1024
        rows = max(1, args.mib * (1 << 20) // n // 4 // cols)
        model = Blob(n, rows, cols)
        sub = xser.params(model)
        rng = np.random.default_rng(0)
        for i in range(n):
            sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
        path = os.path.join(root, "m.yaml")
        with xser.CheckpointSaver(path, keep=args.checkpoints, durable=False) as saver:
            for step in range(args.checkpoints):
                for i in range(n):
                    sub[f"p{i}"] += 1.0
                saver.save(model, step=step)
        total = rows * cols * 4 * n
        del model, sub
        print(machine_header())
        print(f"# {args.checkpoints} checkpoints of {total / 2**30:.2f} GiB ({n} float32 arrays), {args.repeats} repeats, dir {root}")
        results: dict[str, list[dict]] = {
            "xser": [], "floor": [], "strict floor": [], "xser float32": [], "add floor": [], "xser durable": [], "np.save + fsync loop": [], "reference": []
        }
        for r in range(args.repeats):
            for side in results:
                out = os.path.join(root, f"out-{side.replace(' ', '-')}-{r}" + (".yaml" if side.startswith("xser") else ""))
                results[side].append(child(side, path, out, args.checkpoints, total))
                if os.path.isdir(out):
                    shutil.rmtree(out)
                for extra in (out, out + ".data"):
                    if os.path.isdir(extra):
                        shutil.rmtree(extra)
                    elif os.path.exists(extra):
                        os.remove(extra)
        import time

        from xser.tools.convert import convert

        conv_times = []
        for r in range(args.repeats):
            t = time.perf_counter()
            convert(path, os.path.join(root, f"conv-{r}", "m.yaml"), durable=True)
            conv_times.append(time.perf_counter() - t)
        med = {s: (statistics.median(x["seconds"] for x in v), max(x["peak_above_base"] for x in v)) for s, v in results.items()}
        print("\n| side | median s | peak RSS above baseline, MiB |")
        print("|---|---|---|")
        for s, (t, m) in med.items():
            print(f"| {s} | {t:.3f} | {m / 2**20:.0f} |")
        print("\n| ratio | value | target |")
        print("|---|---|---|")
        ok = "yes" if med['xser'][0] / med['floor'][0] <= 1.2 else "**no**"
        print(f"| xser / floor (read inputs + write output, plain numpy) (time) | {med['xser'][0] / med['floor'][0]:.2f} | <= 1.2 ({ok}) |")
        pairs = [x["seconds"] / f["seconds"] for x, f in zip(results["xser"], results["floor"])]
        print(f"| xser / floor, each repeat (the two run back to back) | {', '.join(f'{r:.2f}' for r in pairs)} | <= 1.2 |")
        print(f"| xser / strict floor (readinto one reused buffer, np.save) (time) | {med['xser'][0] / med['strict floor'][0]:.2f} | - |")
        print(f"| xser --accumulate float32 / floor (time) | {med['xser float32'][0] / med['floor'][0]:.2f} | - |")
        print(f"| xser / add floor (mmap adds, no output) (time) | {med['xser'][0] / med['add floor'][0]:.2f} | - |")
        print(f"| xser / reference (time) | {med['xser'][0] / med['reference'][0]:.2f} | < 1 |")
        print(f"| xser peak RSS above baseline, MiB | {med['xser'][1] / 2**20:.0f} | < 100 |")
        durable_cost = med["xser durable"][0] - med["xser"][0]
        print(f"| xser avg durable - xser avg (cost of the durable output), s | {durable_cost:.3f} | - |")
        print(f"| cost of the durable output / np.save + fsync loop of the same bytes | {durable_cost / med['np.save + fsync loop'][0]:.2f} | <= 1.0 |")
        print(f"| xser convert of the newest checkpoint (durable, hard links), ms | {statistics.median(conv_times) * 1000:.1f} | milliseconds |")
        print(f"| reference peak RSS / model size | {med['reference'][1] / total:.2f} | (>= 2 expected) |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
