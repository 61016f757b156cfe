"""JSON from files xser did not write (safetensors headers, HF and RecIS indexes), with the limits of the
``safetensors`` library: nesting at most ``MAX_DEPTH`` deep and, stricter than it, no key twice in an object.

The ``safetensors`` crate parses headers with ``serde_json``, whose recursion limit lets a document nest 127
arrays or objects deep (the 128th is refused). It accepts a key given twice (the last wins); xser refuses
that, because two readers could then see two different files. The depth is counted before parsing, so
a hostile document never reaches Python's recursion limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..errors import DataError, Location

__all__ = ["MAX_DEPTH", "NotJSON", "loads_limited", "nesting_depth"]

MAX_DEPTH = 127
_ESCAPE = re.compile(rb"\\.", re.S)
_CHUNK = 1 << 23


def nesting_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text (brackets inside strings not counted), in bounded memory."""
    text = _ESCAPE.sub(b"", raw) if b"\\" in raw else raw
    depth, inside, deepest = 0, 0, 0
    for s in range(0, len(text), _CHUNK):
        a = np.frombuffer(text, np.uint8, count=min(_CHUNK, len(text) - s), offset=s)
        quotes = np.cumsum(a == 0x22, dtype=np.int64) + inside
        outside = quotes % 2 == 0
        step = (((a == 0x5B) | (a == 0x7B)) & outside).astype(np.int8) - (((a == 0x5D) | (a == 0x7D)) & outside).astype(np.int8)
        level = np.cumsum(step, dtype=np.int64) + depth
        if level.size:
            deepest = max(deepest, int(level.max()))
            depth, inside = int(level[-1]), int(quotes[-1]) % 2
    return deepest


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(k)
            seen.add(k)
    return out


class NotJSON(DataError):
    """The text does not parse as JSON at all (as opposed to JSON beyond the limits)."""


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def loads_limited(raw: bytes, where: str, what: str) -> Any:
    """``json.loads`` of ``raw`` with the limits above; every failure a ``DataError`` naming ``what`` and the file."""
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise DataError(f"{what} nests {depth} levels deep; at most {MAX_DEPTH} are read (the safetensors library's limit)",
                        Location(where))
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except _Duplicate as e:
        raise DataError(f"{what} has the key {e.key!r} twice in one object", Location(where)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise NotJSON(f"{what} is not JSON: {e}", Location(where)) from None
