"""Crash consistency: a kill immediately before each filesystem-changing call of every model-writing operation.

For each operation, ``crash_child.py`` kills a forked child just before call 1, 2, 3, ... of
the operation (every rename, link, unlink, mkdir, rmdir, fsync, file opened for writing, atomic
exchange), then checks that ``xser.load`` gives exactly the old or exactly the new state, that
the checkpoint listing works, and that the next save succeeds and removes every leftover.
Killing at chosen calls, not at random moments, is what finds windows of microseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_child.py")
OPS = ["save", "save-first", "rotate", "rotate-packed", "restart", "partial", "avg", "convert", "ensemble", "import"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("op", OPS)
def test_kill_before_every_call(tmp_path, op):
    """Whatever call the kill lands before, the model is whole: the old state or the new one."""
    proc = subprocess.run([sys.executable, CHILD, op, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["problems"] == []
    assert report["kills"] == report["calls"] and report["calls"] >= 10, report
