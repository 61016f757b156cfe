"""A model's checkpoints over training: their metrics, and how far each one's weights are from the newest.

``trajectory(path)`` gives, per checkpoint (newest first), its step, time and metrics, and the
relative L2 distance of its floating-point parameters to the newest checkpoint's
(``||w_k - w_0|| / ||w_0||`` over every parameter both hold with the same shape). The weights are
streamed in pieces, as averaging reads them, so memory stays bounded whatever the model's size.
Checkpoints far from the newest are the ones averaging with it does not help. ``plot`` draws both,
each metric on its own axis (matplotlib, the ``plot`` extra); ``xser inspect --json`` and
``--plot OUT.png`` use them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..api import retrying
from ..storage.listing import scan
from ..storage.opened import OpenedDir
from ..storage.stores import is_url, store_for
from ..storage.stores import options as storage_context

__all__ = ["figure", "plot", "trajectory"]

CHUNK = 1 << 20  # elements per streamed piece


def _floating(d: OpenedDir) -> dict[tuple[str, str], Any]:
    return {(sub, name): e for sub, ps in d.subcollections.items() for name, e in ps.items()
            if np.dtype(e.dtype).kind in "fc" and "@" not in name}  # hash tables: rows differ between checkpoints


def _distance(newest: OpenedDir, other: OpenedDir, verify: bool) -> float | None:
    """||w_other - w_newest|| / ||w_newest|| over the float parameters both hold with the same shape (None: none)."""
    mine, theirs = _floating(newest), _floating(other)
    diff = norm = 0.0
    shared = 0
    for key, e0 in mine.items():
        ek = theirs.get(key)
        if ek is None or tuple(ek.shape) != tuple(e0.shape) or ek.dtype != e0.dtype:
            continue
        shared += 1
        for a, b in zip(newest.chunks(e0, CHUNK, verify=verify), other.chunks(ek, CHUNK, verify=verify)):
            a64, b64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
            diff += float(np.sum(np.abs(b64 - a64) ** 2))
            norm += float(np.sum(np.abs(a64) ** 2))
    if not shared:
        return None
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return math.sqrt(diff) / math.sqrt(norm)


def trajectory(path: str | os.PathLike, *, distances: bool = True, verify: bool = False,
               storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"model", "metrics": [names], "checkpoints": [{index, directory, step, created, metrics, training_state,
    world_size, distance_to_newest}]}``, newest first, all read from one listing of the model (a local path or a URL, with
    ``storage_options`` for its filesystem; remote weights are streamed in ranged reads)."""
    path = os.fspath(path)

    def once() -> dict[str, Any]:
        with scan(path) as s:
            rows = []
            newest = s.listed[0][1] if s.listed else None
            for ck, d in s.listed:
                dist = (0.0 if d is newest else _distance(newest, d, verify)) if distances else None
                rows.append({
                    "index": ck.index, "directory": os.path.basename(ck.path), "step": ck.step, "created": ck.created,
                    "metrics": ck.metrics, "training_state": ck.has_training_state, "world_size": ck.world_size,
                    "distance_to_newest": None if dist is None or math.isinf(dist) else dist,
                })
        return {"model": path, "metrics": sorted({m for r in rows for m in r["metrics"]}), "checkpoints": rows}

    with storage_context(storage_options):
        return retrying(path, once)


def figure(report: dict[str, Any]) -> Any:
    """The matplotlib figure of ``report``: one panel per metric, each with its own y axis (a loss and an accuracy
    have different scales), and below them each checkpoint's distance to the newest; all share the x axis (step)."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # no pyplot: the caller's backend and figure list are left alone
    except ImportError:
        from ..errors import DataError

        raise DataError("plotting needs matplotlib: pip install 'xser[plot]'") from None
    rows = [r for r in reversed(report["checkpoints"])]  # oldest first
    xs = [r["step"] if r["step"] is not None else -r["index"] for r in rows]
    names = list(report["metrics"])
    fig = Figure(figsize=(7, 2.2 * (len(names) + 1) + 0.6))
    axes = [a for (a,) in fig.subplots(len(names) + 1, 1, sharex=True, squeeze=False)]
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (ax, name) in enumerate(zip(axes, names)):
        pts = [(x, r["metrics"][name]) for x, r in zip(xs, rows)
               if isinstance(r["metrics"].get(name), (int, float)) and not isinstance(r["metrics"].get(name), bool)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[i % len(colors)], label=name)
        ax.set_ylabel(name)
    bottom = axes[-1]
    pts = [(x, r["distance_to_newest"]) for x, r in zip(xs, rows) if r["distance_to_newest"] is not None]
    bottom.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="tab:red", label="distance to the newest")
    bottom.set_ylabel("relative L2 distance\nto the newest checkpoint")
    bottom.set_xlabel("step" if any(r["step"] is not None for r in rows) else "checkpoint (newest = 0)")
    axes[0].set_title(os.path.basename(report["model"]))
    fig.tight_layout()
    return fig


def plot(report: dict[str, Any], out: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None) -> str:
    """``figure(report)`` written to ``out`` (PNG, SVG, PDF: by its extension), a local path or a URL."""
    out = os.fspath(out)
    if not is_url(out):
        figure(report).savefig(out)
        return out
    import io

    fig = figure(report)
    buf = io.BytesIO()
    ext = os.path.splitext(out)[1].lstrip(".").lower()
    fig.savefig(buf, format=ext or None)
    with storage_context(storage_options):
        store_for(out).put(out, buf.getvalue())
    return out
