"""What every save path shares: ``SaveOptions``, ``SaveReport``, and the checks of a model against its checkpoints
(``check_against``; ``same_meta``/``same_bytes``: a save that would add nothing)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from ..errors import CheckpointError, Location
from ..storage.listing import Checkpoint
from ..storage.disk.commit import new_id
from ..storage.manifest import ParamEntry
from ..storage.payloads import FromFile
from .snapshot import Snapshot, growing

_log = logging.getLogger("xser")

__all__ = ["SMALL_PLAN", "SaveOptions", "SaveReport", "before_writing", "check_against", "disk_structure",
           "plan_bytes", "same_bytes", "same_meta"]


def _mapping(value: Any) -> dict:
    return dict(value or {})


@attrs.frozen
class SaveOptions:
    """How a save writes: durability, block sizes and formats by pattern, writer threads."""

    durable: bool = True
    blocks: dict = attrs.field(factory=dict, converter=_mapping)
    formats: dict = attrs.field(factory=dict, converter=_mapping)
    threads: int = 2
    shards: int | None = None  # pack every npy array into at most this many safetensors containers, one writer each
    pack: int | bool = True  # pack npy arrays under this many bytes (True: plan.PACK_BELOW; False: one .npy each)


@attrs.frozen
class SaveReport:
    """What a checkpoint save did.

    The checkpoints a save removed (pruned by the policy, replaced by ``xser.save``, or all of them on
    ``restart=True``) are named as they were *before* the save: ``removed_checkpoints`` holds their
    listing records (``index``: their place in the list before the save, ``path``: the slot they had,
    in the form of ``path``, with their step, id and metrics), newest first. ``removed`` and
    ``removed_steps`` are those records' paths and steps. A slot name there may hold another checkpoint
    after the save (the kept ones shift to ``.data.1``, ...): the id says which checkpoint it was.
    """

    skipped: bool  # the arrays equalled the newest checkpoint's: nothing was written
    path: str | None  # the new checkpoint's directory (None when skipped)
    written: int = 0  # files written
    linked: int = 0  # files hard-linked from the previous checkpoint
    removed_checkpoints: tuple[Checkpoint, ...] = ()  # what the save removed, as listed before it, newest first
    spec_written: bool = False  # the top-level spec file was (re)written
    id: str | None = None  # the new checkpoint's id
    set_aside: tuple[str, ...] = ()  # slots without a valid manifest, moved to <model>.data.damaged-*

    @property
    def removed(self) -> tuple[str, ...]:
        """The slot names the removed checkpoints had before this save (``model.yaml.data.2``), newest first."""
        return tuple(c.path for c in self.removed_checkpoints)

    @property
    def removed_steps(self) -> tuple[int | None, ...]:
        """The steps of the removed checkpoints (None for one saved without a step), newest first."""
        return tuple(c.step for c in self.removed_checkpoints)


#: a plan whose arrays hold fewer bytes than this is written on the caller's thread unless each file is fsynced:
#: handing a few small files to the pool costs more than writing them (no fsync to overlap)
SMALL_PLAN = 1 << 20


def plan_bytes(plan: Any, stop: int) -> int:
    """The bytes of ``plan``'s arrays and files, counted up to ``stop`` (what a piece of unknown size counts)."""
    import numpy as np

    total = 0
    for piece in plan.pieces:
        payload = piece.payload
        if isinstance(payload, bytes):
            total += len(payload)
        elif isinstance(payload, np.ndarray):
            total += payload.nbytes
        elif isinstance(payload, FromFile):  # (hard-linked: no byte written, unless linking fails)
            total += payload.bytes
        else:  # a device tensor, a bundle, a stream: counted as large
            total = stop
        if total >= stop:
            break
    return total


def disk_structure(entries: Mapping[str, Mapping[str, ParamEntry]]) -> dict:
    return {s: {n: (e.dtype, growing(n, e.shape)) for n, e in ps.items()} for s, ps in entries.items()}


