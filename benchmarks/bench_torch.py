"""Torch benchmark: xser against safetensors.torch and torch.save on the same model, side by side.

1 GiB in 64 tensors (by default), float32 and bfloat16, hot page cache, medians of several
repeats, printed as ratios (xser time / reference time: below 1 means xser is faster). Also the
lazy open of the saved model in a fresh process, and the peak memory a save adds above the model.

    python benchmarks/bench_torch.py [--mib 1024] [--tensors 64] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import safetensors.torch as sttorch
import torch

import xser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_save_load  # noqa: E402
from bench_save_load import machine_header, median_table  # noqa: E402


@xser.serializable(tag="!BenchTorchBlob")
class TorchBlob(torch.nn.Module):
    n: int
    rows: int
    cols: int
    dtype: str = "float32"

    def __attrs_post_init__(self):
        p = xser.params(self)
        for i in range(self.n):
            p.add(f"p{i}", (self.rows, self.cols), dtype=getattr(torch, self.dtype), init="zeros")


CHILD_OPEN = r"""
import sys, time
sys.path.insert(0, {here!r})
import torch, bench_torch, xser
t = time.perf_counter()
m = xser.load({path!r}, mmap=True)
print(time.perf_counter() - t)
"""

CHILD_PEAK = r"""
import resource, sys
sys.path.insert(0, {here!r})
import torch, bench_torch, xser
m = bench_torch.TorchBlob({n}, {rows}, {cols}, {dtype!r})
g = torch.Generator().manual_seed(0)
for t in m.parameters():
    t.data.copy_(torch.randn(t.shape, generator=g))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
xser.save(m, {path!r}, durable=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


def touch(sd: dict) -> dict:
    """Read one byte of every page of every tensor: what makes lazily mapped tensors resident."""
    for t in sd.values():
        t.detach().reshape(-1).view(torch.uint8)[::4096].sum()
    return sd


def fresh(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def timed(fn, nbytes):
    """bench_save_load's timing: fresh memory touched first (this VM hands freed memory back to its host)."""
    bench_save_load.WARM_BYTES = nbytes // 2
    return bench_save_load.timed(fn)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    root = tempfile.mkdtemp(prefix="xser-bench-torch-", dir=args.dir)
    print(machine_header() + f", torch {torch.__version__}")
    rows_out = []
    try:
        for dtype in ("float32", "bfloat16"):
            size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
            n = args.tensors
            cols = 1024
            rows = max(1, args.mib * (1 << 20) // n // size // cols)
            model = TorchBlob(n, rows, cols, dtype)
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for t in model.parameters():
                    t.copy_(torch.randn(t.shape, generator=g))
            sd = model.state_dict()
            total = sum(t.numel() * t.element_size() for t in sd.values())
            print(f"# {dtype}: {n} tensors of {rows}x{cols} = {total / 2**30:.3f} GiB; {args.repeats} repeats; dir {root}")
            times: dict[str, list[float]] = {}

            def rec(key, t):
                times.setdefault(key, []).append(t)

            for r in range(args.repeats):
                d = os.path.join(root, f"{dtype}{r}")
                os.makedirs(d)
                path = os.path.join(d, "x", "m.yaml")
                rec("xser.save durable=False", timed(lambda: xser.save(model, path, durable=False), total)[0])
                rec("safetensors.torch.save_file", timed(lambda: sttorch.save_file(sd, os.path.join(d, "st.safetensors")), total)[0])
                rec("torch.save", timed(lambda: torch.save(sd, os.path.join(d, "t.pt")), total)[0])
                t, out = timed(lambda: xser.load(path), total)
                rec("xser.load", t)
                assert torch.equal(xser.params(out)["p0"], sd["p0"])
                del out
                t, out = timed(lambda: sttorch.load_file(os.path.join(d, "st.safetensors")), total)
                rec("safetensors.torch.load_file", t)
                del out
                t, out = timed(lambda: touch(sttorch.load_file(os.path.join(d, "st.safetensors"))), total)
                rec("safetensors.torch.load_file + touch every page", t)
                del out
                t, out = timed(lambda: touch(xser.load(path).state_dict()), total)
                rec("xser.load + touch every page", t)
                del out
                t, out = timed(lambda: xser.load(path, mmap=True), total)
                rec("xser.load mmap=True", t)
                del out
                t, out = timed(lambda: touch(xser.load(path, mmap=True).state_dict()), total)
                rec("xser.load mmap=True + touch every page", t)
                del out
                t, out = timed(lambda: torch.load(os.path.join(d, "t.pt"), weights_only=True), total)
                rec("torch.load", t)
                del out
                t, out = timed(lambda: torch.load(os.path.join(d, "t.pt"), weights_only=True, mmap=True), total)
                rec("torch.load mmap=True", t)
                del out
                rec("xser.load mmap=True, fresh process", fresh(CHILD_OPEN.format(here=here, path=path)))
                shutil.rmtree(d)
            peak = fresh(CHILD_PEAK.format(here=here, n=n, rows=rows, cols=cols, dtype=dtype, path=os.path.join(root, "peak", "m.yaml")))
            shutil.rmtree(os.path.join(root, "peak"), ignore_errors=True)
            med = median_table(times)
            one = rows * cols * size
            rows_out.append((dtype, med, peak, one))
            print("\n| ratio | value | target |")
            print("|---|---|---|")
            print(f"| xser.save / safetensors.torch.save_file | {med['xser.save durable=False'] / med['safetensors.torch.save_file']:.2f} | <= 0.8 |")
            print(f"| xser.save / torch.save | {med['xser.save durable=False'] / med['torch.save']:.2f} | <= 0.5 |")
            print(f"| xser.load (eager: private memory) / safetensors.torch.load_file (lazy: mapped) | "
                  f"{med['xser.load'] / med['safetensors.torch.load_file']:.2f} | <= 1.0 |")
            print(f"| xser.load mmap=True / safetensors.torch.load_file (both mapped) | "
                  f"{med['xser.load mmap=True'] / med['safetensors.torch.load_file']:.2f} | (like for like) |")
            print(f"| xser.load + touch / safetensors.torch.load_file + touch | "
                  f"{med['xser.load + touch every page'] / med['safetensors.torch.load_file + touch every page']:.2f} | (usable tensors) |")
            print(f"| xser.load mmap=True + touch / safetensors.torch.load_file + touch | "
                  f"{med['xser.load mmap=True + touch every page'] / med['safetensors.torch.load_file + touch every page']:.2f} | (like for like) |")
            print(f"| xser.load / torch.load | {med['xser.load'] / med['torch.load']:.2f} | (reference) |")
            print(f"| xser.load mmap=True / torch.load(mmap=True), both untouched (issue 23: <= 1.0) | "
                  f"{med['xser.load mmap=True'] / med['torch.load mmap=True']:.2f} | <= 1.0 |")
            print(f"| xser.load (eager) + touch / safetensors.torch.load_file + touch (issue 23: <= 1.0) | "
                  f"{med['xser.load + touch every page'] / med['safetensors.torch.load_file + touch every page']:.2f} | <= 1.0 |")
            print(f"| lazy open in a fresh process, ms | {med['xser.load mmap=True, fresh process'] * 1000:.1f} | <= 5 |")
            print(f"| peak memory a save adds, MiB (one tensor: {one / 2**20:.0f} MiB) | {peak / 2**20:.1f} | <= {one / 2**20:.0f} |")
            print()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
