"""The manifest schema, both ways: parsing and checking ``manifest.json``, and writing it.

The manifest is a data directory's commit point (``docs/format.md`` section 2.1 is the
specification). Everything that reads or writes one goes through this module, so the schema
has one home. Parsing never trusts the file: every field is type-checked, file names are
confined to the directory, and block layouts are checked to tile their parameter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _version
from ..errors import DataError, Location, did_you_mean
from .checksums import CHECKSUMS, DEFAULT_CHECKSUM
from .formats import FORMATS, get_format
from .formats.npy import parse_dtype
from .manifest_json import descr as _descr
from .manifest_json import render_manifest
from .lazy_entries import LazyParams
from .manifest_records import Block, Manifest, ParamEntry
from .tiling import check_tiling

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "SPEC_FILE",
    "Block",
    "Manifest",
    "NewerFormatError",
    "ParamEntry",
    "block_json",
    "param_json",
    "spec_json",
    "parse_manifest",
    "render_manifest",
]

MANIFEST = "manifest.json"
SPEC_FILE = "spec.yaml"
#: 2 added ``id``, ``model`` and ``spec`` (each checkpoint carries its own spec); 3 added the tags of
#: extension dtypes (``"bfloat16"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``, the ``fnuz`` float8s), stored as their bits.
FORMAT_VERSION = 3
STATE_DIR = "training_state"


class NewerFormatError(DataError):
    """A manifest written by a newer xser: a checkpoint this version cannot read (never 'not a checkpoint')."""

    def __init__(self, message: str, location: Location | None = None, version: int = 0) -> None:
        self.version = version
        super().__init__(message, location)

    def __reduce__(self):
        return (type(self), (self.message, self.location, self.version))


# ---------------------------------------------------------------- writing


def block_json(
    file: str, fmt: str, size: int, checksum: tuple[str, str], start: tuple | None = None, shape: tuple | None = None,
    key: str | None = None, span: tuple[int, int] | None = None,
) -> dict:
    b: dict[str, Any] = {"file": file, "format": fmt, "bytes": int(size), checksum[0]: checksum[1]}
    if key is not None:
        b["key"] = key
    if span is not None:
        b["offset"], b["length"] = int(span[0]), int(span[1])
    if start is not None:
        b["start"], b["shape"] = [int(x) for x in start], [int(x) for x in shape]
    return b


def param_json(dtype: np.dtype, shape: tuple, trainable: bool, blocks: list[dict], attrs: dict | None = None) -> dict:
    out = {"dtype": _descr(dtype), "shape": [int(s) for s in shape], "trainable": bool(trainable), "blocks": blocks}
    if attrs:
        out["attrs"] = attrs
    return out


def new_manifest(meta: Mapping[str, Any], *, id: str, model: str, created: str) -> dict:
    """The top-level fields of a manifest, in the order they are written."""
    return {
        "format": "xser",
        "format_version": FORMAT_VERSION,
        "xser_version": _version.__version__,
        "id": id,
        "model": model,
        "created": created,
        "step": meta.get("step"),
        "metrics": dict(meta.get("metrics") or {}),
        "training": dict(meta.get("training") or {}),
        "custom": dict(meta.get("custom") or {}),
    }


# ---------------------------------------------------------------- reading


def parse_manifest(raw: bytes, mpath: str, *, lazy: bool = False) -> Manifest:
    """Parse and check the bytes of ``manifest.json`` (``mpath``: for messages; ``lazy``: see ``lazy_entries``)."""
    try:
        m = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"corrupt manifest: not UTF-8 ({e.reason} at byte {e.start})", Location(mpath)) from None
    except json.JSONDecodeError as e:
        raise DataError(f"corrupt manifest: {e.msg}", Location(mpath, e.lineno, e.colno)) from None
    except RecursionError:
        raise DataError("corrupt manifest: nested too deeply", Location(mpath)) from None
    return check_manifest(m, mpath, lazy)


def _bad(msg: str, mpath: str) -> DataError:
    return DataError(f"corrupt manifest: {msg}", Location(mpath))


def check_manifest(m: Any, mpath: str, lazy: bool = False) -> Manifest:
    if not isinstance(m, dict) or m.get("format") != "xser":
        raise _bad("not an xser manifest (no \"format\": \"xser\")", mpath)
    version = m.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(f"format_version must be an int >= 1, got {version!r}", mpath)
    if version > FORMAT_VERSION:
        raise NewerFormatError(
            f"format_version {version} was written by a newer xser (this is {_version.__version__}, reads <= {FORMAT_VERSION})",
            Location(mpath),
            version,
        )
    subs = m.get("subcollections")
    if not isinstance(subs, dict):
        raise _bad("\"subcollections\" must be a mapping", mpath)
    for key in ("training", "custom", "metrics"):
        if m.get(key) is not None and not isinstance(m[key], dict):
            raise _bad(f"{key!r} must be a mapping", mpath)
    for key in ("id", "model"):
        value = m.get(key)
        if version >= 2 and (not isinstance(value, str) or not value or len(value) > 64):
            raise _bad(f"{key!r} must be a non-empty string of at most 64 characters, got {value!r}", mpath)
    step = m.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise _bad(f"'step' must be an int or null, got {step!r}", mpath)
    entries: dict[str, Any] = {}
    names: dict[str, str] = {}  # file names checked already (a packed container is named by many blocks)
    for sub, params in subs.items():
        _check_name(sub, mpath)
        if "/" in sub or not isinstance(params, dict):
            raise _bad(f"subcollection {sub!r} must map parameter names to entries", mpath)
        if lazy:  # names checked now, each entry when first looked up
            entries[sub] = LazyParams(sub, params, mpath, lambda *a: _entry(*a, names), _bad)
            continue
        entries[sub] = here = {}
        for pname, e in params.items():
            here[pname] = _entry(sub, pname, e, mpath, names)
    spec = None
    if "spec" in m:
        spec = _spec_block(m["spec"], mpath)
    elif version >= 2:
        raise _bad("missing field 'spec' (the checkpoint's own spec file)", mpath)
    state, state_entries = None, {}
    if "training_state" in m:
        ts = m["training_state"]
        if not isinstance(ts, dict) or not isinstance(ts.get("arrays", {}), dict) or "tree" not in ts:
            raise _bad("training_state must be {\"tree\": ..., \"arrays\": {...}}", mpath)
        state = ts["tree"]
        state_entries = {k: _entry(STATE_DIR, k, e, mpath) for k, e in ts.get("arrays", {}).items()}
    meta = {k: v for k, v in m.items() if k != "subcollections"}
    return Manifest(version, meta, entries, spec, state, state_entries, _ranks(m, mpath))


def _ranks(m: dict, mpath: str) -> tuple:
    """``"world_size": n, "ranks": [{"training": {...}, "training_state": {...}}, ...]`` of a checkpoint saved by n
    ranks, checked."""
    if "ranks" not in m and "world_size" not in m:
        return ()
    n, ranks = m.get("world_size"), m.get("ranks")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or not isinstance(ranks, list) or len(ranks) != n:
        raise _bad(f"'world_size' must be an int >= 1 and 'ranks' a list of that many entries, got {n!r} and "
                   f"{type(ranks).__name__} of {len(ranks) if isinstance(ranks, list) else '?'}", mpath)
    out = []
    for r, entry in enumerate(ranks):
        if not isinstance(entry, dict) or not isinstance(entry.get("training", {}), dict):
            raise _bad(f"ranks[{r}] must be {{\"training\": {{...}}, \"training_state\": ...}}", mpath)
        tree, arrays = None, {}
        ts = entry.get("training_state")
        if ts is not None:
            if not isinstance(ts, dict) or not isinstance(ts.get("arrays", {}), dict) or "tree" not in ts:
                raise _bad(f"ranks[{r}].training_state must be {{\"tree\": ..., \"arrays\": {{...}}}}", mpath)
            tree = ts["tree"]
            arrays = {k: _entry(STATE_DIR, k, e, mpath) for k, e in ts.get("arrays", {}).items()}
        out.append((dict(entry.get("training", {})), tree, arrays))
    return tuple(out)


_DTYPES: dict[str, np.dtype] = {}


def _dtype(descr: Any) -> np.dtype:
    """``parse_dtype``, remembered for plain string descrs."""
    if type(descr) is str:
        got = _DTYPES.get(descr)
        if got is None:
            got = parse_dtype(descr)
            if len(_DTYPES) < 4096:
                _DTYPES[descr] = got
        return got
    return parse_dtype(descr)


def _entry(sub: str, pname: Any, e: Any, mpath: str, names: dict | None = None) -> ParamEntry:
    if not isinstance(pname, str) or not pname or "/" in pname:
        raise _bad(f"{sub}/{pname}: parameter names are non-empty strings without '/'", mpath)
    if not isinstance(e, dict):
        raise _bad(f"{sub}/{pname}: entry must be a mapping", mpath)
    try:
        dtype = _dtype(e["dtype"])
        shape = e["shape"]
        if not isinstance(shape, list):
            raise ValueError(f"bad shape {shape!r}")
        for s in shape:  # (plain ints from JSON: a bool is not one)
            if type(s) is not int or not 0 <= s < 1 << 62:
                raise ValueError(f"bad shape {shape!r}")
        shape = tuple(shape)
        blocks = e["blocks"]
        if not isinstance(blocks, list) or not blocks:
            raise ValueError("blocks must be a non-empty list")
        if len(blocks) == 1:
            parsed = (_check_block(blocks[0], shape, mpath, names),)
            if parsed[0].start is not None:
                check_tiling(parsed, shape)
        else:
            parsed = tuple([_check_block(b, shape, mpath, names) for b in blocks])
            check_tiling(parsed, shape)
        trainable = e.get("trainable", True)
        if trainable is not True and trainable is not False:
            raise ValueError(f"trainable must be true or false, got {trainable!r}")
        extra = e["attrs"] if "attrs" in e else {}
        if extra and (not isinstance(extra, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in extra.items())):
            raise ValueError("attrs must map a system's name to a mapping")
        if not isinstance(extra, dict):
            raise ValueError("attrs must map a system's name to a mapping")
    except DataError:
        raise
    except KeyError as err:
        raise _bad(f"{sub}/{pname}: missing field {err.args[0]!r}", mpath) from None
    except ImportError as err:  # an extension dtype (bfloat16) without ml_dtypes: not corrupt, but unreadable here
        raise DataError(f"{sub}/{pname}: {err}", Location(mpath)) from None
    except (TypeError, ValueError, OverflowError) as err:
        raise _bad(f"{sub}/{pname}: {err}", mpath) from None
    return ParamEntry(sub, pname, dtype, shape, trainable, parsed, extra)


def _check_name(rel: Any, mpath: str) -> str:
    if not isinstance(rel, str) or not rel:
        raise _bad(f"file name must be a non-empty string, got {rel!r}", mpath)
    parts = rel.split("/")
    if rel.startswith("/") or os.path.isabs(rel) or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise DataError(f"unsafe file name {rel!r} (must be a relative path inside the data directory)", Location(mpath))
    return rel


def spec_json(file: str, size: int, checksum: tuple[str, str]) -> dict:
    return {"file": file, "bytes": int(size), checksum[0]: checksum[1]}


def _spec_block(b: Any, mpath: str) -> Block:
    """The ``spec`` field: ``{"file": "spec.yaml", "bytes": n, "xxh3_64": hex}``."""
    try:
        if not isinstance(b, dict) or set(b) - {"file", "bytes"} - set(CHECKSUMS):
            raise ValueError("must be {\"file\", \"bytes\", and one checksum}")
        sums = [k for k in CHECKSUMS if k in b]
        if len(sums) != 1 or not isinstance(b[sums[0]], str):
            raise ValueError(f"needs exactly one checksum ({' or '.join(CHECKSUMS)})")
        int(b[sums[0]], 16)
        if not isinstance(b["bytes"], int) or isinstance(b["bytes"], bool) or not 0 <= b["bytes"] <= 1 << 30:
            raise ValueError(f"bad byte size {b['bytes']!r}")
        name = b["file"]
    except KeyError as err:
        raise _bad(f"spec: missing field {err.args[0]!r}", mpath) from None
    except (TypeError, ValueError) as err:
        raise _bad(f"spec: {err}", mpath) from None
    return Block(_check_name(name, mpath), "spec", b["bytes"], (sums[0], b[sums[0]].lower()))


_BLOCK_KEYS = frozenset({"file", "format", "bytes", "start", "shape", "key", "offset", "length"} | set(CHECKSUMS))


_PACKED_KEYS = 7  # a packed member's block: file, format, bytes, xxh3_64, key, offset, length


def _check_block(b: Any, shape: tuple, mpath: str, names: dict | None = None) -> Block:
    """One block, checked. ``names`` (one manifest's): file names checked already, and the (file, format, bytes,
    digest) of packed containers checked already, so a container's further members check only key, offset, length."""
    if names is not None and type(b) is dict and len(b) == _PACKED_KEYS:
        size = b.get("bytes")
        try:
            known = names.get((b.get("file"), b.get("format"), size, b.get(DEFAULT_CHECKSUM)))
        except TypeError:  # (a list where a string belongs: unhashable; the full check says what is wrong)
            known = None
        if known is not None and type(size) is int:
            key, offset, length = b.get("key"), b.get("offset"), b.get("length")
            if (type(key) is str and 0 < len(key) <= 1000 and type(offset) is int and type(length) is int
                    and offset >= 0 and length >= 0 and offset + length <= size):
                return Block(known[0], known[1], size, known[2], None, None, key, offset, length)
    if not isinstance(b, dict):
        raise ValueError("a block must be a mapping")
    if not b.keys() <= _BLOCK_KEYS:
        raise ValueError(f"block fields not understood by this xser: {sorted(set(b))}")
    digest, algo = b.get(DEFAULT_CHECKSUM), DEFAULT_CHECKSUM  # the usual block: xxh3_64 alone
    if type(digest) is not str or any(k in b for k in CHECKSUMS if k != algo):
        sums = [k for k in CHECKSUMS if k in b]
        if len(sums) != 1 or not isinstance(b[sums[0]], str):
            raise ValueError(f"a block needs exactly one checksum ({' or '.join(CHECKSUMS)})")
        algo = sums[0]
        digest = b[algo]
    int(digest, 16)
    fmt = b["format"]
    if fmt not in FORMATS and (not isinstance(fmt, str) or get_format(fmt) is None):
        near = did_you_mean(str(fmt), FORMATS)
        raise ValueError(f"unknown weight format {fmt!r} (known: {', '.join(sorted(FORMATS))}){near}")
    size = b["bytes"]
    if type(size) is not int or size < 0:
        raise ValueError(f"bad byte size {size!r}")
    start = bshape = None
    if "start" in b or "shape" in b:
        start, bshape = _ints(b.get("start"), "start"), _ints(b.get("shape"), "shape")
        if len(start) != len(shape) or len(bshape) != len(shape):
            raise ValueError(f"block start {list(start)} and shape {list(bshape)} must have {len(shape)} dimensions")
        if any(a + n > full for a, n, full in zip(start, bshape, shape)):
            raise ValueError(f"block at {list(start)} of shape {list(bshape)} reaches outside shape {list(shape)}")
    key = b.get("key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > 1000):
        raise ValueError(f"block key must be a non-empty string, got {key!r}")
    if key is not None and not getattr(get_format(fmt), "bundle", False):
        raise ValueError(f"a key names a tensor in a file that holds several; format {fmt!r} holds one array per file")
    offset, length = b.get("offset"), b.get("length")
    if (offset is None) != (length is None) or (offset is not None and key is None):
        raise ValueError("offset and length come together, with a key")
    if offset is not None:
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise ValueError(f"offset and length must be non-negative ints, got {offset!r} and {length!r}")
        if offset + length > size:
            raise ValueError(f"bytes {offset}..{offset + length} lie outside the file's {size}")
    file = b["file"]
    if names is None or type(file) is not str or file not in names:
        file = _check_name(file, mpath)
        if names is not None:
            names[file] = file
    if names is not None and offset is not None and start is None and algo == DEFAULT_CHECKSUM and len(b) == _PACKED_KEYS:
        names[(file, fmt, size, digest)] = (file, fmt, (algo, digest.lower()))
    return Block(file, fmt, size, (algo, digest.lower()), start, bshape, key, offset, length)


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ValueError(f"block {what} must be a list of non-negative ints, got {v!r}")
    return tuple(v)
