"""The dtype table: every dtype xser stores, with its storage, safetensors and torch names and its averaging rule.

numpy's own dtypes are described in the manifest by their ``.npy`` descr (``'<f4'``). The
machine-learning dtypes numpy lacks (bfloat16, float8) are stored as raw bits (bfloat16 as
little-endian 2-byte words, float8 as bytes), so ``np.load`` of the file gives the bits, and the
manifest records their tag (``"bfloat16"``). In memory they are ``ml_dtypes`` arrays, which is
what numpy users hold them as; ``ml_dtypes`` is imported only when such a dtype is met.

Every dtype either round-trips exactly or is refused before anything is written: plain void
(raw bytes, what an ``ml_dtypes`` array looks like to numpy) and the ``ml_dtypes`` types not in
the table never reach the disk.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..errors import Frozen

__all__ = ["DTYPES", "DType", "dtype_problem", "entry_of", "find", "from_safetensors", "is_averaged", "ml_dtype", "resolve", "storage_of", "tag_of"]


class DType(Frozen):
    __slots__ = ("tag", "storage", "safetensors", "torch", "average", "extension")
    tag: str  # the name: numpy's, torch's and ml_dtypes' own
    storage: np.dtype  # what the .npy file holds (the bits of an extension dtype)
    safetensors: str | None  # the safetensors header's dtype (None: safetensors has none)
    torch: str  # the attribute of ``torch`` (torch.bfloat16)
    average: str | None  # the precision it is averaged in (None: copied from the newest checkpoint)
    extension: bool  # not a numpy dtype: ml_dtypes in memory, raw bits on disk

    def __init__(self, tag: str, storage: np.dtype, safetensors: str | None, torch: str, average: str | None,
                 extension: bool = False) -> None:
        for name, value in (("tag", tag), ("storage", storage), ("safetensors", safetensors), ("torch", torch),
                            ("average", average), ("extension", extension)):
            object.__setattr__(self, name, value)


def _t(tag: str, storage: str, st: str | None, average: str | None, extension: bool = False) -> DType:
    return DType(tag, np.dtype(storage), st, tag, average, extension)


#: tag -> DType. Averaging never happens in a low precision (fairseq's bug): bf16, fp16 and fp8 go
#: through float32 at least (float64 by default), and back with round-to-nearest-even.
DTYPES: dict[str, DType] = {
    d.tag: d
    for d in (
        _t("float16", "<f2", "F16", "float32"),
        _t("float32", "<f4", "F32", "float32"),
        _t("float64", "<f8", "F64", "float64"),
        _t("bfloat16", "<u2", "BF16", "float32", True),
        _t("float8_e4m3fn", "|u1", "F8_E4M3", "float32", True),
        _t("float8_e5m2", "|u1", "F8_E5M2", "float32", True),
        _t("float8_e4m3fnuz", "|u1", "F8_E4M3FNUZ", "float32", True),
        _t("float8_e5m2fnuz", "|u1", "F8_E5M2FNUZ", "float32", True),
        _t("int8", "|i1", "I8", None),
        _t("int16", "<i2", "I16", None),
        _t("int32", "<i4", "I32", None),
        _t("int64", "<i8", "I64", None),
        _t("uint8", "|u1", "U8", None),
        _t("uint16", "<u2", "U16", None),
        _t("uint32", "<u4", "U32", None),
        _t("uint64", "<u8", "U64", None),
        _t("bool", "|b1", "BOOL", None),
        _t("complex64", "<c8", "C64", "complex64"),
        _t("complex128", "<c16", None, "complex128"),
    )
}

_BY_SAFETENSORS = {d.safetensors: d for d in DTYPES.values() if d.safetensors}
_EXTENSION_TAGS = frozenset(t for t, d in DTYPES.items() if d.extension)
_ML: dict[str, np.dtype] = {}


def _is_ml(dt: np.dtype) -> bool:
    return dt.type.__module__.split(".")[0] == "ml_dtypes"


def ml_dtype(tag: str) -> np.dtype:
    """The numpy dtype of an extension tag (``ml_dtypes.bfloat16``); an ``ImportError`` that says what to install."""
    dt = _ML.get(tag)
    if dt is None:
        try:
            ml = importlib.import_module("ml_dtypes")
        except ImportError:
            raise ImportError(f"dtype {tag} needs the ml_dtypes package in numpy: pip install ml_dtypes") from None
        dt = _ML.setdefault(tag, np.dtype(getattr(ml, tag)))
    return dt


def resolve(dtype: Any) -> np.dtype:
    """A numpy dtype from what a caller may write: a numpy dtype or type, a tag (``"bfloat16"``) or a torch
    dtype (``torch.bfloat16``). ``TypeError`` for unknown names, ``ImportError`` naming what to install."""
    if isinstance(dtype, str) and dtype in _EXTENSION_TAGS:
        return ml_dtype(dtype)
    if type(dtype).__module__ == "torch" and str(dtype).startswith("torch."):
        tag = str(dtype)[len("torch."):]
        if tag not in DTYPES:
            raise TypeError(f"torch dtype {dtype} is not in xser's dtype table")
        return ml_dtype(tag) if DTYPES[tag].extension else DTYPES[tag].storage
    return np.dtype(dtype)


_FOUND: dict[np.dtype, DType | None] = {}  # find's answers (numpy's dtype.name is slow: a load asks once per array)


def find(dt: Any) -> DType | None:
    """The table's row for a numpy dtype (any byte order of a numpy one), else None."""
    dt = np.dtype(dt)
    try:
        return _FOUND[dt]
    except KeyError:
        pass
    if dt.fields is not None or dt.subdtype is not None:
        d = None
    elif _is_ml(dt):
        d = DTYPES.get(dt.name) if dt.name in _EXTENSION_TAGS else None
    else:
        d = DTYPES.get(dt.name)
        d = d if d is not None and not d.extension else None
    if len(_FOUND) < 4096:  # (record dtypes are many in principle; the cache stays small)
        _FOUND[dt] = d
    return d


