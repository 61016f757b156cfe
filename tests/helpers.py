"""Small helpers shared by the tests."""

from __future__ import annotations

import errno

import xser
from xser.formats import npy


def fail_nth_write(monkeypatch, n: int, code: int = errno.ENOSPC) -> None:
    """Make the n-th array file write raise OSError(code), as a full disk would."""
    real = npy.NpyFormat.write
    calls = {"n": 0}

    def failing(self, path, array, known=None):
        calls["n"] += 1
        if calls["n"] == n:
            import os

            raise OSError(code, os.strerror(code), path)
        return real(self, path, array, known)

    monkeypatch.setattr(npy.NpyFormat, "write", failing)


def save_steps(path: str, component, steps, keep=5) -> None:
    """Checkpoint ``component`` once per step, with its W (and nothing else) set to the step."""
    with xser.CheckpointSaver(path, keep=keep) as saver:
        for step in steps:
            component.W[...] = step
            saver.save(component, step=step)
