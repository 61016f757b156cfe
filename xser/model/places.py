"""Where a component keeps a parameter's array: an attribute, or an item of a dict or list held in one.

``Subcollection.bind`` records these places when the constructor returns, so that a save can tell
an array updated in place from one rebound to a new value (``self.W = self.W - lr * g``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["GONE", "get_place", "places_of", "put_place", "show_place"]

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
