"""Packed containers: many small arrays saved into N safetensors files against one file per array and safetensors.

1 GiB as 4,096 float32 arrays of 256 KiB (by default): the case where one file per array hurts.
Hot page cache, fresh memory touched before each timed call, medians of several repeats, ratios
(xser time / reference time: below 1 means xser is faster).

    python benchmarks/bench_shards.py [--mib 1024] [--arrays 4096] [--repeats 5] [--shards 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import safetensors.numpy as stnp

import xser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_save_load  # noqa: E402
from bench_save_load import Blob, machine_header, median_table, timed  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--arrays", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    n = args.arrays
    cols = 256
    rows = max(1, args.mib * (1 << 20) // n // 4 // cols)
    model = Blob(n, rows, cols)
    sub = xser.params(model)
    rng = np.random.default_rng(0)
    for i in range(n):
        sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    tensors = {f"p{i}": sub[f"p{i}"] for i in range(n)}
    total = sum(a.nbytes for a in tensors.values())
    bench_save_load.WARM_BYTES = total
    root = tempfile.mkdtemp(prefix="xser-bench-shards-", dir=args.dir)
    print(machine_header())
    print(f"# {n} arrays of {rows}x{cols} float32 ({rows * cols * 4 // 1024} KiB) = {total / 2**30:.3f} GiB; "
          f"shards={args.shards}; {args.repeats} repeats; dir {root}")
    times: dict[str, list[float]] = {}

    def rec(key, t):
        times.setdefault(key, []).append(t)

    packed_key = f"xser.save shards={args.shards}"
    try:
        for r in range(args.repeats):
            d = os.path.join(root, f"r{r}")
            os.makedirs(d)
            packed, per_file, st = os.path.join(d, "p", "m.yaml"), os.path.join(d, "f", "m.yaml"), os.path.join(d, "st.safetensors")
            rec(packed_key, timed(lambda: xser.save(model, packed, durable=False, shards=args.shards))[0])
            rec("xser.save one file per array", timed(lambda: xser.save(model, per_file, durable=False))[0])
            rec("safetensors.numpy.save_file", timed(lambda: stnp.save_file(tensors, st))[0])
            t, out = timed(lambda: xser.load(packed))
            rec("xser.load (packed)", t)
            assert np.array_equal(xser.params(out)["p7"], tensors["p7"])
            del out
            t, out = timed(lambda: xser.load(per_file))
            rec("xser.load (one file per array)", t)
            del out
            t, out = timed(lambda: stnp.load_file(st))
            rec("safetensors.numpy.load_file", t)
            del out
            t, out = timed(lambda: xser.load(packed, mmap=True))
            rec("xser.load mmap=True (packed)", t)
            del out
            shutil.rmtree(d)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = median_table(times)
    print("\n| ratio | value | target |")
    print("|---|---|---|")
    print(f"| {packed_key} / one file per array | {med[packed_key] / med['xser.save one file per array']:.2f} | <= 0.5 |")
    print(f"| {packed_key} / safetensors.numpy.save_file | {med[packed_key] / med['safetensors.numpy.save_file']:.2f} | <= 0.8 |")
    print(f"| xser.load (packed) / safetensors.numpy.load_file | {med['xser.load (packed)'] / med['safetensors.numpy.load_file']:.2f} | <= 1.0 |")
    print(f"| xser.load (packed) / xser.load (one file per array) | "
          f"{med['xser.load (packed)'] / med['xser.load (one file per array)']:.2f} | (reference) |")


if __name__ == "__main__":
    main()
