"""A checkpoint becomes an independent model, with fresh subcollection names.

Several converted checkpoints of one run can then be loaded into one process side by side
(for ensembling). Works without the component classes: the spec is parsed as a plain tree,
only ``xser_subcol_name`` values change, and data files are hard-linked (copied where the
filesystem has no hard links), so a conversion costs no data I/O.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from typing import Any

import attrs

from ..api import retrying
from ..checkpoints.newmodel import write_new_model
from ..checkpoints.saver import SaveOptions
from ..checkpoints.snapshot import Snapshot
from ..errors import CheckpointError, Location
from ..spec import dump, iter_tagged
from ..spec.saved import SavedModel, absolute_paths, open_saved, relative_paths, spec_header, with_spec
from ..storage import training_state
from ..storage.listing import scan, selector
from ..storage.opened import OpenedDir
from ..storage.payloads import from_entry
from ..storage.stores import options as storage_context
from .ranks import rank_states
from .where import same_path

__all__ = ["ConvertReport", "convert", "fresh_names", "numbered"]


@attrs.frozen
class ConvertReport:
    source: str  # the checkpoint's data directory
    out: str
    renamed: dict  # old subcollection name -> new


_NAME = re.compile(r"(.+)([.-])[0-9a-f]{8}")


def fresh_names(old: list[str], taken: set[str]) -> dict[str, str]:
    """A new ``Class.<8 hex>`` for each old name, unique among ``taken`` and each other."""
    out = {}
    for name in old:
        m = _NAME.fullmatch(name)  # Class.8hex (xser), Class-8hex (XNMT since 2020)
        cls, sep = (m.group(1), m.group(2)) if m else (name, ".")
        while True:
            new = f"{cls}{sep}{secrets.token_hex(4)}"
            if new not in taken and new != name:
                break
        taken.add(new)
        out[name] = new
    return out


def numbered(out: str, k: int) -> str:
    """``conv/model.yaml`` -> ``conv/model.<k>.yaml`` (for ``--all``)."""
    root, ext = os.path.splitext(out)
    return f"{root}.{k}{ext}" if ext in (".yaml", ".yml") else f"{out}.{k}.yaml"


def rename_subcols(tree: Any, mapping: dict[str, str]) -> None:
    for node in iter_tagged(tree):
        name = node.args.get("xser_subcol_name")
        if isinstance(name, str) and name in mapping:
            node.args["xser_subcol_name"] = mapping[name]


def spec_subcols(tree: Any) -> list[str]:
    """Subcollection names written in a spec tree, in order, without repeats."""
    seen: dict[str, None] = {}
    for node in iter_tagged(tree):
        name = node.args.get("xser_subcol_name") if node.tag != "!Ref" else None
        if isinstance(name, str):
            seen.setdefault(name)
    return list(seen)


def linked_arrays(data: OpenedDir, mapping: dict[str, str], *, verify: bool = True) -> dict[str, dict[str, tuple[Any, bool]]]:
    """The data directory's arrays as files to link (checked against their checksums first), under their new names."""
    out: dict[str, dict[str, tuple[Any, bool]]] = {}
    for sub, params in data.subcollections.items():
        new = mapping.get(sub, sub)
        out[new] = {name: (from_entry(data, e, verify=verify), e.trainable, e.attrs) for name, e in params.items()}
    return out


def _training_state_files(data: OpenedDir, verify: bool = True) -> Any:
    """The checkpoint's training state with its arrays as files to link."""
    if data.manifest.state is None:
        return None
    files = {k: from_entry(data, e, verify=verify) for k, e in data.manifest.state_entries.items()}
    return training_state.decode(data.manifest.state, files)


