"""Per-array cost: many small arrays saved and loaded by xser (default settings) against safetensors.numpy.

Issue 23, target 1: save and load of 1 GiB as 4,096 and as 65,536 float32 arrays at most 1.5x
``safetensors.numpy`` (``save_file`` / ``load_file``), with xser's default settings, measured from the
built object to disk (``xser.save``: snapshot, plan, files, checksums, manifest, publish) and back
(``xser.load``, ``xser.read_params``). Durable saves are compared with ``save_file`` + fsync of the
file and its directory; ``durable=False`` with ``save_file`` alone. ``xser.load(mmap=True)`` is
compared with ``safe_open`` + ``get_tensor`` of every key. Sides are interleaved within each repeat,
fresh memory is touched before each timed call (``bench_save_load.warm``), medians of ``--repeats``.
Peak RSS (``ru_maxrss``) of a save and of loads is measured in fresh child processes, next to the
model's bytes. Also a scaling check of ``params().add()`` (time per add at n and 4n items).

    python benchmarks/bench_many.py [--mib 1024] [--arrays 4096,65536] [--repeats 3] [--dir DIR] [--no-rss]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_save_load  # noqa: E402
from bench_save_load import Blob, fsync_dir, machine_header, median_table, timed  # noqa: E402

import xser  # noqa: E402

try:
    import safetensors.numpy as stnp
    from safetensors import safe_open
except ImportError:  # pragma: no cover
    stnp = safe_open = None

TARGET = 1.5
COLS = 256


def shape_for(mib: int, n: int) -> tuple[int, int]:
    """(rows, cols) of each of n float32 arrays making ``mib`` MiB (cols 256, or fewer for tiny arrays)."""
    per = mib * (1 << 20) // n // 4
    cols = min(COLS, per)
    return max(1, per // cols), cols


def make_model(n: int, rows: int, cols: int) -> Blob:
    model = Blob(n, rows, cols)
    sub = xser.params(model)
    rng = np.random.default_rng(0)
    for i in range(n):
        sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    return model


def st_save(tensors: dict, path: str, durable: bool) -> None:
    stnp.save_file(tensors, path)
    if durable:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path))


def st_lazy(path: str) -> dict:
    with safe_open(path, framework="np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def rss_child(what: str, n: int, rows: int, cols: int, path: str) -> dict:
    """Peak RSS (bytes) of one operation in a fresh process: before it (after imports and the model) and after."""
    code = f"""
import sys, os, json, resource
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import numpy as np
import xser, bench_many
import safetensors.numpy as stnp
from safetensors import safe_open
def peak():  # VmHWM: this process's own peak (ru_maxrss keeps the forking parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
what, n, rows, cols, path = {what!r}, {n}, {rows}, {cols}, {path!r}
if what.startswith("save"):
    model = bench_many.make_model(n, rows, cols)
    tensors = {{f"p{{i}}": xser.params(model)[f"p{{i}}"] for i in range(n)}}
before = peak()
if what == "save xser":
    xser.save(model, path, durable=False)
elif what == "save safetensors":
    stnp.save_file(tensors, path)
elif what == "load xser":
    out = xser.load(path)
elif what == "read_params xser":
    out = xser.read_params(path)
elif what == "load xser mmap":
    out = xser.load(path, mmap=True)
elif what == "load safetensors":
    out = stnp.load_file(path)
