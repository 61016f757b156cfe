"""Tensors <-> numpy arrays through the dtype table, without copying where memory allows.

A CPU tensor becomes an array that shares its memory (bfloat16 and float8 as ``ml_dtypes``
arrays over the same bytes); an array becomes a tensor over the same memory when numpy's
layout allows it (native byte order, writable), else over a copy.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes  # noqa: F401  (part of the torch extra: bfloat16 and float8 arrays, imported once here)
import numpy as np
import torch

from ..errors import DataError, Location
from ..storage.dtypes import DTYPES, find, ml_dtype
from ..storage.payloads import Lazy

__all__ = ["from_numpy", "host_payload", "numpy_dtype", "to_numpy", "torch_dtype"]

#: torch dtypes of the same size that numpy knows, to view bfloat16 and float8 through
_BITS = {2: torch.int16, 1: torch.uint8}
_NP_BITS = {2: np.int16, 1: np.uint8}


def numpy_dtype(dtype: torch.dtype, where: str = "") -> np.dtype:
    """The numpy dtype of a torch dtype (``ml_dtypes`` for bfloat16 and float8)."""
    tag = str(dtype).removeprefix("torch.")
    d = DTYPES.get(tag)
    if d is None:
        supported = ", ".join(sorted(DTYPES))
        raise DataError(f"{where}torch dtype {dtype} is not in xser's dtype table ({supported})")
    return ml_dtype(tag) if d.extension else d.storage.newbyteorder("=")


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    d = find(dtype)
    if d is None:
        raise DataError(f"numpy dtype {dtype} has no torch dtype in xser's table")
    return getattr(torch, d.torch)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data as a numpy array over the same memory (no copy)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    dt = numpy_dtype(t.dtype)
    if dt.type.__module__ == "ml_dtypes":
        return t.view(_BITS[dt.itemsize]).numpy().view(dt)
    return t.numpy()


def from_numpy(a: np.ndarray, *, copy: bool = False) -> torch.Tensor:
    """A tensor over ``a``'s memory (a copy if ``copy``, or if numpy's layout cannot be shared)."""
    if not a.dtype.isnative or not a.flags.writeable or copy:
        a = np.array(a, dtype=a.dtype.newbyteorder("="), copy=True)
    d = find(a.dtype)
    if d is not None and d.extension:
        return torch.from_numpy(a.view(_NP_BITS[a.dtype.itemsize])).view(getattr(torch, d.torch))
    return torch.from_numpy(a)


#: devices whose tensors are written straight from their memory (the rest are copied to the host one by one)
HOST_DEVICES = ("cpu",)


def host_payload(t: torch.Tensor, where: str) -> Any:
    """What a save writes for a tensor: its array itself on the CPU, else a ``Lazy`` that copies it to host
    memory when its file is written (one tensor at a time, never the whole model)."""
    if t.device.type in HOST_DEVICES:
        return to_numpy(t)
    if t.device.type == "meta":
        raise DataError(f"{where}: the tensor is on the meta device and has no data to save", Location(where))
    dt = numpy_dtype(t.dtype, f"{where}: ")
    shape = tuple(t.shape)
    key = ("torch", str(t.device), t.data_ptr(), shape, tuple(t.stride()), str(t.dtype)) if t.numel() else None

    def take(index: tuple | None = None) -> np.ndarray:
        part = t.detach() if index is None else t.detach()[index]
        return to_numpy(part.to("cpu", copy=True))

    def alloc() -> np.ndarray:
        """Pinned host memory where the device has it (a CUDA tensor copies into it at full speed)."""
        pinned = t.device.type == "cuda"
        return to_numpy(torch.empty(shape, dtype=t.dtype, device="cpu", pin_memory=pinned))

    def into(out: np.ndarray) -> None:
        host = from_numpy(out) if out.dtype == dt else None
        if host is None or host.dtype != t.dtype:
            out[...] = take()
            return
        host.copy_(t.detach(), non_blocking=True)
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()

    return Lazy(dt, shape, take, key, into, alloc)


def _register_kind() -> None:
    from ..storage.training_state import KINDS, Kind

    KINDS["torch"] = Kind("torch", lambda v: isinstance(v, torch.Tensor), host_payload, lambda a: from_numpy(a, copy=False))


_register_kind()
