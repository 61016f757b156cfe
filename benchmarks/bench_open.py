"""Lazy open benchmark: reading one array of a saved model, xser against safetensors ``safe_open``, side by side.

Three measures (issue 23, target 2), each with its reference in the same run, interleaved, medians:

(a) interpreter start to the first value of one array: the wall time of a whole fresh process
    ``import numpy, xser; with xser.CheckpointReader(p) as r: r.read_tensor(k)`` against
    ``import numpy; from safetensors import safe_open; with safe_open(p, "numpy") as f: f.get_tensor(k)``
    (and ``xser.read_params(p, names=[k])``; ``python -c pass`` as the floor both share). Target: <= 1.2x.
(b) ``import xser`` alone, against ``import numpy`` alone (fresh processes), and what it imports.
(c) after import, in one warm process: opening the saved model and reading one small array, against
    ``safe_open`` + ``get_tensor``. Target: <= 2 ms.

The model: ``--arrays`` float32 arrays (default 256, 64 MiB in all) saved with xser's default settings, and the same
arrays in one safetensors file; the array read is a small one (``small``, 16 floats).

    python benchmarks/bench_open.py [--arrays 256] [--mib 64] [--repeats 15] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import xser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_save_load import machine_header  # noqa: E402

try:
    from safetensors import safe_open
    import safetensors.numpy as stnp
except ImportError:  # pragma: no cover
    sys.exit("this benchmark needs safetensors (pip install safetensors)")


@xser.serializable(tag="!BenchOpenModel")
class Model:
    n: int
    rows: int
    cols: int

    def __attrs_post_init__(self):
        p = xser.params(self)
        p.add("small", (16,), init="zeros")
        for i in range(self.n):
            p.add(f"p{i}", (self.rows, self.cols), init="zeros")


CHILDREN = {
    "python -c pass (floor)": "pass",
    "import numpy": "import numpy",
    "import numpy, xser": "import numpy, xser",
    "safetensors safe_open + get_tensor": (
        "import numpy\nfrom safetensors import safe_open\n"
        "with safe_open({st!r}, 'numpy') as f:\n    v = f.get_tensor('small')\nassert float(v[3]) == 3.0"),
    "xser.CheckpointReader + read_tensor": (
        "import numpy, xser\n"
        "with xser.CheckpointReader({x!r}) as r:\n    v = r.read_tensor({k!r})\nassert float(v[3]) == 3.0"),
    "xser.read_params(names=[one])": (
        "import numpy, xser\n"
        "v = xser.read_params({x!r}, names=[{k!r}])[{sub!r}]['small']\nassert float(v[3]) == 3.0"),
}


#: children run as installed code runs: from compiled bytecode (written once to a cache of this run's own, even where
#: PYTHONDONTWRITEBYTECODE is set), each one run once untimed first
CHILD_ENV = dict(os.environ)


def run_child(code: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=CHILD_ENV)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def warm_open(x: str, st: str, k: str, loops: int) -> dict[str, list[float]]:
    """(c): open + read one small array in this (warm) process, each side ``loops`` times, interleaved."""
    out: dict[str, list[float]] = {"safe_open + get_tensor (warm)": [], "CheckpointReader + read_tensor (warm)": [],
                                   "read_params(names=[one]) (warm)": []}
    for _ in range(loops):
        t = time.perf_counter()
        with safe_open(st, "numpy") as f:
            f.get_tensor("small")
        out["safe_open + get_tensor (warm)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        with xser.CheckpointReader(x) as r:
            r.read_tensor(k)
        out["CheckpointReader + read_tensor (warm)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        xser.read_params(x, names=[k])
        out["read_params(names=[one]) (warm)"].append(time.perf_counter() - t)
    return out


def imported_by_xser() -> list[str]:
    code = "import sys; import numpy; b = set(sys.modules); import xser; print(' '.join(sorted(set(sys.modules) - b)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=CHILD_ENV).stdout.split()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=256)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--loops", type=int, default=200, help="warm opens per side for (c)")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="xser-bench-open-", dir=args.dir)
    cols = 256
    rows = max(1, args.mib * (1 << 20) // args.arrays // 4 // cols)
    model = Model(args.arrays, rows, cols)
    p = xser.params(model)
    p["small"][...] = np.arange(16, dtype=np.float32)
    rng = np.random.default_rng(0)
    for i in range(args.arrays):
        p[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    x = os.path.join(root, "x", "m.yaml")
    st = os.path.join(root, "st.safetensors")
    xser.save(model, x, name="m")
    with xser.CheckpointReader(x) as r:  # the subcollection's name is the component's (class name and a hash)
        key = next(n for n in r.tensor_names() if n.endswith("/small"))
    sub = key.split("/")[0]
    stnp.save_file({"small": p["small"], **{f"p{i}": p[f"p{i}"] for i in range(args.arrays)}}, st)
    print(machine_header())
    print(f"# {args.arrays + 1} float32 arrays ({args.arrays} of {rows}x{cols}, one of 16), {args.repeats} repeats; "
          f"xser default save settings; dir {root}")
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = os.path.join(root, "pycache")
    try:
        for name, code in CHILDREN.items():
            run_child(code.format(x=x, st=st, k=key, sub=sub))
        times: dict[str, list[float]] = {k: [] for k in CHILDREN}
        cpu: dict[str, list[float]] = {k: [] for k in CHILDREN}
        for _ in range(args.repeats):
            for name, code in CHILDREN.items():  # interleaved: each repeat runs every child once
                wall, used = run_child(code.format(x=x, st=st, k=key, sub=sub))
                times[name].append(wall)
                cpu[name].append(used)
        times.update(warm_open(x, st, key, args.loops))
        mods = imported_by_xser()
    finally:
        shutil.rmtree(root)
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print("\n| measure | median ms (wall) | median ms (CPU, user + system) |\n|---|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v * 1000:.2f} | {mcpu[k] * 1000:.1f} |" if k in mcpu else f"| {k} | {v * 1000:.3f} | - |")
    ref = med["safetensors safe_open + get_tensor"]
    floor = med["python -c pass (floor)"]
    print("\n| target | xser | reference | ratio | target | met |\n|---|---:|---:|---:|---:|---|")
    for k in ("xser.CheckpointReader + read_tensor", "xser.read_params(names=[one])"):
        r = med[k] / ref
        print(f"| (a) start to first value: {k}, whole process ms | {med[k] * 1000:.1f} | {ref * 1000:.1f} | {r:.2f} | <= 1.2 | "
              f"{'yes' if r <= 1.2 else '**no**'} |")
        c, cref = mcpu[k], mcpu["safetensors safe_open + get_tensor"]
        print(f"| (a) the same, CPU time of the process (less sensitive to a loaded machine), ms | {c * 1000:.1f} | "
              f"{cref * 1000:.1f} | {c / cref:.2f} | <= 1.2 | {'yes' if c / cref <= 1.2 else '**no**'} |")
    xi, ni = med["import numpy, xser"] - floor, med["import numpy"] - floor
    print(f"| (b) import numpy, xser / import numpy, ms above the floor | {xi * 1000:.1f} | {ni * 1000:.1f} | "
          f"{xi / ni:.2f} | - | - |")
    wref = med["safe_open + get_tensor (warm)"]
    for k in ("CheckpointReader + read_tensor (warm)", "read_params(names=[one]) (warm)"):
        print(f"| (c) open + read one small array after import: {k}, ms | {med[k] * 1000:.3f} | {wref * 1000:.3f} | "
              f"{med[k] / wref:.1f} | <= 2 ms | {'yes' if med[k] <= 0.002 else '**no**'} |")
    print(f"\n`import xser` (after numpy) imports {len(mods)} modules: {' '.join(mods)}")


if __name__ == "__main__":
    main()
