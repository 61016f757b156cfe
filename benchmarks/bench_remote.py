"""Remote storage benchmark (issue 21): xser on S3 (a local moto server) against s3fs doing the same work.

Every figure compares xser with a reference in the same run, against the same moto server. moto runs in
its own process (``ThreadedMotoServer`` on 127.0.0.1, a free port): it is CPU-heavy Python, and in a
separate process it does not compete with the benchmark for the GIL (it still competes for the cores).

1. **Save and load** a model of ``--size`` bytes of float32 in 64 arrays, then in 4,096 arrays (``--arrays``):
   ``xser.save(url, threads=T)`` against s3fs ``put_file`` of the same bytes as ``.npy`` files, written locally
   first (not timed), ``T`` uploads at once on a thread pool; ``xser.load(url)`` (its read pool has ``T``
   threads) against s3fs ``cat_file`` of those files, ``T`` at once, each parsed as ``.npy`` without a copy.
2. **Partial read** of 1% of the rows of a ``--partial-size`` float32 matrix, ``xser.read_params(url, rows=)``:
   bytes transferred (the bodies of every GET, counted in s3fs) against the bytes of the rows, with the matrix
   stored as one ``.npy``, in blocks (``blocks=``) and in a packed container (``shards=``).
3. **Averaging** ``--checkpoints`` remote checkpoints of ``--avg-size`` (``CheckpointSaver(keep=5)`` on S3, then
   ``xser.tools.average.average``), wall time and peak RSS above the child's baseline (``VmHWM``, each side in its
   own process), against the same average of the same checkpoints saved locally.

    python benchmarks/bench_remote.py [--size 1GiB] [--arrays 64,4096] [--repeats 3] [--threads 2]
                                      [--partial-size 256MiB] [--avg-size 256MiB] [--only save,partial,avg]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import xser  # noqa: E402
from bench_partial_load import Matrix  # noqa: E402  (the matrix component of the partial-load benchmark)
from bench_save_load import Blob, machine_header  # noqa: E402

MOTO_CHILD = r"""
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"http://{host}:{port}", flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
server.stop()
"""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MiB, 1GiB)")
    unit = (m.group(2) or "B").upper()[:1]
    return int(float(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


def human(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------- the server and its traffic


class Moto:
    """A moto S3 server in a child process; ``options`` are the storage_options to reach it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", MOTO_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http"):
            raise SystemExit("the moto server did not start (pip install 'moto[server]')")
        self.options = {"key": "bench", "secret": "bench", "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}
        import fsspec

        # the reference's filesystem: the options xser's store uses (no listings cache), its own instance
        self.fs = fsspec.filesystem("s3", use_listings_cache=False, skip_instance_cache=True, **self.options)

    def bucket(self, name: str) -> str:
        self.fs.call_s3("create_bucket", Bucket=name)
        return name

    def rm(self, prefix: str) -> None:
        try:
            self.fs.rm(prefix, recursive=True)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Traffic:
    """Requests and body bytes of every GET, counted in s3fs itself (``_cat_file``: every ranged or whole GET of
    xser and of the references), with requests of every kind counted through ``FsspecStore.on_request``."""

    def __init__(self) -> None:
        import s3fs

        self.lock = threading.Lock()
        self.reset()
        original = s3fs.S3FileSystem._cat_file
        traffic = self

        async def counted(fs, path, version_id=None, start=None, end=None, **kw):
            data = await original(fs, path, version_id=version_id, start=start, end=end, **kw)
            with traffic.lock:
                traffic.get_bytes[_kind(path)] += len(data)
                traffic.gets[_kind(path)] += 1
            return data

        s3fs.S3FileSystem._cat_file = counted
        from xser.storage.stores.remote import FsspecStore

        def hook(op, url):
            with traffic.lock:
                traffic.ops[op] += 1

        FsspecStore.on_request = hook

    def reset(self) -> None:
        self.get_bytes: Counter = Counter()
        self.gets: Counter = Counter()
        self.ops: Counter = Counter()


def _kind(path: str) -> str:
    return "data" if path.endswith((".npy", ".safetensors", ".bin", ".txt")) and "/commits/" not in path else "meta"


def median(xs):
    return statistics.median(xs)


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


# ---------------------------------------------------------------- 1. save and load


def make_blob(n: int, total: int, seed: int = 0):
    cols = 1024 if total // n >= 4096 * 16 else 256
    rows = max(1, total // n // 4 // cols)
    model = Blob(n, rows, cols)
    sub = xser.params(model)
    rng = np.random.default_rng(seed)
    for i in range(n):
        sub[f"p{i}"][...] = rng.standard_normal((rows, cols), dtype=np.float32)
    return model, [sub[f"p{i}"] for i in range(n)]


def ref_put(fs, files, prefix, threads):
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda i: fs.put_file(files[i], f"{prefix}/p{i}.npy"), range(len(files))))


def ref_get(fs, prefix, n, threads):
    def one(i):
        data = fs.cat_file(f"{prefix}/p{i}.npy")
        f = io.BytesIO(data)
        np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        return np.frombuffer(data, dtype, offset=f.tell()).reshape(shape)

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(one, range(n)))


