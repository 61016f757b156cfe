"""RecIS checkpoints: export an xser model as a directory RecIS's ``Loader`` and ``CheckpointReader`` read,
and import such a directory (``storage/recis_layout.py`` has the layout).

Hash tables become RecIS hash tables named by component path and table name (``model.emb``, or
``emb`` at the root); every other array is a dense tensor named by its flat key. ``shards`` plays
RecIS's number of GPUs (each shard holds the ids whose ``id % 65536`` falls in its ``gen_slice``)
and ``parallel`` its writer threads per shard: blocks are dealt round-robin to the writers, and a
writer with no block writes no file (numbering keeps RecIS's gaps). Dense tensors go to shard 0.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs
import numpy as np

from . import refuse_existing, takes_storage_options, writes_files
from ..storage.progress import advance, progress
from ..storage.stores import store_for
from ..errors import DataError, Location
from ..model.params import fresh_name, params
from ..model.registry import serializable
from ..model.serialize import subcols_by_path
from ..model.tables import SEP
from ..storage.dtypes import find, resolve
from ..storage.listing import Best, selector
from ..storage.replace import replaced_output, staged_file
from ..storage.payloads import Lazy
from ..storage.formats.safetensors import safetensors_tag
from ..storage.recis_layout import INDEX, RANK_JSON, TENSORKEY, TORCH_NAMES, gen_slice, read_block, read_layout, slice_string, tensors

__all__ = ["RecisModel", "export_recis", "import_recis", "render_files"]


@serializable(tag="!RecisModel")
class RecisModel:
    """A RecIS checkpoint's contents: hash tables ``{name: {dim, dtype, slots}}`` and dense tensors ``{name: [dtype, shape]}``."""

    tables: dict
    dense: dict

    def __attrs_post_init__(self):
        p = params(self)
        self.hash_tables = {
            n: p.add_table(n, tuple(t["dim"]), dtype=resolve(t["dtype"]), slots=tuple(t.get("slots", ())))
            for n, t in self.tables.items()
        }
        self.tensors = {n: p.add(n, tuple(shape), dtype=resolve(dtype)) for n, (dtype, shape) in self.dense.items()}


@attrs.frozen
class Block:
    key: str  # name in the file and the index
    array: Any  # np.ndarray or Lazy
    dense: bool
    internal: str | None = None  # tensorkey.json's value for sparse blocks


def _header(blocks: list[Block]) -> tuple[bytes, dict]:
    """RecIS's header: ordered compact JSON in block order, padded with 8 - len % 8 spaces; and the per-block metas."""
    meta, metas, offset = {}, {}, 0
    for b in blocks:
        n = int(np.prod(b.array.shape, dtype=np.int64)) * np.dtype(b.array.dtype).itemsize
        meta[b.key] = {"dtype": safetensors_tag(np.dtype(b.array.dtype)), "shape": [int(s) for s in b.array.shape], "data_offsets": [offset, offset + n]}
        metas[b.key] = dict(meta[b.key], dense=b.dense)
        offset += n
    text = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (8 - len(text) % 8)
    return len(text).to_bytes(8, "little") + text, metas


def _rank_entry(key: str, m: dict) -> dict:
    m = dict(m)
    if m["dense"]:
        del m["data_offsets"]
        m.update(name=key, dtype=TORCH_NAMES[m["dtype"]], dimension=0, is_hashmap=False)
    elif ".embedding" in key:
        del m["data_offsets"]
        m.update(name=key, dtype=TORCH_NAMES[m["dtype"]], dimension=m["shape"][-1], hashmap_key=key.replace(".embedding", ".id"),
                 hashmap_key_dtype="int64", hashmap_value=key, is_hashmap=True)
    return m


