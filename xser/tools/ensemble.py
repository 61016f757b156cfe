"""Ensembles: several saved models as the members of one saved model.

``ensemble([a, b], out)`` writes a complete model at ``out`` whose experiment is
``!Ensemble {members: [...]}``, each member being one input model's experiment (or a part of
it), with every member's parameters (hard-linked). ``xser.load(out)`` gives one object graph.
Members that share subcollection names (one model twice, two fine-tunings of one parent) get
fresh names with ``rename=True``; otherwise that is an error that says how to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

import contextlib

from ..api import retrying
from ..checkpoints.newmodel import write_new_model
from ..checkpoints.saver import SaveOptions
from ..checkpoints.snapshot import Snapshot
from ..errors import CheckpointError, Location, SpecError
from ..model.refs import NotFound, Resolver, dedupe_ids, inline, parse_path
from ..model.registry import serializable
from ..spec import Doc, Tagged, dump, iter_tagged
from ..spec.saved import SPEC_FORMAT, absolute_paths, open_saved, relative_paths, spec_header
from ..storage.stores import is_url
from ..storage.stores import options as storage_context
from .convert import fresh_names, linked_arrays
from .where import same_path

__all__ = ["Ensemble", "EnsembleReport", "ensemble"]


@serializable(tag="!Ensemble")
class Ensemble:
    """Built-in component holding the member models; combining their outputs is model code."""

    members: list = attrs.field(factory=list)


@attrs.frozen
class EnsembleReport:
    out: str
    members: tuple[str, ...]
    renamed: dict  # (member index, old name) -> new name


def ensemble(
    models: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    rename: bool = False,
    path: str = "",
    checkpoint: int = 0,
    name: str | None = None,
    durable: bool = True,
    force: bool = False,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> EnsembleReport:
    """Write an ensemble of ``models`` (their experiment, or the part at dotted ``path``) to ``out``.

    The ensemble's experiment is named ``name``, by default after its file (``ens.yaml``: ``ens``). Members and
    ``out`` may be local paths or URLs, in any mix (``storage_options`` go to the filesystem of every URL); a
    member on the output's object store is copied on the server."""
    out = os.fspath(out)
    if name is None:
        name = _stem(out)
    models = [os.fspath(m) for m in models]
    if not models:
        raise CheckpointError("an ensemble needs at least one model", Location(out))
    if any(same_path(m, out) for m in models):
        raise CheckpointError("the output is one of the input models; choose another --out", Location(out))
    with storage_context(storage_options):
        return retrying(out, lambda: _ensemble(models, out, rename=rename, path=path, checkpoint=checkpoint, name=name,
                                               durable=durable, force=force, verify=verify))


def _stem(path: str) -> str:
    base = os.path.basename(path)
    root, ext = os.path.splitext(base)
    return root if ext in (".yaml", ".yml") and root else base


def _ensemble(models: list[str], out: str, *, rename: bool, path: str, checkpoint: int, name: str, durable: bool,
              force: bool, verify: bool) -> EnsembleReport:
    with contextlib.ExitStack() as stack:
        return _ensemble_open(stack, models, out, rename=rename, path=path, checkpoint=checkpoint, name=name,
                              durable=durable, force=force, verify=verify)


def _ensemble_open(stack: contextlib.ExitStack, models: list[str], out: str, *, rename: bool, path: str, checkpoint: int,
                   name: str, durable: bool, force: bool, verify: bool) -> EnsembleReport:
    members: list[Any] = []
    arrays: dict[str, Any] = {}
    owner: dict[str, str] = {}  # subcollection name in the ensemble -> member file
    renamed: dict = {}
    ids: set[str] = set()
    for i, model in enumerate(models):
        saved = stack.enter_context(open_saved(model, checkpoint))
        exp = absolute_paths(saved.experiment, model, saved.doc)  # the member's own files, wherever it is
        doc = Doc(exp, model)
        resolver = Resolver(exp, doc)
        try:
            canon = resolver.canonical(parse_path(path, Location(model)), Location(model))
        except NotFound as e:
            raise SpecError(f"path {path!r} not found: {e.why}", Location(model)) from None
        member = inline(resolver, canon, ("members", i))
        dedupe_ids(member, ids)
        data = saved.data
        source = linked_arrays(data, {}, verify=verify)
        here: set[str] = set()
        for node in iter_tagged(member):
            src = node.args.get("xser_subcol_name") if node.tag != "!Ref" else None
            if not isinstance(src, str):
                continue
            if src not in source:
                raise CheckpointError(f"subcollection {src} is named in the spec but missing on disk", Location(data.path))
            new = src
            if src in here:  # an inlined copy inside this member: always a fresh name
                new = fresh_names([src], set(owner) | set(source))[src]
            elif src in owner:
                if not rename:
                    raise CheckpointError(
                        f"{model} shares subcollection {src} with {owner[src]}; pass --rename (rename=True) to give "
                        "later members fresh names, or make independent models first with `xser convert`",
                        Location(model),
                    )
                new = fresh_names([src], set(owner) | set(source))[src]
            here.add(src)
            node.args["xser_subcol_name"] = new
            if new != src:
                renamed[(i, src)] = new
            arrays[new] = source[src]
            owner[new] = model
        members.append(member)
    spec = {"xser_format": SPEC_FORMAT, "name": name, "experiment": relative_paths(Tagged("!Ensemble", {"members": members}), out)}
    meta = {"training": {"ensemble_of": [m if is_url(m) else os.path.abspath(m) for m in models]}}
    write_new_model(out, [Snapshot(spec_header(out) + dump(spec), arrays, meta)], SaveOptions(durable), force=force)
    return EnsembleReport(out, tuple(models), renamed)
