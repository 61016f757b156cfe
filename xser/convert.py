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
from typing import Any

import attrs

from .checkpointing import Checkpoint, checkpoint_dir, checkpoints, write_new_model
from .commit import from_entry
from .errors import CheckpointError, Location
from .spec import dump, iter_tagged, read
from .store import DataDir

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


def _saved_tree(path: str) -> Any:
    doc = read(path)
    if not (isinstance(doc.tree, dict) and "xser_format" in doc.tree):
        raise CheckpointError("not a saved xser model (no xser_format key)", Location(path))
    return doc.tree


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


def linked_arrays(data: DataDir, mapping: dict[str, str]) -> dict[str, dict[str, tuple[Any, bool]]]:
    """The data directory's arrays as files to link, under their new subcollection names."""
    out: dict[str, dict[str, tuple[Any, bool]]] = {}
    for sub, params in data.subcollections.items():
        new = mapping.get(sub, sub)
        out[new] = {name: (from_entry(data, e), e.trainable) for name, e in params.items()}
    return out


def _training_state_files(data: DataDir) -> Any:
    state = data.meta.get("training_state")
    if state is None:
        return None
    from .store import _check_manifest

    fake = {"format": "xser", "format_version": 1, "subcollections": {"ts": state.get("arrays", {})}}
    _, entries = _check_manifest(fake, os.path.join(data.path, "manifest.json"))
    files = {k: from_entry(data, e) for k, e in entries["ts"].items()}

    def build(v: Any) -> Any:
        if isinstance(v, dict):
            return files[v["$array"]] if set(v) == {"$array"} else {k: build(x) for k, x in v.items()}
        if isinstance(v, list):
            return [build(x) for x in v]
        return v

    return build(state.get("tree"))


def convert(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    checkpoint: int = 0,
    keep_training_state: bool = False,
    durable: bool = True,
    force: bool = False,
) -> ConvertReport:
    """Write checkpoint ``checkpoint`` of ``path`` as a new model at ``out`` with fresh names."""
    from .api import spec_header

    path, out = os.fspath(path), os.fspath(out)
    if os.path.realpath(path) == os.path.realpath(out):
        raise CheckpointError("the output is the input model; choose another --out", Location(out))
    tree = _saved_tree(path)
    data = DataDir.open(checkpoint_dir(path, checkpoint))
    names = list(dict.fromkeys(spec_subcols(tree) + list(data.subcollections)))
    mapping = fresh_names(names, set(names))
    rename_subcols(tree, mapping)
    meta = {
        "step": data.meta.get("step"),
        "metrics": data.meta.get("metrics") or {},
        "training": {**(data.meta.get("training") or {}), "converted_from": os.path.basename(data.path)},
        "custom": data.meta.get("custom") or {},
    }
    state = _training_state_files(data) if keep_training_state else None
    text = spec_header(out) + dump(tree)
    write_new_model(out, linked_arrays(data, mapping), text, meta, durable=durable, force=force, training_state=state)
    return ConvertReport(data.path, out, mapping)


def convert_all(path: str | os.PathLike, out: str | os.PathLike, **kw: Any) -> list[ConvertReport]:
    """Convert every checkpoint: ``out.0.yaml`` (the newest), ``out.1.yaml``, ..."""
    ckpts: list[Checkpoint] = checkpoints(path)
    if not ckpts:
        raise CheckpointError("the model has no checkpoints", Location(os.fspath(path)))
    return [convert(path, numbered(os.fspath(out), c.index), checkpoint=c.index, **kw) for c in ckpts]


