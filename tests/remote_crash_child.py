"""Kill a save to an object store immediately before each request to the store, in turn.

Run as ``python remote_crash_child.py ROOT OPTIONS_JSON OPS [SAMPLE]`` by ``test_remote_crash.py``:
``ROOT`` is a URL prefix (``file:///tmp/...`` or ``s3://bucket`` on the test's moto server),
``OPTIONS_JSON`` the storage_options, ``OPS`` comma-separated operation names (``OPS`` below).

For each operation, a first forked child runs it uninterrupted and logs its requests (``R`` of
them; every request passes ``FsspecStore.on_request``, every retry too). Then for N = 1, 2, ...,
R + 1 (or the sample of them ``SAMPLE`` picks: ``chosen``) a forked child sets the hook and runs the
operation on a fresh copy of the model as it was before the operation; the hook SIGKILLs the child
just before request N. After each kill this process checks:

- every checkpoint the newest commit record names reads bit-exact (every file there and matching its
  checksum: spec, arrays, training state) as the old state, or as the new one, and which one follows
  from whether commit record S+1 exists (S: the newest record before the operation);
- the next save (``xser.save(xser.load(url), url)``) succeeds and keeps the newest checkpoint;
  afterwards the model's data root holds exactly the checkpoints the newest record names, the
  ``commits/`` folder and no other name, at most ``KEEP_RECORDS`` records, none numbered above the
  newest, and the top-level spec exists.

The killed saves' local spool directories (``xser-spool-*`` in ``TMPDIR``) are counted.
Prints one JSON line per operation: requests, kills, the Ns killed at, and every problem.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import components  # noqa: E402,F401  (registers the test components)
from crash_child import lin, op_restart, setup_restart  # noqa: E402  (the same operations as on a local disk)
import xser  # noqa: E402
from xser.storage import stores  # noqa: E402
from xser.storage.listing import scan  # noqa: E402
from xser.storage.objects import commit as objects  # noqa: E402
from xser.storage.stores.remote import FsspecStore  # noqa: E402


def state(step: int) -> dict:
    return {"step": step, "m": np.full(3, step, np.float32)}


# ---------------------------------------------------------------- operations: (setup, op) on a URL prefix d


def setup_save(d):
    xser.save(lin(4, 3, 1.0), f"{d}/m.yaml")


def op_save(d):  # a fresh build with new names and new shapes, saved over the old model
    xser.save(lin(4, 5, 2.0), f"{d}/m.yaml")


def setup_rotate(d):
    m = lin(4, 3, 0.0)
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=2) as s:
        for step in (1, 2):
            m.W[...] = step
            s.save(m, step=step, training_state=state(step))


def op_rotate(d):  # keep=2: drops checkpoint 1
    m = xser.load(f"{d}/m.yaml")
    m.W[...] = 3
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=2) as s:
        s.save(m, step=3, training_state=state(3))


def setup_tool(d):
    m = lin(4, 3, 0.0)
    with xser.CheckpointSaver(f"{d}/src.yaml", keep=3) as s:
        for step in (1, 2, 3):
            m.W[...] = step
            s.save(m, step=step)
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=3) as s:  # the existing output, with two checkpoints
        old = lin(4, 5, 7.0)
        s.save(old, step=1)
        old.W[...] = 8.0
        s.save(old, step=2)


def op_convert(d):  # write_new_model; the arrays are copied on the server
    from xser.tools.convert import convert

    convert(f"{d}/src.yaml", f"{d}/m.yaml", checkpoint=1, force=True)


def op_avg(d):  # write_new_model; the arrays are read, averaged and uploaded
    from xser.tools.average import average

    average(f"{d}/src.yaml", f"{d}/m.yaml", force=True)


OPS = {
    "save": (setup_save, op_save),
    "rotate": (setup_rotate, op_rotate),
    "restart": (setup_restart, op_restart),
    "convert": (setup_tool, op_convert),
    "avg": (setup_tool, op_avg),
}


# ---------------------------------------------------------------- the store, seen from this process (no hook here)


class Root:
    """The URL prefix the operations run under, and a raw fsspec filesystem to copy and list it (no hook)."""

    def __init__(self, url: str, options: dict) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.options = options
        self.scheme = url.partition("://")[0]
        self.fs = fsspec.filesystem(self.scheme, **options)

    def path(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    def copy(self, src: str, dst: str) -> None:
        if self.scheme == "file":
            shutil.copytree(self.path(src), self.path(dst))
        else:
            self.fs.copy(self.path(src) + "/", self.path(dst) + "/", recursive=True)

    def objects(self, url: str) -> set[str]:
        """Every object under ``url``, as URLs; on file:// also every directory (a name of its own)."""
        base = self.path(url).rstrip("/")
        found = self.fs.find(base, withdirs=self.scheme == "file")
        return {self.url + "/" + p[len(self.path(self.url).rstrip("/")) + 1 :] for p in found if p.rstrip("/") != base}


