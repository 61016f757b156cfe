"""Writing a manifest's JSON fast: one C encoder for every entry, dtype descriptions remembered per dtype.

``render_manifest`` writes one line per parameter entry (diffable and readable by eye), each line exactly what
``json.dumps(entry, ensure_ascii=False, allow_nan=True)`` gives, without that call's per-call set-up.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .formats.npy import describe_dtype

__all__ = ["descr", "render_manifest"]

_DESCRS: dict[np.dtype, str] = {}


def descr(dtype: np.dtype) -> Any:
    """``describe_dtype``, remembered per dtype for the plain ones (a record's list is made afresh)."""
    got = _DESCRS.get(dtype)
    if got is None:
        got = describe_dtype(dtype)
        if isinstance(got, str):
            _DESCRS[dtype] = got
    return got


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, allow_nan=True)


def _encoder() -> Any:
    """``json.dumps(v, ensure_ascii=False, allow_nan=True)`` without its per-call set-up (one C encoder made once,
    used for every entry of a manifest); ``json.dumps`` itself where the C encoder is missing or differs."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _dumps
    try:
        it = make(None, _refuse, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)
        enc = lambda v: "".join(it(v, 0))  # noqa: E731
        sample = {"dtype": "<f4", "shape": [1, 2], "trainable": True, "x": [None, 1.5, float("nan"), "é\"\n"], "y": {}}
        return enc if enc(sample) == _dumps(sample) else _dumps
    except Exception:  # noqa: BLE001 - another Python's private encoder: the public one
        return _dumps


def _refuse(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


_ENCODE = _encoder()


def render_manifest(manifest: dict) -> str:
    """JSON with one line per parameter entry: diffable and readable by eye."""
    enc = _ENCODE
    lines = ["{"]
    for key, value in manifest.items():
        if key != "subcollections":
            lines.append(f"  {enc(key)}: {enc(value)},")
    subs = manifest["subcollections"]
    lines.append('  "subcollections": {' + ("" if subs else "}"))
    for i, (sub, params) in enumerate(subs.items()):
        end = "," if i < len(subs) - 1 else ""
        if not params:
            lines.append(f"    {enc(sub)}: {{}}{end}")
            continue
        lines.append(f"    {enc(sub)}: {{")
        for j, (pname, entry) in enumerate(params.items()):
            lines.append(f"      {enc(pname)}: {enc(entry)}" + ("," if j < len(params) - 1 else ""))
        lines.append("    }" + end)
    if subs:
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