def _mismatch(new: dict, old: dict) -> str | None:
    if new == old:
        return None
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if gone or added:
        parts = []
        if added:
            parts.append(f"new subcollections {', '.join(added)}")
        if gone:
            parts.append(f"missing subcollections {', '.join(gone)}")
        return "; ".join(parts)
    for sub in sorted(new):
        if new[sub] != old[sub]:
            for name in sorted(set(new[sub]) | set(old[sub])):
                a, b = new[sub].get(name), old[sub].get(name)
                if a != b:
                    def show(t):
                        return "absent" if t is None else f"{tuple(t[1])!r} {t[0]}"
                    return f"{sub}: param {name!r} is {show(a)} in the model, {show(b)} in the checkpoint"
    return "differs"


def check_against(path: str, snap: Snapshot, against: list[tuple[Checkpoint, Any]], total: int, saver: str) -> None:
    """Refuse a model that no longer matches the checkpoints; the message offers the fix that keeps them first."""
    structure = snap.structure
    for ck, d in against:
        problem = _mismatch(structure, disk_structure(d.subcollections))
        if problem is not None:
            what = "the checkpoint" if total == 1 else f"all {total} checkpoints"
            raise CheckpointError(
                f"the model no longer matches checkpoint {ck.path}: {problem}. To continue the saved run, resume it: "
                f"r = xser.resume({path!r}) gives the model (r.model), its training state and step; save r.model. "
                f"To start a new model instead, {saver}(..., restart=True) replaces {what} "
                "(they are removed only after the new model's first checkpoint is saved)",
                Location(path),
            )


def same_meta(snap: Snapshot, previous: Any) -> bool:
    """The save brings nothing new to record: same step, metrics, training and custom data, no training state."""
    meta = previous.meta
    return (
        snap.state_arrays is None and previous.manifest.state is None and snap.meta["step"] == meta.get("step")
        and all(snap.meta[k] == (meta.get(k) or {}) for k in ("metrics", "training", "custom"))
    )


def same_bytes(snap: Snapshot, previous: Any) -> bool:
    from ..storage.formats import FORMATS

    import numpy as np

    for sub, params in snap.arrays.items():
        for name, (arr, _) in params.items():
            entry = previous.subcollections[sub][name]
            if not isinstance(arr, np.ndarray) or not entry.whole or entry.blocks[0].format != "npy":
                return False
            block = entry.blocks[0]
            size, digest = FORMATS["npy"].digest(arr)
            if block.checksum != ("xxh3_64", digest) or block.bytes != size:
                return False  # usually the first array already differs: cheap
    return True


def before_writing(
    path: str, snap: Snapshot, options: SaveOptions, existing: list[tuple[Checkpoint, Any]], *, replaced: Any,
    policy: Any, restart: bool, check_all: bool, skip_duplicates: bool,
) -> tuple[Any, str, bool]:
    """What every save decides before it writes, on any store: the model must match the checkpoints it keeps
    (``replaced(checkpoint)``: the one ``xser.save`` replaces, which need not), the previous checkpoint (link
    candidates; None on ``restart``), the model id, and whether the save brings nothing new (``skip_duplicates``).
    Returns (previous, model id, skip)."""
    if not restart:
        if policy is None:  # xser.save replaces the newest; every other checkpoint stays and must match
            check_against(path, snap, [(c, d) for c, d in existing if not replaced(c)], len(existing), "xser.CheckpointSaver")
        else:
            check_against(path, snap, existing if check_all else existing[:1], len(existing), "CheckpointSaver")
    previous = existing[0][1] if existing and not restart else None
    model = previous.manifest.model if previous is not None and previous.manifest.model else new_id()
    skip = bool(skip_duplicates and previous is not None and same_meta(snap, previous) and not options.blocks
                and not snap.formats and disk_structure(previous.subcollections) == snap.structure
                and same_bytes(snap, previous))
    if skip:
        _log.info("%s: arrays equal the newest checkpoint %s; save skipped", path, previous.path)
    return previous, model, skip
