"""YAML text -> plain trees (dicts, lists, scalars, ``Tagged`` nodes), with locations.

No object is built here. Parsing is safe by construction: the YAML is *composed*
into nodes and converted by hand, so no tag can run code. Standard scalar tags
become Python scalars, local tags (``!Linear``) become ``Tagged`` nodes, anything
else (``!!python/...``, ``!!set``, ...) is a ``SpecError`` with its location.
Aliases are expanded as copies (only ``!Ref`` shares), and expansion is bounded.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..errors import DataError, Location, SpecError
from ..storage.stores import store_for

__all__ = ["Doc", "Tagged", "children", "format_path", "iter_tagged", "parse", "read", "read_text", "rewrite_children"]

#: Upper bound on nodes produced from one document (guards against alias bombs).
MAX_NODES = 2_000_000
#: Upper bound on the size of a spec file, and on how deeply it may nest.
MAX_SPEC_BYTES = 256 << 20
MAX_DEPTH = 200
_STD = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_STD + t for t in ("str", "int", "float", "bool", "null", "timestamp", "binary")}
_MERGE = _STD + "merge"
#: the pure parser resolves a plain ``=`` to YAML 1.1's !!value, which YAML 1.2 does not have:
#: it is the string "=" (as libyaml resolves it)
_VALUE = _STD + "value"


class Tagged:
    """A tagged mapping in a spec, ``!Linear {in_dim: 4}``: ``tag`` and ``args``.

    ``origin`` is bookkeeping for the builder (where this node's parameters come
    from); it never takes part in equality and is never written.
    """

    __slots__ = ("tag", "args", "origin")

    def __init__(self, tag: str, args: dict | None = None, origin: Any = None) -> None:
        self.tag = tag
        self.args = {} if args is None else args
        self.origin = origin

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tagged):
            return NotImplemented
        return self.tag == other.tag and self.args == other.args

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Tagged({self.tag!r}, {self.args!r})"


def children(node: Any) -> Any:
    """(key, child) pairs of a tree node: a Tagged node's arguments, a dict's items, a list's items."""
    if isinstance(node, Tagged):
        return node.args.items()
    if isinstance(node, dict):
        return node.items()
    if isinstance(node, list):
        return enumerate(node)
    return ()


def rewrite_children(node: Any, fn: Any) -> None:
    """Replace each child ``v`` at key ``k`` of a tree node by ``fn(k, v)``, in place."""
    target = node.args if isinstance(node, Tagged) else node
    for k, v in list(children(node)):
        target[k] = fn(k, v)