def bench_save_load(moto, traffic, bucket, args, root):
    fs, opts, T = moto.fs, moto.options, args.threads
    rows_out = []
    for n in args.arrays:
        model, arrays = make_blob(n, args.size)
        total = sum(a.nbytes for a in arrays)
        local = os.path.join(root, f"npy-{n}")
        os.makedirs(local)
        files = []
        for i, a in enumerate(arrays):  # the reference's .npy files, written before any timing
            files.append(os.path.join(local, f"p{i}.npy"))
            np.save(files[-1], a)
        print(f"\n## save/load: {n} arrays of {arrays[0].shape} float32 = {human(total)}, threads={T}, {args.repeats} repeats")
        times: dict[str, list[float]] = {}
        reqs: dict[str, Counter] = {}
        for r in range(args.repeats):
            ref_prefix, x_url = f"{bucket}/ref-{n}-{r}", f"s3://{bucket}/x-{n}-{r}/m.yaml"
            for key, fn in (
                ("s3fs put_file", lambda: ref_put(fs, files, ref_prefix, T)),
                ("xser.save", lambda: xser.save(model, x_url, threads=T, storage_options=opts)),
                ("s3fs cat_file", lambda: ref_get(fs, ref_prefix, n, T)),
                ("xser.load", lambda: xser.load(x_url, storage_options=opts)),
            ):
                traffic.reset()
                t, out = timed(fn)
                times.setdefault(key, []).append(t)
                reqs[key] = Counter(traffic.ops) + Counter({f"GET ({k})": v for k, v in traffic.gets.items()})
                if key == "xser.load":
                    assert np.array_equal(xser.params(out)[f"p{n - 1}"], arrays[-1])
                elif key == "s3fs cat_file":
                    assert np.array_equal(out[-1], arrays[-1])
                del out
            moto.rm(ref_prefix)
            moto.rm(f"{bucket}/x-{n}-{r}")
        shutil.rmtree(local)
        med = {k: median(v) for k, v in times.items()}
        print("| measure | median s | MiB/s | requests (last repeat) |")
        print("|---|---|---|---|")
        for k, v in med.items():
            print(f"| {k} | {v:.3f} | {total / v / 2**20:.0f} | {dict(reqs[k]) or '-'} |")
        for a, b in (("xser.save", "s3fs put_file"), ("xser.load", "s3fs cat_file")):
            ratio = med[a] / med[b]
            rows_out.append((f"{a} / {b}, {n} arrays, {human(total)}", ratio, "<= 1.1", "yes" if ratio <= 1.1 else "no"))
            print(f"| {a} / {b} | {ratio:.2f} | target <= 1.1 | {'met' if ratio <= 1.1 else 'MISSED'} |")
        del model, arrays
    return rows_out


# ---------------------------------------------------------------- 2. partial reads


