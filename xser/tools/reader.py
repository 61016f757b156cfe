"""One reader for every kind of saved model: ``xser.CheckpointReader``.

xser models (every format and layout: one file per array, blocks, safetensors files, packed
containers, hash tables), RecIS checkpoint directories, Hugging Face safetensors files and
sharded directories. Names are exact
(RecIS's reader matches prefixes, so ``a`` also got the blocks of ``ab``): ``<subcollection>/<param>``
for xser parameters, ``<subcollection>/<table>@id``, ``@embedding``, ``@<slot>`` for the parts of
hash tables, the keys themselves for safetensors. Opening reads only metadata (manifest or
headers); ``read_tensor`` reads one tensor, or only its ``rows``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import CheckpointError, DataError, Location, did_you_mean
from ..storage.dtypes import find
from ..storage.listing import open_checkpoint
from ..storage.opened import CheckpointVanished, check_rows
from ..storage.stores import Store, is_url, store_for
from ..storage.stores import options as storage_context

__all__ = ["CheckpointReader", "tensor_lines"]



def _tag(dtype: np.dtype) -> str:
    d = find(dtype)
    return d.tag if d is not None else dtype.str


def _is_safetensors(path: str, store: Store) -> bool:
    try:
        with contextlib.closing(store.open_read(path, "the file")) as r:
            head = r.read(9)
    except (OSError, DataError):
        return False
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 40


class CheckpointReader:
    """Tensors of a saved model by exact name, read lazily: ``tensor_names()``, ``tensor_shape(name)``,
    ``tensor_dtype(name)`` (the dtype tag, ``"float32"``, ``"bfloat16"``...), ``read_tensor(name, rows=None)``;
    as with safetensors' ``safe_open``, ``keys()``, ``name in reader`` and ``reader[name]`` (``read_tensor``).

    Opening an xser model reads its manifest and nothing else (no spec, no listing of older checkpoints, no component
    class): each tensor's entry is checked when it is first asked for, and ``read_tensor`` reads that tensor's bytes
    only (checksums are checked by ``xser.load(..., verify=True)`` and ``xser.read_params(..., verify=True)``). The
    reader holds the checkpoint open: a saver rotating or pruning checkpoints meanwhile never changes what it reads.

    ``path`` is an xser model (its spec file; ``checkpoint=k`` picks the k-th newest), a safetensors
    file, or a Hugging Face directory (``model.safetensors`` or shards with their index). Close it
    (or use ``with``) to release the checkpoint it holds open.

    ``path`` may be a URL (``s3://...``, any fsspec protocol; ``storage_options`` for its filesystem): the reader
    keeps the store it opened, so ``read_tensor`` works after the call, and reads only the bytes asked for
    (ranged GETs).
    """

    def __init__(self, path: str | os.PathLike, checkpoint: int | None = None, *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        self._data: Any = None
        self._files: dict[str, tuple[str, int]] = {}  # safetensors: name -> (file, data start)
        self._meta: dict[str, tuple[np.dtype, tuple]] = {}
        self._recis: dict[str, list] = {}
        with storage_context(storage_options):
            self._store = store_for(self.path)
            self._open(checkpoint)
        self.kind = "xser" if self._data is not None else ("recis" if self._recis else "safetensors")

    def _open(self, checkpoint: int | None) -> None:
        st = self._store
        remote = is_url(self.path)
        isdir = st.isdir if remote else os.path.isdir
        isfile = (lambda p: st.size(p) is not None) if remote else os.path.isfile
        if isdir(self.path) and isfile(st.join(self.path, "index") if remote else os.path.join(self.path, "index")):
            if checkpoint not in (None, 0):
                raise CheckpointError("a RecIS checkpoint directory holds one checkpoint", Location(self.path))
            self._open_recis()
        elif isdir(self.path) or (isfile(self.path) and _is_safetensors(self.path, st)):
            if checkpoint not in (None, 0):
                raise CheckpointError("a safetensors file or directory holds one checkpoint", Location(self.path))
            self._open_safetensors()
        else:  # an xser model: entries are looked up (and checked) one by one, when asked for
            self._data = open_checkpoint(self.path, checkpoint or 0, lazy=True)

    def _open_safetensors(self) -> None:
        from ..storage.hf_layout import hf_files, hf_tensors  # (here and below: imported by the kind of model that needs it)

        for key, (file, dtype, shape, offset, _) in hf_tensors(hf_files(self.path, self._store), self._store).items():
            self._meta[key] = (dtype, shape)
            self._files[key] = (file, offset)

    def _open_recis(self) -> None:
        """RecIS's names: ``emb@id``, ``emb@embedding``, ``emb@<slot>`` (slices put together in slice order), dense names."""
        from ..storage.recis_layout import read_layout, tensors

        self._recis = tensors(read_layout(self.path, self._store))
        for name, bs in self._recis.items():
            if any(b.dtype != bs[0].dtype or b.shape[1:] != bs[0].shape[1:] for b in bs):
                raise DataError(f"tensor {name!r}: its slices differ in dtype or row shape", Location(self.path))
            self._meta[name] = (bs[0].dtype, (sum(b.shape[0] for b in bs),) + tuple(bs[0].shape[1:]) if bs[0].shape else ())

    # -- the API
    def tensor_names(self) -> list[str]:
        if self._data is not None:
            return sorted(f"{sub}/{n}" for sub, params in self._data.subcollections.items() for n in params)
        return sorted(self._meta)

    def _known(self, name: str) -> tuple[np.dtype, tuple]:
        if self._data is not None:
            sub, _, param = str(name).partition("/")
            if name in self:
                e = self._data.subcollections[sub][param]
                return e.dtype, tuple(e.shape)
            raise DataError(f"no tensor {name!r}{did_you_mean(str(name), self.tensor_names())}", Location(self.path))
        got = self._meta.get(name)
        if got is None:
            raise DataError(f"no tensor {name!r}{did_you_mean(str(name), self._meta)}", Location(self.path))
        return got

    def keys(self) -> list[str]:
        """``tensor_names()``, as ``safe_open``'s ``keys()``."""
        return self.tensor_names()

    def __contains__(self, name: object) -> bool:
        if self._data is not None:
            sub, _, param = str(name).partition("/")
            return param in self._data.subcollections.get(sub, ())
        return name in self._meta

    def __getitem__(self, name: str) -> np.ndarray:
        """``read_tensor(name)``."""
        return self.read_tensor(name)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._known(name)[1]

    def tensor_dtype(self, name: str) -> str:
        return _tag(self._known(name)[0])

    def read_tensor(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The tensor (a copy in memory), or only rows ``first:stop`` of its first dimension."""
        dtype, shape = self._known(name)
        if self._data is not None:
            sub, _, param = name.partition("/")
            try:
                return self._data.read(self._data.subcollections[sub][param], rows=rows)
            except CheckpointVanished:
                raise CheckpointError("the checkpoint was removed (pruned) while the reader held it; open a new reader",
                                      Location(self._data.path)) from None
        if rows is not None:
            rows = check_rows(_Entry(name, shape), rows)
        if self._recis:
            from ..storage.recis_layout import read_block

            whole = np.concatenate([read_block(b) for b in self._recis[name]]) if shape else read_block(self._recis[name][0])
            return whole if rows is None else whole[rows[0] : rows[1]].copy()
        from ..storage.formats.safetensors import read_at

        file, offset = self._files[name]
        return read_at(file, offset, dtype, shape, rows, store=self._store)

    def close(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data = None

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        n = len(self.tensor_names()) if self._data is not None else len(self._meta)
        return f"<CheckpointReader {self.path} ({self.kind}, {n} tensors)>"


class _Entry:
    """What ``check_rows`` needs to know of a tensor."""

    def __init__(self, name: str, shape: tuple) -> None:
        self.subcol, self.name, self.shape = "", name, shape


def tensor_lines(path: str | os.PathLike, checkpoint: int | None = None, *,
                 storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Any saved model's tensors through ``CheckpointReader``: name, shape, dtype tag, bytes (metadata only)."""
    with CheckpointReader(path, checkpoint, storage_options=storage_options) as r:
        names = r.tensor_names()
        width = max((len(n) for n in names), default=0)
        out = [f"{r.kind} model {os.fspath(path)}: {len(names)} tensors"]
        total = 0
        for n in names:
            shape, tag = r.tensor_shape(n), r.tensor_dtype(n)
            size = int(np.prod(shape, dtype=np.int64)) * r._known(n)[0].itemsize
            total += size
            out.append(f"  {n:<{width}}  {shape!r:<16} {tag:<10} {size:>14,} B")
        out.append(f"  total {total:,} B")
    return out
