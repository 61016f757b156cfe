"""RecIS checkpoint directories (v2), both ways, without RecIS: the layout only (``docs/research/formats.md`` §3).

A directory holds ``model-%06d-of-%06d.safetensors`` files (numbered ``shard * parallel + writer``
of ``shards * parallel``, with gaps where a writer had no block), ``index`` (compact JSON, sorted
keys: ``{"block_index": {block: file idx}, "file_index": {file: idx}}``), ``tensorkey.json``
(indent 4: on-disk sparse block name -> internal name ``<t>@<part>^<begin>@<end>@<size>``) and
``torch_rank_weights_embs_table_multi_shard.json`` (indent 4, one entry per block). Hash-table
blocks are ``<t>.<part>/part_<shard>_<shards>`` (an id block, then ``embedding`` and the slots,
rows in id order); dense blocks are ``<name>^ ``. RecIS writes bool as ``"bool"``, which its own
reader cannot read back; xser writes ``BOOL`` and reads both.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs
import numpy as np

from ..errors import DataError, Location
from .dtypes import DTYPES
from .formats.safetensors import parse_header, read_at
from .jsonlimit import NotJSON, loads_limited
from .source import open_source
from .stores import Store, store_for

__all__ = ["INDEX", "RANK_JSON", "TENSORKEY", "RecisBlock", "gen_slice", "read_block", "read_capped", "read_layout", "slice_string",
           "tensors"]

INDEX = "index"
TENSORKEY = "tensorkey.json"
RANK_JSON = "torch_rank_weights_embs_table_multi_shard.json"
SLICE_SIZE = 65536
_INTERNAL = re.compile(r"(.+)@([^@^]+)\^([0-9]+)@([0-9]+)@([0-9]+)")


def gen_slice(shard: int, shards: int, size: int = SLICE_SIZE) -> tuple[int, int, int]:
    """RecIS's ``gen_slice``: ``size`` split into ``shards`` runs, the first ``size % shards`` one longer."""
    base, extra = divmod(size, shards)
    begin = shard * base + min(shard, extra)
    return begin, begin + base + (1 if shard < extra else 0), size


def slice_string(begin: int, end: int, size: int) -> str:
    """``00000@32768@65536``: begin and end zero-padded to the width of size."""
    w = len(str(size))
    return f"{begin:0{w}d}@{end:0{w}d}@{size}"


@attrs.frozen
class RecisBlock:
    key: str  # the block's name in its safetensors file and in the index
    file: str  # path of the file
    dtype: np.dtype
    shape: tuple
    offset: int  # absolute, in the file
    tensor: str  # RecIS's internal tensor name: "emb@id", "emb@embedding", or a dense name
    slice: tuple | None  # (begin, end, size) of a hash-table block, None for dense
    store: Any = attrs.field(default=None, eq=False, repr=False)  # the store holding ``file`` (None: ``store_for(file)``)


def read_capped(path: str, cap: int = 64 << 20, store: Store | None = None, missing: str | None = None) -> bytes:
    """A small metadata file, whole; one larger than ``cap`` is refused before anything is allocated, and a FIFO or
    other special file is refused, not waited for. ``missing``: the message when the file is not there."""
    with open_source(store or store_for(path), path, "the metadata file", missing=missing) as f:
        size = f.size
        if size > cap:
            raise DataError(f"file of {size} bytes: larger than {cap} bytes, the limit for this metadata", Location(path))
        return f.read(size)


def _json(path: str, what: str, store: Store) -> Any:
    raw = read_capped(path, store=store, missing=f"{what} is missing: not a RecIS checkpoint directory")
    try:
        return loads_limited(raw, path, what)
    except NotJSON:
        if what == "index" and raw and all(line.strip() for line in raw.decode("utf-8", "replace").splitlines()):
            raise DataError("a RecIS v1 checkpoint (its index lists files, one per line): convert it with RecIS's "
                            "tools/convert_v1_to_v2.py first", Location(path)) from None
        raise


def read_layout(directory: str, store: Store | None = None) -> list[RecisBlock]:
    """Every block of a RecIS v2 checkpoint directory (on ``store``, by default the one its path names), checked (files
    inside the directory, headers, names)."""
    st = store or store_for(directory)
    index_path, tensorkey_path = st.join(directory, INDEX), st.join(directory, TENSORKEY)
    index = _json(index_path, "index", st)
    if not isinstance(index, dict) or not isinstance(index.get("block_index"), dict) or not isinstance(index.get("file_index"), dict):
        raise DataError('index must be {"block_index": {...}, "file_index": {...}}', Location(index_path))
    names = _json(tensorkey_path, "tensorkey.json", st)
    if not isinstance(names, dict):
        raise DataError("tensorkey.json must map block names to tensor names", Location(tensorkey_path))
    files: dict[int, str] = {}
    for name, idx in index["file_index"].items():
        if not isinstance(name, str) or os.path.basename(name) != name or name in (".", "..") or type(idx) is not int:
            raise DataError(f"index names file {name!r} (index {idx!r}) outside the directory", Location(index_path))
        files[idx] = st.join(directory, name)
    headers: dict[str, tuple[dict, int]] = {}
    out = []
    for key, idx in index["block_index"].items():
        file = files.get(idx) if type(idx) is int else None
        if file is None:
            raise DataError(f"block {key!r} names file index {idx!r}, which the index does not list", Location(index_path))
        if file not in headers:
            with open_source(st, file, "the RecIS data file", missing="a file the index names is missing") as f:
                headers[file] = parse_header(f, file, aliases={"bool": "BOOL"})
        head, start = headers[file]
        t = head.get(key)
        if t is None or key == "__metadata__":
            raise DataError(f"block {key!r} is not in its file", Location(file))
        if key.endswith("^ "):
            tensor, sl = key[:-2], None
        else:
            m = _INTERNAL.fullmatch(str(names.get(key, "")))
            if m is None:
                raise DataError(f"block {key!r} has no internal name in tensorkey.json (got {names.get(key)!r})",
                                Location(tensorkey_path))
            tensor, sl = f"{m.group(1)}@{m.group(2)}", (int(m.group(3)), int(m.group(4)), int(m.group(5)))
        out.append(RecisBlock(key, file, t[0], tuple(t[1]), start + t[2], tensor, sl, st))
    return out


def read_block(b: RecisBlock, rows: tuple[int, int] | None = None) -> np.ndarray:
    return read_at(b.file, b.offset, b.dtype, b.shape, rows, store=b.store)


def tensors(blocks: list[RecisBlock]) -> dict[str, list[RecisBlock]]:
    """``{internal tensor name: its blocks}``, a table's slices in slice order (how RecIS's reader puts them together)."""
    out: dict[str, list[RecisBlock]] = {}
    for b in blocks:
        out.setdefault(b.tensor, []).append(b)
    for bs in out.values():
        bs.sort(key=lambda b: b.slice or (0, 0, 0))
    return out


TORCH_NAMES = {d.safetensors: d.torch for d in DTYPES.values() if d.safetensors}
