"""Save/load benchmark: xser against a numpy loop and safetensors, side by side.

1 GiB of float32 in 64 arrays (by default), hot page cache, medians of several
repeats, printed as ratios (xser time / reference time: below 1 means xser is faster).
Sides are interleaved within each repeat so they see the same machine state.

    python benchmarks/bench_save_load.py [--mib 1024] [--arrays 64] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np
from ruamel.yaml import YAML

import xser

try:
    import safetensors.numpy as stnp
except ImportError:  # pragma: no cover - the benchmark says so below
    stnp = None


@xser.serializable(tag="!BenchBlob")
class Blob:
    n: int
    rows: int
    cols: int

    def __attrs_post_init__(self):
        p = xser.params(self)
        for i in range(self.n):
            p.add(f"p{i}", (self.rows, self.cols), init="zeros")


@xser.serializable(tag="!BenchNode")
class Node:
    width: int = 4
    name: str = "n"
    child: object = None


def machine_header() -> str:
    """The line every benchmark prints first: when, where, and with what."""
    return (f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cpus, "
            f"python {platform.python_version()}, numpy {np.__version__}, xser {xser.__version__}")


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def np_save_loop(arrays, d, durable):
    os.makedirs(d)
    for i, a in enumerate(arrays):
        fn = os.path.join(d, f"p{i}.npy")
        with open(fn, "wb") as f:
            np.save(f, a)
            if durable:
                f.flush()
                os.fsync(f.fileno())
    if durable:
        fsync_dir(d)
        fsync_dir(os.path.dirname(d))


def dd_durable(src, dst):
    """dd's durable write of the same bytes: one file, 8 MiB blocks, fsync at the end."""
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=8M", "conv=fsync", "status=none"], check=True)


LAZY_CHILD = r"""
import sys, time
sys.path.insert(0, {here!r})
import bench_save_load, xser
t = time.perf_counter()
m = xser.load({path!r}, mmap=True)
t1 = time.perf_counter() - t
print(t1)
"""

ST_CHILD = r"""
import time
import numpy
from safetensors import safe_open
t = time.perf_counter()
with safe_open({path!r}, framework="numpy") as f:
    keys = list(f.keys())
print(time.perf_counter() - t)
"""


