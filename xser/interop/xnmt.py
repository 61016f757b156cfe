"""XNMT saved models: a YAML spec plus ``.data``, ``.data.1``, ... of DyNet text files.

Format and semantics in ``docs/research/xnmt.md`` (sections 1 and 4); the test fixture is a
model XNMT itself wrote (``tests/data/xnmt/``). Import keeps XNMT's tags as unknown tags (no
XNMT classes are needed), turns ``xnmt_subcol_name`` into ``xser_subcol_name`` (names
unchanged), drops the sentinel that XNMT writes into every ``!Ref``, and makes every DyNet
record a named array (``_0``, ``_1``, ... as DyNet names them) of DyNet's dimensions (DyNet
text is column-major). Every checkpoint comes along, identical ones too. Export writes XNMT's
files back; for an imported model whose subcollection names did not change the bytes are
those XNMT wrote (the original spec text is kept in each checkpoint's manifest for that).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import numpy as np

from . import refuse_existing, takes_storage_options, writes_files
from ..storage.replace import replaced_outputs, staged_file
from ..storage.progress import advance, progress
from ..errors import DataError, Location
from ..spec import Tagged, dump, iter_tagged, parse
from ..storage.formats.dynet_codec import parse_dynet_text, write_dynet_text
from ..storage.stores import Store, store_for


@takes_storage_options
def read_dynet_text(path: str, *, storage_options: dict | None = None) -> list[dict]:
    """The records of one DyNet text file (see ``parse_dynet_text``); ``path`` may be a URL."""
    return _read_dynet_text(store_for(os.fspath(path)), os.fspath(path))


def _read_dynet_text(store: Store, path: str) -> list[dict]:
    return parse_dynet_text(store.read_bytes(path, "DyNet data file"), path)

__all__ = ["export_xnmt", "import_xnmt", "read_dynet_text", "write_dynet_text"]

GRAD = ".grad"  # the gradient values of a FULL_GRAD record, stored beside the array (name + ".grad")
_SENTINEL = 1928437192847  # XNMT's "no default" marker, written into every saved !Ref


def _checkpoint_dirs(store: Store, mod: str) -> list[str]:
    out = [mod + ".data"] if store.isdir(mod + ".data") else []
    k = 1
    while store.isdir(f"{mod}.data.{k}"):
        out.append(f"{mod}.data.{k}")
        k += 1
    return out


def _to_xser(tree: Any) -> None:
    for node in iter_tagged(tree):
        if node.tag == "!Ref":
            if node.args.get("default") == _SENTINEL:
                del node.args["default"]
            if node.args.get("name", 0) is None:
                del node.args["name"]
        elif "xnmt_subcol_name" in node.args:
            node.args = {("xser_subcol_name" if k == "xnmt_subcol_name" else k): v for k, v in node.args.items()}


def _records(sub: str, params: dict, arrays: dict, layout: list | None) -> list[dict]:
    """DyNet records of a subcollection: from each array's ``attrs["dynet"]`` (kind, grad mode, position, key with
    the subcollection renamed), else from an imported checkpoint's layout, else plain parameters in declaration order."""
    if params and all("dynet" in e.attrs for e in params.values()):
        out = []
        for n, e in params.items():
            dy = e.attrs["dynet"]
            if "grad_of" in dy:
                continue
            key = dy.get("key") or f"/{sub}/{n}"
            if dy.get("sub") != sub:  # renamed by a tool (convert, ensemble --rename): the key follows the new name
                key = "/" + sub + "/" + key.split("/", 2)[-1] if key.count("/") >= 2 else f"/{sub}/{n}"
            grads = arrays.get(n + GRAD)
            out.append({"kind": dy.get("kind", "Parameter"), "key": key, "name": n, "dims": list(arrays[n].shape),
                        "grad": dy.get("grad", "ZERO_GRAD"), "array": arrays[n], "grad_array": grads, "index": dy.get("index", 0)})
        out.sort(key=lambda r: (r["kind"] != "Parameter", r["index"]))  # DyNet writes parameters, then lookup parameters
        return out
    if layout is not None and {r["name"] for r in layout} == set(arrays):
        return [{**r, "grad": "ZERO_GRAD", "array": arrays[r["name"]]} for r in layout]
    return [{"kind": "Parameter", "key": f"/{sub}/{n}", "name": n, "dims": list(a.shape), "array": a} for n, a in arrays.items()]


