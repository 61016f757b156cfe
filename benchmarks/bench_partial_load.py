"""Partial load benchmark: 1% of the rows of a 1 GiB float32 matrix, against a full load.

Bytes read are the process's ``rchar`` (bytes returned by read calls, /proc/self/io), so they
count page-cache reads too. The matrix is saved once as a single file and once in blocks of
rows; both are read whole and by a 1% row range from the middle. Hot page cache, medians.

    python benchmarks/bench_partial_load.py [--mib 1024] [--cols 1024] [--block-rows 4096] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import xser
from bench_save_load import machine_header


@xser.serializable(tag="!BenchMatrix")
class Matrix:
    rows: int
    cols: int

    def __attrs_post_init__(self):
        xser.params(self).add("W", (self.rows, self.cols), init="zeros")


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar"):
                return int(line.split()[1])
    return 0


def measure(fn):
    gc.collect()
    warm = np.ones(1 << 28, np.uint8)
    del warm
    r0, t0 = rchar(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, rchar() - r0, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--block-rows", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    rows = args.mib * (1 << 20) // (4 * args.cols)
    root = tempfile.mkdtemp(prefix="xser-partial-", dir=args.dir)
    try:
        m = Matrix(rows, args.cols)
        p = xser.params(m)
        p["W"][...] = np.random.default_rng(0).standard_normal((rows, args.cols), dtype=np.float32)
        single, blocked = os.path.join(root, "single.yaml"), os.path.join(root, "blocked.yaml")
        xser.save(m, single, durable=False)
        xser.save(m, blocked, durable=False, blocks={"*/W": args.block_rows})
        key = f"{p.name}/W"
        first = rows // 2
        stop = first + max(1, rows // 100)
        expected = p["W"][first:stop].copy()
        del m, p
        print(machine_header())
        print(f"# {rows}x{args.cols} float32 ({args.mib} MiB), rows {first}:{stop} (1%), blocks of {args.block_rows} rows, {args.repeats} repeats")
        results = {}
        for label, path in (("single file", single), (f"blocks of {args.block_rows} rows", blocked)):
            full_t, part_t, full_b, part_b = [], [], [], []
            for _ in range(args.repeats):
                t, b, out = measure(lambda: xser.read_params(path))
                full_t.append(t)
                full_b.append(b)
                del out
                t, b, out = measure(lambda: xser.read_params(path, rows={key: (first, stop)}))
                part_t.append(t)
                part_b.append(b)
                (sub,) = out.values()
                assert np.array_equal(sub["W"], expected)
                del out, sub
            results[label] = (statistics.median(full_t), statistics.median(part_t), statistics.median(full_b), statistics.median(part_b))
        print("\n| layout | full load s | 1% load s | time ratio | full load MiB read | 1% load MiB read | bytes ratio |")
        print("|---|---|---|---|---|---|---|")
        for label, (ft, pt, fb, pb) in results.items():
            print(f"| {label} | {ft:.3f} | {pt:.4f} | {pt / ft:.4f} | {fb / 2**20:.1f} | {pb / 2**20:.2f} | {pb / fb:.4f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
