"""PyTorch Lightning: ``XserCheckpointIO``, a ``CheckpointIO`` plugin that saves every Lightning checkpoint as an xser model.

``Trainer(plugins=[XserCheckpointIO()])`` (or ``AsyncCheckpointIO(XserCheckpointIO())`` to save on a background
thread). A checkpoint Lightning names ``epoch=0-step=10.ckpt`` becomes a spec file at that path and its data directory
``epoch=0-step=10.ckpt.data/``, as ``xser.save`` writes them, so every xser tool reads it: ``xser inspect``,
``xser avg``, ``xser convert``, ``xser export safetensors``, ``xser.torch.state_dict(path)`` (the model's own keys).

- The model's ``state_dict`` tensors are the parameters of one ``!LightningStateDict`` component, by their keys.
- Everything else Lightning puts in a checkpoint (optimizer and scheduler states, loops, callbacks, hyperparameters,
  epoch, global step, version, what ``on_save_checkpoint`` adds) is the checkpoint's training state: tensors and
  numpy arrays as array files, the rest as JSON in the manifest; tuples come back as tuples, int-keyed dicts with
  int keys. A value of any other type is refused before anything is written, with its key
  (``checkpoint['hyper_parameters']['root']: cannot store a PosixPath ...``).
- Each save is one ``CheckpointSaver`` save that replaces whatever was at the path (``restart=True``, ``keep=1``):
  durable, atomic, a crash leaves the previous checkpoint whole; ``global_step`` is the checkpoint's xser step.
- ``storage_options`` go to xser: a URL (``s3://``, ``memory://``, ...) as ``dirpath`` keeps checkpoints on an
  object store.

In Lightning's DDP only global rank 0 calls the plugin (the model is replicated), so a save is one process's.
Layer: beside ``xser.torch``, above it (imports it, and the layers below).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from .api import resume
from .checkpoints.saver import CheckpointSaver
from .errors import CheckpointError, DataError, Location, SpecError
from .model.params import PRESET_NAME, PRESET_WHERE
from .model.registry import serializable
from .storage.dtypes import DTYPES, dtype_problem
from .storage.model_files import remove_model, touch_spec
from .storage.stores import is_url, options
from .torch.tensors import numpy_dtype

__all__ = ["LightningStateDict", "XserCheckpointIO"]

#: how deep the non-tensor part of a checkpoint may nest (JSON in the manifest; a cycle is refused at this depth)
MAX_DEPTH = 100


@serializable(tag="!LightningStateDict")
class LightningStateDict(torch.nn.Module):
    """A Lightning checkpoint's ``state_dict``: ``tensors`` is ``{key: [dtype, shape]}`` in the dict's order. The tensors
    are the buffers of a tree of plain modules (``module``), so the component's subcollection has exactly these keys."""

    tensors: dict
    #: the component's state is the state_dict of this child (its keys as the checkpoint has them)
    _xser_state_root = "module"

    def __attrs_post_init__(self) -> None:
        given = self.__dict__.pop("_xser_adopt", None)
        if given is None:
            try:
                given = {k: torch.empty(_shape(v, k), dtype=_dtype(v, k)) for k, v in _entries(self.tensors).items()}
            except DataError as e:  # placed at the spec's component, when a spec built it
                raise SpecError(e.message, self.__dict__.get(PRESET_WHERE)) from None
        self.module = _tree(given)

    def state(self) -> OrderedDict[str, torch.Tensor]:
        """The tensors by key, in the saved order."""
        flat = self.module.state_dict()
        return OrderedDict((k, flat[k]) for k in self.tensors)


def _entries(tensors: Any) -> dict:
    if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
        raise DataError(f"tensors must map state_dict keys to [dtype, shape], got {type(tensors).__name__}")
    return tensors


def _dtype(v: Any, key: str) -> torch.dtype:
    tag = v[0] if isinstance(v, (list, tuple)) and len(v) == 2 else None
    if not isinstance(tag, str) or tag not in DTYPES or not isinstance(getattr(torch, tag, None), torch.dtype):
        raise DataError(f"tensors[{key!r}] must be [dtype, shape] with a torch dtype of xser's table, got {v!r}")
    return getattr(torch, tag)


def _shape(v: Any, key: str) -> tuple[int, ...]:
    shape = v[1] if isinstance(v, (list, tuple)) and len(v) == 2 else None
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise DataError(f"tensors[{key!r}] must be [dtype, shape] with a list of non-negative ints, got {v!r}")
    return tuple(shape)


