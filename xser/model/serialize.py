"""Object graph -> spec tree (the inverse of ``build``), and the subcollections to save.

Components are written as tagged mappings of their constructor arguments in field
order. An object reached twice is written once; its other places become ``!Ref``
(by name when it has an ``xser_id``, else by path). Cycles are reported.
"""

from __future__ import annotations

import enum
import pathlib
from typing import Any

import numpy as np

from ..errors import DataError, Location, RegistryError, SpecError
from .adapters import unsaved_hint
from .params import Subcollection, subcollection_of
from .registry import info_for
from ..spec import Tagged, format_path, iter_tagged

__all__ = ["arg_changes", "arg_clause", "flat_keys", "saved_args", "subcols_by_path", "to_tree"]

SAVE_HOOK = "xser_saved_args"


class _Dumper:
    def __init__(self) -> None:
        self.seen: dict[int, tuple[Any, tuple]] = {}
        self.active: set[int] = set()
        self.subcols: dict[str, tuple[Subcollection, str]] = {}

    def walk(self, value: Any, path: tuple) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic) and not isinstance(value, (np.void, np.datetime64, np.timedelta64)):
            return value.item()
        if isinstance(value, pathlib.PurePath):
            return str(value)
        if isinstance(value, enum.Enum):
            return value.name  # read back by name
        info = info_for(value)
        if info is not None:
            return self._component(value, info, path)
        if isinstance(value, dict):
            return self._container(value, path, lambda: {self._key(k, path): self.walk(v, path + (k,)) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            return self._container(value, path, lambda: [self.walk(v, path + (i,)) for i, v in enumerate(value)])
        where = Location(path=format_path(path) or None)
        if isinstance(value, np.ndarray):
            raise SpecError(
                "a numpy array in a constructor argument is not saved; declare it with xser.params(self).add(...)",
                where,
            )
        hint = unsaved_hint(value)
        raise SpecError(f"cannot save a value of type {type(value).__module__}.{type(value).__qualname__}" + (f": {hint}" if hint else ""),
                        where)

    def _key(self, k: Any, path: tuple) -> Any:
        if isinstance(k, (str, int, float, bool)) or k is None:
            return k
        raise SpecError(f"mapping key {k!r} is not a YAML scalar", Location(path=format_path(path) or None))

    def _container(self, value: Any, path: tuple, make: Any) -> Any:
        if id(value) in self.active:
            raise SpecError("cycle: a container contains itself", Location(path=format_path(path)))
        self.active.add(id(value))
        try:
            return make()
        finally:
            self.active.discard(id(value))

    def _component(self, obj: Any, info: Any, path: tuple) -> Any:
        key = id(obj)
        where = Location(path=format_path(path) or None)
        if key in self.active:
            first = format_path(self.seen[key][1]) or "the root"
            raise SpecError(f"cycle: this {info.tag} is also its own ancestor at {first}", where)
        if key in self.seen:
            xid = obj.__dict__.get("_xser_id")
            if xid is not None:
                return Tagged("!Ref", {"name": xid})
            return Tagged("!Ref", {"path": format_path(self.seen[key][1])})
        self.seen[key] = (obj, path)
        self.active.add(key)
        try:
            args = {f.alias: getattr(obj, f.name) for f in info.fields}
            hook = getattr(obj, SAVE_HOOK, None)
            if hook is not None:
                args = hook(dict(args))
                if not isinstance(args, dict):
                    raise RegistryError(f"{info.tag}.{SAVE_HOOK} must return a dict, got {type(args).__name__}")
                allowed = {f.alias for f in info.fields}
                bad = sorted(set(args) - allowed, key=str)
                if bad:
                    raise RegistryError(f"{info.tag}.{SAVE_HOOK} returned unknown argument(s) {', '.join(map(repr, bad))}")
            out: dict[str, Any] = {}
            xid = obj.__dict__.get("_xser_id")
            if xid is not None:
                out["xser_id"] = xid
            drawn = obj.__dict__.get("_xser_random") or {}
            for k, v in args.items():
                out[k] = self.walk(v, path + (k,))
                if k in drawn:  # a !RandomParam: the value drawn, and the choices it was drawn from
                    out[k] = Tagged("!RandomParam", {"values": drawn[k], "drawn": out[k]})
            if info.version is not None:
                out["xser_version"] = info.version
            sub = subcollection_of(obj)
            if sub is None and info.adapter is not None:
                sub = info.adapter.before_save(obj)
            if sub is not None:
                other = self.subcols.get(sub.name)
                if other is not None and other[0] is not sub:
                    raise DataError(
                        f"subcollection name {sub.name} is used by two components: at {other[1]} and at {format_path(path) or 'the root'}",
                        where,
                    )
                self.subcols[sub.name] = (sub, format_path(path) or "the root")
                out["xser_subcol_name"] = sub.name
            return Tagged(info.tag, out)
        finally:
            self.active.discard(key)


def subcols_by_path(tree: Any, path: tuple = ()) -> dict[str, str]:
    """``{component path: subcollection name}`` of a spec tree (``!Ref`` places skipped), paths as ``to_tree`` gives them."""
    out: dict[str, str] = {}
    if isinstance(tree, Tagged):
        if tree.tag == "!Ref":
            return out
        name = tree.args.get("xser_subcol_name")
        if isinstance(name, str):
            out[format_path(path)] = name
        items = tree.args.items()
    elif isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return out
    for k, v in items:
        if k not in ("xser_subcol_name", "xser_id", "xser_version"):
            out.update(subcols_by_path(v, path + (k,)))
    return out


def flat_keys(experiment: Any, subcollections: dict) -> dict[str, tuple[str, str]]:
    """``{flat key: (subcollection, param)}`` in spec order; subcollections the spec does not place keep their name."""
    placed = subcols_by_path(experiment)
    out: dict[str, tuple[str, str]] = {}
    for where, sub in list(placed.items()) + [(s, s) for s in subcollections if s not in placed.values()]:
        for name in subcollections.get(sub, {}):
            key = f"{where}.{name}" if where else name
            if key in out:
                raise DataError(f"two parameters have the flat key {key!r}: {out[key][0]}/{out[key][1]} and {sub}/{name}")
            out[key] = (sub, name)
    return out


def to_tree(obj: Any) -> tuple[Any, dict[str, tuple[Subcollection, str]]]:
    """The spec tree of ``obj`` and its subcollections ``{name: (subcollection, path)}``."""
    d = _Dumper()
    return d.walk(obj, ()), d.subcols


def saved_args(tree: Any, subcol: str) -> dict[str, Any] | None:
    """The arguments a saved spec gives the component whose subcollection is ``subcol`` (None: no such component)."""
    for node in iter_tagged(tree):
        if node.tag != "!Ref" and node.args.get("xser_subcol_name") == subcol:
            return {k: v for k, v in node.args.items() if k not in ("xser_subcol_name", "xser_id", "xser_version")}
    return None


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, (str, int)) and _plain(x) for k, x in v.items())
    return False


