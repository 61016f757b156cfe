"""Small helpers shared by the tests."""

from __future__ import annotations

import errno

import xser
from xser.storage.formats import npy


def fail_nth_write(monkeypatch, n: int, code: int = errno.ENOSPC) -> None:
    """Make the n-th array file write raise OSError(code), as a full disk would."""
    real = npy.NpyFormat.write
    calls = {"n": 0}

    def failing(self, path, array, known=None, **options):
        calls["n"] += 1
        if calls["n"] == n:
            import os

            raise OSError(code, os.strerror(code), path)
        return real(self, path, array, known, **options)

    monkeypatch.setattr(npy.NpyFormat, "write", failing)


def save_steps(path: str, component, steps, keep=5) -> None:
    """Checkpoint ``component`` once per step, with its W (and nothing else) set to the step."""
    with xser.CheckpointSaver(path, keep=keep) as saver:
        for step in steps:
            component.W[...] = step
            saver.save(component, step=step)


def edit_spec(path, fn, slot: str = ".data") -> str:
    """Edit a saved model's spec as a tamperer or a broken tool would, consistently.

    ``fn(text) -> text`` is applied to the checkpoint's own ``spec.yaml`` (its manifest entry's
    size and checksum are updated to match) and to the top-level file. Returns the path of the
    checkpoint's spec file (where load errors now point).
    """
    import json
    from pathlib import Path

    import xxhash

    spec = Path(str(path) + slot) / "spec.yaml"
    text = fn(spec.read_text())
    spec.write_text(text)
    mp = Path(str(path) + slot) / "manifest.json"
    m = json.loads(mp.read_text())
    raw = text.encode()
    m["spec"] = {"file": "spec.yaml", "bytes": len(raw), "xxh3_64": xxhash.xxh3_64_hexdigest(raw)}
    mp.write_text(json.dumps(m))
    Path(path).write_text(text)
    return str(spec)


def scored_model(path, scores, metric="dev"):
    """A Linear(2, 2) saved once per score (its W filled with the step, 1, 2, ...), each checkpoint recording
    ``{metric: score}`` (nothing for None) and training_state ``{"s": step}``; returns the model's path."""
    import xser
    from components import Linear

    lin = Linear(2, 2)
    with xser.CheckpointSaver(path, keep=len(scores)) as saver:
        for step, score in enumerate(scores, 1):
            lin.W[...] = step
            saver.save(lin, step=step, metrics={} if score is None else {metric: score}, training_state={"s": step})
    return path


def returns_soon(call, seconds: float = 30.0) -> dict:
    """Run ``call`` in a thread: it must finish (a FIFO opened for reading without a writer would block forever).
    Gives ``{"value": ...}`` or ``{"error": exception}``."""
    import threading

    result: dict = {}

    def run():
        try:
            result["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked"
    return result


def free_port() -> int:
    """A TCP port nobody listens on now (for a torch.distributed rendezvous): see ``free_ports``."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports nobody holds now, for servers the test starts later (a rendezvous, a job's store).

    Picked below the kernel's ephemeral range (``ip_local_port_range``), at random: a port the kernel handed out for
    ``bind(0)`` and that was closed again can be handed out anew to any ``connect()`` on the machine (gloo's pairs, a
    store client) before the test's server binds it, and then the server cannot listen and every rank waits for it
    (seen in CI: both ranks of a job "hung"). Below the range only a process that asks for the port by number can
    take it."""
    import os
    import random
    import socket
    import time

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = range(max(1024, low - 16384), low)
    rng = random.Random(os.getpid() * 1_000_003 + time.monotonic_ns())
    out: list[int] = []
    for _ in range(1000):
        if len(out) == n:
            return out
        port = rng.choice(candidates) if len(candidates) >= 256 else 0
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every interface: the servers listen on all of them
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in out:
            out.append(port)
    raise RuntimeError(f"no {n} free ports found below {low}")
