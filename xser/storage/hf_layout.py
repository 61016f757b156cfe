"""Hugging Face safetensors layouts, read side: a file, a directory with ``model.safetensors``, or a sharded
directory with ``model.safetensors.index.json``. Used by the importer and by ``CheckpointReader``."""

from __future__ import annotations

import os
import stat
from typing import Any

from ..errors import DataError, Location
from .formats.safetensors import parse_header
from .fsutil import open_regular
from .jsonlimit import loads_limited
from .recis_layout import read_capped

__all__ = ["INDEX", "KEPT_SUFFIXES", "SINGLE", "hf_files", "hf_side_files", "hf_tensors"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", Location(path)) from None


def hf_files(path: str) -> list[str]:
    """The safetensors files of ``path``: itself, the directory's ``model.safetensors``, or its index's shards."""
    mode = _mode(path)
    if mode is None:
        raise DataError("no such file or directory", Location(path))
    if not stat.S_ISDIR(mode):
        with open_regular(path, "the safetensors file"):  # a FIFO or device is refused here, never waited for
            return [path]
    index = os.path.join(path, INDEX)
    if _mode(index) is not None:
        head = loads_limited(read_capped(index), index, "safetensors index")
        wm = head.get("weight_map") if isinstance(head, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise DataError('not a safetensors index: it must hold {"weight_map": {key: file name}}', Location(index))
        files = list(dict.fromkeys(wm.values()))
        for name in files:
            if os.path.basename(name) != name or name in (".", ".."):
                raise DataError(f"index names {name!r}, which is not a file of this directory", Location(index))
        return [os.path.join(path, n) for n in files]
    single = os.path.join(path, SINGLE)
    if _mode(single) is not None:
        return [single]
    raise DataError(f"not a model directory: neither {INDEX} nor {SINGLE} is in it; pass a saved xser model's .yaml file "
                    "(MODEL.yaml, beside MODEL.yaml.data/), a RecIS checkpoint directory or a Hugging Face safetensors directory",
                    Location(path))


#: the files of a Hugging Face model directory besides its weights that an import keeps (configuration,
#: tokenizer, generation settings, chat template): ``*.json`` but the index, ``*.txt``, ``*.model`` (SentencePiece),
#: ``*.tiktoken``, ``*.jinja``
KEPT_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")


def hf_side_files(path: str) -> tuple[list[str], list[str]]:
    """``(kept, left out)``: the configuration and tokenizer files of an HF directory (none for a single file), by
    name; left out are files with such a suffix that are not regular files (a FIFO is never opened)."""
    if _mode(path) is None or not stat.S_ISDIR(_mode(path) or 0):
        return [], []
    kept: list[str] = []
    skipped: list[str] = []
    for name in sorted(os.listdir(path)):
        if name == INDEX or name.startswith(".") or not name.endswith(KEPT_SUFFIXES):
            continue
        mode = _mode(os.path.join(path, name))
        (kept if mode is not None and stat.S_ISREG(mode) else skipped).append(name)
    return kept, skipped


def hf_tensors(files: list[str]) -> dict[str, tuple[str, Any, tuple[int, ...], int, tuple[Any, ...]]]:
    """``{key: (file, dtype, shape, absolute offset, parsed header entry)}`` of every tensor of the files, each key once."""
    found: dict[str, tuple[str, Any, tuple[int, ...], int, tuple[Any, ...]]] = {}
    for file in files:
        try:
            with open_regular(file, "the safetensors file") as f:
                head, start = parse_header(f, file)
        except FileNotFoundError:
            raise DataError("a file the index names is missing", Location(file)) from None
        for key, t in head.items():
            if key == "__metadata__":
                continue
            if key in found:
                raise DataError(f"tensor {key!r} is in two files: {found[key][0]} and this one", Location(file))
            found[key] = (file, t[0], tuple(t[1]), start + t[2], t)
    return found
