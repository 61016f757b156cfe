"""Hugging Face's safetensors layout: export a saved model, import a file or a sharded directory.

Export writes ``model.safetensors`` (or shards ``model-00001-of-0000N.safetensors`` and
``model.safetensors.index.json`` when a shard size is given), keys by component path
(``model.encoder.emb.weight``), the model's spec YAML in each file's ``__metadata__`` (with
``"format": "pt"``, which transformers expects). Import makes an xser model with one built-in
``!SafetensorsWeights`` component holding the tensors by key, so ``avg``, ``convert``,
``inspect`` and ``read_params`` work on it. Both stream one tensor at a time: memory stays
bounded by the largest tensor, not the model. Neither needs torch or the safetensors package.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import attrs
import numpy as np

from . import refuse_existing, takes_storage_options, writes_files
from ..storage.progress import advance, progress
from ..errors import DataError, Location, did_you_mean
from ..model.params import NAME_RE, fresh_name, params
from ..model.registry import serializable
from ..model.resources import PREFIX as RESOURCE
from ..model.resources import resources
from ..model.serialize import flat_keys
from ..model.tables import SEP
from ..spec import Tagged
from ..storage.dtypes import find, resolve
from ..storage.formats.safetensors import SAFETENSORS
from ..storage.hf_layout import hf_files, hf_side_files, hf_tensors
from ..storage.listing import Best, selector
from ..storage.payloads import Lazy, Stream
from ..storage.replace import replaced_output, staged_file
from ..storage.source import open_source
from ..storage.stores import Store, store_for

__all__ = ["SafetensorsWeights", "export_safetensors", "import_safetensors", "parse_size"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CHUNK_ELEMENTS = 1 << 20
_log = logging.getLogger("xser")


@serializable(tag="!SafetensorsWeights")
class SafetensorsWeights:
    """Tensors by key, as a safetensors file holds them: ``{key: [dtype, shape]}``; and the configuration and tokenizer
    files of the Hugging Face directory they came from (``files``: names), kept as resources (``resource.config.json``),
    ``paths`` gives the saved copies."""

    tensors: dict
    files: list = attrs.field(factory=list)
    tables: dict = attrs.field(factory=dict)

    def __attrs_post_init__(self):
        p = params(self)
        self.arrays = {k: p.add(k, tuple(shape), dtype=resolve(dtype), init="zeros") for k, (dtype, shape) in self.tensors.items()}
        self.paths = {n: resources(self).add(n, name=n) for n in self.files}
        self.hash_tables = {n: p.add_table(n, tuple(t["dim"]), dtype=resolve(t["dtype"]), slots=tuple(t.get("slots", ())))
                            for n, t in self.tables.items()}


def parse_size(text: str | int) -> int:
    """``"5GB"``, ``"500MB"``, ``"2GiB"`` or a number of bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", str(text), re.I)
        if m is None:
            raise DataError(f"shard size must look like 5GB, 500MB, 2GiB or a number of bytes, got {text!r}")
        unit = (m.group(2) or "B").upper()
        base = 1024 if "I" in unit else 1000
        size = int(float(m.group(1)) * base ** "BKMGT".index(unit[0]))
    if size < 1:
        raise DataError(f"shard size must be at least 1 byte, got {text!r}")
    return size


@attrs.frozen
class ExportReport:
    out: str
    files: tuple[str, ...]
    keys: int
    total_size: int


def _shards(sizes: list[tuple[str, int]], limit: int | None) -> list[list[str]]:
    """Keys in order, cut greedily so no shard passes ``limit`` (a tensor larger than it gets a shard of its own)."""
    out: list[list[str]] = [[]]
    used = 0
    for key, n in sizes:
        if limit is not None and out[-1] and used + n > limit:
            out.append([])
            used = 0
        out[-1].append(key)
        used += n
    return out


