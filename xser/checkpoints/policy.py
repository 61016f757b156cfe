"""Retention policies: pure functions from a list of checkpoints to the indices to keep.

``best_n`` (in ``storage.listing``) is the one implementation of "the best N by a metric"; retention
(``KeepBest``), ``xser avg --best`` and ``checkpoint="best"`` all use it, and both ignore checkpoints whose score is missing, not a
number, or NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from ..errors import CheckpointError
from ..storage.listing import Checkpoint, best_n, score

__all__ = ["AnyOf", "KeepBest", "KeepEvery", "KeepLast", "Policy", "as_policy", "best_n", "retain", "score"]


class Policy(Protocol):
    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        """Indices (into ``ckpts``, newest first) this policy wants kept."""
        ...


def _count(self: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (1 if attribute.name == "k" else 0):
        raise CheckpointError(f"{type(self).__name__}: {attribute.name} must be an int >= {1 if attribute.name == 'k' else 0}, got {value!r}")


def _metric(self: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise CheckpointError(f"{type(self).__name__}: metric must be a non-empty string, got {value!r}")


def _mode(self: Any, attribute: Any, value: Any) -> None:
    if value not in ("max", "min"):
        raise CheckpointError(f"{type(self).__name__}: mode must be 'max' or 'min', got {value!r}")


class _Combinable:
    def __or__(self, other: Policy) -> AnyOf:
        return AnyOf((self, other))


@attrs.frozen
class KeepLast(_Combinable):
    """Keep the newest ``n``."""

    n: int = attrs.field(validator=_count)

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        return set(range(min(self.n, len(ckpts))))


@attrs.frozen
class KeepBest(_Combinable):
    """Keep the ``n`` best by ``metric`` (``mode="max"`` or ``"min"``); ties go to the newer; NaN never counts."""

    n: int = attrs.field(validator=_count)
    metric: str = attrs.field(validator=_metric)
    mode: str = attrs.field(default="max", validator=_mode)

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        return set(best_n(ckpts, self.n, self.metric, self.mode))


@attrs.frozen
class KeepEvery(_Combinable):
    """Keep every checkpoint whose step is a multiple of ``k``."""

    k: int = attrs.field(validator=_count)

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        return {i for i, c in enumerate(ckpts) if isinstance(c.step, int) and c.step % self.k == 0}


@attrs.frozen
class AnyOf(_Combinable):
    """Keep what any of the policies keeps (``KeepLast(3) | KeepBest(2, "bleu")``)."""

    policies: tuple

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        out: set[int] = set()
        for p in self.policies:
            out |= p.keep(ckpts)
        return out


def metrics_of(policy: Any) -> list[tuple[str, str]]:
    """(metric, mode) of every ``KeepBest`` inside a policy."""
    if isinstance(policy, KeepBest):
        return [(policy.metric, policy.mode)]
    if isinstance(policy, AnyOf):
        return [m for p in policy.policies for m in metrics_of(p)]
    return []


def retain(ckpts: Sequence[Checkpoint], policy: Policy) -> list[int]:
    """The indices to keep, newest first: what the policy keeps, and always the newest."""
    if not ckpts:
        return []
    keep = {i for i in policy.keep(ckpts) if 0 <= i < len(ckpts)} | {0}
    return sorted(keep)


def as_policy(keep: Any) -> Policy:
    if keep is None:
        return KeepLast(1)
    if isinstance(keep, bool) or (isinstance(keep, int) and keep < 1):
        raise CheckpointError(f"keep must be an int >= 1 or a policy, got {keep!r}")
    if isinstance(keep, int):
        return KeepLast(keep)
    if not callable(getattr(keep, "keep", None)):
        raise CheckpointError(f"keep must be an int >= 1 or a policy, got {keep!r}")
    return keep
