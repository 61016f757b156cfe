"""Checking built argument values against a component's annotations.

Deliberately small: the builtins YAML can produce, containers of them, unions,
``Literal`` and classes. Anything it does not understand passes unchecked (attrs
validators and the constructor still run).
"""

from __future__ import annotations

import types
import typing
from collections import abc
from typing import Any

__all__ = ["check"]

_OK = object()


def _name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def check(value: Any, tp: Any) -> tuple[Any, str | None]:
    """Return (possibly converted value, None) if ``value`` fits ``tp``, else (value, expected)."""
    out = _check(value, tp)
    return (value, _name(tp)) if out is _BAD else (out, None)


_BAD = object()


def _check(v: Any, tp: Any) -> Any:
    if tp is Any or tp is object or isinstance(tp, (str, typing.TypeVar)) or tp is None and v is None:
        return v
    if tp is None or tp is type(None):
        return v if v is None else _BAD
    if tp is bool:
        return v if isinstance(v, bool) else _BAD
    if tp is int:
        return v if isinstance(v, int) and not isinstance(v, bool) else _BAD
    if tp is float:
        if isinstance(v, bool):
            return _BAD
        if isinstance(v, int):
            return float(v)
        return v if isinstance(v, float) else _BAD
    if tp is str:
        return v if isinstance(v, str) else _BAD
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for a in args:
            out = _check(v, a)
            if out is not _BAD:
                return out
        return _BAD
    if origin is typing.Literal:
        return v if any(v == a and type(v) is type(a) for a in args) else _BAD
    if origin in (list, abc.Sequence, abc.MutableSequence) or tp in (list, abc.Sequence):
        if not isinstance(v, (list, tuple)) or isinstance(v, str):
            return _BAD
        if not args:
            return v
        items = [_check(x, args[0]) for x in v]
        return _BAD if any(x is _BAD for x in items) else type(v)(items)
    if origin is tuple or tp is tuple:
        if not isinstance(v, (list, tuple)):
            return _BAD
        if not args:
            return tuple(v)
        if len(args) == 2 and args[1] is Ellipsis:
            items = [_check(x, args[0]) for x in v]
        elif len(args) != len(v):
            return _BAD
        else:
            items = [_check(x, a) for x, a in zip(v, args)]
        return _BAD if any(x is _BAD for x in items) else tuple(items)
    if origin in (dict, abc.Mapping, abc.MutableMapping) or tp in (dict, abc.Mapping):
        if not isinstance(v, dict):
            return _BAD
        if len(args) != 2:
            return v
        out = {}
        for k, x in v.items():
            ck, cx = _check(k, args[0]), _check(x, args[1])
            if ck is _BAD or cx is _BAD:
                return _BAD
            out[ck] = cx
        return out
    if origin is not None:
        return v
    if isinstance(tp, type):
        if getattr(tp, "_is_protocol", False):
            return v
        return v if isinstance(v, tp) else _BAD
    return v
