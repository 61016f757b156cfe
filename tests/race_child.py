"""Processes for the reader/writer race test (``test_race.py``).

``writer PATH SECONDS``: saves a Linear again and again with ``CheckpointSaver(keep=4)``, every
array (and the training state) filled with the step, so each checkpoint is one number.
``reader KIND PATH SECONDS OUT``: reads while the writer rotates and prunes, and reports as
JSON how many reads were whole checkpoints, how many failed cleanly, and every mixed one.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import components  # noqa: E402
import xser  # noqa: E402


def one_value(arrays) -> float | None:
    """The one value every array holds, or None if they hold several (a mix of checkpoints)."""
    values = set()
    for a in arrays:
        values |= set(np.unique(np.asarray(a)).tolist())
    return values.pop() if len(values) == 1 else None


def writer(path: str, seconds: float) -> None:
    m = components.Linear(64, 64)
    end = time.time() + seconds
    step = 0
    with xser.CheckpointSaver(path, keep=4, durable=False) as saver:
        while time.time() < end:
            step += 1
            m.W[...] = step
            m.b[...] = step
            saver.save(m, step=step, training_state={"step": step, "m": np.full(64, step, np.float32)})
            print(step, flush=True)


def read_once(kind: str, path: str, out: str, rng: random.Random):
    """One read; returns (whole?, detail)."""
    k = rng.choice([0, 0, 1, 2])
    if kind == "load":
        m = xser.load(path, checkpoint=k)
        v = one_value([m.W, m.b])
        return v is not None, f"load checkpoint {k}: values {sorted(set(m.W.flat) | set(m.b.flat))[:6]}"
    if kind == "read_params":
        rows = {}
        if rng.random() < 0.5:
            name = next(iter(xser.checkpoints(path)[0].path and xser.read_params(path, checkpoint=0)))
            rows = {f"{name}/W": (3, 40)}
        (sub,) = xser.read_params(path, checkpoint=k, rows=rows or None).values()
        return one_value(sub.values()) is not None, f"read_params {k} rows={bool(rows)}: {[np.unique(a)[:4] for a in sub.values()]}"
    if kind == "training_state":
        state = xser.load_training_state(path, checkpoint=k)
        ok = np.all(state["m"] == state["step"])
        return bool(ok), f"training_state {k}: step {state['step']}, m {np.unique(state['m'])[:4]}"
    if kind == "avg":
        from xser.tools.average import average

        average(path, out, last=3, durable=False, force=True)
        man = xser.checkpoints(out)[0]
        steps = [e["step"] for e in man.training["averaged_from"]]
        ids = [e["id"] for e in man.training["averaged_from"]]
        (sub,) = xser.read_params(out).values()
        v = one_value(sub.values())
        expected = np.float32(np.mean(np.array(steps, np.float64)))
        ok = len(set(steps)) == 3 and len(set(ids)) == 3 and v is not None and np.float32(v) == expected
        return ok, f"avg of steps {steps}: values {[np.unique(a)[:4] for a in sub.values()]}"
    if kind == "listing":
        ckpts = xser.checkpoints(path)
        steps = [c.step for c in ckpts]
        ids = [c.id for c in ckpts]
        ok = steps == sorted(set(steps), reverse=True) and len(set(ids)) == len(ids) and 1 <= len(ckpts) <= 4
        return ok, f"checkpoints(): steps {steps}"
    raise ValueError(kind)


def reader(kind: str, path: str, seconds: float, out: str) -> None:
    rng = random.Random(os.getpid())
    end = time.time() + seconds
    whole, clean_errors, mixed = 0, [], []
    while time.time() < end:
        try:
            ok, detail = read_once(kind, path, out, rng)
        except xser.CheckpointError as e:  # a clean refusal (e.g. removed while reading, 5 times in a row)
            clean_errors.append(str(e)[:200])
            continue
        if ok:
            whole += 1
        else:
            mixed.append(detail)
    print(json.dumps({"kind": kind, "whole": whole, "clean_errors": clean_errors[:5], "n_clean_errors": len(clean_errors), "mixed": mixed[:5], "n_mixed": len(mixed)}))


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], float(sys.argv[3]))
    else:
        reader(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])
