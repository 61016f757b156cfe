"""Hugging Face safetensors layouts, read side: a file, a directory with ``model.safetensors``, or a sharded
directory with ``model.safetensors.index.json``. Used by the importer and by ``CheckpointReader``."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import DataError, Location
from .formats.safetensors import parse_header
from .recis_layout import read_capped

__all__ = ["INDEX", "SINGLE", "hf_files", "hf_tensors"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def hf_files(path: str) -> list[str]:
    """The safetensors files of ``path``: itself, the directory's ``model.safetensors``, or its index's shards."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise DataError("no such file or directory", Location(path))
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            wm = json.loads(read_capped(index).decode("utf-8"))["weight_map"]
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise ValueError("weight_map must map keys to file names")
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
            raise DataError(f"not a safetensors index: {e}", Location(index)) from None
        files = list(dict.fromkeys(wm.values()))
        for name in files:
            if os.path.basename(name) != name or name in (".", ".."):
                raise DataError(f"index names {name!r}, which is not a file of this directory", Location(index))
        return [os.path.join(path, n) for n in files]
    single = os.path.join(path, SINGLE)
    if os.path.isfile(single):
        return [single]
    raise DataError(f"not a model directory: neither {INDEX} nor {SINGLE} is in it; pass a saved xser model's .yaml file "
                    "(MODEL.yaml, beside MODEL.yaml.data/), a RecIS checkpoint directory or a Hugging Face safetensors directory",
                    Location(path))


def hf_tensors(files: list[str]) -> dict[str, tuple[str, Any, tuple, int, tuple]]:
    """``{key: (file, dtype, shape, absolute offset, parsed header entry)}`` of every tensor of the files, each key once."""
    found: dict[str, tuple[str, Any, tuple, int, tuple]] = {}
    for file in files:
        try:
            with open(file, "rb") as f:
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
