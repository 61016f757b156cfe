"""Weight formats benchmark: write and read 20M float32 values in every format, against plain numpy.

Each format is timed through ``xser.save`` / ``xser.read_params`` on one 20000x1000 float32 matrix
(durable=False, hot page cache, checksums written and verified as always), against the references
measured in the same rounds, interleaved: every round times ``np.savetxt`` / ``np.loadtxt`` (``%.9g``,
exact for float32), ``np.save`` / ``np.load`` of the same matrix, then every format; medians over the
rounds. Memory is warmed before each timed call (this VM hands freed memory back to the host).

Targets (issue 23): a text format writes and reads at least 5x faster than ``np.savetxt`` /
``np.loadtxt`` (xser time <= 0.2x numpy's); a binary format takes at most 2x ``np.save`` / ``np.load``.
Sparse text is measured on a 1%-dense matrix too. Partial loads have their own benchmark:
bench_partial_load.py.

    python benchmarks/bench_formats.py [--rows 20000] [--cols 1000] [--repeats 3] [--formats dense-text,...]
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
TEXT = ("dense-text", "sparse-text", "dynet-text", "value-text", "colid-value-text", "rowid-colid-value-text", "text-column")
BINARY = ("value-binary", "colid-value-binary", "rowid-colid-value-binary", "binary-column")


def _speed(ratio: float) -> str:
    return f"{1 / ratio:.1f}x faster" if ratio <= 1 else f"{ratio:.1f}x slower"


def timed(fn) -> float:
    warm = np.ones(1 << 28, np.uint8)
    del warm
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


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
        print(f"# {args.rows}x{args.cols} float32 = {dense.size / 1e6:.0f}M values, {args.repeats} rounds, dir {root}")
        cases = [("dense matrix", dense, f) for f in chosen]
        if "sparse-text" in chosen:
            cases.append(("1% dense matrix", sparse, "sparse-text"))
        times: dict = {}  # (label, fmt) -> ([save s], [load s], size)
        ref: dict = {k: [] for k in ("savetxt", "loadtxt", "np.save", "np.load")}
        txt, npy = os.path.join(root, "savetxt.txt"), os.path.join(root, "np.npy")
        for r in range(args.repeats):
            ref["savetxt"].append(timed(lambda: np.savetxt(txt, dense, fmt="%.9g")))
            ref["loadtxt"].append(timed(lambda: np.loadtxt(txt, dtype=np.float32)))
            ref["np.save"].append(timed(lambda: np.save(npy, dense)))
            ref["np.load"].append(timed(lambda: np.load(npy)))
            os.remove(txt)
            os.remove(npy)
            for label, matrix, fmt in cases:
                m = Matrix(args.rows, args.cols)
                xser.params(m)["W"][...] = matrix
                path = os.path.join(root, f"{fmt}-{label[:2]}-{r}", "m.yaml")
                t_save = timed(lambda: xser.save(m, path, durable=False, formats={"*/W": fmt}))
                t_load = timed(lambda: xser.read_params(path))
                (sub,) = xser.read_params(path).values()
                assert np.array_equal(sub["W"], matrix)
                size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path + ".data") for f in fs)
                saves, loads, _ = times.setdefault((label, fmt), ([], [], 0))
                saves.append(t_save)
                loads.append(t_load)
                times[(label, fmt)] = (saves, loads, size)
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                print(f"# round {r}: {label} {fmt} save {t_save:.3f} s, load {t_load:.3f} s", flush=True)
        med = statistics.median
        rs = {k: med(v) for k, v in ref.items()}
        print("\n| matrix | format | save s | load s | MiB | save / npy | load / npy | size / npy |")
        print("|---|---|---|---|---|---|---|---|")
        base = {label: (med(s), med(l), z) for (label, fmt), (s, l, z) in times.items() if fmt == "npy"}
        for (label, fmt), (s, l, z) in times.items():
            bs, bl, bz = base.get(label, base["dense matrix"])
            print(f"| {label} | {fmt} | {med(s):.3f} | {med(l):.3f} | {z / 2**20:.1f} | {med(s) / bs:.2f} | {med(l) / bl:.2f} | {z / bz:.2f} |")
        print("\n| reference (same rounds) | median s | each round |")
        print("|---|---|---|")
        for k, v in ref.items():
            print(f"| {k} | {rs[k]:.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
        print("\n| format | save / reference | load / reference | target | met |")
        print("|---|---|---|---|---|")
        for (label, fmt), (s, l, _) in times.items():
            if fmt in TEXT:
                a, b = med(s) / rs["savetxt"], med(l) / rs["loadtxt"]
                ok = "yes" if a <= 0.2 and b <= 0.2 else "**no**"
                print(f"| {fmt} ({label}) / np.savetxt, np.loadtxt | {a:.3f} ({_speed(a)}) | {b:.3f} ({_speed(b)}) | <= 0.2 both | {ok} |")
            elif fmt in BINARY or fmt == "npy":
                a, b = med(s) / rs["np.save"], med(l) / rs["np.load"]
                ok = "yes" if a <= 2 and b <= 2 else "**no**"
                print(f"| {fmt} ({label}) / np.save, np.load | {a:.2f} | {b:.2f} | <= 2 both{'' if fmt in BINARY else ' (xser npy, for scale)'} | {ok} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
