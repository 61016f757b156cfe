"""A checkpoint's listing record, a listing (``Scan``), and ranking by metric: shared by the local listing
(``listing.py``) and the object-store one (``objects/commit.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..errors import CheckpointError, DataError, Location, did_you_mean
from .layout import data_dir_of
from .opened import OpenedDir

__all__ = ["Best", "Checkpoint", "Scan", "best_n", "common_training", "record_of", "score"]

@attrs.frozen
class Checkpoint:
    """One published checkpoint, as its manifest describes it."""

    index: int  # position in the list, 0 = newest
    path: str  # its data directory
    step: int | None
    created: str
    metrics: dict[str, float] = attrs.field(factory=dict)  # as saved: numbers (ints stay ints), NaN included
    training: dict[str, Any] = attrs.field(factory=dict)  # JSON data
    custom: dict[str, Any] = attrs.field(factory=dict)  # JSON data
    has_training_state: bool = False
    id: str | None = None  # unique per checkpoint (format_version >= 2)
    model: str | None = None  # shared by the checkpoints of one model
    world_size: int = 1  # the processes that saved it together (``save(..., coordinator=)``)


@attrs.define
class Scan:
    """What the slots of a model hold, taken as one snapshot. Close it (or use ``with``)."""

    spec_path: str
    listed: list[tuple[Checkpoint, OpenedDir]]  # the model's checkpoints, newest first
    foreign: list[OpenedDir] = attrs.field(factory=list)  # another model's (an interrupted replacement)
    damaged: list[tuple[str, str]] = attrs.field(factory=list)  # (slot path, why it is not a checkpoint)
    slots: dict[str, int] = attrs.field(factory=dict)  # slot path -> slot number

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return [c for c, _ in self.listed]

    def close(self) -> None:
        for _, d in self.listed:
            d.close()
        for d in self.foreign:
            d.close()

    def __enter__(self) -> Scan:
        return self

    def take(self, checkpoint: int | Best) -> OpenedDir:
        """Checkpoint ``checkpoint`` (an index, 0 = newest, or a ``Best``) of this listing, handed over to the caller
        (who closes it); its ``index`` is its place here. Errors name what the listing holds."""
        found = self.listed
        path = self.spec_path
        if isinstance(checkpoint, Best) and found:  # chosen in this listing, so the choice and the data agree
            top = best_n([c for c, _ in found], 1, checkpoint.metric, checkpoint.mode)
            if not top:
                seen = sorted({k for c, _ in found for k in c.metrics})
                raise CheckpointError(
                    f"no checkpoint records a number for metric {checkpoint.metric!r} (recorded: {', '.join(seen) or 'no metrics'})"
                    f"{did_you_mean(checkpoint.metric, seen)}", Location(path))
            checkpoint = top[0]
        if isinstance(checkpoint, int) and checkpoint < len(found):
            d = found.pop(checkpoint)[1]
            d.index = checkpoint
            return d
        if not found:
            if self.damaged:
                raise DataError(self.damaged[0][1], Location(self.damaged[0][0]))
            raise DataError("data directory not found (was the model saved with xser.save?)", Location(data_dir_of(path, 0)))
        raise CheckpointError(f"no checkpoint {checkpoint}: the model has {len(found)} (0 to {len(found) - 1})", Location(path))

    def __exit__(self, *exc: Any) -> None:
        self.close()


def record_of(index: int, d: OpenedDir) -> Checkpoint:
    """The listing record of an opened checkpoint at ``index`` (0 = newest)."""
    meta = d.meta
    ranks = d.manifest.ranks
    training = dict(meta.get("training") or {})
    if ranks:  # saved by several ranks: the entries of their training dicts that every rank saved alike
        training = common_training(ranks)[0] | training
    return Checkpoint(
        index, d.path, meta.get("step"), str(meta.get("created", "")), dict(meta.get("metrics") or {}),
        training, dict(meta.get("custom") or {}), d.manifest.state is not None or any(t is not None for _, t, _ in ranks),
        meta.get("id"), meta.get("model"), len(ranks) or 1,
    )


def common_training(ranks: tuple) -> tuple[dict, bool]:
    """Of a checkpoint saved by several ranks (``Manifest.ranks``): the ``training`` entries every rank saved alike,
    and whether that is all of them (no rank's differs)."""
    if not ranks:
        return {}, True
    common = {k: v for k, v in ranks[0][0].items() if all(k in t and t[k] == v for t, _, _ in ranks[1:])}
    return common, all(set(t) == set(common) for t, _, _ in ranks)


def score(ck: Checkpoint, metric: str) -> float | None:
    """The checkpoint's value of ``metric`` if it is a real number (not NaN), else None."""
    v = ck.metrics.get(metric)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        return float(v)
    return None


def best_n(ckpts: Sequence[Checkpoint], n: int, metric: str, mode: str = "max") -> list[int]:
    """Indices of the ``n`` best checkpoints by ``metric`` (ties go to the newer), newest first."""
    if mode not in ("max", "min"):
        raise CheckpointError(f"mode must be 'max' or 'min', got {mode!r}")
    scored = [(s, i) for i, c in enumerate(ckpts) if (s := score(c, metric)) is not None]
    sign = -1 if mode == "max" else 1
    scored.sort(key=lambda t: (sign * t[0], t[1]))
    return sorted(i for _, i in scored[:n])


@attrs.frozen
class Best:
    """Select the checkpoint with the best ``metric`` (``mode`` ``"max"`` or ``"min"``; ties go to the newer)."""

    metric: str
    mode: str = "max"

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise CheckpointError(f"metric must be a metric name, got {self.metric!r}")
        if self.mode not in ("max", "min"):
            raise CheckpointError(f"mode must be 'max' or 'min', got {self.mode!r}")
