"""Weight formats benchmark: write and read 20M float32 values in every format.

Each format (the external ones, DyNet and Angel, once; the others with repeats) is timed through ``xser.save`` / ``xser.read_params`` on one 20000x1000 float32
matrix (durable=False, hot page cache, medians), with time and file size as ratios to npy.
Dense text is also compared with ``np.savetxt`` / ``np.loadtxt`` of the same matrix at the same
precision (``%.9g``, exact for float32). Sparse text is measured on a 1%-dense matrix too.
Partial loads have their own benchmark: bench_partial_load.py.

    python benchmarks/bench_formats.py [--rows 20000] [--cols 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import xser
from bench_partial_load import Matrix
from bench_save_load import machine_header


FORMAT_NAMES = ("npy", "dense-text", "sparse-text", "dynet-text", "value-binary", "colid-value-binary", "rowid-colid-value-binary",
                "value-text", "colid-value-text", "rowid-colid-value-text", "binary-column", "text-column")


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        warm = np.ones(1 << 28, np.uint8)
        del warm
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--cols", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMAT_NAMES), help="comma-separated format names (npy is always measured)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    chosen = ["npy"] + [f for f in args.formats.split(",") if f and f != "npy"]
    root = tempfile.mkdtemp(prefix="xser-formats-", dir=args.dir)
    try:
        rng = np.random.default_rng(0)
        dense = rng.standard_normal((args.rows, args.cols), dtype=np.float32)
        sparse = np.where(rng.random((args.rows, args.cols)) < 0.01, dense, 0).astype(np.float32)
        print(machine_header())
        print(f"# {args.rows}x{args.cols} float32 = {dense.size / 1e6:.0f}M values, {args.repeats} repeats, dir {root}")
        rows = []
        for label, matrix in (("dense matrix", dense), ("1% dense matrix", sparse)):
            m = Matrix(args.rows, args.cols)
            xser.params(m)["W"][...] = matrix
            for fmt in chosen if label == "dense matrix" else [f for f in chosen if f in ("npy", "dense-text", "sparse-text")]:
                counter = iter(range(1 << 30))

                def save():
                    xser.save(m, os.path.join(root, f"{fmt}-{next(counter)}", "m.yaml"), durable=False, formats={"*/W": fmt})

                reps = args.repeats if fmt in ("npy", "dense-text", "sparse-text") else 1
                t_save = timed(save, reps)
                path = os.path.join(root, f"{fmt}-0", "m.yaml")
                t_load = timed(lambda: xser.read_params(path), reps)
                (sub,) = xser.read_params(path).values()
                assert np.array_equal(sub["W"], matrix)
                size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path + ".data") for f in fs)
                rows.append((label, fmt, t_save, t_load, size))
                for k in range(args.repeats):
                    shutil.rmtree(os.path.join(root, f"{fmt}-{k}"), ignore_errors=True)
        txt = os.path.join(root, "savetxt.txt")
        t_savetxt = timed(lambda: np.savetxt(txt, dense, fmt="%.9g"), 1)
        t_loadtxt = timed(lambda: np.loadtxt(txt, dtype=np.float32), 1)
        base = {label: (s, l, z) for label, fmt, s, l, z in rows if fmt == "npy"}
        print("\n| matrix | format | save s | load s | MiB | save / npy | load / npy | size / npy |")
        print("|---|---|---|---|---|---|---|---|")
        for label, fmt, s, l, z in rows:
            bs, bl, bz = base[label]
            print(f"| {label} | {fmt} | {s:.3f} | {l:.3f} | {z / 2**20:.1f} | {s / bs:.2f} | {l / bl:.2f} | {z / bz:.2f} |")
        print("\n| comparison | value | target | met |")
        print("|---|---|---|---|")
        print(f"| np.savetxt / np.loadtxt (%.9g) s | {t_savetxt:.3f} / {t_loadtxt:.3f} | | |")
        text = ("dense-text", "dynet-text", "value-text", "colid-value-text", "rowid-colid-value-text", "text-column")
        binary = ("value-binary", "colid-value-binary", "rowid-colid-value-binary", "binary-column")
        for label, fmt, s, l, _ in rows:
            if label != "dense matrix":
                continue
            if fmt in text:
                up_s, up_l = t_savetxt / s, t_loadtxt / l
                ok = "yes" if up_s >= 5 and up_l >= 5 else "**no**"
                print(f"| {fmt} save / load speed-up over np.savetxt / np.loadtxt | {up_s:.1f}x / {up_l:.1f}x | >= 5x both | {ok} |")
            elif fmt in binary:
                bs, bl, _ = base[label]
                ok = "yes" if s / bs <= 2 and l / bl <= 2 else "**no**"
                print(f"| {fmt} save / load over npy | {s / bs:.2f} / {l / bl:.2f} | <= 2 both | {ok} |")
        sp = next((r for r in rows if r[0] == "1% dense matrix" and r[1] == "sparse-text"), None)
        if sp is not None:
            print(f"| sparse-text (1% dense) save / load speed-up over np.savetxt / np.loadtxt of the dense text | "
                  f"{t_savetxt / sp[2]:.1f}x / {t_loadtxt / sp[3]:.1f}x | >= 5x both | {'yes' if t_savetxt / sp[2] >= 5 and t_loadtxt / sp[3] >= 5 else '**no**'} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
