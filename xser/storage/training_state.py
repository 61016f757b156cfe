"""Training state (optimizer moments, RNG state, data position) both ways: tree + arrays.

A caller's state is JSON data with arrays anywhere inside. ``encode`` replaces each array by
``{"$array": "<key>"}`` and returns the arrays by key (they are stored as ``training_state/<key>.npy``
and described in the manifest like parameters); ``decode`` puts arrays back. Arrays of another
kind (torch tensors) are converted by the ``KINDS`` a plugin registers and marked
``{"$array": key, "$kind": "torch"}``, so they come back as that kind. Mappings with int keys (an
optimizer's ``state``) are ``{"$int_keys": {...}}``; tuples come back as lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from ..errors import DataError
from .dtypes import dtype_problem
from .payloads import FromFile, Lazy

__all__ = ["ARRAY_KEY", "KINDS", "Kind", "Marked", "decode", "encode"]

ARRAY_KEY = "$array"
KIND_KEY = "$kind"
INT_KEYS = "$int_keys"


@attrs.frozen
class Kind:
    """Arrays of another library: how to recognise one, store it (numpy or a ``Lazy``) and make one back."""

    name: str
    holds: Callable[[Any], bool]
    to_numpy: Callable[[Any, str], Any]
    from_numpy: Callable[[np.ndarray], Any]


@attrs.frozen
class Marked:
    """An array of a kind kept as stored (a file to link), for tools that copy training state unchanged."""

    kind: str
    payload: Any


#: name -> Kind, registered by plugins (``xser.torch`` registers "torch")
KINDS: dict[str, Kind] = {}


def encode(state: Any) -> tuple[Any, dict[str, Any]]:
    """(JSON tree with ``{"$array": key}`` markers, ``{key: array or FromFile}``)."""
    arrays: dict[str, Any] = {}

    def walk(value: Any, where: str) -> Any:
        for kind in KINDS.values():
            if kind.holds(value):
                key = str(len(arrays))
                arrays[key] = kind.to_numpy(value, f"training_state{where}")
                return {ARRAY_KEY: key, KIND_KEY: kind.name}
        if isinstance(value, Marked):
            key = str(len(arrays))
            arrays[key] = value.payload
            return {ARRAY_KEY: key, KIND_KEY: value.kind}
        if isinstance(value, (np.ndarray, FromFile, Lazy)):
            why = dtype_problem(value.dtype) if isinstance(value, np.ndarray) else None
            if why is not None:
                raise DataError(f"training_state{where}: {why}")
            key = str(len(arrays))
            arrays[key] = value
            return {ARRAY_KEY: key}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, Mapping) and value and all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            return {INT_KEYS: {str(k): walk(v, f"{where}[{k}]") for k, v in value.items()}}
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


def decode(tree: Any, arrays: Mapping[str, Any], kind: Callable[[str], Kind | None] | None = None) -> Any:
    """The caller's state again, each ``{"$array": key}`` replaced by ``arrays[key]``, made of its kind by
    ``kind(name)`` (without ``kind``, an array of another kind stays ``Marked``, for ``encode`` to keep)."""

    def build(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) in ({ARRAY_KEY}, {ARRAY_KEY, KIND_KEY}):
                key = v[ARRAY_KEY]
                if not isinstance(key, str) or key not in arrays:
                    raise DataError(f"training_state names array {key!r}, which the manifest does not describe")
                if KIND_KEY in v and kind is None:
                    return Marked(str(v[KIND_KEY]), arrays[key])
                if KIND_KEY in v:
                    k = kind(v[KIND_KEY]) if isinstance(v[KIND_KEY], str) else None
                    if k is None:
                        raise DataError(f"training_state array {key!r} is of kind {v[KIND_KEY]!r}, which this xser cannot make")
                    return k.from_numpy(arrays[key])
                return arrays[key]
            if set(v) == {INT_KEYS} and isinstance(v[INT_KEYS], dict):
                try:
                    return {int(k): build(x) for k, x in v[INT_KEYS].items()}
                except ValueError:
                    raise DataError(f"training_state: {INT_KEYS} keys must be ints, got {sorted(v[INT_KEYS])!r}") from None
            return {k: build(x) for k, x in v.items()}
        if isinstance(v, list):
            return [build(x) for x in v]
        return v

    return build(tree)