@takes_storage_options
@writes_files
def export_safetensors(model: str | os.PathLike, out: str | os.PathLike, *, path: str = "", checkpoint: int | str | Best = 0,
                       metric: str | None = None, mode: str = "max", max_shard_size: str | int | None = None, force: bool = False,
                       verify: bool = True, storage_options: dict | None = None) -> ExportReport:
    """Write the Hugging Face layout of ``model``'s checkpoint into the directory ``out``.

    Keys are the parameters' component paths (``encoder.emb.weight``); with ``path``, only the parameters under that
    component or submodule, relative to it (``path="model.lm"`` turns ``model.lm.bert.embeddings...`` into
    ``bert.embeddings...``, the keys ``BertForMaskedLM.from_pretrained`` expects). The resource files of that
    component (``resource.config.json``: an imported HF directory's configuration and tokenizer) are written as files.
    ``checkpoint``, ``metric`` and ``mode`` select a checkpoint as for ``xser.load``. The directory appears whole:
    it is written beside ``out`` and renamed into place. ``out`` may be a URL (``s3://``, ``memory://``, ...;
    ``storage_options`` go to its filesystem): the files are uploaded, the index last (not atomic as a set there: see
    docs/interop.md).
    """
    from ..api import retrying
    from ..spec.saved import open_saved

    model, out = os.fspath(model), os.fspath(out)
    which = selector(checkpoint, metric, mode, model)
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    store = store_for(out)
    refuse_existing(out, force, store)

    def once() -> ExportReport:
        with open_saved(model, which) as saved:
            data = saved.data
            text = data.spec_text()
            if text is None:  # format_version 1: the top-level file is the spec
                text = store_for(model).read_bytes(model, "the model's spec").decode("utf-8")
            keys, files = _selected(flat_keys(saved.experiment, data.subcollections), data.subcollections, path, data.path)
            _warn_unloadable(saved.experiment, path, keys, out)
            entries = {k: data.subcollections[s][n] for k, (s, n) in keys.items()}
            for k, e in entries.items():
                d = find(e.dtype)
                if d is None or d.safetensors is None:
                    raise DataError(f"{k} is {e.dtype}: safetensors has no such dtype", Location(data.path))
            groups = _shards([(k, e.nbytes) for k, e in entries.items()], limit)
            sharded = len(groups) > 1  # one shard is model.safetensors without an index, as save_pretrained writes it
            names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))] if sharded else [SINGLE]
            for name in files:
                if name in names or name == INDEX:
                    raise DataError(f"the resource {name!r} has the name of a file the export writes", Location(data.path))
            total = sum(e.nbytes for e in entries.values())
            with replaced_output(out, store=store, last=(INDEX,)) as staging:
                metadata = {"format": "pt", "xser_spec": text, **({"xser_path": path} if path else {})}
                with progress(total + sum(data.subcollections[s][n].nbytes for s, n in files.values()), "exporting"):
                    for name, group in zip(names, groups):
                        arrays = {k: Lazy(entries[k].dtype, entries[k].shape, _reader(data, entries[k], verify)) for k in group}
                        SAFETENSORS.write_bundle(os.path.join(staging, name), arrays, metadata)
                    for name, (s, n) in files.items():
                        raw = _reader(data, data.subcollections[s][n], verify)()
                        with staged_file(os.path.join(staging, name)) as f:
                            f.write(np.ascontiguousarray(raw).tobytes())
                if sharded:
                    index = {"metadata": {"total_size": total}, "weight_map": {k: n for n, g in zip(names, groups) for k in g}}
                    with staged_file(os.path.join(staging, INDEX), text=True) as f:
                        json.dump(index, f, indent=2)
                        f.write("\n")
            written = names + ([INDEX] if sharded else []) + sorted(files)
            return ExportReport(out, tuple(store.join(out, n) for n in written), len(entries), total)

    return retrying(model, once)


def _is_resource(name: str, e: Any) -> bool:
    return name.startswith(RESOURCE) and e.dtype == np.uint8 and len(e.shape) == 1 and all(b.format == "raw" for b in e.blocks)


def _selected(keys: dict[str, tuple[str, str]], subs: dict, path: str, where: str) -> tuple[dict, dict]:
    """``({key: (sub, param)}, {file name: (sub, param)})``: the tensors under ``path``, relative to it, and the resource
    files of the component there. Resources of the components below it are neither (they are not tensors)."""
    if path:
        prefix = path + "."
        under = {k[len(prefix):]: v for k, v in keys.items() if k.startswith(prefix)}
        if not under:
            known = sorted({k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)})
            raise DataError(f"no component or submodule {path!r} holds parameters{did_you_mean(path, known)}", Location(where))
        keys = under
    tensors, files = {}, {}
    for k, (s, n) in keys.items():
        if _is_resource(n, subs[s][n]):
            if k == n:  # the exported component's own resource
                files[n[len(RESOURCE):]] = (s, n)
            continue
        tensors[k] = (s, n)
    return tensors, files


