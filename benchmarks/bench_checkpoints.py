"""Checkpoint benchmark: ten saves of a 256 MiB model with keep=3, side by side with np.save.

Reference: one plain np.save loop of the same arrays with fsync (into a fresh directory),
run right before each xser save, in the same memory state. Printed: time per save as a
ratio (target < 1.3x) and disk used at the end. Two scenarios: every array changes
between saves (ordinary training), and half of the arrays are frozen (fine-tuning with
a frozen part: unchanged arrays are hard-linked from the previous checkpoint).

    python benchmarks/bench_checkpoints.py [--mib 256] [--arrays 32] [--saves 10] [--keep 3]
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
from bench_save_load import Blob, machine_header, np_save_loop


def disk_bytes(root: str) -> int:
    seen, total = set(), 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def run(scenario: str, args, root: str) -> dict:
    n = args.arrays
    cols = 1024
    rows = max(1, args.mib * (1 << 20) // n // 4 // cols)
    model = Blob(n, rows, cols)
    sub = xser.params(model)
    rng = np.random.default_rng(0)
    for i in range(n):
        sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    arrays = [sub[f"p{i}"] for i in range(n)]
    total = sum(a.nbytes for a in arrays)
    changing = arrays if scenario == "all change" else arrays[: n // 2]
    warm = np.ones(2 * total, np.uint8)
    del warm
    path = os.path.join(root, scenario.replace(" ", "_"), "m.yaml")
    ref_dirs: list[str] = []
    t_ref, t_x, linked = [], [], 0
    saver = xser.CheckpointSaver(path, keep=args.keep)
    try:
        for step in range(1, args.saves + 1):
            for a in changing:
                a += 1.0
            gc.collect()
            warm = np.ones(total, np.uint8)
            del warm
            d = os.path.join(root, f"ref-{scenario.replace(' ', '_')}-{step}")
            t = time.perf_counter()
            np_save_loop(arrays, d, True)
            t_ref.append(time.perf_counter() - t)
            ref_dirs.append(d)
            while len(ref_dirs) > args.keep:
                shutil.rmtree(ref_dirs.pop(0))
            gc.collect()
            warm = np.ones(total, np.uint8)
            del warm
            t = time.perf_counter()
            report = saver.save(model, step=step, metrics={"step": float(step)})
            t_x.append(time.perf_counter() - t)
            linked += report.linked
    finally:
        saver.close()
    ck = xser.checkpoints(path)
    assert [c.step for c in ck] == list(range(args.saves, args.saves - args.keep, -1))
    return {
        "scenario": scenario,
        "model_mib": total / 2**20,
        "ref_median": statistics.median(t_ref),
        "xser_median": statistics.median(t_x),
        "ratio": statistics.median(t_x) / statistics.median(t_ref),
        "ratio_of_totals": sum(t_x) / sum(t_ref),
        "linked": linked,
        "disk_xser": disk_bytes(os.path.dirname(path)) / 2**20,
        "disk_ref": sum(disk_bytes(d) for d in ref_dirs) / 2**20,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--arrays", type=int, default=32)
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="xser-ckbench-", dir=args.dir)
    print(machine_header())
    print(f"# {args.saves} durable saves, keep={args.keep}, {args.arrays} float32 arrays, dir {root}")
    try:
        results = [run(s, args, root) for s in ("all change", "half frozen")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| scenario | model MiB | np.save+fsync s (median) | xser save s (median) | ratio | ratio of totals | files linked | disk xser MiB | disk np MiB (last 3) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['scenario']} | {r['model_mib']:.0f} | {r['ref_median']:.3f} | {r['xser_median']:.3f} | {r['ratio']:.2f} | "
              f"{r['ratio_of_totals']:.2f} | {r['linked']} | {r['disk_xser']:.0f} | {r['disk_ref']:.0f} |")
    print("\ntarget: ratio < 1.3")


if __name__ == "__main__":
    main()
