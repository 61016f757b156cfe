"""One rank of a gloo job that loads a checkpoint (``test_reshard.py``):
``python reshard_child.py RANK WORLD PORT PATH SLICE_SIZE``.

Loads the ``reshard_model.Shard`` saved at ``PATH`` (its newest checkpoint is step 2) with a
``xser.dist.TorchDistributed`` coordinator and the table's slice size ``SLICE_SIZE``, and prints one JSON line:
``{"rank", "problems": [...], "state": [rng] or "Error: message"}``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch.distributed as dist

import xser
import xser.dist
from reshard_model import SLICE, problems


def main() -> None:
    rank, world, port, path, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    c = xser.dist.TorchDistributed(timeout=30)
    SLICE["size"] = size
    out: dict = {"rank": rank}
    try:
        out["problems"] = problems(xser.load(path, coordinator=c), c, 2)
    except Exception as e:  # noqa: BLE001 - the test compares the message
        out["problems"] = [f"{type(e).__name__}: {e}"]
    try:
        out["state"] = xser.load_training_state(path, coordinator=c)["rng"].tolist()
    except xser.CheckpointError as e:
        out["state"] = f"CheckpointError: {e.message}"
    print(json.dumps(out), flush=True)
    os._exit(0)  # no teardown of the process group: nothing to wait for


if __name__ == "__main__":
    main()
