"""Named parameter initialisers: ``(shape, rng) -> array``, cast to the declared dtype by ``Subcollection.add``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["INITS"]


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _glorot_uniform(shape, rng):
    fan_in, fan_out = _fans(shape)
    limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
    return rng.uniform(-limit, limit, shape)


def _glorot_normal(shape, rng):
    fan_in, fan_out = _fans(shape)
    return rng.normal(0.0, math.sqrt(2.0 / max(1, fan_in + fan_out)), shape)


def _he_normal(shape, rng):
    return rng.normal(0.0, math.sqrt(2.0 / max(1, _fans(shape)[0])), shape)


def _he_uniform(shape, rng):
    limit = math.sqrt(6.0 / max(1, _fans(shape)[0]))
    return rng.uniform(-limit, limit, shape)


#: Named initialisers: ``(shape, rng) -> array`` (cast to the declared dtype afterwards).
INITS: dict[str, Callable[[tuple[int, ...], np.random.Generator], np.ndarray]] = {
    "zeros": lambda shape, rng: np.zeros(shape),
    "ones": lambda shape, rng: np.ones(shape),
    "normal": lambda shape, rng: rng.standard_normal(shape),
    "uniform": lambda shape, rng: rng.uniform(-1.0, 1.0, shape),
    "glorot_uniform": _glorot_uniform,
    "glorot_normal": _glorot_normal,
    "he_normal": _he_normal,
    "he_uniform": _he_uniform,
}