def convert(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    checkpoint: Any = 0,
    metric: str | None = None,
    mode: str = "max",
    keep_training_state: bool = False,
    durable: bool = True,
    force: bool = False,
    verify: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> ConvertReport:
    """Write checkpoint ``checkpoint`` of ``path`` as a new model at ``out`` with fresh names (``checkpoint="best",
    metric=..., mode=...`` or ``"last"`` select as for ``xser.load``).

    ``path`` and ``out`` may be local paths or URLs, in any mix (``storage_options`` go to the filesystem of every
    URL). Between two prefixes of one object store the data objects are copied on the server: no array byte passes
    through this process, and their checksums are carried over from the source's manifest (``verify`` then checks
    nothing more: the objects are immutable and the manifest was checked against its commit record)."""
    path, out = os.fspath(path), os.fspath(out)
    checkpoint = selector(checkpoint, metric, mode, path)
    if same_path(path, out):
        raise CheckpointError("the output is the input model; choose another --out", Location(out))

    def once() -> ConvertReport:
        with open_saved(path, checkpoint) as saved:
            return _convert_opened(saved, path, out, keep_training_state=keep_training_state, durable=durable, force=force,
                                   verify=verify)

    with storage_context(storage_options):
        return retrying(path, once)


def _convert_opened(saved: SavedModel, path: str, out: str, *, keep_training_state: bool, durable: bool, force: bool,
                    verify: bool) -> ConvertReport:
    data = saved.data
    experiment = relative_paths(absolute_paths(saved.experiment, path, saved.doc), out)  # paths in the model's directory
    tree = {"xser_format": saved.doc.tree["xser_format"], "name": saved.name, "experiment": experiment}
    names = list(dict.fromkeys(spec_subcols(tree) + list(data.subcollections)))
    mapping = fresh_names(names, set(names))
    rename_subcols(tree, mapping)
    meta = {
        "step": data.meta.get("step"),
        "metrics": data.meta.get("metrics") or {},
        "training": {**(data.meta.get("training") or {}), "converted_from": os.path.basename(data.path),
                     "converted_from_id": data.id},
        "custom": data.meta.get("custom") or {},
    }
    state_tree = state_arrays = None
    if keep_training_state and data.manifest.state is not None:
        state_tree, state_arrays = training_state.encode(_training_state_files(data, verify))
    if data.manifest.ranks:  # saved by several ranks: their training dicts, and their training states if kept
        states = rank_states(data, verify)
        meta["ranks"] = [training for training, _ in states]
        if keep_training_state and any(state is not None for _, state in states):
            state_tree, state_arrays = [], {}
            for r, (_, state) in enumerate(states):
                rank_tree, arrays = (None, {}) if state is None else training_state.encode(state)
                state_tree.append(rank_tree)
                state_arrays.update({f"rank{r}-{k}": v for k, v in arrays.items()})
    text = spec_header(out) + dump(tree)
    snap = Snapshot(text, linked_arrays(data, mapping, verify=verify), meta, {}, state_tree, state_arrays)
    write_new_model(out, [snap], SaveOptions(durable), force=force)
    return ConvertReport(data.path, out, mapping)


def convert_all(path: str | os.PathLike, out: str | os.PathLike, *, keep_training_state: bool = False, durable: bool = True,
                force: bool = False, verify: bool = True, storage_options: Mapping[str, Any] | None = None) -> list[ConvertReport]:
    """Convert every checkpoint: ``out.0.yaml`` (the newest), ``out.1.yaml``, ... All come from one listing (a
    saver rotating meanwhile neither shifts one checkpoint into two outputs nor leaves one out). Paths and
    ``storage_options`` as for ``convert``."""
    path, out = os.fspath(path), os.fspath(out)
    if same_path(path, out):
        raise CheckpointError("the output is the input model; choose another --out", Location(out))

    def once() -> list[ConvertReport]:
        with scan(path) as s:
            if not s.listed:
                raise CheckpointError("the model has no checkpoints", Location(path))
            return [_convert_opened(with_spec(path, data), path, numbered(out, c.index), keep_training_state=keep_training_state,
                                    durable=durable, force=force, verify=verify) for c, data in s.listed]

    with storage_context(storage_options):
        return retrying(path, once)


