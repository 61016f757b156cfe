"""Where a component keeps a parameter's array: an attribute, or an item of a dict or list held in one.

``Subcollection.bind`` records these places when the constructor returns, so that a save can tell
an array updated in place from one rebound to a new value (``self.W = self.W - lr * g``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import DataError, Location, shape_str

__all__ = ["GONE", "get_place", "places_of", "put_place", "rebound", "show_place"]

GONE = object()


def places_of(owned: dict) -> Iterator[tuple]:
    """Every place one level into the owner's attributes: ("attr", a), ("item", a, key or index)."""
    for attr, value in list(owned.items()):
        if attr.startswith("_xser_"):
            continue
        yield ("attr", attr)
        if isinstance(value, dict):
            for key in list(value):
                yield ("item", attr, key)
        elif isinstance(value, (list, tuple)):
            for i in range(len(value)):
                yield ("item", attr, i)


def get_place(owner: Any, place: tuple, default: Any = None) -> Any:
    value = getattr(owner, "__dict__", {}).get(place[1], default)
    if place[0] == "attr" or value is default:
        return value
    try:
        return value[place[2]]
    except (KeyError, IndexError, TypeError):
        return default


def put_place(owner: Any, place: tuple, new: Any) -> None:
    d = getattr(owner, "__dict__", {})
    if place[0] == "attr":
        d[place[1]] = new
    elif isinstance(d.get(place[1]), (dict, list)):
        d[place[1]][place[2]] = new


def show_place(place: tuple) -> str:
    return f"attribute .{place[1]}" if place[0] == "attr" else f"attribute .{place[1]}[{place[2]!r}]"


def rebound(owner: Any, sub: str, name: str, arr: np.ndarray, places: list, want: tuple, dtype: np.dtype) -> np.ndarray:
    """The parameter's array now: ``arr``, or the new numpy array of shape ``want`` and ``dtype`` that the places where
    the owner kept it hold (``self.W = self.W - lr * g``). Anything else there is a ``DataError`` naming the place."""
    changed = {}
    for place in places:
        now = get_place(owner, place, GONE)
        if now is not arr and now is not GONE:
            changed.setdefault(id(now), (place, now))
    if not changed:
        return arr
    place, now = next(iter(changed.values()))
    where = show_place(place)
    how = f"update it in place (obj{where[len('attribute '):]}[...] = new) or with xser.params(obj)[{name!r}] = new"
    if len(changed) > 1:
        shown = " and ".join(show_place(p) for p, _ in changed.values())
        raise DataError(f"param {name!r}: {shown} hold different new values; {how}", Location(path=sub))
    if not isinstance(now, np.ndarray):
        kind = f"{type(now).__module__}.{type(now).__qualname__}".replace("builtins.", "")
        raise DataError(f"param {name!r}: {where} holds a {kind} now, not the parameter's numpy array; {how}", Location(path=sub))
    if now.shape != want or now.dtype != dtype:
        raise DataError(
            f"param {name!r}: {where} was rebound to {shape_str(now.shape)} {now.dtype}, declared {shape_str(want)} {dtype}"
            + (f"; keep the dtype: .astype(np.{dtype}) on the new value, or update in place ([...] =)" if now.shape == want else ""),
            Location(path=sub),
        )
    return now
