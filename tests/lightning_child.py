"""One rank of tests/test_lightning.py's Trainer tests, run under torchrun with 2 processes (DDP over gloo on the CPU).

First, for each of ``sync`` (``XserCheckpointIO``) and ``async`` (``AsyncCheckpointIO(XserCheckpointIO())``): the README
example's first fit (4 steps, checkpoints every 2, ``save_last=True``), then a second fit from ``ckpt_path="last"``
to step 8. Each rank writes what it saw to ``<out>/<mode>-rank<r>.json``: the plugin's save calls on this rank, the
step the second fit started at, whether the weights and the optimizer state it started from equal those the first
fit ended with (bit for bit), and on rank 0 the files left and ``last.ckpt`` as loaded again.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/lightning_child.py OUT
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import sys

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

from lightning_ddp import Regressor, data, trainer  # noqa: E402

from xser.lightning import XserCheckpointIO  # noqa: E402

SAVES: list[str] = []  # the paths this rank's plugin was asked to save (main() counts them)


def difference(a, b, where: str = "") -> str | None:
    """Where nested dicts, lists, tuples, tensors and arrays first differ (tensors and arrays: dtype, shape, values bit for
    bit; NaN equals NaN); None if nowhere."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return None if same else f"{where}: {a!r} != {b!r}"
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        same = isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
        return None if same else f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} != {list(b)}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{where}[{k!r}]")) is not None), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := difference(x, y, f"{where}[{i}]")) is not None), None)
    if type(a) is float and type(b) is float and a != a and b != b:
        return None  # NaN
    return None if type(a) is type(b) and a == b else f"{where}: {a!r} != {b!r}"


def snapshot(trainer, module) -> dict:
    return {"step": trainer.global_step, "weights": {k: v.clone() for k, v in module.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizers[0].state_dict())}  # its tensors change in place later


class Seen(Callback):
    def __init__(self, when: str) -> None:
        self.when = when
        self.state = None

    def on_train_start(self, trainer, module) -> None:
        if self.when == "start":
            self.state = snapshot(trainer, module)

    def on_train_end(self, trainer, module) -> None:
        if self.when == "end":
            self.state = snapshot(trainer, module)


def run(out: str, mode: str) -> None:
    d = os.path.join(out, mode)
    ended, started = Seen("end"), Seen("start")
    first = trainer(d, 4, save_async=mode == "async", callbacks=[ended])
    first.fit(Regressor(), data())
    first.strategy.barrier()  # as the example does: rank 0's asynchronous saves are written before rank 1 looks for "last"
    first_saves = list(SAVES)
    second = trainer(d, 8, save_async=mode == "async", callbacks=[started])
    second.fit(Regressor(), data(), ckpt_path="last")
    report = {
        "saves": [first_saves, SAVES[len(first_saves):]],
        "ckpt_path": os.path.relpath(second.ckpt_path, d),
        "start_step": started.state["step"],
        "weights_differ": difference(started.state["weights"], ended.state["weights"]),
        "optimizer_differs": difference(started.state["optimizer"], ended.state["optimizer"]),
        "end_step": second.global_step,
    }
    if second.is_global_zero:
        last = XserCheckpointIO().load_checkpoint(os.path.join(d, "last.ckpt"))
        report["files"] = sorted(os.listdir(d))
        report["last"] = {"global_step": last["global_step"], "epoch": last["epoch"],
                          "weights_differ": difference(dict(last["state_dict"]), dict(second.lightning_module.state_dict())),
                          "hyper_parameters": last["hyper_parameters"]}
    SAVES.clear()
    with open(os.path.join(out, f"{mode}-rank{second.global_rank}.json"), "w") as f:
        json.dump(report, f)


def main() -> None:
    save = XserCheckpointIO.save_checkpoint

    def counted(self, checkpoint, path, storage_options=None):
        SAVES.append(os.path.basename(str(path)))
        return save(self, checkpoint, path, storage_options)

    XserCheckpointIO.save_checkpoint = counted
    out = sys.argv[1]
    for mode in ("sync", "async"):
        run(out, mode)
    XserCheckpointIO.save_checkpoint = save
    example = os.path.join(EXAMPLES, "lightning_ddp.py")
    sys.argv = [example, os.path.join(out, "example")]
    runpy.run_path(example, run_name="__main__")


if __name__ == "__main__":
    main()
