"""Placeholders in configs: ``{EXP}``, ``{EXP_DIR}``, ``{PID}`` and the caller's own; ``{{X}}`` is literal."""

from __future__ import annotations

import re
from typing import Any

from ..errors import Location, SpecError, did_you_mean
from ..spec import Doc, rewrite_children

__all__ = ["substitute"]

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}|\{(\w+)\}")
_UPPER = re.compile(r"[A-Z][A-Z0-9_]*")


def substitute(node: Any, values: dict[str, Any], doc: Doc, loc: Location | None = None) -> Any:
    """Fill ``{NAME}`` placeholders in every string; ``{{NAME}}`` is a literal ``{NAME}``."""
    if isinstance(node, str):
        if "{" not in node:
            return node
        whole = _PLACEHOLDER.fullmatch(node)
        if whole and whole.group(2) in values and not isinstance(values[whole.group(2)], str):
            return values[whole.group(2)]

        def repl(m: re.Match) -> str:
            escaped, name = m.group(1), m.group(2)
            key = escaped or name
            if key not in values and not _UPPER.fullmatch(key):
                return m.group(0)
            if escaped:
                return "{" + escaped + "}"
            if name not in values:
                near = did_you_mean(name, values)
                raise SpecError(f"unknown placeholder {{{name}}} (known: {', '.join(sorted(values))}){near}", loc)
            return str(values[name])

        return _PLACEHOLDER.sub(repl, node)
    rewrite_children(node, lambda k, v: substitute(v, values, doc, doc.where(node, k)))
    return node
