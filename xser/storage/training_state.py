"""Training state (optimizer moments, RNG state, data position) both ways: tree + arrays.

A caller's state is JSON data with arrays anywhere inside. ``encode`` replaces each array by
``{"$array": "<key>"}`` and returns the arrays by key (they are stored as ``training_state/<key>.npy``
and described in the manifest like parameters); ``decode`` puts arrays back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import DataError
from .dtypes import dtype_problem
from .payloads import FromFile

__all__ = ["ARRAY_KEY", "decode", "encode"]

ARRAY_KEY = "$array"


def encode(state: Any) -> tuple[Any, dict[str, Any]]:
    """(JSON tree with ``{"$array": key}`` markers, ``{key: array or FromFile}``)."""
    arrays: dict[str, Any] = {}

    def walk(value: Any, where: str) -> Any:
        if isinstance(value, (np.ndarray, FromFile)):
            why = dtype_problem(value.dtype) if isinstance(value, np.ndarray) else None
            if why is not None:
                raise DataError(f"training_state{where}: {why}")
            key = str(len(arrays))
            arrays[key] = value
            return {ARRAY_KEY: key}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str) or k.startswith("$"):
                    raise DataError(f"training_state{where}: keys must be strings not starting with '$', got {k!r}")
                out[k] = walk(v, f"{where}.{k}")
            return out
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise DataError(f"training_state{where}: cannot store a {type(value).__name__} (arrays and JSON data only)")

    return walk(state, ""), arrays


def decode(tree: Any, arrays: Mapping[str, Any]) -> Any:
    """The caller's state again, each ``{"$array": key}`` replaced by ``arrays[key]``."""

    def build(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) == {ARRAY_KEY}:
                key = v[ARRAY_KEY]
                if key not in arrays:
                    raise DataError(f"training_state names array {key!r}, which the manifest does not describe")
                return arrays[key]
            return {k: build(x) for k, x in v.items()}
        if isinstance(v, list):
            return [build(x) for x in v]
        return v

    return build(tree)