print(json.dumps({{"before": before, "after": peak()}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def add_scaling(n: int) -> tuple[float, float]:
    """Seconds per ``params().add()`` when building a component of n and of 4n parameters."""
    out = []
    for m in (n, 4 * n):
        t = time.perf_counter()
        Blob(m, 1, 1)
        out.append((time.perf_counter() - t) / m)
    return out[0], out[1]


def run(n: int, mib: int, repeats: int, root: str, rss: bool) -> list[tuple[str, float, float]]:
    rows, cols = shape_for(mib, n)
    t = time.perf_counter()
    model = make_model(n, rows, cols)
    built = time.perf_counter() - t
    sub = xser.params(model)
    tensors = {f"p{i}": sub[f"p{i}"] for i in range(n)}
    total = sum(a.nbytes for a in tensors.values())
    bench_save_load.WARM_BYTES = total
    print(f"\n## {n} arrays of {rows}x{cols} float32 ({rows * cols * 4 / 1024:g} KiB) = {total / 2**30:.3f} GiB; "
          f"{repeats} repeats; model built (with random values) in {built:.2f} s")
    times: dict[str, list[float]] = {}

    def rec(key, t):
        times.setdefault(key, []).append(t)

    for r in range(repeats):
        d = os.path.join(root, f"n{n}-r{r}")
        os.makedirs(d)
        xp, st = os.path.join(d, "x", "m.yaml"), os.path.join(d, "st.safetensors")
        os.makedirs(os.path.dirname(xp))
        rec("save durable: xser.save", timed(lambda: xser.save(model, xp))[0])
        rec("save durable: safetensors save_file + fsync", timed(lambda: st_save(tensors, st, True))[0])
        os.unlink(st)
        rec("save durable=False: safetensors save_file", timed(lambda: st_save(tensors, st, False))[0])
        rec("save durable=False: xser.save", timed(lambda: xser.save(model, xp, durable=False))[0])
        t, out = timed(lambda: xser.read_params(xp))
        rec("load: xser.read_params", t)
        assert np.array_equal(next(iter(out.values()))["p7"], tensors["p7"])
        del out
        t, out = timed(lambda: stnp.load_file(st))
        rec("load: safetensors load_file", t)
        del out
        t, out = timed(lambda: xser.load(xp))
        rec("load: xser.load", t)
        assert np.array_equal(xser.params(out)["p7"], tensors["p7"])
        del out
        t, out = timed(lambda: st_lazy(st))
        rec("lazy: safe_open + get_tensor each", t)
        del out
        t, out = timed(lambda: xser.load(xp, mmap=True))
        rec("lazy: xser.load mmap=True", t)
        del out
        shutil.rmtree(d)
    med = median_table(times)
    rows_out = []
    print("\n| ratio (xser / safetensors) | value | target | per array xser / safetensors (us) |")
    print("|---|---|---|---|")
    for name, a, b, target in [
        ("save durable", "save durable: xser.save", "save durable: safetensors save_file + fsync", TARGET),
        ("save durable=False", "save durable=False: xser.save", "save durable=False: safetensors save_file", TARGET),
        ("read_params / load_file", "load: xser.read_params", "load: safetensors load_file", TARGET),
        ("load / load_file", "load: xser.load", "load: safetensors load_file", TARGET),
        ("load(mmap=True) / safe_open", "lazy: xser.load mmap=True", "lazy: safe_open + get_tensor each", None),
    ]:
        ratio = med[a] / med[b]
        verdict = "" if target is None else (" met" if ratio <= target else " MISSED")
        print(f"| {name} | {ratio:.2f} | {'<= %.1f' % target + verdict if target else '(reference)'} | "
              f"{med[a] / n * 1e6:.1f} / {med[b] / n * 1e6:.1f} |")
        rows_out.append((name, ratio, med[a]))
    if rss:
        print(f"\n| peak RSS (fresh process, MiB) | before | after | after - before | model {total / 2**20:.0f} MiB |")
        print("|---|---|---|---|---|")
        d = os.path.join(root, f"rss{n}")
        os.makedirs(d)
        xp, st = os.path.join(d, "m.yaml"), os.path.join(d, "st.safetensors")
        for what, path in [("save xser", xp), ("save safetensors", st), ("read_params xser", xp), ("load xser", xp),
                           ("load xser mmap", xp), ("load safetensors", st)]:
            got = rss_child(what, n, rows, cols, path)
            b, a = got["before"] / 2**20, got["after"] / 2**20
            print(f"| {what} | {b:.0f} | {a:.0f} | {a - b:.0f} | {(a - b) / (total / 2**20):.2f}x |")
        shutil.rmtree(d)
    return rows_out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--arrays", default="4096,65536", help="comma-separated counts of arrays")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS children")
    args = ap.parse_args(argv)
    if stnp is None:
        sys.exit("bench_many needs the safetensors package")
    print(machine_header())
    root = tempfile.mkdtemp(prefix="xser-bench-many-", dir=args.dir)
    print(f"# {args.mib} MiB as {args.arrays} float32 arrays; default xser settings; dir {root}")
    a, b = add_scaling(2048)
    print(f"# params().add(): {a * 1e6:.1f} us per add at 2,048 items, {b * 1e6:.1f} us at 8,192 (O(1): about equal)")
    try:
        for n in (int(x) for x in args.arrays.split(",")):
            run(n, args.mib, args.repeats, root, not args.no_rss)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