def mask(text: str) -> str:
    """The spec without the subcollections' generated names and the header comment (``avg`` copies its input's)."""
    return re.sub(r"(Linear)\.[0-9a-f]{8}", "NAME", re.sub(r"^# xser saved model: .*\n", "", text))


def fingerprint(u: str, newest: bool = False):
    """Every checkpoint of the model at ``u`` (or the newest), from one listing of its newest commit record: step, its
    spec, every array bit for bit and its training state, every file read and checked against its checksum (so every
    object the record names is there and whole)."""
    try:
        out = []
        with scan(u) as s:
            for c, data in s.listed[: 1 if newest else None]:
                arrays = sorted((n, a.dtype.str, a.shape, a.tobytes().hex())
                                for sub in data.read_all(verify=True).values() for n, a in sub.items())
                st = sorted((k, a.tobytes().hex()) for k, a in data.read_state_arrays(verify=True).items())
                out.append((c.step, mask(data.spec_text() or ""), tuple(arrays), json.dumps(data.manifest.state), tuple(st)))
        return ("model", tuple(out))
    except xser.XserError as e:
        return ("error", type(e).__name__, str(e))


def leftovers(root: Root, d: str, names: set[str]) -> list[str]:
    """What the model at ``d/m.yaml`` holds beyond what its newest record names (and ``names`` at the top)."""
    u = f"{d}/m.yaml"
    store = stores.store_for(u)
    seq, rec = objects.latest(store, u)
    problems = []
    if rec is None:
        return ["no commit record"]
    data = u + ".data"
    listed = [c["dir"] for c in rec["checkpoints"]]
    allowed = {f"{data}/commits"} | {f"{data}/{p}" for p in listed}
    numbers = []
    for o in sorted(root.objects(data)):
        rel = o[len(data) + 1 :]
        top = rel.split("/", 1)[0]
        if top == "commits" and "/" in rel:
            m = re.fullmatch(r"commits/(\d{20})\.json", rel)
            if m is None:
                problems.append(f"a stray object {rel}")
            else:
                numbers.append(int(m.group(1)))
        elif f"{data}/{top}" not in allowed:
            problems.append(f"a leftover {rel}")
    if len(numbers) > objects.KEEP_RECORDS or max(numbers) != seq:
        problems.append(f"commit records {numbers} after commit {seq}")
    for p in listed:
        if f"{data}/{p}/manifest.json" not in root.objects(f"{data}/{p}"):
            problems.append(f"checkpoint {p} named by record {seq} has no manifest")
    top = {o[len(d) + 1 :].split("/", 1)[0] for o in root.objects(d)}
    if top != names:
        problems.append(f"at the top: {sorted(top)}, expected {sorted(names)}")
    return problems


# ---------------------------------------------------------------- children