def iter_tagged(node: Any) -> Any:
    """Every Tagged node in a tree (``!Ref`` nodes included), parents before children."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Tagged):
            yield n
        stack.extend(reversed([v for _, v in children(n)]))


def format_path(path: tuple) -> str:
    """('model', 'layers', 0, 'W') -> 'model.layers.0.W'."""
    return ".".join(str(p) for p in path)


class Doc:
    """A parsed document: ``tree`` plus a side table of locations per container."""

    def __init__(self, tree: Any, file: str | None) -> None:
        self.tree = tree
        self.file = file
        # id(container) -> (container, own Location, {key: value Location}, {key: key Location})
        self._locs: dict[int, tuple[Any, Location, dict, dict]] = {}

    def _note(self, container: Any, loc: Location) -> tuple[dict, dict]:
        entry = (container, loc, {}, {})
        self._locs[id(container)] = entry
        return entry[2], entry[3]

    def where(self, container: Any, key: Any = None, *, of_key: bool = False) -> Location | None:
        """Location of ``container`` or of its child ``key`` (value, or key if ``of_key``)."""
        entry = self._locs.get(id(container))
        if entry is None or entry[0] is not container:
            return None
        if key is None:
            return entry[1]
        table = entry[3] if of_key else entry[2]
        return table.get(key, entry[1])

    def note_value(self, container: Any, key: Any, loc: Location) -> None:
        """Record where the value at ``container[key]`` came from (a value set by an override, say)."""
        entry = self._locs.get(id(container))
        if entry is None or entry[0] is not container:
            entry = (container, loc, {}, {})
            self._locs[id(container)] = entry
        entry[2][key] = loc

    def locate_all(self, loc: Location) -> None:
        """Every location of this document becomes ``loc`` (a one-line value given on a command line)."""
        for key, (container, _, values, keys) in list(self._locs.items()):
            self._locs[key] = (container, loc, dict.fromkeys(values, loc), dict.fromkeys(keys, loc))

    def adopt(self, other: Doc) -> None:
        """Take over the location entries of another document (for inlined subtrees)."""
        self._locs.update(other._locs)

    def copy(self, node: Any) -> Any:
        """Deep-copy a subtree; copies keep the locations of their originals."""
        if isinstance(node, Tagged):
            new: Any = Tagged(node.tag, {}, node.origin)
            for k, v in node.args.items():
                new.args[k] = self.copy(v)
            self._relocate(node, new)
            return new
        if isinstance(node, dict):
            new = {k: self.copy(v) for k, v in node.items()}
        elif isinstance(node, list):
            new = [self.copy(v) for v in node]
        else:
            return node
        self._relocate(node, new)
        return new

    def _relocate(self, old: Any, new: Any) -> None:
        entry = self._locs.get(id(old))
        if entry is not None and entry[0] is old:
            self._locs[id(new)] = (new, entry[1], entry[2], entry[3])


def _loc(file: str | None, node: Any) -> Location:
    m = node.start_mark
    return Location(file, m.line + 1, m.column + 1)


def _yaml_error(e: YAMLError, file: str | None) -> SpecError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    msg = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
    loc = Location(file, mark.line + 1, mark.column + 1) if mark is not None else Location(file)
    return SpecError(msg, loc)


class _Converter:
    def __init__(self, doc: Doc, constructor: Any) -> None:
        self.doc = doc
        self.file = doc.file
        self.constructor = constructor
        self.count = 0
        self.active: set[int] = set()

    def convert(self, node: Any) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise SpecError(
                f"document expands to more than {MAX_NODES} nodes (aliases nested too deeply?)",
                _loc(self.file, node),
            )
        tag = node.tag
        if isinstance(node, ScalarNode):
            if tag == _STD + "str" or (tag == _VALUE and node.value == "="):
                return node.value
            if tag in _SCALAR_TAGS:
                return self._scalar(node)
            if tag.startswith("!") and tag != "!":
                if node.value.strip() in ("", "~", "null"):
                    return self._tagged(tag, None)
                raise SpecError(
                    f"component {tag} must be followed by a mapping of arguments, got scalar {node.value!r}",
                    _loc(self.file, node),
                )
            raise self._bad_tag(node)
        if id(node) in self.active:
            raise SpecError("recursive alias: a node contains itself", _loc(self.file, node))
        if len(self.active) >= MAX_DEPTH:
            raise SpecError(f"nested more than {MAX_DEPTH} levels deep", _loc(self.file, node))
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if tag != _STD + "seq":
                    if tag.startswith("!") and tag != "!":
                        raise SpecError(
                            f"component {tag} must be followed by a mapping of arguments, got a list",
                            _loc(self.file, node),
                        )
                    raise self._bad_tag(node)
                out: list = []
                locs, _ = self.doc._note(out, _loc(self.file, node))
                for i, child in enumerate(node.value):
                    out.append(self.convert(child))
                    locs[i] = _loc(self.file, child)
                return out
            if isinstance(node, MappingNode):
                if tag == _STD + "map":
                    return self._mapping(node)
                if tag.startswith("!") and tag != "!":
                    return self._tagged(tag, node)
                raise self._bad_tag(node)
        finally:
            self.active.discard(id(node))
        raise SpecError(f"unsupported YAML node {type(node).__name__}", _loc(self.file, node))

    def _scalar(self, node: ScalarNode) -> Any:
        """A scalar with a standard tag (``!!int 3``), through ruamel's constructor, whose own failures on odd text
        (``!!float ''``: IndexError, ``!!bool ''``: KeyError) are ``SpecError``s here."""
        kind = node.tag[len(_STD):]
        if kind == "null" and node.value not in ("", "~", "null", "Null", "NULL"):
            raise SpecError(f"bad null value {node.value!r}: !!null takes ~, null or nothing", _loc(self.file, node))
        try:
            return self.constructor.construct_object(node, deep=True)
        except (YAMLError, ValueError) as e:  # their message says what is wrong (its first line: no ruamel marks)
            why = (getattr(e, "problem", None) or str(e)).splitlines()[0] if str(e) else ""
        except Exception:  # noqa: BLE001 - the constructor's own slips (an index past an empty string...)
            why = ""
        raise SpecError(f"bad {kind} value {node.value!r}: " + (why or f"not a YAML {kind}"), _loc(self.file, node))

    def _bad_tag(self, node: Any) -> SpecError:
        tag = node.tag
        shown = "!!" + tag[len(_STD):] if tag.startswith(_STD) else tag
        why = "tags that construct Python objects are never loaded" if "python/" in tag else "unsupported tag"
        return SpecError(f"{why}: {shown}", _loc(self.file, node))

    def _tagged(self, tag: str, node: Any) -> Tagged:
        t = Tagged(tag)
        if node is None:
            return t
        t.args = self._mapping(node, owner=t)
        return t

    def _mapping(self, node: MappingNode, owner: Any = None) -> dict:
        out: dict = {}
        locs, key_locs = self.doc._note(owner if owner is not None else out, _loc(self.file, node))
        merged: dict = {}
        for knode, vnode in node.value:
            if knode.tag == _MERGE:
                for src in vnode.value if isinstance(vnode, SequenceNode) else [vnode]:
                    value = self.convert(src)
                    if not isinstance(value, dict):
                        raise SpecError("merge key '<<' needs a mapping or a list of mappings", _loc(self.file, src))
                    for k, v in value.items():
                        merged.setdefault(k, v)
                continue
            if not isinstance(knode, ScalarNode):
                raise SpecError("mapping keys must be scalars", _loc(self.file, knode))
            key = self.convert(knode)
            if isinstance(key, (list, dict, Tagged)) or not isinstance(key, (str, int, float, bool, type(None))):
                raise SpecError(f"unsupported mapping key {key!r}", _loc(self.file, knode))
            if key in out:
                first = key_locs[key]
                raise SpecError(f"duplicate key {key!r} (first defined at line {first.line})", _loc(self.file, knode))
            out[key] = self.convert(vnode)
            locs[key] = _loc(self.file, vnode)
            key_locs[key] = _loc(self.file, knode)
        for k, v in merged.items():
            if k not in out:
                out[k] = v
        return out


try:
    from ruamel.yaml import CParser as _CParser  # libyaml, from ruamel.yaml.clib: about 3x faster
except ImportError:  # pragma: no cover - a platform without the wheel: the pure parser does it all
    _CParser = None


def _yaml(fast: bool) -> YAML:
    y = YAML(typ="safe", pure=not fast)
    y.allow_duplicate_keys = True  # we detect duplicates ourselves, with both locations
    return y


#: A text whose nesting cannot exceed this (``_depth_bound``) is composed without looking at its events first.
#: ruamel's composer recurses once per level (libyaml's C one overflows the stack, SIGSEGV, near 25,000).
SAFE_BOUND = 1000
#: the longest run of indentation and block indicators (``- ``, ``? ``, ``: ``) at the start of a line
_LEADING = re.compile(r"^[ \t?:-]*", re.M)


def _depth_bound(text: str) -> int:
    """An upper bound on how deeply ``text`` nests collections, from its characters alone (no parser).

    A block collection nested in another starts at a greater column, or at the same one once (a sequence as a
    mapping's value), and a nested sequence entry is two columns further: block depth is at most the leading run of a
    line plus 2. Flow depth is at most the number of ``[`` and ``{``. Tags, anchors and aliases add no nesting that
    the composer recurses into."""
    lead = max((len(m) for m in _LEADING.findall(text)), default=0)
    return lead + 2 + text.count("[") + text.count("{")


def _check_depth(text: str, fname: str | None) -> None:
    """Refuse ``text`` nested more than ``MAX_DEPTH`` levels deep *before* it is composed (the composers recurse per
    level; libyaml's kills the process). Only a text whose ``_depth_bound`` is over ``SAFE_BOUND`` is looked at: its
    parse events (the parsers keep their own stacks: no recursion), stopped at the first level too deep."""
    if _depth_bound(text) <= SAFE_BOUND:
        return
    depth = 0
    try:
        for event in _yaml(_CParser is not None).parse(text):
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise SpecError(f"nested more than {MAX_DEPTH} levels deep", _loc(fname, event))
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
    except YAMLError:
        return  # a syntax error before any level too deep: composing stops there too, and words it


def _compose(text: str, fname: str | None) -> tuple[Any, YAML]:
    """The node graph of ``text``; ruamel's warnings (a reused anchor is legal YAML: the later one wins) stay quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_depth(text, fname)
        return _compose_quietly(text, fname)


def _compose_quietly(text: str, fname: str | None) -> tuple[Any, YAML]:
    """The node graph of ``text``: libyaml when installed, the pure parser for errors (its messages)."""
    if _CParser is not None:
        y = _yaml(True)
        try:
            return y.compose(text), y
        except (YAMLError, RecursionError):
            pass  # parse again below: the pure parser words syntax errors as the tests pin them
    y = _yaml(False)
    try:
        return y.compose(text), y
    except MarkedYAMLError as e:
        raise _yaml_error(e, fname) from None
    except YAMLError as e:
        raise SpecError(f"YAML error: {e}", Location(fname)) from None
    except RecursionError:
        raise SpecError(f"nested more than {MAX_DEPTH} levels deep", Location(fname)) from None


def _children(node: Any) -> list:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _refuse_bombs(root: Any, file: str | None) -> None:
    """Refuse a document whose aliases expand past ``MAX_NODES`` before converting any of it: the expanded size of
    every distinct node is counted once (aliases share their node), so a billion-laughs document is refused in
    milliseconds, at the innermost node that expands too far. A node inside itself counts once here; the converter
    refuses it with its own message."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            kids = _children(node)
            total = 1 + sum(size.get(id(k), 1) for k in kids)
            if total > MAX_NODES and all(size.get(id(k), 1) <= MAX_NODES for k in kids):
                raise SpecError(f"document expands to more than {MAX_NODES} nodes (aliases nested too deeply?)",
                                _loc(file, node))
            size[key] = min(total, MAX_NODES + 1)
            continue
        if key in size or key in open_:
            continue
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in reversed(_children(node)) if id(k) not in size and id(k) not in open_)


def parse(text: str, file: str | os.PathLike | None = None) -> Doc:
    """Parse one YAML document into a ``Doc`` (tree + locations). Empty text gives ``None``."""
    fname = None if file is None else os.fspath(file)
    node, y = _compose(text, fname)
    doc = Doc(None, fname)
    if node is not None:
        _refuse_bombs(node, fname)
        doc.tree = _Converter(doc, y.constructor).convert(node)
    return doc


def read(path: str | os.PathLike) -> Doc:
    """Read and parse a YAML file; I/O and encoding problems are ``SpecError``s."""
    fname = os.fspath(path)
    return parse(read_text(fname), fname)


def read_text(path: str | os.PathLike) -> str:
    """The text of a spec file (a local path or a URL): a regular file (a FIFO or device is refused, never waited on),
    at most ``MAX_SPEC_BYTES``, UTF-8; every problem is a ``SpecError`` naming the file."""
    fname = os.fspath(path)
    store = store_for(fname)
    if store.remote:  # one GET of at most the limit + 1 bytes; the checks below only to explain a failure
        try:
            return _decoded(store.read_bytes(fname, "the spec", limit=MAX_SPEC_BYTES), fname)
        except DataError:
            pass
    size = store.size(fname)
    if size is None and not store.exists(fname):
        raise SpecError("file not found", Location(fname))
    if size is not None and size > MAX_SPEC_BYTES:
        raise SpecError(f"file has {size} bytes, more than the {MAX_SPEC_BYTES} a spec may have", Location(fname))
    try:
        raw = store.read_bytes(fname, "the spec", limit=MAX_SPEC_BYTES)
    except DataError as e:
        if e.message == "the spec not found":  # removed since it was looked at
            raise SpecError("file not found", Location(fname)) from None
        raise SpecError(e.message.replace("cannot read the spec:", "cannot read file:"), e.location) from None
    return _decoded(raw, fname)


def _decoded(raw: bytes, fname: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"cannot read file: not UTF-8 ({e.reason} at byte {e.start})", Location(fname)) from None