def render_files(tables: dict[str, dict[str, Any]], dense: dict[str, Any], *, shards: int = 1, parallel: int = 4) -> dict[str, Any]:
    """``{file name: bytes or [header, arrays...]}`` of a RecIS directory: the data files (as header plus arrays, written
    in order) and the three JSON files. ``tables``: ``{name: {"id": ids, "embedding": rows, slot: rows}}`` in id order."""
    if shards < 1 or parallel < 1:
        raise DataError(f"shards and parallel must be >= 1, got {shards} and {parallel}")
    files: dict[str, Any] = {}
    file_index: dict[str, int] = {}
    block_index: dict[str, int] = {}
    tensorkey: dict[str, str] = {}
    rank: dict[str, dict] = {}
    for shard in range(shards):
        begin, end, size = gen_slice(shard, shards)
        blocks: list[Block] = []
        for name, parts in tables.items():
            ids = parts["id"]
            keep = np.flatnonzero(((ids.view(np.uint64) % np.uint64(size)) >= np.uint64(begin)) & ((ids.view(np.uint64) % np.uint64(size)) < np.uint64(end)))
            for part, arr in parts.items():
                key = f"{name}.{part}/part_{shard}_{shards}"
                blocks.append(Block(key, arr[keep], False, f"{name}@{part}^{slice_string(begin, end, size)}"))
        if shard == 0:
            blocks += [Block(f"{name}^ ", arr, True) for name, arr in dense.items()]
        writers: list[list[Block]] = [[] for _ in range(parallel)]
        order: list[int] = []  # writers in the order they first get a block (RecIS's file_index order)
        for i, b in enumerate(blocks):
            w = i % parallel
            if not writers[w]:
                order.append(w)
            writers[w].append(b)
        base = len(file_index)
        for rank_in_shard, w in enumerate(order):
            fname = f"model-{shard * parallel + w:06d}-of-{shards * parallel:06d}.safetensors"
            file_index[fname] = base + rank_in_shard
            header, metas = _header(writers[w])
            files[fname] = [header] + [b.array for b in writers[w]]
            for b in writers[w]:
                block_index[b.key] = base + rank_in_shard
                rank[b.key] = _rank_entry(b.key, metas[b.key])
                if b.internal is not None:
                    tensorkey[b.key] = b.internal
    files[INDEX] = json.dumps({"block_index": block_index, "file_index": file_index}, sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False).encode("utf-8")
    files[TENSORKEY] = json.dumps(tensorkey, sort_keys=True, indent=4, ensure_ascii=False).encode("utf-8")
    files[RANK_JSON] = json.dumps(rank, sort_keys=True, indent=4, ensure_ascii=False).encode("utf-8")
    return files


def _contents(data: Any, experiment: Any) -> tuple[dict, dict]:
    """A checkpoint's hash tables and dense arrays, by RecIS name (arrays read when the files are written)."""
    placed = {sub: path for path, sub in subcols_by_path(experiment).items()}
    tables: dict[str, dict[str, Any]] = {}
    dense: dict[str, Any] = {}
    for sub, entries in data.subcollections.items():
        where = placed.get(sub, sub)
        for name, e in entries.items():
            table, sep, part = name.partition(SEP)
            full = f"{where}.{table if sep else name}" if where else (table if sep else name)
            arr = data.read(e, verify=True)
            if sep:
                tables.setdefault(full, {})[part] = arr
            else:
                dense[full] = arr
    for name, parts in tables.items():  # RecIS order: ids, embedding, then the slots
        ids = parts["id"]
        if ids.size > 1 and not (ids[1:] > ids[:-1]).all():  # saved by several ranks: one sorted run each
            order = np.argsort(ids, kind="stable")
            parts = {p: a[order] for p, a in parts.items()}
        tables[name] = {"id": parts.pop("id"), "embedding": parts.pop("embedding"), **parts}
    return tables, dense


