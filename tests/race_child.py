"""Processes for the reader/writer race test (``test_race.py``).

``writer PATH SECONDS KEEP SHARDS``: saves a Linear again and again with ``CheckpointSaver(keep=KEEP)``
(``SHARDS`` > 0 packs the arrays into that many safetensors containers), so every save prunes one
checkpoint and shifts the others. Checkpoint ``s`` holds ``s`` everywhere: every array, the training
state (``step`` and an array), the manifest's step and ``custom``; so its content says which one it is.

``reader KINDS PATH SECONDS OUT KEEP``: while the writer rotates, reads again and again, in turn, with
every kind of reader named in ``KINDS`` (comma-separated), each asking for ``checkpoint=k`` for every
``k < KEEP``, ``"last"`` and ``"best"``: those checkpoints exist at every moment, so every read must
succeed (any exception is a failure) and give one whole checkpoint: one value everywhere, agreeing with
the records that come with it, and for one ``k`` never an older checkpoint than an earlier read gave.
Prints one JSON line: per kind, the attempts and every failure.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import components  # noqa: E402
import xser  # noqa: E402

KINDS = ("load", "load_mmap", "read_params", "training_state", "resume", "reader", "inspect", "avg", "convert", "ensemble",
         "load_serialized", "listing")


SUB: list[str] = []  # the subcollection's name (one for all checkpoints)


def one_value(arrays) -> float | None:
    """The one value every array holds, or None if they hold several (a mix of checkpoints)."""
    values = set()
    for a in arrays:
        values |= set(np.unique(np.asarray(a)).tolist())
    return values.pop() if len(values) == 1 else None


def acc(step: int) -> float:
    return ((step * 7919) % 101) / 100.0


def writer(path: str, seconds: float, keep: int, shards: int) -> None:
    m = components.Linear(16, 16)
    end = time.time() + seconds
    step = 0
    with xser.CheckpointSaver(path, keep=keep, durable=False, shards=shards or None) as saver:
        while time.time() < end:
            step += 1
            m.W[...] = step
            m.b[...] = step
            saver.save(m, step=step, metrics={"acc": acc(step)}, custom={"step": step},
                       training_state={"step": step, "m": np.full(8, step, np.float32)})
            print(step, flush=True)


class Mixed(Exception):
    """A read that gave no whole checkpoint, or one that disagrees with its records."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Mixed(what)


def value(arrays, what: str) -> float:
    v = one_value(arrays)
    expect(v is not None, f"{what}: several values {sorted({float(x) for a in arrays for x in np.unique(np.asarray(a))})[:6]}")
    return float(v)


