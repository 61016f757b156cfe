"""Kill a model-writing operation immediately before each filesystem-changing call, in turn.

Run as ``python crash_child.py OP WORKDIR`` by ``test_crash.py``. For N = 1, 2, ... this
process forks a child that counts every filesystem-changing call (rename, replace, link,
unlink, mkdir, rmdir, fsync, a file opened for writing, the atomic exchange, the lock file's
truncate and write) and sends itself SIGKILL just before call N. After each kill the model
must load as exactly the old or exactly the new state; then a follow-up save must succeed and
leave no leftovers. The loop ends at the first N the operation survives (it made fewer calls).
Prints one JSON line: the operation, the calls it makes, the kills done, and every problem.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import components  # noqa: E402
import xser  # noqa: E402
from xser.model.serialize import to_tree  # noqa: E402
from xser.spec import dump  # noqa: E402
from xser.storage.disk import commit  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def arm(limit: int, hit=None, setattr=setattr) -> list:
    """Count filesystem-changing calls from now on; just before call ``limit`` run ``hit()``
    (default: SIGKILL this process). ``setattr`` installs the wrappers (``monkeypatch.setattr``
    in-process). Returns the one-element call counter."""
    count = [0]

    def tick() -> None:
        count[0] += 1
        if count[0] == limit:
            if hit is None:
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                hit()

    def counted(fn, test=None):
        def wrapper(*a, **kw):
            if test is None or test(*a, **kw):
                tick()
            return fn(*a, **kw)

        return wrapper

    for name in ("rename", "replace", "link", "unlink", "remove", "mkdir", "rmdir", "fsync", "ftruncate", "pwrite", "symlink"):
        setattr(os, name, counted(getattr(os, name)))
    setattr(os, "open", counted(os.open, lambda path, flags, *a, **kw: bool(flags & _WRITE_FLAGS)))
    writing = lambda file, mode="r", *a, **kw: any(c in mode for c in "wxa+")  # noqa: E731
    setattr(builtins, "open", counted(builtins.open, writing))
    setattr(io, "open", builtins.open)
    setattr(commit, "exchange", counted(commit.exchange))
    return count


# ---------------------------------------------------------------- states


def fingerprint(path: str):
    """What ``xser.load(path)`` gives, names of subcollections masked: the spec and every array."""
    try:
        obj = xser.load(path, verify=True)
    except xser.XserError as e:
        return ("error", type(e).__name__, str(e).replace(os.path.dirname(path), "<dir>"))
    tree, subs = to_tree(obj)
    text = re.sub(r"(Linear|Norm|DismecModel)\.[0-9a-f]{8}", "NAME", dump(tree))
    arrays = sorted(
        (p, n, a.dtype.str, a.shape, a.tobytes().hex()) for _, (sub, p) in subs.items() for n, (a, _) in sub.current().items()
    )
    return ("model", text, tuple(arrays))


def leftovers(workdir: str) -> list[str]:
    return sorted(n for n in os.listdir(workdir) if re.search(r"\.(tmp|old)-", n))


def lin(in_dim: int, out_dim: int, value: float) -> components.Linear:
    m = components.Linear(in_dim, out_dim)
    m.W[...] = value
    m.b[...] = value
    return m


# ---------------------------------------------------------------- operations: (setup, op) in the work directory


def setup_save(d):
    xser.save(lin(4, 3, 1.0), f"{d}/m.yaml")


def op_save(d):  # a fresh build with new names and new shapes, saved over the old model
    xser.save(lin(4, 5, 2.0), f"{d}/m.yaml")


def op_rotate_packed(d):  # packed containers: several safetensors files, some linked from the previous checkpoint
    m = xser.load(f"{d}/m.yaml")
    m.W[...] = 3
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=2, shards=2) as s:
        s.save(m, step=3, training_state={"step": 3, "m": np.full(3, 3, np.float32)})


def setup_nothing(d):
    pass


def setup_rotate(d):
    m = lin(4, 3, 0.0)
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=2) as s:
        for step in (1, 2):
            m.W[...] = step
            s.save(m, step=step, training_state={"step": step, "m": np.full(3, step, np.float32)})


def op_rotate(d):
    m = xser.load(f"{d}/m.yaml")
    m.W[...] = 3
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=2) as s:
        s.save(m, step=3, training_state={"step": 3, "m": np.full(3, 3, np.float32)})


def setup_restart(d):
    m = lin(4, 3, 0.0)
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=3) as s:
        for step in (1, 2, 3):
            m.W[...] = step
            s.save(m, step=step)


def op_restart(d):
    with xser.CheckpointSaver(f"{d}/m.yaml", keep=3, restart=True) as s:
        s.save(lin(4, 5, 9.0), step=1)


def setup_partial(d):
    m = lin(4, 6, 1.0)
    xser.save(m, f"{d}/m.yaml")
    again = xser.load(f"{d}/m.yaml")
    ps = xser.PartialSaver(f"{d}/m.yaml", again, worker="w0")
    name = xser.params(again).name
    ps.write_rows(f"{name}/W", 0, np.full((3, 4), 5.0, np.float32))
    ps.write_rows(f"{name}/W", 3, np.full((3, 4), 6.0, np.float32))


def op_partial(d):
    obj = xser.load(f"{d}/m.yaml")
    obj.b[...] = 4.0
    xser.PartialSaver(f"{d}/m.yaml", obj).finalize()


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


def op_avg(d):
    from xser.tools.average import average

    average(f"{d}/src.yaml", f"{d}/m.yaml", force=True)


def op_convert(d):
    from xser.tools.convert import convert

    convert(f"{d}/src.yaml", f"{d}/m.yaml", checkpoint=1, force=True)


def op_ensemble(d):
    from xser.tools.ensemble import ensemble

    ensemble([f"{d}/src.yaml"], f"{d}/m.yaml", force=True)


def setup_import(d):
    shutil.copytree(os.path.join(DATA, "dismec", "split-DenseNPY"), f"{d}/dismec")
    xser.save(lin(4, 3, 1.0), f"{d}/m.yaml")


def op_import(d):
    from xser.interop.dismec import import_dismec

    import_dismec(f"{d}/dismec/model.json", f"{d}/m.yaml", force=True)


OPS = {
    "save": (setup_save, op_save),
    "save-first": (setup_nothing, op_save),
    "rotate": (setup_rotate, op_rotate),
    "rotate-packed": (setup_rotate, op_rotate_packed),
    "restart": (setup_restart, op_restart),
    "partial": (setup_partial, op_partial),
    "avg": (setup_tool, op_avg),
    "convert": (setup_tool, op_convert),
    "ensemble": (setup_tool, op_ensemble),
    "import": (setup_import, op_import),
}


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


def main(op: str, root: str) -> None:
    setup, run = OPS[op]
    template, work = os.path.join(root, "template"), os.path.join(root, "work")
    os.makedirs(template)
    setup(template)
    old = fingerprint(f"{template}/m.yaml")
    shutil.copytree(template, work, symlinks=True)
    assert in_child(lambda: run(work)) == 0, "the operation fails without any kill"
    new = fingerprint(f"{work}/m.yaml")
    assert new[0] == "model" and new != old, "the operation does not change the model"
    problems, kills, limit = [], 0, 1
    while True:
        shutil.rmtree(work)
        shutil.copytree(template, work, symlinks=True)
        status = in_child(lambda: (arm(limit), run(work)))
        if status == 0:
            break  # the operation makes fewer calls than `limit`
        if status != -signal.SIGKILL:
            problems.append(f"call {limit}: the operation failed (status {status}) instead of being killed")
            break
        kills += 1
        got = fingerprint(f"{work}/m.yaml")
        if got != old and got != new:
            problems.append(f"kill before call {limit}: the model is neither the old nor the new state: {str(got)[:300]}")
            limit += 1
            continue
        try:
            xser.checkpoints(f"{work}/m.yaml")
        except xser.XserError as e:
            problems.append(f"kill before call {limit}: checkpoints() fails: {e}")
        if got[0] == "model":  # the next save repairs: it works, and nothing is left over
            status = in_child(lambda: xser.save(xser.load(f"{work}/m.yaml"), f"{work}/m.yaml"))
            after = fingerprint(f"{work}/m.yaml")
            if status != 0 or after != got:
                problems.append(f"kill before call {limit}: the next save failed or changed the state (status {status})")
            elif leftovers(work):
                problems.append(f"kill before call {limit}: the next save left {leftovers(work)}")
        limit += 1
    print(json.dumps({"op": op, "calls": limit - 1, "kills": kills, "problems": problems}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