@takes_storage_options
@writes_files
def export_recis(model: str | os.PathLike, out: str | os.PathLike, *, checkpoint: int | str | Best = 0, metric: str | None = None,
                 mode: str = "max", shards: int = 1, parallel: int = 4, force: bool = False, model_pt: bool = True,
                 storage_options: dict | None = None) -> list[str]:
    """Write ``model``'s checkpoint as a RecIS directory ``out`` (written beside it, then renamed into place).
    ``checkpoint``, ``metric`` and ``mode`` select a checkpoint as for ``xser.load``. ``out`` may be a URL (``s3://``,
    ``memory://``, ...; ``storage_options`` go to its filesystem): the files are uploaded, ``index`` last (not atomic
    as a set there: see docs/interop.md).

    With torch installed (and ``model_pt``), dense tensors also go to ``model.pt`` (a ``torch.save`` of a dict of
    tensors: a pickle of tensors only, loadable with ``weights_only=True``), as RecIS's CheckpointManager writes it.
    """
    from ..api import retrying
    from ..spec.saved import open_saved

    model, out = os.fspath(model), os.fspath(out)
    which = selector(checkpoint, metric, mode, model)
    store = store_for(out)
    refuse_existing(out, force, store)

    def once() -> list[str]:
        with open_saved(model, which) as saved:
            tables, dense = _contents(saved.data, saved.experiment)
        files = render_files(tables, dense, shards=shards, parallel=parallel)
        with replaced_output(out, store=store, last=(INDEX,)) as staging:
            total = sum(a.nbytes for t in tables.values() for a in t.values()) + sum(a.nbytes for a in dense.values())
            with progress(total, "exporting"):
                for name, body in files.items():
                    with staged_file(os.path.join(staging, name)) as f:
                        for piece in [body] if isinstance(body, bytes) else body:
                            raw = piece if isinstance(piece, bytes) else np.ascontiguousarray(piece).astype(piece.dtype.newbyteorder("<"), copy=False).tobytes()
                            f.write(raw)
                            advance(len(raw))
            if model_pt and dense:
                _model_pt(os.path.join(staging, "model.pt"), dense)
        return [store.join(out, n) for n in store.listdir(out)]

    return retrying(model, once)


def _model_pt(path: str, dense: dict[str, np.ndarray]) -> None:
    """``torch.save`` of ``{name: tensor}`` (tensors only: no code is pickled), when torch is installed."""
    try:
        import torch
    except ImportError:
        return
    out = {}
    for name, a in dense.items():
        a = np.ascontiguousarray(a)
        d = find(a.dtype)
        if d is not None and d.extension:
            out[name] = torch.from_numpy(a.view(np.int16 if a.dtype.itemsize == 2 else np.uint8).copy()).view(getattr(torch, d.torch))
        else:
            out[name] = torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True))
    torch.save(out, path)


