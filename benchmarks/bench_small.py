"""Small saves: a model of 10 small tensors saved again and again, xser against ``torch.save`` in the same run.

Issue 23, target 3: with ``durable=False`` a save takes at most 2x ``torch.save`` of the model's state_dict (page
cache); a durable save at most ``torch.save`` + fsync of the file and of its directory. Cases, each timed both ways:

- ``new``: every save to a new path (``xser.save(m, "m<i>.yaml")`` against ``torch.save(sd, "t<i>.pt")``);
- ``over``: the same path again and again, as a training loop does (``xser.save`` replaces the checkpoint; torch.save
  overwrites its file);
- ``saver``: ``xser.CheckpointSaver(keep=3)`` rotating checkpoints, against ``torch.save`` over one file.

for a tiny torch ConvNet (``xser.torch``: its subcollection is its state_dict) and a numpy component with the same
10 arrays. The weights change before every save (both sides), so nothing is skipped or hard-linked. The two sides
alternate save by save (which goes first alternates too), so they see the same machine; medians of ``--saves``.

``--gap MS`` idles that long before each save (not timed), as a training loop computes between saves: work a save
leaves to a background thread (a ``CheckpointSaver`` deletes what it pruned on one) then runs there, as it would.
The default, 0, times saves back to back.

    python benchmarks/bench_small.py [--saves 200] [--dir DIR] [--cases new,over,saver] [--kinds torch,numpy] [--gap 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import xser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_save_load import machine_header  # noqa: E402


@xser.serializable(tag="!BenchSmallConvNet")
class ConvNet(torch.nn.Module):
    """10 tensors (5 layers' weights and biases), 3.4 KiB of float32 in all."""

    channels: int = 8

    def __attrs_post_init__(self):
        c = self.channels
        self.conv1 = torch.nn.Conv2d(1, c, 3)
        self.conv2 = torch.nn.Conv2d(c, c, 3)
        self.conv3 = torch.nn.Conv2d(c, c, 3)
        self.conv4 = torch.nn.Conv2d(c, c, 3)
        self.fc = torch.nn.Linear(c, 10)


@xser.serializable(tag="!BenchSmallNumpy")
class NumpyNet:
    """The same 10 arrays as ``ConvNet``, as a numpy component."""

    channels: int = 8

    def __attrs_post_init__(self):
        c = self.channels
        p = xser.params(self)
        shapes = [(c, 1, 3, 3), (c,)] + [(c, c, 3, 3), (c,)] * 3 + [(10, c), (10,)]
        for i, shape in enumerate(shapes):
            p.add(f"p{i}", shape, init="zeros")


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Side:
    """One model, both ways: ``bump()`` changes every weight; ``torch_save`` / ``xser_save`` save it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.model = ConvNet() if kind == "torch" else NumpyNet()
        if kind == "torch":
            self.tensors = list(self.model.state_dict().values())
        else:
            self.tensors = [a for a, _ in xser.params(self.model).current().values()]
        self.count = 0

    def bump(self) -> None:
        self.count += 1
        if self.kind == "torch":
            with torch.no_grad():
                for t in self.tensors:
                    t.add_(1.0)
        else:
            for a in self.tensors:
                a += 1.0

    def state(self) -> dict:
        """What torch.save writes: the state_dict (torch), the arrays as tensors sharing memory (numpy)."""
        if self.kind == "torch":
            return self.model.state_dict()
        return {f"p{i}": torch.from_numpy(a) for i, a in enumerate(self.tensors)}


def one_case(side: Side, case: str, durable: bool, saves: int, root: str, gap: float = 0.0) -> tuple[list[float], list[float]]:
    d = tempfile.mkdtemp(prefix=f"{side.kind}-{case}-{'durable' if durable else 'cache'}-", dir=root)
    ref_t: list[float] = []
    x_t: list[float] = []
    saver = xser.CheckpointSaver(os.path.join(d, "s.yaml"), keep=3, durable=durable) if case == "saver" else None

    def ref(i: int) -> None:
        side.bump()
        time.sleep(gap)
        path = os.path.join(d, f"t{i}.pt" if case == "new" else "t.pt")
        t = time.perf_counter()
        torch.save(side.state(), path)
        if durable:
            fsync_path(path)
            fsync_path(d)
        ref_t.append(time.perf_counter() - t)

    def ours(i: int) -> None:
        side.bump()
        time.sleep(gap)
        t = time.perf_counter()
        if saver is not None:
            saver.save(side.model, step=i)
        else:
            xser.save(side.model, os.path.join(d, f"m{i}.yaml" if case == "new" else "m.yaml"), durable=durable)
        x_t.append(time.perf_counter() - t)

    try:
        for i in range(-5, saves):  # 5 warm-up saves each, not counted
            first, second = (ref, ours) if i % 2 == 0 else (ours, ref)
            first(i)
            second(i)
            if i < 0:
                ref_t.clear()
                x_t.clear()
    finally:
        if saver is not None:
            saver.close()
        shutil.rmtree(d, ignore_errors=True)
    return ref_t, x_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=200)
    ap.add_argument("--dir", default=None, help="where to save (default: a temporary directory)")
    ap.add_argument("--cases", default="new,over,saver")
    ap.add_argument("--kinds", default="torch,numpy")
    ap.add_argument("--durable", default="cache,durable", help="cache (durable=False), durable, or both")
    ap.add_argument("--gap", type=float, default=0.0, help="ms idle before each save, not timed (compute between saves)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="xser-bench-small-", dir=args.dir)
    print(machine_header())
    print(f"# torch {torch.__version__}; {args.saves} saves per case, medians; the weights change before every save; "
          f"{args.gap:g} ms idle before each save")
    print(f"{'model':6} {'case':6} {'mode':8} {'reference':>26} {'ref ms':>8} {'xser ms':>8} {'ratio':>6} {'target':>6}  met")
    try:
        for kind in args.kinds.split(","):
            side = Side(kind)
            for mode in args.durable.split(","):
                durable = mode == "durable"
                for case in args.cases.split(","):
                    ref_t, x_t = one_case(side, case, durable, args.saves, root, args.gap / 1e3)
                    r, x = statistics.median(ref_t) * 1e3, statistics.median(x_t) * 1e3
                    target = 1.0 if durable else 2.0
                    what = "torch.save+fsync file+dir" if durable else "torch.save"
                    print(f"{kind:6} {case:6} {mode:8} {what:>26} {r:8.2f} {x:8.2f} {x / r:6.2f} {target:6.1f}  "
                          f"{'yes' if x / r <= target else 'NO'}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