def arg_changes(obj: Any, saved: dict[str, Any] | None) -> list[str]:
    """The constructor arguments of ``obj`` that differ from ``saved`` (a saved spec's arguments of the same component),
    as ``"dim=8 here, 4 saved"``; only plain values are compared (components and other objects are skipped)."""
    info = info_for(obj)
    if info is None or saved is None:
        return []
    out = []
    for f in info.fields:
        now = getattr(obj, f.name, None)
        was = saved.get(f.alias, now)
        if isinstance(now, tuple):
            now = list(now)
        if _plain(now) and _plain(was) and now != was:
            out.append(f"{f.alias}={now!r} here, {was!r} saved")
    return out


def arg_clause(obj: Any, saved: dict[str, Any] | None) -> str:
    """For a message about tensors that differ from a checkpoint: which constructor arguments differ from the saved
    ones (``"; constructor argument(s) that differ: dim=8 here, 4 saved"``), or that none does (then the class's
    code changed); "" if the saved arguments are unknown."""
    if saved is None or info_for(obj) is None:
        return ""
    changes = arg_changes(obj, saved)
    if changes:
        return "; constructor argument(s) that differ: " + ", ".join(changes)
    return "; its constructor arguments are the saved ones: the difference comes from its class's code, or from a change made after the constructor ran"
