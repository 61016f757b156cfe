"""The first step of a save, on the caller's thread: what to save, taken from the live objects.

A ``Snapshot`` holds the spec text, the arrays (references, not copies: the write step reads
them before the save returns), the formats components declared, the checkpoint's metadata and
the encoded training state. Everything after it (plan, write, finish, publish) works on the
snapshot alone, never on the objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from ..errors import CheckpointError, DataError, Location
from ..model.build import experiment_name
from ..model.registry import info_for
from ..model.serialize import to_tree
from ..spec.saved import render_saved
from ..storage import training_state

__all__ = ["Snapshot", "check_metrics", "check_step", "growing", "plain_json", "snapshot"]


@attrs.frozen
class Snapshot:
    spec_text: str
    arrays: dict  # {sub: {param: (array | FromFile | FromFiles | Stream, trainable)}}
    meta: dict  # step, metrics, training, custom
    formats: dict = attrs.field(factory=dict)  # patterns -> format; what save() says first, then declarations
    state_tree: Any = None
    state_arrays: dict | None = None
    #: {sub: (place in the object graph, class tag, {param: (start, stop, full shape)} held in part, {table: IdSlice})}
    layout: dict = attrs.field(factory=dict)

    def refuse_parts(self) -> None:
        """A save by one process needs every row: a parameter declared with ``add(..., rows=)`` that holds fewer is
        refused (a save with a coordinator puts every rank's rows together)."""
        for sub, (_, _, held, slices) in self.layout.items():
            for name, (a, b, shape) in held.items():
                if (a, b) != (0, shape[0]):
                    raise DataError(f"param {name!r} holds rows {a}:{b} of its {shape[0]} (add(..., rows=)): a save by one "
                                    "process needs every row; save with coordinator=xser.dist.TorchDistributed() on every rank",
                                    Location(path=sub))
            for name, sl in slices.items():
                if (sl.begin, sl.end) != (0, sl.size):
                    raise DataError(f"table {name!r} holds the ids of {sl!r} only (add_table(..., slice=)): a save by one process "
                                    "needs every id bucket; save with coordinator=xser.dist.TorchDistributed() on every rank",
                                    Location(path=sub))

    @property
    def structure(self) -> dict:
        return {s: {n: (np.dtype(spec[0].dtype), growing(n, tuple(spec[0].shape))) for n, spec in ps.items()} for s, ps in self.arrays.items()}


def growing(name: str, shape: tuple) -> tuple:
    """The shape a checkpoint must keep: a table's parts (``emb@id``) grow, so their first dimension is free."""
    return (None,) + tuple(shape[1:]) if "@" in name and shape else tuple(shape)


def plain_json(value: Any, where: str) -> Any:
    """Check that caller metadata is JSON data; return a deep copy of it."""
    try:
        return json.loads(json.dumps(value, allow_nan=True))
    except (TypeError, ValueError, RecursionError) as e:
        raise DataError(f"{where} must be JSON data (dicts, lists, str, numbers, bool, None): {e}") from None


def check_step(step: Any) -> int | None:
    if step is None:
        return None
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        return int(step)
    raise CheckpointError(f"step must be an int, got {step!r}")


def check_metrics(metrics: Any) -> dict:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise CheckpointError(f"metrics must be a mapping of names to numbers, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise CheckpointError(f"metric names must be strings, got {k!r}")
        if isinstance(v, np.generic):
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise CheckpointError(f"metric {k!r} must be a number, got {v!r}")
        out[k] = v
    return out


def meta_of(*, step: Any = None, metrics: Any = None, training: Any = None, custom: Any = None) -> dict:
    return {
        "step": check_step(step),
        "metrics": check_metrics(metrics),
        "training": plain_json(dict(training or {}), "training"),
        "custom": plain_json(dict(custom or {}), "custom"),
    }


def snapshot(
    obj: Any,
    path: str,
    *,
    name: str | None = None,
    step: Any = None,
    metrics: Any = None,
    training: Any = None,
    custom: Any = None,
    training_state_value: Any = None,
    formats: Mapping[str, Any] | None = None,
    replace: Mapping[str, Any] | None = None,
) -> Snapshot:
    """Everything a save of ``obj`` as ``path`` needs, taken now.

    ``replace`` maps ``"sub/param"`` to what to store instead of the object's array (files
    already written, for ``PartialSaver``).
    """
    tree, subcols = to_tree(obj)
    arrays = {sub_name: sub.current() for sub_name, (sub, _) in subcols.items()}
    layout = {}
    for sub_name, (sub, where) in subcols.items():
        info = info_for(sub.owner)
        held = {n: (a, b, sub.decls[n].shape) for n, (a, b) in getattr(sub, "sharded", {}).items()}
        layout[sub_name] = (where, info.tag if info is not None else type(sub.owner).__qualname__, held, getattr(sub, "slices", {}))
    for key, item in (replace or {}).items():
        sub_name, _, pname = key.partition("/")
        arrays[sub_name][pname] = (item, arrays[sub_name][pname][1])
    merged = dict(formats or {})  # patterns are tried in order: what save() says wins over the declaration
    for sub_name, (sub, _) in subcols.items():
        for d in sub.decls.values():
            if d.format:
                merged.setdefault(f"{sub_name}/{d.name}", d.format)
    meta = meta_of(step=step, metrics=metrics, training=training, custom=custom)
    text = render_saved(tree, name if name is not None else experiment_name(obj), path)
    state_tree = state_arrays = None
    if training_state_value is not None:
        state_tree, state_arrays = training_state.encode(training_state_value)
    return Snapshot(text, arrays, meta, merged, state_tree, state_arrays, layout)
