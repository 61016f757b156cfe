"""References inside a spec tree: dotted paths, ``xser_id`` names, canonical paths."""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import Location, SpecError, did_you_mean
from .registry import lookup
from ..spec import Doc, Tagged, children, format_path, iter_tagged, rewrite_children

__all__ = ["NotFound", "Resolver", "dedupe_ids", "inline", "parse_path"]

_MISSING = object()


def parse_path(text: Any, loc: Location | None) -> tuple:
    if not isinstance(text, str):
        raise SpecError(f"a path must be a dotted string, got {text!r}", loc)
    if text == "":
        return ()
    parts = text.split(".")
    if any(p == "" for p in parts):
        raise SpecError(f"bad path {text!r}", loc)
    return tuple(parts)


class Resolver:
    """Path and name lookup inside one tree (an experiment, or a saved model's)."""

    def __init__(self, root: Any, doc: Doc) -> None:
        self.root = root
        self.doc = doc
        self.ids: dict[str, tuple] = {}
        self._collect_ids(root, ())

    def _collect_ids(self, node: Any, path: tuple) -> None:
        if isinstance(node, Tagged):
            if node.tag == "!LoadSerialized":
                return
            xid = node.args.get("xser_id")
            if xid is not None:
                loc = self.doc.where(node, "xser_id")
                if not isinstance(xid, str):
                    raise SpecError(f"xser_id must be a string, got {xid!r}", loc)
                if xid in self.ids:
                    raise SpecError(f"xser_id {xid!r} is used twice (also at {format_path(self.ids[xid])})", loc)
                self.ids[xid] = path
        for k, v in children(node):
            self._collect_ids(v, path + (k,))

    def target(self, ref: Tagged, loc: Location | None, depth: int = 0) -> tuple[str, Any]:
        """('path', canonical path) or ('value', default) for a ``!Ref`` node."""
        if depth > 100:
            raise SpecError("reference cycle: a chain of !Ref never reaches a value", loc)
        args = ref.args
        unknown = set(args) - {"path", "name", "default"}
        if unknown:
            raise SpecError(f"!Ref takes path or name, and default; unknown key {sorted(unknown, key=repr)[0]!r}", loc)
        if ("path" in args) == ("name" in args):
            raise SpecError("!Ref needs exactly one of 'path' and 'name'", loc)
        if "name" in args and not isinstance(args["name"], str):
            raise SpecError(f"!Ref name must be a string (an xser_id), got {args['name']!r}", loc)
        if "name" in args:
            path = self.ids.get(args["name"])
            if path is None:
                if "default" in args:
                    return "value", args["default"]
                near = did_you_mean(str(args["name"]), self.ids)
                raise SpecError(f"!Ref to unknown name {args['name']!r}: no component has this xser_id{near}", loc)
            return "path", self.canonical(path, loc, depth + 1)
        try:
            return "path", self.canonical(parse_path(args["path"], loc), loc, depth + 1)
        except NotFound as e:
            if "default" in args:
                return "value", args["default"]
            raise SpecError(f"!Ref path {args['path']!r} not found: {e.why}", loc) from None

    def canonical(self, path: tuple, loc: Location | None, depth: int = 0) -> tuple:
        """The path of the node ``path`` leads to, with every ``!Ref`` on the way followed."""
        node, canon = self.root, ()
        for seg in path:
            node, canon = self._deref(node, canon, loc, depth)
            node, key = _step(node, seg, canon)
            canon += (key,)
        return self._deref(node, canon, loc, depth)[1]

    def node_at(self, canon: tuple) -> Any:
        node = self.root
        for seg in canon:
            node, _ = _step(node, seg, ())
        return node

    def _deref(self, node: Any, canon: tuple, loc: Location | None, depth: int) -> tuple[Any, tuple]:
        while isinstance(node, Tagged) and node.tag == "!Ref":
            kind, value = self.target(node, loc, depth + 1)
            if kind == "value":
                return value, canon
            canon = value
            node = self.node_at(canon)
        return node, canon


class NotFound(Exception):
    def __init__(self, why: str) -> None:
        self.why = why


def _step(node: Any, seg: Any, canon: tuple) -> tuple[Any, Any]:
    here = format_path(canon) or "the experiment"
    if isinstance(node, Tagged):
        if seg in node.args:
            return node.args[seg], seg
        field = _field_default(node, seg)
        if field is not _MISSING:
            return field, seg
        raise NotFound(f"{here} ({node.tag}) has no argument {seg!r}")
    if isinstance(node, dict):
        if seg in node:
            return node[seg], seg
        if isinstance(seg, str) and seg.lstrip("-").isdigit() and int(seg) in node:
            return node[int(seg)], int(seg)
        keys = [str(k) for k in node]
        raise NotFound(f"{here} has no key {seg!r}{did_you_mean(str(seg), keys)}")
    if isinstance(node, list):
        try:
            i = int(seg)
        except ValueError:
            raise NotFound(f"{here} is a list; {seg!r} is not an index") from None
        if not 0 <= i < len(node):
            raise NotFound(f"{here} has {len(node)} items; no index {i}")
        return node[i], i
    raise NotFound(f"{here} is {type(node).__name__} {node!r}, not a mapping or list")


def _field_default(node: Tagged, seg: Any) -> Any:
    """A component argument absent from the spec but defaulted by the class."""
    try:
        info = lookup(node.tag)
    except SpecError:
        return _MISSING
    for f in info.fields:
        if f.alias == seg and f.default is not attrs.NOTHING:
            if isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
                return _MISSING
            return f.default
    return _MISSING


def inline(resolver: Resolver, canon: tuple, at: tuple, depth: int = 0, placed: dict | None = None) -> Any:
    """Copy the subtree at ``canon`` for use at path ``at`` of another tree.

    ``!Ref``s that stay inside the subtree are re-rooted to ``at`` (as path refs). A ref that
    leaves it is replaced by a copy of its target the first time that target is met, and by a
    path ref to that copy every later time, so objects shared in the source stay shared (a
    tied embedding stays one matrix). Refs with a default that do not resolve become the default.
    """
    if depth > 50:
        raise SpecError(f"references nest too deeply while copying {format_path(canon)!r}", None)
    placed = {canon: at} if placed is None else placed
    new = resolver.doc.copy(resolver.node_at(canon))

    def fix(n: Any, rel: tuple) -> Any:
        if isinstance(n, Tagged) and n.tag == "!Ref":
            kind, target = resolver.target(n, resolver.doc.where(n))
            if kind == "value":
                return target
            for source, place in sorted(placed.items(), key=lambda kv: -len(kv[0])):
                if target[: len(source)] == source:
                    return Tagged("!Ref", {"path": format_path(place + target[len(source):])})
            placed[target] = at + rel
            return inline(resolver, target, at + rel, depth + 1, placed)
        rewrite_children(n, lambda k, v: fix(v, rel + (k,)))
        return n

    return fix(new, ())


def dedupe_ids(node: Any, taken: set[str]) -> None:
    """Drop ``xser_id``s already ``taken`` (refs to them must have been made paths); record the rest."""
    for n in iter_tagged(node):
        xid = n.args.get("xser_id")
        if isinstance(xid, str):
            if xid in taken:
                del n.args["xser_id"]
            else:
                taken.add(xid)