@takes_storage_options
def import_recis(directory: str | os.PathLike, out: str | os.PathLike, *, force: bool = False, durable: bool = True,
                 storage_options: dict | None = None) -> str:
    """Make an xser model (one ``!RecisModel``) of a RecIS v2 checkpoint directory; returns its subcollection name.

    A table's slices are put together in slice order; its ids must be unique across slices. ``directory`` may be a
    URL (``s3://``, ``memory://``, ...; ``storage_options`` go to its filesystem): only the blocks' bytes are read.
    """
    from . import where_from

    from ..checkpoints.newmodel import write_new_model
    from ..checkpoints.saver import SaveOptions
    from ..checkpoints.snapshot import Snapshot
    from ..spec import Tagged, dump
    from ..spec.saved import SPEC_FORMAT, spec_header

    directory, out = os.fspath(directory), os.fspath(out)
    store = store_for(directory)
    blocks = read_layout(directory, store)
    tables: dict[str, dict[str, list]] = {}
    dense: dict[str, Any] = {}
    for tensor, bs in tensors(blocks).items():  # a table's slices in slice order
        if bs[0].slice is None:
            if len(bs) > 1:
                raise DataError(f"tensor {tensor!r} is both a dense block and a hash-table slice ({', '.join(repr(b.key) for b in bs)})",
                                Location(directory))
            dense[tensor] = bs[0]
        else:
            table, _, part = tensor.partition("@")
            tables.setdefault(table, {})[part] = bs
    arrays: dict[str, tuple[Any, bool]] = {}
    spec_tables, spec_dense = {}, {}
    for name, parts in tables.items():
        if "id" not in parts or "embedding" not in parts:
            raise DataError(f"hash table {name!r} lacks its id or embedding blocks", Location(directory))
        _check_table(name, parts, directory)
        ids = np.concatenate([read_block(b) for b in parts["id"]]) if parts["id"] else np.empty(0, np.int64)
        order = np.argsort(ids, kind="stable")
        if ids.size > 1 and (ids[order][1:] == ids[order][:-1]).any():
            raise DataError(f"hash table {name!r}: an id is in two slices", Location(directory))
        arrays[f"{name}@id"] = (ids[order], False)
        row_shape = parts["embedding"][0].shape[1:]
        dtype = parts["embedding"][0].dtype
        for part, bs in parts.items():
            if part == "id":
                continue
            if any(b.shape[1:] != row_shape or b.dtype != dtype for b in bs):
                raise DataError(f"hash table {name!r}: part {part!r} has rows of another shape or dtype than its embedding", Location(directory))
            arrays[f"{name}@{part}"] = (_gathered(bs, order, row_shape, dtype), part == "embedding")
        spec_tables[name] = {"dim": list(row_shape), "dtype": find(dtype).tag, "slots": [p for p in parts if p not in ("id", "embedding")]}
    for name, b in dense.items():
        arrays[name] = (_lazy(b), True)
        spec_dense[name] = [find(b.dtype).tag, list(b.shape)]
    sub = fresh_name(RecisModel)
    tree = Tagged("!RecisModel", {"tables": spec_tables, "dense": spec_dense, "xser_subcol_name": sub})
    text = spec_header(out) + dump({"xser_format": SPEC_FORMAT, "name": store.basename(directory.rstrip("/")), "experiment": tree})
    meta = {"training": {"imported_from": where_from(directory), "recis_blocks": len(blocks)}}
    write_new_model(out, [Snapshot(text, {sub: arrays}, meta)], SaveOptions(durable), force=force)
    return sub


def _check_table(name: str, parts: dict[str, list], directory: str) -> None:
    """Every part of a hash table has the slices its ids have, each block as many rows as its slice's ids."""
    ids = parts["id"]
    for b in ids:
        if len(b.shape) != 1 or np.dtype(b.dtype) != np.int64:
            raise DataError(f"hash table {name!r}: id block {b.key!r} is {find(b.dtype).tag if find(b.dtype) else b.dtype} of shape "
                            f"{list(b.shape)}; ids are a 1-D int64 array", Location(directory))
    slices = [b.slice for b in ids]
    for part, bs in parts.items():
        if [b.slice for b in bs] != slices:
            raise DataError(f"hash table {name!r}: part {part!r} has the slices {[b.slice for b in bs]}, its ids {slices}",
                            Location(directory))
        for b, i in zip(bs, ids):
            if len(b.shape) < 1 or b.shape[0] != i.shape[0]:
                rows = b.shape[0] if b.shape else "no"
                raise DataError(f"hash table {name!r}: block {b.key!r} holds {rows} rows, its slice's id block {i.key!r} "
                                f"{i.shape[0]} ids", Location(directory))


def _lazy(b: Any) -> Lazy:
    return Lazy(b.dtype, b.shape, lambda index=None: read_block(b) if index is None else read_block(b)[index])


def _gathered(bs: list, order: np.ndarray, row_shape: tuple, dtype: np.dtype) -> Lazy:
    """A table part's slices, concatenated and put in id order when it is written."""
    n = order.size

    def take(index=None):
        rows = np.concatenate([read_block(b) for b in bs]) if bs else np.empty((0,) + row_shape, dtype)
        out = rows[order]
        return out if index is None else out[index]

    return Lazy(dtype, (n,) + tuple(row_shape), take)