def bench_partial(moto, traffic, bucket, args):
    opts = moto.options
    cols = 1024
    rows = args.partial_size // 4 // cols
    model = Matrix(rows, cols)
    W = xser.params(model)["W"]
    W[...] = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32)
    with tempfile.TemporaryDirectory() as d:  # the subcollection's name (it depends on the arguments), from a local save
        xser.save(model, os.path.join(d, "m.yaml"), durable=False)
        sub = next(iter(xser.read_params(os.path.join(d, "m.yaml"), mmap=True)))
    nrows = max(1, rows // 100)
    first = rows // 3
    row_bytes = nrows * cols * 4
    print(f"\n## partial read: rows ({first}, {first + nrows}) of a {rows}x{cols} float32 matrix ({human(W.nbytes)}): "
          f"{nrows} rows = {human(row_bytes)}")
    print("| stored as | GET bytes, array files | GET bytes, metadata | GETs (data, meta) | requests by op | data bytes / row bytes | "
          "all bytes / row bytes | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    rows_out = []
    for label, kw in (("one .npy", {}), (f"blocks of {rows // 16} rows", {"blocks": {f"{sub}/W": rows // 16}}),
                      ("packed (shards=2)", {"shards": 2})):
        url = f"s3://{bucket}/partial-{label.split()[0]}/m.yaml"
        xser.save(model, url, storage_options=opts, **kw)
        traffic.reset()
        t, got = timed(lambda: xser.read_params(url, rows={f"{sub}/W": (first, first + nrows)}, storage_options=opts))
        assert np.array_equal(got[sub]["W"], W[first : first + nrows])
        data, meta = traffic.get_bytes["data"], traffic.get_bytes["meta"]
        print(f"| {label} | {data} | {meta} | ({traffic.gets['data']}, {traffic.gets['meta']}) | {dict(traffic.ops)} | "
              f"{data / row_bytes:.4f} | {(data + meta) / row_bytes:.4f} | {t:.3f} |")
        ok = data <= 1.1 * row_bytes + 4096 * traffic.gets["data"]
        rows_out.append((f"partial read 1% rows, {label}: array-file bytes / row bytes", data / row_bytes,
                         "<= 1.1 + headers", "yes" if ok else "no"))
        moto.rm(f"{bucket}/partial-{label.split()[0]}")
    return rows_out


# ---------------------------------------------------------------- 3. averaging

AVG_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {here!r})
import numpy as np
def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
import xser, xser.tools.average
from xser.storage.stores import options
import bench_save_load
opts = json.loads({opts!r})
if opts:  # fsspec and s3fs imported and the store made before the baseline
    from xser.storage.stores import store_for
    store_for({model!r}, opts)
open("/proc/self/clear_refs", "w").write("5")
base = rss("VmRSS:")
t = time.perf_counter()
with options(opts or None):
    xser.tools.average.average({model!r}, {out!r}, durable=False)
print(json.dumps({{"seconds": time.perf_counter() - t, "peak_above_base": rss("VmHWM:") - base}}))
"""


def avg_child(model: str, out: str, opts: dict) -> dict:
    code = AVG_CHILD.format(here=HERE, model=model, out=out, opts=json.dumps(opts))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_average(moto, bucket, args, root):
    opts = moto.options
    n = 64
    model, arrays = make_blob(n, args.avg_size, seed=2)
    total = sum(a.nbytes for a in arrays)
    url, local = f"s3://{bucket}/avg/m.yaml", os.path.join(root, "avg", "m.yaml")
    for path, kw in ((url, {"storage_options": opts}), (local, {"durable": False})):
        with xser.CheckpointSaver(path, keep=args.checkpoints, **kw) as saver:
            for step in range(args.checkpoints):
                for a in arrays:
                    a += 1.0
                saver.save(model, step=step)
    del model, arrays
    print(f"\n## averaging {args.checkpoints} checkpoints of {human(total)} ({n} float32 arrays), {args.repeats} repeats "
          "(each side in its own process; peak RSS above the process's baseline)")
    res: dict[str, list[dict]] = {"local -> local": [], "S3 -> S3": [], "S3 -> local": []}
    for r in range(args.repeats):
        for side in res:
            src = local if side.startswith("local") else url
            out = (f"s3://{bucket}/avg-out-{r}/m.yaml" if side.endswith("S3") else os.path.join(root, f"avg-out-{side[:2]}-{r}", "m.yaml"))
            res[side].append(avg_child(src, out, opts if "S3" in side else {}))
            if side.endswith("S3"):
                moto.rm(f"{bucket}/avg-out-{r}")
            else:
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    print("| side | median s | peak RSS above baseline |")
    print("|---|---|---|")
    med = {}
    for side, got in res.items():
        errors = [g["error"] for g in got if "error" in g]
        if errors:
            print(f"| {side} | failed: {errors[0]} | - |")
            continue
        med[side] = (median([g["seconds"] for g in got]), median([g["peak_above_base"] for g in got]))
        print(f"| {side} | {med[side][0]:.3f} | {human(med[side][1])} |")
    rows_out = []
    for side in ("S3 -> S3", "S3 -> local"):
        if side in med and "local -> local" in med:
            t, m = med[side][0] / med["local -> local"][0], med[side][1] / max(1, med["local -> local"][1])
            rows_out.append((f"average {side} / local: time", t, "(reported)", "-"))
            rows_out.append((f"average {side} / local: peak RSS", m, "<= 1.0 (no more than locally)",
                             "yes" if med[side][1] <= med["local -> local"][1] * 1.05 else "no"))
    shutil.rmtree(os.path.dirname(local), ignore_errors=True)
    moto.rm(f"{bucket}/avg")
    return rows_out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="model size for save/load (default 1GiB)")
    ap.add_argument("--arrays", default="64,4096", help="array counts for save/load, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="xser's writer threads = the reference's concurrent requests")
    ap.add_argument("--partial-size", type=parse_size, default=parse_size("256MiB"))
    ap.add_argument("--avg-size", type=parse_size, default=parse_size("256MiB"))
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--only", default="save,partial,avg")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    args.arrays = [int(x) for x in args.arrays.split(",")]
    only = set(args.only.split(","))
    from xser.storage.pool import pool

    if pool()._max_workers != args.threads:
        print(f"# note: xser's read pool has {pool()._max_workers} threads, the references use {args.threads}")
    print(machine_header())
    moto = Moto()
    print(f"# moto server (its own process) at {moto.endpoint}; s3fs {__import__('s3fs').__version__}, "
          f"moto {__import__('moto').__version__}")
    traffic = Traffic()
    root = tempfile.mkdtemp(prefix="xser-remotebench-", dir=args.dir)
    summary = []
    t0 = time.perf_counter()
    try:
        bucket = moto.bucket("bench")
        if "save" in only:
            summary += bench_save_load(moto, traffic, bucket, args, root)
        if "partial" in only:
            summary += bench_partial(moto, traffic, bucket, args)
        if "avg" in only:
            summary += bench_average(moto, bucket, args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        moto.close()
    print("\n| ratio | value | target | met |")
    print("|---|---|---|---|")
    for name, value, target, met in summary:
        print(f"| {name} | {value:.3f} | {target} | {met} |")
    print(f"\n# total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