def _tree(tensors: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Plain modules holding ``tensors`` as buffers at their dotted keys (``l.weight``: buffer ``weight`` of child ``l``),
    so that ``state_dict()`` gives exactly these keys. Entered in the modules' tables directly, not as attributes: any
    key works (``half``, ``to``, a tensor ``a`` beside ``a.b``), as ``state_dict()`` reads only those tables."""
    root = torch.nn.Module()
    for key, t in tensors.items():
        if not key or "/" in key or "@" in key:
            raise DataError(f"checkpoint['state_dict'][{key!r}]: an xser parameter name is not empty and holds no '/' or '@'")
        *path, leaf = key.split(".")
        m = root
        for part in path:
            child = m._modules.get(part)
            if child is None:
                child = m._modules[part] = torch.nn.Module()
            m = child
        m._buffers[leaf] = t
    return root


# ---------------------------------------------------------------- a checkpoint dict, both ways


def _name(trail: list) -> str:
    return "checkpoint" + "".join(f"[{k!r}]" for k in trail)


def _split(checkpoint: Any, where: str) -> tuple[dict[str, torch.Tensor], dict, list[list]]:
    """(the state_dict's tensors by key, the rest as ``training_state`` takes it, the trails of the tuples in the rest).
    The rest keeps a ``state_dict`` entry (where the checkpoint has one) holding its entries that are not tensors."""
    if not isinstance(checkpoint, Mapping):
        raise DataError(f"a checkpoint is a dict, got {type(checkpoint).__name__}", Location(where))
    tensors: dict[str, torch.Tensor] = {}
    rest = dict(checkpoint)
    if isinstance(rest.get("state_dict"), Mapping):
        extra = {}
        for key, t in rest["state_dict"].items():
            if isinstance(t, torch.Tensor) and isinstance(key, str):
                tensors[key] = _tensor(t, ["state_dict", key], where)
            else:
                extra[key] = t
        rest["state_dict"] = extra
    tuples: list[list] = []
    return tensors, _plain(rest, [], tuples, where), tuples


def _tensor(t: torch.Tensor, trail: list, where: str) -> torch.Tensor:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise DataError(f"{_name(trail)}: cannot store a {type(t).__name__} (a tensor subclass); XserCheckpointIO stores "
                        "plain tensors (a full state dict)", Location(where))
    if t.layout != torch.strided or t.is_quantized:
        raise DataError(f"{_name(trail)}: cannot store a {'quantized' if t.is_quantized else str(t.layout)} tensor "
                        "(dense tensors only)", Location(where))
    try:
        numpy_dtype(t.dtype)
    except DataError as e:
        raise DataError(f"{_name(trail)}: {e.message}", Location(where)) from None
    if t.device.type == "meta":
        raise DataError(f"{_name(trail)}: the tensor is on the meta device and has no data to save", Location(where))
    return t.detach()


_SCALARS = (bool, int, float, str, type(None))


def _plain(value: Any, trail: list, tuples: list[list], where: str) -> Any:
    """``value`` as ``training_state`` stores it (tensors and arrays kept, tuples as lists with their trails noted),
    or a ``DataError`` naming the key of the first value it cannot store."""
    if len(trail) > MAX_DEPTH:
        raise DataError(f"{_name(trail[:3])}...: nests more than {MAX_DEPTH} levels deep (or contains itself)", Location(where))
    if isinstance(value, torch.Tensor):
        return _tensor(value, trail, where)
    if isinstance(value, np.ndarray):
        why = dtype_problem(value.dtype)
        if why is not None:
            raise DataError(f"{_name(trail)}: {why}", Location(where))
        return value
    if type(value) in _SCALARS:
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biufU":
        return value.item()  # a numpy scalar comes back as the Python number or str of the same value
    if isinstance(value, Mapping):
        keys = list(value)
        ints = [k for k in keys if type(k) is int]
        strs = [k for k in keys if type(k) is str]
        if len(ints) != len(keys) and len(strs) != len(keys):
            bad = next(k for k in keys if type(k) is not (int if ints and not strs else str))
            raise DataError(f"{_name(trail)}: key {bad!r} ({type(bad).__name__}): a dict's keys must be all str or all int",
                            Location(where))
        for k in strs:
            if k.startswith("$"):
                raise DataError(f"{_name(trail + [k])}: keys starting with '$' are xser's markers", Location(where))
        return {k: _plain(v, trail + [k], tuples, where) for k, v in value.items()}
    if type(value) in (list, tuple):
        if type(value) is tuple:
            tuples.append(list(trail))
        return [_plain(v, trail + [i], tuples, where) for i, v in enumerate(value)]
    raise DataError(f"{_name(trail)}: cannot store a {type(value).__name__} (XserCheckpointIO stores tensors, numpy arrays, "
                    "dicts, lists, tuples, str, int, float, bool and None)", Location(where))


def _restore(rest: Any, tuples: list, where: str) -> Any:
    """Tuples back where they were (the deepest first, so a tuple holds the tuples inside it)."""
    for trail in sorted(tuples, key=len, reverse=True):
        try:
            node = rest
            for k in trail[:-1]:
                node = node[k]
            if trail:
                node[trail[-1]] = tuple(node[trail[-1]])
        except (KeyError, IndexError, TypeError):
            raise DataError(f"the training state notes a tuple at {_name(trail)}, which it does not hold", Location(where)) from None
    return rest


def _moved(value: Any, map_location: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if callable(map_location):  # as torch.load calls it for a tensor saved on the CPU
            storage = map_location(value.untyped_storage(), "cpu")
            if storage is None or storage.device == value.device:
                return value
            return torch.empty(0, dtype=value.dtype, device=storage.device).set_(storage, value.storage_offset(), value.shape, value.stride())
        device = map_location.get("cpu", "cpu") if isinstance(map_location, Mapping) else map_location
        return value.to(device)
    if isinstance(value, dict):
        out = {k: _moved(v, map_location) for k, v in value.items()}
        return OrderedDict(out) if isinstance(value, OrderedDict) else out
    if isinstance(value, (list, tuple)):
        moved = [_moved(v, map_location) for v in value]
        return tuple(moved) if isinstance(value, tuple) else moved
    return value


# ---------------------------------------------------------------- the plugin


class XserCheckpointIO(CheckpointIO):
    """Lightning's checkpoints as xser models (see the module's docstring).

    ``durable`` (fsync before a save returns), ``threads`` (files written at once) are ``CheckpointSaver``'s;
    ``storage_options`` go to every URL this plugin saves to, loads or removes (a save's own ``storage_options``,
    from ``trainer.save_checkpoint(..., storage_options=...)``, take their place for that save).
    """

    def __init__(self, *, durable: bool = True, threads: int = 2, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.durable = durable
        self.threads = threads
        self.storage_options = None if storage_options is None else dict(storage_options)

    def _options(self, path: str, given: Any = None) -> Any:
        if given is not None:
            return given
        return self.storage_options if is_url(path) else None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Save ``checkpoint`` as the model ``path`` (whatever was there is replaced, atomically)."""
        path = os.fspath(path)
        tensors, rest, tuples = _split(checkpoint, path)
        described = {k: [str(t.dtype).removeprefix("torch."), list(t.shape)] for k, t in tensors.items()}
        obj = LightningStateDict.__new__(LightningStateDict)
        obj.__dict__["_xser_adopt"] = tensors
        obj.__dict__[PRESET_NAME] = _subcollection_name(described)
        try:
            obj.__init__(tensors=described)  # type: ignore[misc]
        except DataError as e:
            raise DataError(e.message, Location(path)) from None
        step = checkpoint.get("global_step")
        opts = self._options(path, storage_options)
        with _path_lock(path):
            with CheckpointSaver(path, keep=1, restart=True, durable=self.durable, threads=self.threads, storage_options=opts) as saver:
                saver.save(obj, step=step if type(step) is int else None, training_state={"checkpoint": rest, "tuples": tuples})
            with options(opts):
                touch_spec(path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint saved at ``path``, tensors bit-exact on the CPU (or where ``map_location`` says: a device, a
        string, ``{"cpu": device}`` or a function called as ``torch.load`` calls it). ``weights_only`` changes nothing:
        nothing is unpickled."""
        path = os.fspath(path)
        with _path_lock(path):
            got = resume(path, checkpoint=0, storage_options=self._options(path))
        if got is None:
            raise CheckpointError("no checkpoint here", Location(path))
        state = got.training_state
        if not isinstance(got.model, LightningStateDict) or not (isinstance(state, dict) and set(state) == {"checkpoint", "tuples"}):
            raise DataError("this model was not saved by XserCheckpointIO (its component is not a !LightningStateDict with "
                            "the checkpoint as training state)", Location(path))
        out = state["checkpoint"]
        if isinstance(out.get("state_dict"), dict):
            out["state_dict"] = OrderedDict(list(got.model.state().items()) + list(out["state_dict"].items()))
        out = _restore(out, state["tuples"], path)
        return _moved(out, map_location) if map_location is not None else out

    def remove_checkpoint(self, path: Any) -> None:
        """Remove the model at ``path``: its spec and every data directory (nothing there is no error)."""
        path = os.fspath(path)
        with _path_lock(path), options(self._options(path)):
            remove_model(path)


def _subcollection_name(described: dict) -> str:
    """The same for every save of the same tensors (keys, dtypes, shapes), so that saving ``last.ckpt`` again writes the
    same spec: xser then leaves the spec file in place, and the checkpoint never disappears from its name while it is
    saved (another rank's ``ckpt_path="last"`` looks for it then, with ``AsyncCheckpointIO``)."""
    digest = hashlib.sha256(json.dumps(described, sort_keys=False).encode("utf-8")).hexdigest()
    return f"LightningStateDict.{digest[:8]}"


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _path_lock(path: str) -> threading.Lock:
    """One lock per path in this process: a removal or a load of a path that ``AsyncCheckpointIO``'s thread is saving
    waits for that save (rather than finding nothing there yet, or meeting the model's lock)."""
    key = path if is_url(path) else os.path.abspath(path)
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(key, threading.Lock())
