"""Hugging Face safetensors layouts, read side: a file, a directory with ``model.safetensors``, or a sharded
directory with ``model.safetensors.index.json``. Used by the importer and by ``CheckpointReader``."""

from __future__ import annotations

import os
from typing import Any

from ..errors import DataError, Location
from .formats.safetensors import parse_header
from .jsonlimit import loads_limited
from .recis_layout import read_capped
from .source import open_source
from .stores import Store, store_for

__all__ = ["INDEX", "KEPT_SUFFIXES", "SINGLE", "hf_files", "hf_side_files", "hf_tensors"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _there(store: Store, path: str) -> bool:
    """``path`` is a file or a directory (following links; on an object store: an object or a prefix of some)."""
    return store.isdir(path) or store.size(path) is not None


def hf_files(path: str, store: Store | None = None) -> list[str]:
    """The safetensors files of ``path`` (on ``store``, by default the one its path names): itself, the directory's
    ``model.safetensors``, or its index's shards."""
    st = store or store_for(path)
    if not st.isdir(path):
        if st.size(path) is None:
            raise DataError("no such file or directory", Location(path))
        with open_source(st, path, "the safetensors file"):  # a FIFO or device is refused here, never waited for
            return [path]
    index = st.join(path, INDEX)
    if _there(st, index):
        head = loads_limited(read_capped(index, store=st), index, "safetensors index")
        wm = head.get("weight_map") if isinstance(head, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise DataError('not a safetensors index: it must hold {"weight_map": {key: file name}}', Location(index))
        files = list(dict.fromkeys(wm.values()))
        for name in files:
            if os.path.basename(name) != name or name in (".", ".."):
                raise DataError(f"index names {name!r}, which is not a file of this directory", Location(index))
        return [st.join(path, n) for n in files]
    single = st.join(path, SINGLE)
    if _there(st, single):
        return [single]
    raise DataError(f"not a model directory: neither {INDEX} nor {SINGLE} is in it; pass a saved xser model's .yaml file "
                    "(MODEL.yaml, beside MODEL.yaml.data/), a RecIS checkpoint directory or a Hugging Face safetensors directory",
                    Location(path))


#: the files of a Hugging Face model directory besides its weights that an import keeps (configuration,
#: tokenizer, generation settings, chat template): ``*.json`` but the index, ``*.txt``, ``*.model`` (SentencePiece),
#: ``*.tiktoken``, ``*.jinja``
KEPT_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")


def hf_side_files(path: str, store: Store | None = None) -> tuple[list[str], list[str]]:
    """``(kept, left out)``: the configuration and tokenizer files of an HF directory (none for a single file), by
    name; left out are files with such a suffix that are not regular files (a FIFO is never opened)."""
    st = store or store_for(path)
    if not st.isdir(path):
        return [], []
    kept: list[str] = []
    skipped: list[str] = []
    for name in st.listdir(path):
        if name == INDEX or name.startswith(".") or not name.endswith(KEPT_SUFFIXES):
            continue
        (kept if _regular(st, st.join(path, name)) else skipped).append(name)
    return kept, skipped


def _regular(store: Store, path: str) -> bool:
    """A file that can be read (a local FIFO, socket, device or directory cannot: it is never opened)."""
    local = store.local_path(path)
    if local is not None and not store.remote:
        import stat

        try:
            return stat.S_ISREG(os.stat(local).st_mode)
        except OSError:
            return False
    return not store.isdir(path) and store.size(path) is not None


def hf_tensors(files: list[str], store: Store | None = None) -> dict[str, tuple[str, Any, tuple[int, ...], int, tuple[Any, ...]]]:
    """``{key: (file, dtype, shape, absolute offset, parsed header entry)}`` of every tensor of the files, each key once."""
    found: dict[str, tuple[str, Any, tuple[int, ...], int, tuple[Any, ...]]] = {}
    for file in files:
        with open_source(store or store_for(file), file, "the safetensors file", missing="a file the index names is missing") as f:
            head, start = parse_header(f, file)
        for key, t in head.items():
            if key == "__metadata__":
                continue
            if key in found:
                raise DataError(f"tensor {key!r} is in two files: {found[key][0]} and this one", Location(file))
            found[key] = (file, t[0], tuple(t[1]), start + t[2], t)
    return found