def from_safetensors(name: str) -> DType | None:
    return _BY_SAFETENSORS.get(name)


def dtype_problem(dt: np.dtype) -> str | None:
    """Why a dtype cannot be saved (None: it round-trips). Records are checked field by field."""
    if dt.hasobject:
        return "object dtypes need pickle and are not supported"
    if dt.fields is not None:
        for name in dt.names:
            why = dtype_problem(dt.fields[name][0])
            if why is not None:
                return f"field {name!r}: {why}"
        return None
    if dt.subdtype is not None:
        return dtype_problem(dt.subdtype[0])
    if _is_ml(dt):
        if dt.name in _EXTENSION_TAGS:
            return None
        supported = ", ".join(sorted(_EXTENSION_TAGS))
        return f"ml_dtypes.{dt.name} is not supported (of ml_dtypes' types xser stores {supported})"
    if dt.kind == "V":
        return f"raw void dtype {dt.str} cannot be saved (its meaning is not recorded); view it as uint8 or a record dtype"
    return None


def storage_of(dt: np.dtype) -> np.dtype:
    """The dtype the ``.npy`` file holds: the bits of an extension dtype, the dtype itself otherwise."""
    if dt.kind in "Vf" and dt.fields is None and _is_ml(dt):
        d = DTYPES.get(dt.name)
        if d is not None and d.extension:
            return d.storage
    return dt


def tag_of(dt: np.dtype) -> str | None:
    """The manifest's tag of an extension dtype (None for numpy's own, described by their descr)."""
    if dt.fields is None and _is_ml(dt) and dt.name in _EXTENSION_TAGS:
        return dt.name
    return None


def entry_of(value: Any) -> np.dtype | None:
    """A manifest dtype that is an extension tag, as its numpy dtype (None if ``value`` is not a tag)."""
    if isinstance(value, str) and value in _EXTENSION_TAGS:
        return ml_dtype(value)
    return None


def is_averaged(dt: np.dtype) -> bool:
    """Floating-point (real or complex) arrays are averaged; integers, bools and records are copied."""
    if dt.fields is not None:
        return False
    d = find(dt)
    if d is not None:
        return d.average is not None
    return dt.kind in "fc"


def round_into(out: np.ndarray, acc: np.ndarray) -> None:
    """``out[...] = acc`` rounded once, to nearest with ties to even, whatever the two dtypes.

    numpy and ml_dtypes convert float64 to bfloat16 and float8 through float32, which rounds twice
    (1 + 2**-8 + 2**-30 becomes 1, not 1 + 2**-7). Rounding to float32 *to odd* first and then to
    nearest-even is exact whenever float32 has two more bits than the target, as it has here.
    """
    if not (acc.dtype == np.float64 and tag_of(out.dtype) is not None):
        np.copyto(out, acc, casting="unsafe")
        return
    r = acc.astype(np.float32)
    back = r.astype(np.float64)
    with np.errstate(invalid="ignore"):
        inexact = (back != acc) & ~np.isnan(acc)
    if inexact.any():
        bits = r.view(np.uint32)
        away = inexact & (np.abs(back) > np.abs(acc))  # rounded away from zero: step back to the truncation
        bits[away] -= np.uint32(1)
        bits[inexact] |= np.uint32(1)  # odd: remembers that bits were dropped
    np.copyto(out, r, casting="unsafe")
