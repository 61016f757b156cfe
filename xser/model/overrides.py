"""Command-line overrides of a config, as Hydra users write them: ``small.model.hidden.out_dim=64``.

The first part names the experiment, the rest walks mappings (by key), component arguments (any
constructor argument of the class, set in the file or not; the arguments of ``!Repeat`` and
``!RandomParam``) and lists (by index). The value is YAML (``64``, ``[1, 2]``, ``!Linear {in_dim: 4}``,
``null``; a value that starts with a placeholder is quoted, ``"{EXP_DIR}/x"``); it is type-checked when
the experiment is built, as a value from the file would be, and errors point at the override. ``+key=value`` adds a
key to a plain mapping; ``~key`` removes one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import Location, SpecError, did_you_mean
from ..spec import Doc, Tagged, parse
from .registry import BUILTIN_ARGS, lookup

__all__ = ["apply_overrides", "split_overrides"]


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(overrides, other arguments) of a script's command line: ``key=value``, ``+key=value`` and ``~key`` are overrides."""
    overrides, rest = [], []
    for a in argv:
        is_override = not a.startswith("-") and ("=" in a.split("/", 1)[0] or a.startswith("~"))
        (overrides if is_override else rest).append(a)
    return overrides, rest


def apply_overrides(experiments: dict[str, Any], doc: Doc, overrides: list[str]) -> None:
    """Apply ``overrides`` in order to ``experiments`` (``{name: tree}``, changed in place); ``doc`` learns their locations."""
    for i, text in enumerate(overrides):
        label = f"override {i + 1} {text!r}"
        where = Location(label)
        if not isinstance(text, str):
            raise SpecError(f"an override is a string 'path=value', got {text!r}", where)
        add, remove = text.startswith("+"), text.startswith("~")
        body = text[1:] if add or remove else text
        key_text, eq, value_text = body.partition("=")
        if remove and eq:
            raise SpecError("~path removes a key and takes no value", where)
        if not remove and not eq:
            raise SpecError("an override is path=value (or +path=value to add a key, ~path to remove one)", where)
        parts = [p for p in key_text.strip().split(".")]
        if not parts or any(p == "" for p in parts):
            raise SpecError(f"bad path {key_text!r}: dotted keys, the experiment name first", where)
        name = parts[0]
        if name not in experiments:
            raise SpecError(f"unknown experiment {name!r} (experiments: {', '.join(experiments)}){did_you_mean(name, experiments)}", where)
        if len(parts) == 1:
            raise SpecError(f"{name}: give a key inside the experiment (for example {name}.model.dim=4)", where)
        value = None
        if not remove:
            vdoc = _parse_value(text[: len(text) - len(value_text)], value_text, where)
            doc.adopt(vdoc)
            value = vdoc.tree
        parent: Any = experiments
        key: Any = name
        for depth, part in enumerate(parts[1:], 1):
            parent, key = _step(parent, key, part, parts[:depth], add and depth == len(parts) - 1, where)
        _set(parent, key, value, remove, add, ".".join(parts), where)
        if not remove:
            doc.note_value(parent, key, where)


#: a value that starts with a placeholder, ``{EXP_DIR}/out``: YAML reads ``{`` as the start of a mapping
_PLACEHOLDER_FIRST = re.compile(r"\s*\{\{?\w+\}")


def _parse_value(head: str, value: str, where: Location) -> Doc:
    """The YAML value of an override (``head`` is the text up to ``=``); errors say where in the value, and how to quote
    a value that starts with a placeholder."""
    quote = (f"; a value that starts with a placeholder is a string only in quotes: {head}{json.dumps(value)} (on a shell, "
             f"in single quotes around it all: '{head}{json.dumps(value)}')")
    try:
        vdoc = parse(value, where.file)
    except SpecError as e:
        loc = e.location
        at = ""
        if loc is not None and loc.line is not None:
            at = f" (line {loc.line}, character {loc.column})" if "\n" in value.strip() else f" (character {loc.column})"
        hint = quote if _PLACEHOLDER_FIRST.match(value) else ""
        raise SpecError(f"value {value!r}{at}: {e.message}{hint}", where) from None
    if _PLACEHOLDER_FIRST.match(value) and isinstance(vdoc.tree, dict):
        raise SpecError(f"value {value!r} is YAML for a mapping {vdoc.tree!r}{quote}", where)
    vdoc.locate_all(where)  # errors inside the value name the override and the key path, not line 1 of it
    return vdoc


def _child(container: Any, key: Any) -> Any:
    return container.args[key] if isinstance(container, Tagged) else container[key]


def _step(parent: Any, key: Any, part: str, done: list[str], adding_last: bool, where: Location) -> tuple[Any, Any]:
    """From ``parent[key]`` one level down to ``part``: (the container, the key in it)."""
    node = _child(parent, key)
    at = ".".join(done)
    if isinstance(node, Tagged):
        builtin = BUILTIN_ARGS.get(node.tag)  # !Repeat {times, content}, !RandomParam {values}, ...
        fields = list(builtin) if builtin is not None else [f.alias for f in lookup(node.tag, where).fields]
        if part not in fields and part not in node.args:
            raise SpecError(f"{at}: {node.tag} has no argument {part!r}{did_you_mean(part, fields)}", where)
        return node, part
    if isinstance(node, dict):
        if part not in node and not adding_last:
            known = [str(k) for k in node]
            raise SpecError(f"{at}: no key {part!r} (keys: {', '.join(known) or 'none'}){did_you_mean(part, known)}; "
                            f"+{at}.{part}=VALUE adds one", where)
        return node, part
    if isinstance(node, list):
        try:
            index = int(part)
        except ValueError:
            raise SpecError(f"{at} is a list: index it with a number, got {part!r}", where) from None
        if not -len(node) <= index < len(node):
            raise SpecError(f"{at} has {len(node)} items, no index {index}", where)
        return node, index % len(node)
    raise SpecError(f"{at} is {type(node).__name__} {node!r}, not a mapping, component or list: nothing to set inside", where)


def _set(container: Any, key: Any, value: Any, remove: bool, add: bool, path: str, where: Location) -> None:
    target = container.args if isinstance(container, Tagged) else container
    if remove and isinstance(target, list):
        del target[key]
        return
    if remove:
        if key not in target:
            raise SpecError(f"{path}: nothing to remove", where)
        del target[key]
        return
    if add and isinstance(container, dict) and key in target:
        raise SpecError(f"{path} exists: set it without '+'", where)
    target[key] = value