def fresh_process(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def np_load_loop(d, n):
    return [np.load(os.path.join(d, f"p{i}.npy")) for i in range(n)]


WARM_BYTES = 0


def warm():
    """Touch as much fresh memory as one side will allocate, then free it.

    This VM hands freed memory back to its host after 10-15 s and touching it again
    is many times slower; warming right before each timed call puts every side in
    the same memory state.
    """
    if WARM_BYTES:
        buf = np.ones(WARM_BYTES * 2, dtype=np.uint8)
        del buf


def median_table(times: dict) -> dict:
    """Print the medians of ``{measure: [seconds, ...]}`` as a markdown table and return them."""
    med = {k: statistics.median(v) for k, v in times.items()}
    print("\n| measure | median s |")
    print("|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.4f} |")
    return med


def timed(fn):
    gc.collect()
    warm()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--arrays", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--components", type=int, default=2000)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args(argv)

    root = tempfile.mkdtemp(prefix="xser-bench-", dir=args.dir)
    n = args.arrays
    per = args.mib * (1 << 20) // n // 4
    cols = 1024
    rows = max(1, per // cols)
    rng = np.random.default_rng(0)
    model = Blob(n, rows, cols)
    sub = xser.params(model)
    for i in range(n):
        sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    arrays = [sub[f"p{i}"] for i in range(n)]
    total = sum(a.nbytes for a in arrays)
    global WARM_BYTES
    WARM_BYTES = total
    print(f"# {n} arrays of {rows}x{cols} float32 = {total / 2**30:.3f} GiB; {args.repeats} repeats; dir {root}")
    print(machine_header())

    times: dict[str, list[float]] = {}

    def rec(key, t):
        times.setdefault(key, []).append(t)

    try:
        for r in range(args.repeats):
            d = os.path.join(root, f"r{r}")
            os.makedirs(d)
            # --- saves (fresh target paths; cleanup is not timed)
            rec("np.save loop", timed(lambda: np_save_loop(arrays, os.path.join(d, "np"), False))[0])
            rec("xser.save durable=False", timed(lambda: xser.save(model, os.path.join(d, "x", "m.yaml"), durable=False))[0])
            rec("np.save loop + fsync", timed(lambda: np_save_loop(arrays, os.path.join(d, "npf"), True))[0])
            rec("xser.save durable=True", timed(lambda: xser.save(model, os.path.join(d, "xf", "m.yaml")))[0])
            blob = os.path.join(d, "blob")
            with open(blob, "wb") as f:  # the same bytes in one file, in the page cache: dd's source
                for a in arrays:
                    f.write(a.data)
            rec("dd conv=fsync (same bytes, one file)", timed(lambda: dd_durable(blob, os.path.join(d, "dd.out")))[0])
            if stnp is not None:
                tensors = {f"p{i}": a for i, a in enumerate(arrays)}
                rec("safetensors save_file", timed(lambda: stnp.save_file(tensors, os.path.join(d, "st.safetensors")))[0])
            # --- eager loads (hot page cache: the files were just written)
            t, out = timed(lambda: np_load_loop(os.path.join(d, "np"), n))
            rec("np.load loop", t)
            del out
            t, out = timed(lambda: xser.load(os.path.join(d, "x", "m.yaml")))
            rec("xser.load", t)
            assert np.array_equal(xser.params(out)["p0"], arrays[0])
            del out
            if stnp is not None:
                t, out = timed(lambda: stnp.load_file(os.path.join(d, "st.safetensors")))
                rec("safetensors load_file", t)
                del out
            t, out = timed(lambda: xser.load(os.path.join(d, "x", "m.yaml"), mmap=True))
            rec("xser.load mmap=True (open)", t)
            del out
            here = os.path.dirname(os.path.abspath(__file__))
            rec("xser.load mmap=True, fresh process", fresh_process(LAZY_CHILD.format(here=here, path=os.path.join(d, "x", "m.yaml"))))
            if stnp is not None:
                rec("safetensors safe_open, fresh process", fresh_process(ST_CHILD.format(path=os.path.join(d, "st.safetensors"))))
            shutil.rmtree(d)

        # --- spec: 2,000 components
        text = spec_text(args.components)
        untagged = re.sub(r"!\w+ ", "", text)
        cfg = os.path.join(root, "spec.yaml")
        with open(cfg, "w") as f:
            f.write(text)
        for r in range(args.repeats):
            rec("ruamel YAML() load", timed(lambda: YAML().load(text))[0])
            # the safe loader rejects local tags: same text with the tags removed
            rec("ruamel YAML(typ='safe') load", timed(lambda: YAML(typ="safe").load(untagged))[0])
            out_path = os.path.join(root, f"spec{r}", "m.yaml")

            def xser_spec():
                exp = xser.load_config(cfg)["big"]
                xser.save(xser.build(exp), out_path, durable=False)

            rec(f"xser load_config+build+save ({args.components} components)", timed(xser_spec)[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = median_table(times)

    def ratio(a, b, target):
        if a in med and b in med:
            print(f"| {a} / {b} | {med[a] / med[b]:.2f} | {target} |")

    print("\n| ratio | value | target |")
    print("|---|---|---|")
    ratio("xser.save durable=False", "np.save loop", "<= 0.8")
    ratio("xser.save durable=True", "np.save loop + fsync", "<= 1.0")
    ratio("dd conv=fsync (same bytes, one file)", "xser.save durable=True", ">= 0.95 (xser's durable bandwidth / dd's)")
    ratio("xser.save durable=False", "safetensors save_file", "< 1.0")
    ratio("xser.load", "np.load loop", "<= 0.8")
    ratio("xser.load", "safetensors load_file", "< 1.0")
    spec_key = f"xser load_config+build+save ({args.components} components)"
    ratio(spec_key, "ruamel YAML() load", "< 3.0")
    ratio(spec_key, "ruamel YAML(typ='safe') load", "(stricter reference)")
    print(f"| xser.load mmap=True (open), ms | {med['xser.load mmap=True (open)'] * 1000:.1f} | - |")
    print(f"| xser.load mmap=True in a fresh process (YAML included), ms | {med['xser.load mmap=True, fresh process'] * 1000:.1f} | <= 5 |")
    if "safetensors safe_open, fresh process" in med:
        print(f"| safetensors safe_open in a fresh process, ms | {med['safetensors safe_open, fresh process'] * 1000:.2f} | (reference) |")
    if stnp is None:
        print("\nsafetensors is not installed: pip install '.[test]' to compare against it", file=sys.stderr)


def spec_text(n: int) -> str:
    """An experiment with ``n`` components: a chain of nested lists of !BenchNode."""
    lines = ["big:", "  layers:"]
    for i in range(n):
        lines.append(f"  - !BenchNode {{width: {i % 97}, name: 'layer {i}', child: {{a: [1, 2, 3], b: x{i}}}}}")
    lines.append("  shared: !Ref {path: layers.0}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