def _node(tree: Any, path: str) -> tuple[bool, Any]:
    """``(found, node)``: the spec node at a dotted path; not found when the path goes below a component's
    arguments (into its parameters: a submodule)."""
    node = tree
    for part in path.split(".") if path else []:
        if isinstance(node, Tagged):
            node = node.args
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _warn_unloadable(experiment: Any, path: str, keys: dict, out: str) -> None:
    """Warn when the exported part of the spec is a plain mapping or list, not a component: its keys then begin with
    the spec's own structure (``model.``), which no module's ``state_dict()`` has, so ``from_pretrained`` or
    ``load_state_dict`` would initialise every tensor at random (transformers only reports that). The suggested
    ``--path`` is where every key starts with the same component or submodule prefix, as deep as that goes."""
    found, node = _node(experiment, path)
    if not keys or not found or not isinstance(node, (dict, list)):
        return
    parts = [k.split(".") for k in keys]
    common: list[str] = []
    while all(len(p) > len(common) + 1 for p in parts) and len({p[len(common)] for p in parts}) == 1:
        common.append(parts[0][len(common)])
    firsts = sorted({p[0] for p in parts})
    hint = (f"export the module with --path {'.'.join(filter(None, [path, *common]))} (path= in the API)" if common
            else f"export one component with --path (path= in the API): {', '.join('.'.join(filter(None, [path, f])) for f in firsts)}")
    start = ".".join(filter(None, [path, firsts[0]])) if path else firsts[0]
    _log.warning("%s: the keys begin with the spec's structure (%r), not with a module's: no module's state_dict() has "
                 "such keys, so from_pretrained or load_state_dict would leave every tensor at its initial value; %s",
                 out, f"{start}.", hint)


def _reader(data: Any, entry: Any, verify: bool) -> Any:
    def take(index: tuple | None = None) -> np.ndarray:
        a = data.read(entry, verify=verify)
        advance(a.nbytes)
        return a if index is None else a[index]

    return take


# ---------------------------------------------------------------- import


@takes_storage_options
def import_safetensors(source: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                       format: str = "npy", storage_options: dict | None = None) -> str:
    """Make an xser model of a safetensors file or HF directory; returns its subcollection name.

    Tensors are copied one at a time, in chunks (the source is never loaded whole). ``format``
    is the weight format of the new model (``npy`` or ``safetensors``). A directory's configuration
    and tokenizer files (``*.json`` but the index, ``*.txt``, ``*.model``, ``*.tiktoken``, ``*.jinja``)
    are kept as resources of the model, and ``export_safetensors`` writes them back. ``source`` may be a URL
    (``s3://``, ``memory://``, ...; ``storage_options`` go to its filesystem): only the bytes of each tensor are read.
    """
    from ..checkpoints.newmodel import write_new_model
    from ..checkpoints.saver import SaveOptions
    from ..checkpoints.snapshot import Snapshot
    from ..spec import dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    from . import where_from

    source, out = os.fspath(source), os.fspath(out)
    store = store_for(source)
    files = hf_files(source, store)
    found = {k: (v[0], v[4]) for k, v in hf_tensors(files, store).items()}
    tables = _tables(found)
    for key, (path, _) in found.items():
        if SEP in key:
            continue  # a hash table's part, checked by _tables
        if not NAME_RE.fullmatch(key):
            raise DataError(f"tensor name {key!r} cannot be an xser parameter name (it must match {NAME_RE.pattern})", Location(path))
        if key.startswith(RESOURCE):
            raise DataError(f"tensor name {key!r}: names starting with {RESOURCE!r} are the model's resource files", Location(path))
    side, skipped = hf_side_files(source, store)
    for name in skipped:
        _log.warning("%s: not a regular file, not imported", store.join(source, name))
    for n in [n for n in side if not NAME_RE.fullmatch(RESOURCE + n)]:
        _log.warning("%s: a file name xser cannot keep (%r must match %s), not imported", store.join(source, n), RESOURCE + n,
                     NAME_RE.pattern)
        side.remove(n)
    name = fresh_name(SafetensorsWeights)
    tensors = {k: [find(t[0]).tag, list(t[1])] for k, (_, t) in found.items() if SEP not in k}
    args: dict[str, Any] = {"tensors": tensors, **({"files": side} if side else {}), **({"tables": tables} if tables else {}),
                            "xser_subcol_name": name}
    tree = Tagged("!SafetensorsWeights", args)
    text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": store.basename(source.rstrip("/")), "experiment": tree})
    arrays: dict[str, tuple[Any, bool]] = {
        k: (_stream(store, path, k, t) if format == "npy" else _whole(store, path, k, t), True) for k, (path, t) in found.items()}
    arrays.update({RESOURCE + n: (_side_file(store, store.join(source, n)), False) for n in side})
    meta = {"training": {"imported_from": where_from(source), "files": [store.basename(p) for p in files]}}
    formats = {f"{name}/{RESOURCE}*": "raw", f"{name}/*": format}
    write_new_model(out, [Snapshot(text, {name: arrays}, meta, formats)], SaveOptions(durable), force=force)
    return name