def read_once(kind: str, path: str, out: str, keep: int, k, rng: random.Random) -> float:
    """One read of checkpoint ``k``; returns its step (from its content), after checking it is whole."""
    sel = {"checkpoint": k, "metric": "acc"} if k == "best" else {"checkpoint": k}
    if kind in ("load", "load_mmap"):
        m = xser.load(path, mmap=kind == "load_mmap", **sel)
        return value([m.W, m.b], kind)
    if kind == "read_params":
        rows = {f"{SUB[0]}/W": (3, 9)} if rng.random() < 0.5 else None  # only rows 3..8 of W are read
        (sub,) = xser.read_params(path, rows=rows, **sel).values()
        return value(list(sub.values()), kind)
    if kind == "training_state":
        state = xser.load_training_state(path, **sel)
        return value([state["m"], np.array(state["step"])], kind)
    if kind == "resume":
        r = xser.resume(path, **sel)
        v = value([r.model.W, r.model.b, r.training_state["m"], np.array(r.training_state["step"])], kind)
        expect(r.step == v and r.checkpoint.step == v and r.checkpoint.custom == {"step": v}, f"resume: records {r.checkpoint} for {v}")
        if isinstance(k, int):
            expect(r.checkpoint.index == k, f"resume: checkpoint={k} gave index {r.checkpoint.index}")
        return v
    if kind == "reader":
        from xser.tools.reader import CheckpointReader

        with CheckpointReader(path, checkpoint=k if isinstance(k, int) else 0) as rd:
            return value([rd.read_tensor(n) for n in rd.tensor_names()], kind)
    if kind == "inspect":
        from xser.tools.inspect import open_model

        index = k if isinstance(k, int) else 0
        view = open_model(path, index)
        try:
            v = value(list(view.data.read_all().values())[0].values(), kind)
            ids = [c.id for c in view.checkpoints]
            expect(len(ids) == keep and view.data.id in ids and ids.index(view.data.id) == index,
                   f"inspect: checkpoint {index} is not at {index} of its own listing {[c.step for c in view.checkpoints]}")
            return v
        finally:
            view.data.close()
    if kind == "avg":
        from xser.tools.average import average

        average(path, out, last=keep, durable=False, force=True)
        (rec,) = xser.checkpoints(out)
        steps = [e["step"] for e in rec.training["averaged_from"]]
        (sub,) = xser.read_params(out).values()
        v = value(list(sub.values()), kind)
        expect(steps == list(range(steps[0], steps[0] - keep, -1)), f"avg of steps {steps}")
        expect(np.float32(v) == np.float32(np.mean(np.array(steps, np.float64))), f"avg of steps {steps} is {v}")
        return float(steps[min(keep - 1, k if isinstance(k, int) else 0)])
    if kind == "convert":
        from xser.tools.convert import convert

        convert(path, out, durable=False, force=True, keep_training_state=True, **sel)
        (sub,) = xser.read_params(out).values()
        v = value(list(sub.values()) + [xser.load_training_state(out)["m"]], kind)
        expect(xser.checkpoints(out)[0].step == v, f"convert: step {xser.checkpoints(out)[0].step} holds {v}")
        return v
    if kind == "ensemble":
        from xser.tools.ensemble import ensemble

        ensemble([path], out, checkpoint=k if isinstance(k, int) else 0, durable=False, force=True)
        (sub,) = xser.read_params(out).values()
        return value(list(sub.values()), kind)
    if kind == "load_serialized":
        cfg = out + ".config.yaml"
        if not os.path.exists(cfg):
            with open(cfg, "w") as f:
                f.write(f"e:\n  model: !LoadSerialized {{filename: {json.dumps(path)}}}\n")
        m = xser.build(xser.load_config(cfg)["e"])["model"]
        return value([m.W, m.b], kind)
    if kind == "listing":
        steps = [c.step for c in xser.checkpoints(path)]
        expect(len(steps) == keep and steps == list(range(steps[0], steps[0] - keep, -1)), f"checkpoints(): steps {steps}")
        return float(steps[k] if isinstance(k, int) else steps[0])
    raise ValueError(kind)


def reader(kinds: list[str], path: str, seconds: float, out: str, keep: int) -> None:
    rng = random.Random(os.getpid())
    SUB.append(xser.checkpoints(path) and next(iter(xser.read_params(path))))
    end = time.time() + seconds
    report = {kind: {"attempts": 0, "failures": []} for kind in kinds}
    newest: dict = {}
    selections = list(range(keep)) + ["last", "best"]
    turn = 0
    while time.time() < end:
        kind = kinds[turn % len(kinds)]
        k = selections[(turn // len(kinds)) % len(selections)]
        turn += 1
        rep = report[kind]
        rep["attempts"] += 1
        try:
            v = read_once(kind, path, os.path.join(out, kind + ".yaml"), keep, k, rng)
            if k != "best":  # the k-th newest never goes back in time
                expect(v >= newest.get((kind, k), 0), f"checkpoint={k!r} gave step {v} after step {newest.get((kind, k))}")
                newest[(kind, k)] = v
        except Exception as e:  # noqa: BLE001 - every failure is reported, whatever it is
            detail = traceback.format_exc(limit=-3) if not isinstance(e, Mixed) else str(e)
            rep["failures"].append(f"checkpoint={k!r}: {type(e).__name__}: {detail[-1500:]}")
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        reader(sys.argv[2].split(","), sys.argv[3], float(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
