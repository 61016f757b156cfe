"""The saving process of ``test_remote_race.py``: ``python remote_race_child.py URL OPTIONS_JSON SECONDS KEEP``.

Saves a Linear again and again with ``CheckpointSaver(keep=KEEP)`` to the model at ``URL`` (every
save after the first KEEP drops the oldest checkpoint), for SECONDS. Checkpoint ``s`` holds ``s``
in every array and its training state, and has step ``s``: its content says which one it is. Prints
each step as it is saved.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import components  # noqa: E402
import xser  # noqa: E402


def writer(url: str, options: dict, seconds: float, keep: int) -> None:
    m = components.Linear(8, 8)
    end = time.time() + seconds
    step = 0
    with xser.CheckpointSaver(url, keep=keep, storage_options=options) as saver:
        while time.time() < end:
            step += 1
            m.W[...] = step
            m.b[...] = step
            saver.save(m, step=step, training_state={"step": step, "m": np.full(4, step, np.float32)})
            print(step, flush=True)


if __name__ == "__main__":
    writer(sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
