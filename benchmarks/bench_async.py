"""Async saves in one process (issue 22 §4): memory over many saves, and what a save in the background costs a
training step.

- RSS: 20 back-to-back ``save(..., blocking=False)`` of a model of ``--mib`` MiB (the model changed in place
  between saves, as training does), RSS read from /proc/self/statm after the first save and after the 20th;
  the target is no growth (the saver's host buffer is reused).
- GIL: a Python-bound training step (a pure-Python loop) timed alone, then while an async save writes in the
  background; the ratio says how much the background writer holds the GIL (and takes the CPU: on a machine
  with few cores the two also compete for cores, which the ratio includes). The same step beside a
  blocking save in another *process* gives the floor that CPU competition alone causes.

    python benchmarks/bench_async.py [--mib 256] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import xser  # noqa: E402


@xser.serializable(tag="!BenchAsync")
class Model:
    n: int = 32
    rows: int = 1024
    cols: int = 2048

    def __attrs_post_init__(self):
        p = xser.params(self)
        self.ws = [p.add(f"w{i}", (self.rows, self.cols)) for i in range(self.n)]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def step() -> float:
    t = time.perf_counter()
    x = 0
    for i in range(200_000):
        x += i * i
    return time.perf_counter() - t


def _save_elsewhere(path: str, mib: int) -> None:
    m = Model(rows=mib * 2**20 // (32 * 2048 * 4))
    xser.save(m, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="xser-async-", dir=a.dir)
    try:
        m = Model(rows=a.mib * 2**20 // (32 * 2048 * 4))
        with xser.CheckpointSaver(os.path.join(root, "m.yaml"), keep=2) as saver:
            saver.save(m, step=0, blocking=False).result()
            before = rss_mib()
            blocked = []
            for k in range(1, 21):
                t = time.perf_counter()
                pending = saver.save(m, step=k, blocking=False)
                blocked.append(time.perf_counter() - t)
                for w in m.ws:
                    w += 1.0
            pending.result()
            after = rss_mib()
            print(f"20 async saves of {a.mib} MiB: RSS {before:.0f} -> {after:.0f} MiB (growth {after - before:+.0f} MiB; "
                  f"target 0: {'met' if after - before <= 0.02 * a.mib else 'MISSED'}); caller blocked median "
                  f"{statistics.median(blocked) * 1e3:.0f} ms (each waits for the save before it)")
            alone = statistics.median(step() for _ in range(15))
            saver.save(m, step=30, blocking=False).result()
            pending = saver.save(m, step=31, blocking=False)
            during = []
            while not pending.done():
                during.append(step())
            pending.result()
        p = multiprocessing.get_context("spawn").Process(target=_save_elsewhere, args=(os.path.join(root, "o.yaml"), a.mib))
        p.start()
        beside = []
        while p.is_alive():
            beside.append(step())
        p.join()
        d, b = statistics.median(during), statistics.median(beside) if beside else float("nan")
        print(f"training step (pure Python) alone {alone * 1e3:.1f} ms; during an async save in this process "
              f"{d * 1e3:.1f} ms ({d / alone:.2f}x, {len(during)} steps); beside a save in another process "
              f"{b * 1e3:.1f} ms ({b / alone:.2f}x: CPU competition alone, no shared GIL)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