@takes_storage_options
def import_xnmt(mod: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                storage_options: dict | None = None) -> list[str]:
    """Make an xser model of an XNMT saved model with all its checkpoints; returns the checkpoint dirs read.
    ``mod`` may be a URL (``s3://``, ``memory://``, ...; ``storage_options`` go to its filesystem)."""
    from ..checkpoints.newmodel import write_new_model
    from ..checkpoints.saver import SaveOptions
    from ..checkpoints.snapshot import Snapshot
    from ..spec.saved import SPEC_FORMAT, spec_header

    from . import where_from

    mod, out = os.fspath(mod), os.fspath(out)
    store = store_for(mod)
    try:
        text = store.read_bytes(mod, "XNMT model").decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"cannot read XNMT model: {e}", Location(mod)) from None
    doc = parse(text, mod)
    tree = doc.tree
    if not isinstance(tree, Tagged):
        raise DataError("an XNMT saved model is one tagged experiment (e.g. !Experiment)", Location(mod, 1, 1))
    names = [n.args["xnmt_subcol_name"] for n in iter_tagged(tree) if isinstance(n.args.get("xnmt_subcol_name"), str)]
    _to_xser(tree)
    dirs = _checkpoint_dirs(store, mod)
    if not dirs:
        raise DataError("no .data directory beside the model: there are no weights to import", Location(mod))
    exp_name = tree.args.get("name") if isinstance(tree.args.get("name"), str) else store.basename(mod)
    spec_text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": exp_name, "experiment": tree})
    snaps = []
    per_dir = []
    for d in dirs:
        on_disk = sorted(store.listdir(d))
        missing = [n for n in names if n not in on_disk]
        if missing:
            raise DataError(f"subcollections named in the spec have no file: {', '.join(missing)}", Location(d))
        per_dir.append((d, {sub: _read_dynet_text(store, store.join(d, sub)) for sub in on_disk}))
    with_records = {sub for _, subs in per_dir for sub, records in subs.items() if records}
    for d, subs in per_dir:
        arrays: dict[str, dict[str, tuple]] = {}
        layout: dict[str, list[dict]] = {}
        for sub, records in subs.items():
            if not records and sub in with_records:
                raise DataError("empty file, but other checkpoints hold this component's parameters: DyNet's populate "
                                "(and so XNMT) cannot load it", Location(store.join(d, sub)))
            arrays[sub] = {}
            for i, r in enumerate(records):
                if r["name"] in arrays[sub]:
                    raise DataError("two records with the same name", Location(store.join(d, sub)))
                dynet = {"kind": r["kind"], "key": r["key"], "grad": r["grad"], "index": i, "sub": sub}
                arrays[sub][r["name"]] = (r["array"], True, {"dynet": dynet})
                if r["grad_array"] is not None:  # FULL_GRAD (or an old file): DyNet wrote the gradient too
                    arrays[sub][r["name"] + GRAD] = (r["grad_array"], False, {"dynet": {"grad_of": r["name"]}})
            layout[sub] = [{k2: r[k2] for k2 in ("kind", "key", "name", "dims", "grad")} for r in records]
        meta = {"training": {"xnmt": {"imported_from": where_from(d), "mod_text": text, "records": layout}}}
        snaps.append(Snapshot(spec_text, arrays, meta))
    write_new_model(out, snaps, SaveOptions(durable), force=force)
    return dirs


@takes_storage_options
@writes_files
def export_xnmt(model: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, storage_options: dict | None = None) -> list[str]:
    """Write ``out`` (XNMT's YAML) and ``out.data[.N]`` (DyNet text) for every checkpoint of ``model``.

    The checkpoints come from one consistent listing and are read through their opened
    directories, so a saver rotating them meanwhile cannot mix them. ``out`` may be a URL (``s3://``, ``memory://``,
    ...; ``storage_options`` go to its filesystem): the files are uploaded, the model file last (not atomic as a set
    there: see docs/interop.md).
    """
    from ..errors import CheckpointError
    from ..spec.saved import with_spec
    from ..storage.listing import scan

    model, out = os.fspath(model), os.fspath(out)
    store = store_for(out)
    refuse_existing(out, force, store)
    written = []
    stack = contextlib.ExitStack()
    with stack, scan(model) as s:
        if not s.listed:
            raise CheckpointError("the model has no checkpoints", Location(model))
        newest = s.listed[0][1]
        exp = with_spec(model, newest).experiment
        spec_names = [n.args["xser_subcol_name"] for n in iter_tagged(exp) if isinstance(n.args.get("xser_subcol_name"), str)]
        # every path written beside its name, then put in place when all are written: the data directories, the model file last
        targets = [out + ".data" + ("" if c.index == 0 else f".{c.index}") for c, _ in s.listed]
        staged = stack.enter_context(replaced_outputs(targets + [out], [True] * len(targets) + [False], store))
        with progress(sum(e.nbytes for _, d in s.listed for ps in d.subcollections.values() for e in ps.values()), "exporting"):
            for (c, data), target, staging in zip(s.listed, targets, staged):
                xnmt = (data.meta.get("training") or {}).get("xnmt") or {}
                layout = xnmt.get("records") or {}
                for sub, params in data.subcollections.items():
                    arrays = {n: data.read(e) for n, e in params.items()}
                    for n, a in arrays.items():
                        if a.ndim == 0 or a.dtype.kind != "f" or not np.array_equal(a.astype(np.float32).astype(a.dtype), a, equal_nan=True):
                            raise DataError(
                                f"{sub}/{n} is {a.dtype} of shape {tuple(a.shape)}: DyNet (XNMT) holds float32 arrays of at least "
                                "one dimension, so it cannot be exported without changing it",
                                Location(data.path),
                            )
                    records = _records(sub, params, arrays, layout.get(sub))
                    body = write_dynet_text(records)
                    with staged_file(os.path.join(staging, sub)) as f:
                        f.write(body)
                    written.append(store.join(target, sub))
                    advance(sum(a.nbytes for a in arrays.values()))
        first = newest.meta.get("training", {}).get("xnmt", {})
        text = first.get("mod_text")
        original = [m for m in re.findall(r"xnmt_subcol_name: (\S+)", text)] if text else None
        if text is None or original != spec_names:
            tree = exp
            for node in iter_tagged(tree):
                if "xser_subcol_name" in node.args:
                    node.args = {("xnmt_subcol_name" if k == "xser_subcol_name" else k): v for k, v in node.args.items()}
            text = dump(tree, yaml11=True)  # XNMT reads it with PyYAML (YAML 1.1)
        with staged_file(staged[-1], text=True) as f:
            f.write(text)
    written.append(out)
    return written