def _tables(found: dict[str, tuple[str, tuple]]) -> dict[str, dict[str, Any]]:
    """Hash tables from keys ``<table>@id``, ``<table>@embedding`` and ``<table>@<slot>`` (as xser's export writes
    them): ``{table: {dim, dtype, slots}}``, each part checked against the ids."""
    parts: dict[str, dict[str, tuple[str, tuple]]] = {}
    for key, v in found.items():
        if SEP in key:
            table, _, part = key.rpartition(SEP)
            parts.setdefault(table, {})[part] = v
    out = {}
    for table, ps in parts.items():
        where = next(iter(ps.values()))[0]
        if "id" not in ps or "embedding" not in ps:
            raise DataError(f"tensors {', '.join(repr(f'{table}{SEP}{p}') for p in ps)}: a name with {SEP!r} is a hash table's part, "
                            f"and the table needs {table}{SEP}id and {table}{SEP}embedding", Location(where))
        if not NAME_RE.fullmatch(table) or not all(NAME_RE.fullmatch(p) for p in ps):
            raise DataError(f"hash table {table!r}: its name and part names must match {NAME_RE.pattern}", Location(where))
        (ipath, it), (epath, et) = ps["id"], ps["embedding"]
        if len(it[1]) != 1 or np.dtype(it[0]) != np.int64:
            raise DataError(f"hash table {table!r}: {table}{SEP}id is {find(it[0]).tag} of shape {list(it[1])}; ids are a 1-D int64 "
                            "array", Location(ipath))
        if len(et[1]) < 1:
            raise DataError(f"hash table {table!r}: {table}{SEP}embedding has no rows (shape {list(et[1])})", Location(epath))
        for part, (path, t) in ps.items():
            if part != "id" and (tuple(t[1]) != (it[1][0],) + tuple(et[1][1:]) or np.dtype(t[0]) != np.dtype(et[0])):
                raise DataError(f"hash table {table!r}: {table}{SEP}{part} is {find(t[0]).tag} of shape {list(t[1])}; its "
                                f"{it[1][0]} ids need {find(et[0]).tag} rows of shape {list(et[1][1:])}", Location(path))
        out[table] = {"dim": list(et[1][1:]), "dtype": find(et[0]).tag, "slots": [p for p in ps if p not in ("id", "embedding")]}
    return out


def _side_file(store: Store, path: str) -> np.ndarray:
    """A configuration or tokenizer file's bytes (a regular file, at most a resource's size)."""
    from ..model.resources import MAX_BYTES

    with open_source(store, path, "the configuration or tokenizer file") as f:
        size = f.size
        if size > MAX_BYTES:
            raise DataError(f"{size} bytes, more than the {MAX_BYTES} a resource may have", Location(path))
        return np.frombuffer(_read_all(f, size, path), np.uint8).copy()


def _read_all(f: Any, size: int, path: str) -> bytes:
    """``size`` bytes from an open file, however many reads it takes; an OS failure is a ``DataError``."""
    try:
        parts, got = [], 0
        while got < size:
            b = f.read(size - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", Location(path)) from None


def _whole(store: Store, path: str, key: str, t: tuple) -> Lazy:
    """One tensor read when its turn to be written comes (for output formats that take whole arrays)."""
    dtype, shape = t[0], tuple(t[1])

    def take(index: tuple | None = None) -> np.ndarray:
        with open_source(store, path, "the safetensors file") as f:
            a = SAFETENSORS.read(f, path, dtype, shape, f.size, mmap=False, verify=None, key=key)
        return a if index is None else a[index]

    return Lazy(dtype, shape, take)


def _stream(store: Store, path: str, key: str, t: tuple) -> Stream:
    dtype, shape = t[0], tuple(t[1])

    def chunks():
        with open_source(store, path, "the safetensors file") as f:
            size = f.size
            for piece in SAFETENSORS.chunks(f, path, dtype, shape, size, CHUNK_ELEMENTS, key=key):
                yield piece.view(np.uint8)

    return Stream(dtype, shape, False, chunks)

