"""Config sugar that XNMT had: ``!Repeat {times, content}`` and ``!RandomParam {values}``.

Both are expanded in the spec tree before anything is built, so references (``!Ref {path:
model.layers.2}``) see their result. ``!Repeat`` becomes a list of ``times`` independent deep copies
(each component in it gets its own subcollection). ``!RandomParam`` becomes one of its ``values``,
drawn once from the build's random generator (``build(seed=...)`` makes it reproducible); the draw
is remembered so that the saved spec writes ``!RandomParam {values: [...], drawn: v}``: the choice and
the choices, and loading uses the drawn value again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SpecError
from ..spec import Doc, Tagged, children, iter_tagged

__all__ = ["RANDOM", "REPEAT", "expand_sugar", "random_args"]

REPEAT, RANDOM = "!Repeat", "!RandomParam"
MAX_TIMES = 100_000


def expand_sugar(tree: Any, doc: Doc, rng: np.random.Generator) -> tuple[Any, dict[tuple, list]]:
    """The tree with every ``!Repeat`` and ``!RandomParam`` expanded, and ``{path: values}`` of each draw."""
    draws: dict[tuple, list] = {}

    def walk(node: Any, path: tuple) -> Any:
        if isinstance(node, Tagged) and node.tag == REPEAT:
            return [walk(copy, path + (i,)) for i, copy in enumerate(_repeat(node, doc))]
        if isinstance(node, Tagged) and node.tag == RANDOM:
            values, value = _draw(node, doc, rng)
            draws[path] = values
            return value
        target = node.args if isinstance(node, Tagged) else node
        for k, v in list(children(node)):
            target[k] = walk(v, path + (k,))
        return node

    return walk(tree, ()), draws


def _repeat(node: Tagged, doc: Doc) -> list:
    where = doc.where(node)
    unknown = sorted(set(node.args) - {"times", "content"}, key=str)
    if unknown:
        raise SpecError(f"{REPEAT}: unknown argument {unknown[0]!r} (it takes times and content)", where)
    times, content = node.args.get("times"), node.args.get("content")
    if not isinstance(times, int) or isinstance(times, bool) or not 0 <= times <= MAX_TIMES:
        raise SpecError(f"{REPEAT}: times must be an int from 0 to {MAX_TIMES}, got {times!r}", doc.where(node, "times") or where)
    if "content" not in node.args:
        raise SpecError(f"{REPEAT} needs content: the component (or value) to repeat", where)
    ids = [n for n in iter_tagged(content) if isinstance(n, Tagged) and "xser_id" in n.args]
    if ids:
        raise SpecError(f"{REPEAT}: content marked xser_id {ids[0].args['xser_id']!r} would be {times} objects with one name; "
                        "drop xser_id there (refer to a copy by path: !Ref {path: ...N})", doc.where(ids[0]) or where)
    return [doc.copy(content) for _ in range(times)]


def _draw(node: Tagged, doc: Doc, rng: np.random.Generator) -> tuple[list, Any]:
    where = doc.where(node)
    unknown = sorted(set(node.args) - {"values", "drawn"}, key=str)
    if unknown:
        raise SpecError(f"{RANDOM}: unknown argument {unknown[0]!r} (it takes values, and drawn in a saved spec)", where)
    values = node.args.get("values")
    if not isinstance(values, list) or not values:
        raise SpecError(f"{RANDOM}: values must be a non-empty list of choices, got {values!r}", doc.where(node, "values") or where)
    if "drawn" in node.args:  # a saved spec: the value drawn when the model was built
        drawn = node.args["drawn"]
        if not any(drawn == v and type(drawn) is type(v) for v in values):
            raise SpecError(f"{RANDOM}: drawn value {drawn!r} is not one of the values {values!r}", doc.where(node, "drawn") or where)
        return values, drawn
    return values, doc.copy(values[int(rng.integers(len(values)))])


def random_args(draws: dict[tuple, list], path: tuple, keys: Any) -> dict[str, list]:
    """The arguments of the component at ``path`` that were drawn: ``{key: values}``."""
    return {k: draws[path + (k,)] for k in keys if path + (k,) in draws}


