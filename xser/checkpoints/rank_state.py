"""Per-rank state of a checkpoint saved by the ranks of a job, given back to the same ranks.

Each rank of a distributed save (``distributed.py``) passes its own ``training`` dict and ``training_state`` (RNG
states, data-loader position): the manifest keeps them per rank (``"world_size": n, "ranks": [...]``). A load gives
rank r its own. At another world size no rank's state is another's, so ``load_training_state`` and ``resume``
refuse, naming both world sizes, unless the caller says what to do instead (``rank_state``):

- ``"error"`` (the default): refuse;
- ``"drop"``: go on without it (the caller starts the per-rank state afresh);
- ``"replicate"``: a state saved by one process goes to every rank (the same state on every rank: meant for
  state that is replicated, never for RNG states).

``training`` entries that every rank saved alike (an epoch, a config) are not per-rank: they are the
checkpoint's, at any world size (``storage.scanned.common_training``).
"""

from __future__ import annotations

from typing import Any

from ..dist import Coordinator, current
from ..errors import CheckpointError, Location
from ..storage.scanned import common_training

__all__ = ["RANK_STATE", "check_rank_state", "rank_part", "rank_training", "without"]

RANK_STATE = ("error", "drop", "replicate")


def check_rank_state(rank_state: Any, path: str) -> None:
    if rank_state not in RANK_STATE:
        raise CheckpointError(f"rank_state must be one of {', '.join(map(repr, RANK_STATE))}, got {rank_state!r}", Location(path))


def _world(coordinator: Coordinator | None) -> Coordinator:
    return coordinator if coordinator is not None else current()


def _saved(data: Any) -> int:
    return len(data.manifest.ranks) or 1


def _has_state(data: Any) -> bool:
    return data.manifest.state is not None or any(tree is not None for _, tree, _ in data.manifest.ranks)


def without(data: Any, coordinator: Coordinator | None) -> str | None:
    """Why ``rank_part`` gave no training state: the error to raise, or None when it was dropped at another world
    size (``rank_state="drop"``)."""
    if _has_state(data) and _saved(data) != _world(coordinator).world_size:
        return None
    if data.manifest.ranks and _has_state(data):
        return f"rank {_world(coordinator).rank} saved no training_state (other ranks did)"
    return "this checkpoint was saved without training_state"


def rank_training(data: Any, coordinator: Coordinator | None) -> dict:
    """This rank's ``training`` dict; at another world size, the entries every rank saved alike (with the checkpoint's
    own, such as those ``xser convert`` adds)."""
    ranks, c = data.manifest.ranks, _world(coordinator)
    own = dict(ranks[c.rank][0]) if len(ranks) == c.world_size else common_training(ranks)[0]
    return own | dict(data.meta.get("training") or {})


def rank_part(data: Any, coordinator: Coordinator | None, rank_state: str, what: str) -> tuple[Any, dict] | None:
    """This rank's (training-state tree, {key: entry}) of the checkpoint, None if it has none (or it was dropped at
    another world size with ``rank_state="drop"``); a ``CheckpointError`` at another world size by default. ``what``:
    "training_state" (only the state counts) or "resume" (``training`` dicts that differ between ranks count too)."""
    c = _world(coordinator)
    ranks = data.manifest.ranks
    saved = _saved(data)
    if saved == c.world_size:
        if ranks:
            _, tree, entries = ranks[c.rank]
            return None if tree is None else (tree, entries)
        return None if data.manifest.state is None else (data.manifest.state, data.manifest.state_entries)
    if not _has_state(data) and (what == "training_state" or common_training(ranks)[1]):
        return None  # nothing per rank to lose
    if rank_state == "drop":
        return None
    if rank_state == "replicate" and not ranks:
        return (data.manifest.state, data.manifest.state_entries)
    if ranks:
        kind = ("per-rank training state (RNG states, data positions)" if _has_state(data)
                else "per-rank training metadata (training=, which differs between the ranks)")
        why = f"its {kind} belongs to the ranks that saved it; load it at world size {saved}, or pass rank_state=\"drop\" to start it afresh"
        by = f"{saved} processes"
        if rank_state == "replicate":
            why += " (rank_state=\"replicate\" is for a checkpoint saved by one process)"
    else:
        why = ("its training state would be the same on every rank (RNG states must differ); load it in one process, or pass "
               "rank_state=\"drop\" to start it afresh or rank_state=\"replicate\" to give every rank the saved one")
        by = "one process"
    raise CheckpointError(f"this checkpoint was saved by {by} (world size {saved}) and is loaded at world size {c.world_size}: "
                          f"{why} (the model itself loads at any world size)", Location(data.path))
