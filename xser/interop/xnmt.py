"""XNMT saved models: a YAML spec plus ``.data``, ``.data.1``, ... of DyNet text files.

Format and semantics in ``shared/research/xnmt.md`` (sections 1 and 4); the test fixture is a
model XNMT itself wrote (``tests/data/xnmt/``). Import keeps XNMT's tags as unknown tags (no
XNMT classes are needed), turns ``xnmt_subcol_name`` into ``xser_subcol_name`` (names
unchanged), drops the sentinel that XNMT writes into every ``!Ref``, and makes every DyNet
record a named array (``_0``, ``_1``, ... as DyNet names them) of DyNet's dimensions (DyNet
text is column-major). Every checkpoint comes along, identical ones too. Export writes XNMT's
files back; for an imported model whose subcollection names did not change the bytes are
those XNMT wrote (the original spec text is kept in each checkpoint's manifest for that).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import numpy as np

from ..errors import DataError, Location
from ..spec import Tagged, dump, iter_tagged, parse

__all__ = ["export_xnmt", "import_xnmt", "read_dynet_text", "write_dynet_text"]

_HEADER = re.compile(r"#(Parameter|LookupParameter)# (\S+) \{([0-9,]+)(?:X([0-9]+))?\} ([0-9]+)(?: (ZERO_GRAD|FULL_GRAD))?")
_SENTINEL = 1928437192847  # XNMT's "no default" marker, written into every saved !Ref


def read_dynet_text(path: str) -> list[dict]:
    """The records of one DyNet text file: kind, key, name, dims, grad flag and float32 values."""
    with open(path, "rb") as f:
        data = f.read()
    records = []
    pos = 0
    line_no = 1
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            raise DataError("record header without a newline", Location(path, line_no))
        header = data[pos:end].decode("ascii", "replace")
        m = _HEADER.fullmatch(header)
        if not m:
            raise DataError(f"not a DyNet record header: {header[:80]!r}", Location(path, line_no))
        kind, key, dims, batch, nbytes, grad = m.groups()
        if batch is not None and batch != "1":
            raise DataError(f"batched parameters are not supported ({header[:80]!r})", Location(path, line_no))
        shape = tuple(int(d) for d in dims.split(","))
        n = int(np.prod(shape, dtype=np.int64))
        nbytes = int(nbytes)
        full = grad in (None, "FULL_GRAD")
        expected = (16 * n + 1) * (2 if full else 1)
        if nbytes != expected:
            raise DataError(f"byte count {nbytes} does not match {n} values ({expected})", Location(path, line_no))
        body = data[end + 1 : end + 1 + nbytes]
        if len(body) != nbytes:
            raise DataError(f"file ends inside the values of {key}", Location(path, line_no + 1))
        values_line = body[: 16 * n + 1]
        tokens = values_line.split()
        if len(tokens) != n or not values_line.endswith(b"\n"):
            raise DataError(f"{key}: {len(tokens)} values on the line, the header says {n}", Location(path, line_no + 1))
        try:
            values = np.array([float(t) for t in tokens], np.float32)
        except ValueError:
            raise DataError(f"{key}: a value is not a number", Location(path, line_no + 1)) from None
        if not np.all(np.isfinite(values)):
            raise DataError(f"{key}: non-finite value", Location(path, line_no + 1))
        name = key.rsplit("/", 1)[-1]
        records.append({"kind": kind, "key": key, "name": name, "dims": list(shape), "grad": grad,
                        "array": values.reshape(shape, order="F")})
        pos = end + 1 + nbytes
        line_no += 2 + (1 if full else 0)
    return records


def write_dynet_text(records: list[dict]) -> bytes:
    """DyNet's TextFileSaver output for these records (values as ``%+.8e``, zero gradients)."""
    out = []
    for r in records:
        a = np.asarray(r["array"], np.float32)
        n = a.size
        dims = ",".join(str(d) for d in r["dims"])
        out.append(f"#{r['kind']}# {r['key']} {{{dims}}} {16 * n + 1} ZERO_GRAD\n")
        flat = a.reshape(-1, order="F").tolist()
        out.append("".join(f"{v:+.8e} " for v in flat) + "\n")
    return "".join(out).encode("ascii")


def _checkpoint_dirs(mod: str) -> list[str]:
    out = [mod + ".data"] if os.path.isdir(mod + ".data") else []
    k = 1
    while os.path.isdir(f"{mod}.data.{k}"):
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


