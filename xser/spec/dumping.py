"""Plain trees (dicts, lists, scalars, ``Tagged`` nodes) -> YAML text, keys in insertion order."""

from __future__ import annotations

import io
import re
from typing import Any

from ruamel.yaml import YAML

from .yamlio import _STD, Tagged

__all__ = ["dump"]


_FLOW_WIDTH = 88


def _short(items: Any) -> bool:
    """Flow style (``{a: 1, b: 2}``) only for short collections of scalars."""
    total = 0
    for k, v in items:
        if isinstance(v, (dict, list, tuple, Tagged)):
            return False
        total += len(str(k)) + len(str(v)) + 4
        if total > _FLOW_WIDTH:
            return False
    return True


def _represent_tagged(representer: Any, data: Tagged) -> Any:
    return representer.represent_mapping(data.tag, data.args, flow_style=_short(data.args.items()))


#: Strings that may be written plain (ruamel still quotes the ones that would read back
#: as another type, like 'true' or '12'). Everything else is double-quoted, because
#: ruamel's plain and single-quoted styles mis-handle some strings in flow context
#: ('?x', ':0' as a key) and some line-break characters ('\x85', '\u2028').
_PLAIN_OK = re.compile(r"[^\W_][\w./+\-]*(?: [\w./+\-]+)*", re.UNICODE)
_SAFE_CHAR = re.compile(r"[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*")


def _represent_str(representer: Any, data: str) -> Any:
    if data and _PLAIN_OK.fullmatch(data) and _SAFE_CHAR.fullmatch(data):
        return representer.represent_scalar(_STD + "str", data)
    return representer.represent_scalar(_STD + "str", data, style='"')


#: Plain scalars YAML 1.1 (PyYAML, XNMT's loader) reads as something other than a string: booleans (y/n too),
#: nulls, ints (underscores, octal, binary, sexagesimal), floats, timestamps, merge and value keys.
_YAML11_IMPLICIT = re.compile(
    r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
    r"|~|null|Null|NULL|<<|="
    r"|[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
    r"|[-+]?(?:[0-9][0-9_]*)?\.[0-9.]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
    r"|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:(?:[Tt]|[ \t]+).*)?"
)


def _represent_str_yaml11(representer: Any, data: str) -> Any:
    if _YAML11_IMPLICIT.fullmatch(data):
        return representer.represent_scalar(_STD + "str", data, style='"')
    return _represent_str(representer, data)


def _represent_float_yaml11(representer: Any, data: float) -> Any:
    """A float PyYAML reads back as that float: a '.' in the mantissa, a signed exponent, .inf and .nan."""
    if data != data:
        text = ".nan"
    elif data in (float("inf"), float("-inf")):
        text = ".inf" if data > 0 else "-.inf"
    else:
        text = repr(float(data))
        mantissa, e, exp = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = mantissa + (e + (exp if exp[:1] in "+-" else "+" + exp) if e else "")
    return representer.represent_scalar(_STD + "float", text)


def _represent_dict(representer: Any, data: dict) -> Any:
    return representer.represent_mapping(_STD + "map", data, flow_style=bool(data) and _short(data.items()))


def _represent_list(representer: Any, data: list) -> Any:
    return representer.represent_sequence(_STD + "seq", data, flow_style=_short(enumerate(data)))


def _dumper(yaml11: bool = False) -> YAML:
    y = YAML(typ="safe", pure=True)
    y.width = 1 << 16  # never fold long lines

    y.representer.sort_base_mapping_type_on_output = False
    y.representer.add_representer(Tagged, _represent_tagged)
    y.representer.add_representer(dict, _represent_dict)
    y.representer.add_representer(str, _represent_str)
    y.representer.add_representer(list, _represent_list)
    if yaml11:
        y.representer.add_representer(str, _represent_str_yaml11)
        y.representer.add_representer(float, _represent_float_yaml11)
    return y


def dump(tree: Any, *, yaml11: bool = False) -> str:
    """Render a plain tree (with ``Tagged`` nodes) as YAML text, keys in insertion order.

    ``yaml11=True`` writes what a YAML 1.1 loader (PyYAML: XNMT) reads back the same: strings it would take for
    booleans, nulls or numbers are quoted, and floats always have a '.' and a signed exponent."""
    try:
        key: Any = (yaml11, _key(tree))
    except _Uncached:
        key = None
    text = _RENDERED.get(key) if key is not None else None
    if text is None:
        out = io.StringIO()
        _dumper(yaml11).dump(tree, out)
        text = out.getvalue()
        if key is not None:
            if len(_RENDERED) >= _RENDERED_MAX:
                _RENDERED.clear()
            _RENDERED[key] = text
    return text


#: texts already rendered, by ``_key`` of their tree: a model saved again and again renders its unchanged spec once
#: (building the key walks the tree, far cheaper than ruamel's emitter)
_RENDERED: dict[Any, str] = {}
_RENDERED_MAX = 32


class _Uncached(Exception):
    """A tree holding a value whose text ``_key`` cannot tell apart exactly (rendered every time)."""


def _key(v: Any, seen: dict | None = None) -> Any:
    """A hashable value equal for two trees exactly when they render the same: every type kept (``1``, ``1.0`` and
    ``True`` differ), floats by their repr (``-0.0``, ``nan``), keys in order, and which containers are one object
    seen again (the emitter writes those as an anchor and aliases)."""
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return (t, v)
    if t is float:
        return (t, repr(v))
    if seen is None:
        seen = {}
    if t is dict or t is list or t is Tagged:
        again = seen.get(id(v))
        if again is not None:
            return ("alias", again)
        seen[id(v)] = len(seen)
    if t is dict:
        return (t, tuple((_key(k, seen), _key(x, seen)) for k, x in v.items()))
    if t is list:
        return (t, tuple(_key(x, seen) for x in v))
    if t is Tagged:
        return (t, v.tag if type(v.tag) is str else _key(v.tag, seen), _key(v.args, seen))
    raise _Uncached
