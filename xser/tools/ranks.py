"""What the tools show and keep of a checkpoint saved by several ranks (``save(..., coordinator=)``).

Its manifest keeps each rank's own ``training`` dict and ``training_state`` (``"world_size": n, "ranks": [...]``).
``xser inspect`` lists them (``ranks_json``, ``rank_lines``); ``xser convert --keep-training-state`` carries them
over (``rank_states``). Its tables are one sorted run of ids per rank (``model.tables.runs``): the tools that
read tables by id merge the runs (``average_tables``).
"""

from __future__ import annotations

from typing import Any

from ..storage import training_state
from ..storage.opened import OpenedDir
from ..storage.payloads import from_entry

__all__ = ["rank_lines", "rank_states", "ranks_json"]


def _bytes(entries: dict) -> int:
    return sum({b.file: b.bytes for e in entries.values() for b in e.blocks}.values())


def ranks_json(data: OpenedDir) -> list[dict[str, Any]]:
    """Each rank's own state, ``{rank, training, training_state}``, the last None or ``{arrays, bytes}`` (an empty list
    for a checkpoint saved by one process)."""
    return [{"rank": r, "training": training, "training_state": None if tree is None else {"arrays": len(entries), "bytes": _bytes(entries)}}
            for r, (training, tree, entries) in enumerate(data.manifest.ranks)]


def rank_lines(data: OpenedDir) -> list[str]:
    """The text of ``ranks_json`` for ``xser inspect`` (no lines for a checkpoint saved by one process)."""
    ranks = ranks_json(data)
    if not ranks:
        return []
    out = ["", f"ranks: {len(ranks)} (each rank's own training dict and training state; a load at another world size "
               "refuses them unless rank_state=\"drop\")"]
    for r in ranks:
        st = r["training_state"]
        state = "-" if st is None else f"{st['arrays']} array{'s' if st['arrays'] != 1 else ''}, {st['bytes']:,} B"
        text = str(r["training"])
        text = text if len(text) <= 300 else text[:300] + f"... ({len(text)} characters in the manifest)"
        out.append(f"  {r['rank']}  training state: {state}  training: {text}")
    return out


def rank_states(data: OpenedDir, verify: bool = True) -> list[tuple[dict, Any]]:
    """Each rank's (``training`` dict, training state with its arrays as files to link, or None), for a copy of the
    checkpoint that keeps them."""
    out = []
    for training, tree, entries in data.manifest.ranks:
        state = None if tree is None else training_state.decode(tree, {k: from_entry(data, e, verify=verify) for k, e in entries.items()})
        out.append((dict(training), state))
    return out
