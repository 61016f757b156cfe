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
import os
import re
import shutil
import secrets
from typing import Any

import attrs
import numpy as np

from . import refuse_existing, writes_files
from ..storage.progress import advance, progress
from ..errors import DataError, Location
from ..model.params import NAME_RE, fresh_name, params
from ..model.registry import serializable
from ..model.serialize import flat_keys
from ..storage.dtypes import find, resolve
from ..storage.formats.safetensors import SAFETENSORS
from ..storage.payloads import Lazy, Stream
from ..storage.hf_layout import hf_files, hf_tensors

__all__ = ["SafetensorsWeights", "export_safetensors", "import_safetensors", "parse_size"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CHUNK_ELEMENTS = 1 << 20


@serializable(tag="!SafetensorsWeights")
class SafetensorsWeights:
    """Tensors by key, as a safetensors file holds them: ``{key: [dtype, shape]}``."""

    tensors: dict

    def __attrs_post_init__(self):
        p = params(self)
        self.arrays = {k: p.add(k, tuple(shape), dtype=resolve(dtype), init="zeros") for k, (dtype, shape) in self.tensors.items()}


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


@writes_files
def export_safetensors(model: str | os.PathLike, out: str | os.PathLike, *, checkpoint: int = 0,
                       max_shard_size: str | int | None = None, force: bool = False, verify: bool = True) -> ExportReport:
    """Write the Hugging Face layout of ``model``'s ``checkpoint`` into the directory ``out``.

    The directory appears whole: it is written beside ``out`` and renamed into place.
    """
    from ..api import retrying
    from ..spec.saved import open_saved

    model, out = os.fspath(model), os.fspath(out)
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    refuse_existing(out, force)

    def once() -> ExportReport:
        with open_saved(model, checkpoint) as saved:
            data = saved.data
            text = data.spec_text()
            if text is None:  # format_version 1: the top-level file is the spec
                with open(model, encoding="utf-8") as f:
                    text = f.read()
            keys = flat_keys(saved.experiment, data.subcollections)
            entries = {k: data.subcollections[s][n] for k, (s, n) in keys.items()}
            for k, e in entries.items():
                d = find(e.dtype)
                if d is None or d.safetensors is None:
                    raise DataError(f"{k} is {e.dtype}: safetensors has no such dtype", Location(data.path))
            groups = _shards([(k, e.nbytes) for k, e in entries.items()], limit)
            names = [SINGLE] if limit is None else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
            staging = f"{out}.tmp-{secrets.token_hex(4)}"
            os.makedirs(staging)
            try:
                metadata = {"format": "pt", "xser_spec": text}
                with progress(sum(e.nbytes for e in entries.values()), "exporting"):
                    for name, group in zip(names, groups):
                        arrays = {k: Lazy(entries[k].dtype, entries[k].shape, _reader(data, entries[k], verify)) for k in group}
                        SAFETENSORS.write_bundle(os.path.join(staging, name), arrays, metadata)
                total = sum(e.nbytes for e in entries.values())
                if limit is not None:
                    index = {"metadata": {"total_size": total}, "weight_map": {k: n for n, g in zip(names, groups) for k in g}}
                    with open(os.path.join(staging, INDEX), "w", encoding="utf-8") as f:
                        json.dump(index, f, indent=2)
                        f.write("\n")
                _put_in_place(staging, out)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            files = tuple(os.path.join(out, n) for n in names + ([INDEX] if limit is not None else []))
            return ExportReport(out, files, len(entries), total)

    return retrying(model, once)


def _reader(data: Any, entry: Any, verify: bool) -> Any:
    def take(index: tuple | None = None) -> np.ndarray:
        a = data.read(entry, verify=verify)
        advance(a.nbytes)
        return a if index is None else a[index]

    return take


def _put_in_place(staging: str, out: str) -> None:
    """Rename the finished directory to ``out``; an existing ``out`` (``force``) is removed only after that."""
    old = None
    if os.path.lexists(out):
        old = f"{out}.old-{secrets.token_hex(4)}"
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old)
        else:
            os.unlink(old)


# ---------------------------------------------------------------- import


def import_safetensors(source: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                       format: str = "npy") -> str:
    """Make an xser model of a safetensors file or HF directory; returns its subcollection name.

    Tensors are copied one at a time, in chunks (the source is never loaded whole). ``format``
    is the weight format of the new model (``npy`` or ``safetensors``).
    """
    from ..checkpoints.saver import SaveOptions, write_new_model
    from ..checkpoints.snapshot import Snapshot
    from ..spec import Tagged, dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    source, out = os.fspath(source), os.fspath(out)
    files = hf_files(source)
    found = {k: (v[0], v[4]) for k, v in hf_tensors(files).items()}
    for key, (path, _) in found.items():
        if not NAME_RE.fullmatch(key):
            raise DataError(f"tensor name {key!r} cannot be an xser parameter name (it must match {NAME_RE.pattern})", Location(path))
    name = fresh_name(SafetensorsWeights)
    tensors = {k: [find(t[0]).tag, list(t[1])] for k, (_, t) in found.items()}
    tree = Tagged("!SafetensorsWeights", {"tensors": tensors, "xser_subcol_name": name})
    text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": os.path.basename(source.rstrip("/")), "experiment": tree})
    arrays = {k: (_stream(path, k, t) if format == "npy" else _whole(path, k, t), True) for k, (path, t) in found.items()}
    meta = {"training": {"imported_from": os.path.abspath(source), "files": [os.path.basename(p) for p in files]}}
    formats = {f"{name}/*": format} if format != "npy" else None
    write_new_model(out, [Snapshot(text, {name: arrays}, meta, formats or {})], SaveOptions(durable), force=force)
    return name


def _whole(path: str, key: str, t: tuple) -> Lazy:
    """One tensor read when its turn to be written comes (for output formats that take whole arrays)."""
    dtype, shape = t[0], tuple(t[1])

    def take(index: tuple | None = None) -> np.ndarray:
        with open(path, "rb") as f:
            a = SAFETENSORS.read(f, path, dtype, shape, os.fstat(f.fileno()).st_size, mmap=False, verify=None, key=key)
        return a if index is None else a[index]

    return Lazy(dtype, shape, take)


def _stream(path: str, key: str, t: tuple) -> Stream:
    dtype, shape = t[0], tuple(t[1])

    def chunks():
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for piece in SAFETENSORS.chunks(f, path, dtype, shape, size, CHUNK_ELEMENTS, key=key):
                yield piece.view(np.uint8)

    return Stream(dtype, shape, False, chunks)

