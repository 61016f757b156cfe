"""Checking built argument values against a component's annotations.

Deliberately small: the builtins YAML can produce, containers of them, unions, ``Literal``,
``pathlib.Path`` (from a string), ``enum.Enum`` (by member name or value) and classes. A mismatch
inside a container names the element (``opt.beta``, ``sizes.2``), so the error points at it. Anything
it does not understand passes unchecked (attrs validators and the constructor still run); a field
with an attrs ``converter=`` is left to its converter.

Why not cattrs: it structures well but reports the first failure as an exception chain without the
element's place in the YAML; xser's errors need that path (and the line), and this check is the
size of the adapter cattrs would need. Measured in ``docs/design.md``.
"""

from __future__ import annotations

import enum
import pathlib
import types
import typing
from collections import abc
from typing import Any

__all__ = ["check", "check_at", "describe"]


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return f"{tp.__name__} (one of {', '.join(m.name for m in tp)})"
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


class Mismatch(Exception):
    """A value that does not fit: where inside the argument (a tuple of keys), what was expected, what was found."""

    def __init__(self, where: tuple, expected: str, value: Any, tp: Any = None) -> None:
        super().__init__(expected)
        self.where, self.expected, self.value, self.tp = where, expected, value, tp


def check(value: Any, tp: Any) -> tuple[Any, str | None]:
    """Return (possibly converted value, None) if ``value`` fits ``tp``, else (value, expected)."""
    try:
        return _check(value, tp, ()), None
    except Mismatch as m:
        return value, m.expected


def check_at(value: Any, tp: Any) -> Any:
    """The converted value; raises ``Mismatch`` naming the element that does not fit."""
    return _check(value, tp, ())


def _bad(v: Any, tp: Any, where: tuple) -> Mismatch:
    return Mismatch(where, _name(tp), v, tp)


def _check(v: Any, tp: Any, where: tuple) -> Any:  # noqa: C901 - one branch per kind of annotation
    if tp is Any or tp is object or isinstance(tp, (str, typing.TypeVar)) or tp is None and v is None:
        return v
    if tp is None or tp is type(None):
        if v is None:
            return v
        raise _bad(v, tp, where)
    if tp is bool:
        if isinstance(v, bool):
            return v
        raise _bad(v, tp, where)
    if tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise _bad(v, tp, where)
    if tp is float:
        if isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, float):
            return v
        raise _bad(v, tp, where)
    if tp is str:
        if isinstance(v, str):
            return v
        raise _bad(v, tp, where)
    if isinstance(tp, type) and issubclass(tp, pathlib.PurePath):
        if isinstance(v, (str, pathlib.PurePath)):
            return tp(v)
        raise _bad(v, tp, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(v, tp):
            return v
        if isinstance(v, str) and v in tp.__members__:
            return tp.__members__[v]
        for member in tp:
            if member.value == v and type(member.value) is type(v):
                return member
        raise _bad(v, tp, where)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = None
        for a in args:
            try:
                return _check(v, a, where)
            except Mismatch as m:
                if m.where != where and isinstance(v, (list, tuple, dict)):
                    inner = inner or m  # the right kind of container with a wrong element: say which
        raise inner or _bad(v, tp, where)
    if origin is typing.Literal:
        if any(v == a and type(v) is type(a) for a in args):
            return v
        raise _bad(v, tp, where)
    if origin in (list, abc.Sequence, abc.MutableSequence) or tp in (list, abc.Sequence):
        if not isinstance(v, (list, tuple)) or isinstance(v, str):
            raise _bad(v, tp, where)
        if not args:
            return v
        return type(v)(_check(x, args[0], where + (i,)) for i, x in enumerate(v))
    if origin is tuple or tp is tuple:
        if not isinstance(v, (list, tuple)):
            raise _bad(v, tp, where)
        if not args:
            return tuple(v)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_check(x, args[0], where + (i,)) for i, x in enumerate(v))
        if len(args) != len(v):
            raise Mismatch(where, f"{_name(tp)} ({len(args)} items)", v)
        return tuple(_check(x, a, where + (i,)) for i, (x, a) in enumerate(zip(v, args)))
    if origin in (dict, abc.Mapping, abc.MutableMapping) or tp in (dict, abc.Mapping):
        if not isinstance(v, dict):
            raise _bad(v, tp, where)
        if len(args) != 2:
            return v
        return {_check(k, args[0], where + (k,)): _check(x, args[1], where + (k,)) for k, x in v.items()}
    if origin is not None:
        return v
    if isinstance(tp, type):
        if getattr(tp, "_is_protocol", False) or isinstance(v, tp):
            return v
        raise _bad(v, tp, where)
    return v


def describe(value: Any) -> str:
    """A found value for a message: its type, and the value itself when it is a scalar."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__
