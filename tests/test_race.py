"""Readers in other processes see one whole checkpoint while a saver rotates and prunes.

A writer process saves again and again (every array equal to its step, ``keep=4``, so every
save prunes one checkpoint); reader processes meanwhile ``load``, ``read_params`` (with and
without ``rows=``), ``load_training_state``, list the checkpoints and average the last three. Every
result must come from one checkpoint: one value everywhere, and an average equal to the mean of
three distinct saved steps, and a listing newest first without repeats. A reader may give up cleanly (``CheckpointError``) but never mix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "race_child.py")
SECONDS = 4.0


def test_readers_see_whole_checkpoints(tmp_path):
    """No read mixes two checkpoints, whatever the rotation is doing."""
    path = str(tmp_path / "m.yaml")
    writer = subprocess.Popen([sys.executable, CHILD, "writer", path, str(SECONDS + 3)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(4):
            writer.stdout.readline()  # a few checkpoints exist before the readers start
        readers = [
            subprocess.Popen([sys.executable, CHILD, "reader", kind, path, str(SECONDS), str(tmp_path / f"avg-{kind}.yaml")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for kind in ("load", "read_params", "training_state", "avg", "listing")
        ]
        reports = []
        for r in readers:
            out, err = r.communicate(timeout=120)
            assert r.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        writer.kill()
        writer.communicate()
    for rep in reports:
        assert rep["n_mixed"] == 0, rep
        assert rep["whole"] >= 5, rep  # the readers really ran while the writer rotated