def import_xnmt(mod: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True) -> list[str]:
    """Make an xser model of an XNMT saved model with all its checkpoints; returns the checkpoint dirs read."""
    from ..api import SPEC_FORMAT, spec_header
    from ..checkpointing import _slots
    from ..commit import ModelLock, clean_temporaries, stage, write_text_atomic
    from ..errors import CheckpointError
    from ..store import data_dir_of

    mod, out = os.fspath(mod), os.fspath(out)
    try:
        with open(mod, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise DataError(f"cannot read XNMT model: {e.strerror}", Location(mod)) from None
    doc = parse(text, mod)
    tree = doc.tree
    if not isinstance(tree, Tagged):
        raise DataError("an XNMT saved model is one tagged experiment (e.g. !Experiment)", Location(mod, 1, 1))
    names = [n.args["xnmt_subcol_name"] for n in iter_tagged(tree) if isinstance(n.args.get("xnmt_subcol_name"), str)]
    _to_xser(tree)
    dirs = _checkpoint_dirs(mod)
    if not dirs:
        raise DataError("no .data directory beside the model: there are no weights to import", Location(mod))
    exp_name = tree.args.get("name") if isinstance(tree.args.get("name"), str) else os.path.basename(mod)
    spec_text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": exp_name, "experiment": tree})
    with ModelLock(out):
        clean_temporaries(out)
        if os.path.exists(out) or _slots(out):
            if not force:
                raise CheckpointError("the output model exists; remove it or pass --force to replace it", Location(out))
        staged_dirs = []
        try:
            for k, d in enumerate(dirs):
                arrays: dict[str, dict[str, tuple[np.ndarray, bool]]] = {}
                layout: dict[str, list[dict]] = {}
                on_disk = sorted(os.listdir(d))
                missing = [n for n in names if n not in on_disk]
                if missing:
                    raise DataError(f"subcollections named in the spec have no file: {', '.join(missing)}", Location(d))
                for sub in on_disk:
                    records = read_dynet_text(os.path.join(d, sub))
                    arrays[sub] = {r["name"]: (r["array"], True) for r in records}
                    if len(arrays[sub]) != len(records):
                        raise DataError("two records with the same name", Location(os.path.join(d, sub)))
                    layout[sub] = [{k2: r[k2] for k2 in ("kind", "key", "name", "dims", "grad")} for r in records]
                meta = {"training": {"xnmt": {"imported_from": os.path.abspath(d), "mod_text": text, "records": layout}}}
                staged_dirs.append(stage(data_dir_of(out, 0), arrays, durable=durable, meta=meta))
            write_text_atomic(out, spec_text, durable=durable)
            for _, p in _slots(out):  # only with force: the old model goes whole
                shutil.rmtree(p, ignore_errors=True)
            for k, s in enumerate(staged_dirs):
                os.rename(s.path, data_dir_of(out, k))
        except BaseException:
            for s in staged_dirs:
                s.discard()
            raise
    return dirs


def export_xnmt(model: str | os.PathLike, out: str | os.PathLike, *, force: bool = False) -> list[str]:
    """Write ``out`` (XNMT's YAML) and ``out.data[.N]`` (DyNet text) for every checkpoint of ``model``."""
    from ..checkpointing import checkpoints
    from ..errors import CheckpointError
    from ..spec import read
    from ..store import DataDir

    model, out = os.fspath(model), os.fspath(out)
    if os.path.exists(out) and not force:
        raise CheckpointError("the output exists; remove it or pass --force to replace it", Location(out))
    ckpts = checkpoints(model)
    if not ckpts:
        raise CheckpointError("the model has no checkpoints", Location(model))
    doc = read(model)
    exp = doc.tree.get("experiment") if isinstance(doc.tree, dict) else None
    spec_names = [n.args["xser_subcol_name"] for n in iter_tagged(exp) if isinstance(n.args.get("xser_subcol_name"), str)]
    written = []
    for c in ckpts:
        data = DataDir.open(c.path)
        xnmt = (data.meta.get("training") or {}).get("xnmt") or {}
        layout = xnmt.get("records") or {}
        target = out + ".data" + ("" if c.index == 0 else f".{c.index}")
        os.makedirs(target, exist_ok=True)
        for sub, params in data.subcollections.items():
            arrays = {n: data.read(e) for n, e in params.items()}
            records = layout.get(sub)
            if records is None or {r["name"] for r in records} != set(arrays):
                # not imported from XNMT (or changed since): plain parameters, in declaration order
                records = [{"kind": "Parameter", "key": f"/{sub}/{n}", "name": n, "dims": list(a.shape)} for n, a in arrays.items()]
            body = write_dynet_text([{**r, "array": arrays[r["name"]]} for r in records])
            path = os.path.join(target, sub)
            with open(path, "wb") as f:
                f.write(body)
            written.append(path)
    first = DataDir.open(ckpts[0].path).meta.get("training", {}).get("xnmt", {})
    text = first.get("mod_text")
    original = [m for m in re.findall(r"xnmt_subcol_name: (\S+)", text)] if text else None
    if text is None or original != spec_names:
        tree = exp
        for node in iter_tagged(tree):
            if "xser_subcol_name" in node.args:
                node.args = {("xnmt_subcol_name" if k == "xser_subcol_name" else k): v for k, v in node.args.items()}
        text = dump(tree)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    written.append(out)
    return written