def in_child(fn) -> int:
    """Run ``fn()`` in a forked child; its exit status (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            print(f"child failed: {type(e).__name__}: {e}", file=sys.stderr)
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def arm(limit: int, log: list | None = None) -> None:
    """Count requests from now on (every thread); SIGKILL this process just before request ``limit``."""
    count = [0]
    lock = threading.Lock()

    def hook(op: str, url: str) -> None:
        with lock:
            count[0] += 1
            n = count[0]
            if log is not None:
                log.append((op, url))
        if n == limit:
            os.kill(os.getpid(), signal.SIGKILL)

    FsspecStore.on_request = hook


def logged_run(run, d: str, out: str) -> None:
    log: list = []
    arm(0, log)
    run(d)
    FsspecStore.on_request = None
    with open(out, "w") as f:
        json.dump(log, f)


def spools() -> int:
    return len([n for n in os.listdir(tempfile.gettempdir()) if n.startswith("xser-spool-")])


MUTATING = ("write", "delete", "copy")


def chosen(log: list, sample: str) -> list[int]:
    """The Ns to kill before. ``all``: every request. ``writes``: every request that changes the store (a kill
    before a read leaves the store as a kill before the next change does), the first and the last. ``writes:K``:
    every K-th of those, plus the commit and the request after it, and the last three."""
    requests = len(log)
    if sample == "all":
        return list(range(1, requests + 1))
    changes = [i for i, (op, _url) in enumerate(log, 1) if op in MUTATING]
    every = int(sample.partition(":")[2] or 1)
    picks = {1, requests} | set(changes[::every]) | set(changes[-3:])
    for i, (op, url) in enumerate(log, 1):
        if op == "write" and "/commits/" in url:  # just before the commit and just after it
            picks |= {i, i + 1}
    return sorted(n for n in picks if n <= requests)


def campaign(root: Root, op: str, sample: str) -> dict:
    setup, run = OPS[op]
    template = f"{root.url}/{op}-template"
    setup(template)
    u0 = f"{template}/m.yaml"
    names = {n for n in ("m.yaml", "m.yaml.data", "src.yaml", "src.yaml.data")} & {
        o[len(template) + 1 :].split("/", 1)[0] for o in root.objects(template)}
    old = fingerprint(u0)
    before, _ = objects.latest(stores.store_for(u0), u0)
    problems: list[str] = []
    work = f"{root.url}/{op}-clean"
    root.copy(template, work)
    logfile = os.path.join(tempfile.gettempdir(), f"requests-{op}.json")
    if in_child(lambda: logged_run(run, work, logfile)) != 0:
        return {"op": op, "problems": ["the operation fails without any kill"]}
    with open(logfile) as f:
        log = json.load(f)
    new = fingerprint(f"{work}/m.yaml")
    if new[0] != "model" or new == old:
        return {"op": op, "problems": [f"the operation does not change the model: {str(new)[:300]}"]}
    spools0 = spools()
    kills, killed_at, completed = 0, [], []
    t0 = time.time()
    for n in chosen(log, sample) + [len(log) + 1]:
        work = f"{root.url}/{op}-{n}"
        root.copy(template, work)
        status = in_child(lambda: (arm(n), run(work)))
        u = f"{work}/m.yaml"
        if status == 0:
            completed.append(n)
            if n <= len(log):
                continue  # this run made fewer requests (threads, retries): nothing was killed
            got, committed = fingerprint(u), True
            if got != new:
                problems.append(f"the uninterrupted operation gives another state: {str(got)[:300]}")
        elif status != -signal.SIGKILL:
            problems.append(f"request {n}: the operation failed (status {status}) instead of being killed")
            continue
        else:
            kills += 1
            killed_at.append(n)
            seq, _ = objects.latest(stores.store_for(u), u)
            committed = seq > before
            got = fingerprint(u)
            want = new if committed else old
            if got != want:
                problems.append(f"kill before request {n} ({log[n - 1] if n <= len(log) else '?'}): commit record "
                                f"{seq} {'exists' if committed else 'only'}, but the model is "
                                f"{'the old state' if got == old else 'not the ' + ('new' if committed else 'old') + ' state'}: "
                                f"{str(got)[:300]}")
                continue
        try:
            xser.save(xser.load(u), u)  # the next save, in this process (no hook)
        except xser.XserError as e:
            problems.append(f"kill before request {n}: the next save fails: {type(e).__name__}: {e}")
            continue
        after = fingerprint(u, newest=True)
        if after[0] != "model" or after[1][0][1:3] != got[1][0][1:3]:
            problems.append(f"kill before request {n}: the next save changed the newest checkpoint: {str(after)[:300]}")
        for p in leftovers(root, work, names):
            problems.append(f"kill before request {n}, after the next save: {p}")
        root.fs.rm(root.path(work), recursive=True)
    return {"op": op, "requests": len(log), "kills": kills, "killed_at": killed_at, "completed": completed,
            "committed_by": before + 1, "spools_left": spools() - spools0, "seconds": round(time.time() - t0, 1),
            "problems": problems}


def main(url: str, options: dict, ops: list[str], sample: str) -> None:
    root = Root(url, options)
    with stores.options(options):
        for op in ops:
            print(json.dumps(campaign(root, op, sample)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(","), sys.argv[4] if len(sys.argv) > 4 else "all")
