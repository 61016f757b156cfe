"""A saved model as one flat ``{component.path.key: tensor}`` state dict, readable without the user's classes.

Keys are the component's place in the experiment (``model.encoder``) joined with the parameter's
name in its subcollection (``emb.weight``): ``model.encoder.emb.weight``. A parameter stored once
under two names (tied weights) is one tensor under both keys.
"""

from __future__ import annotations

import os

import torch

from ..api import retrying
from ..errors import DataError, Location, key_lists
from ..model.serialize import flat_keys
from ..spec.saved import open_saved
from ..storage.opened import gather
from .module import log_rounded
from .tensors import from_numpy

__all__ = ["load_state_dict", "state_dict"]


def state_dict(path: str | os.PathLike, checkpoint: int | None = None, *, mmap: bool = False, verify: bool = False) -> dict[str, torch.Tensor]:
    """The saved model at ``path`` (its ``checkpoint``-th newest checkpoint; default the newest) as a flat state dict.

    ``mmap=True`` gives tensors over the mapped files (no read until used).
    """
    path = os.fspath(path)

    def once() -> dict[str, torch.Tensor]:
        with open_saved(path, checkpoint or 0) as saved:
            data = saved.data
            keys = flat_keys(saved.experiment, data.subcollections)
            entries = {}
            for sub, name in keys.values():
                entries.setdefault(data.subcollections[sub][name].blocks, data.subcollections[sub][name])
            futs = data.read_many(entries.values(), mmap=mmap, verify=verify)
            arrays = gather(futs, {s: {} for s in data.subcollections})
            tensors = {blocks: from_numpy(arrays[e.subcol][e.name]) for blocks, e in entries.items()}
            return {key: tensors[data.subcollections[sub][name].blocks] for key, (sub, name) in keys.items()}

    return retrying(path, once)


def load_state_dict(module: torch.nn.Module, path: str | os.PathLike, checkpoint: int | None = None, *, strict: bool = True) -> None:
    """Load a saved model's flat state dict into any ``nn.Module`` by key (as ``module.load_state_dict`` does).

    Missing and unexpected keys are listed sorted in one ``DataError``, then every key whose shape differs; tensors are
    copied with a cast to the module's dtypes, as ``load_state_dict`` does, and casts that can change values are logged.
    """
    path = os.fspath(path)
    view = state_dict(path, checkpoint)
    own = module.state_dict()
    where = Location(path)
    missing, unexpected = sorted(set(own) - set(view)), sorted(set(view) - set(own))
    if missing or (strict and unexpected):
        raise DataError(f"loading into {type(module).__name__}: " + key_lists(missing, unexpected if strict else [], " in state_dict"), where)
    shapes = [f"{key!r} is {list(view[key].shape)} on disk, {list(own[key].shape)} in the module"
              for key in sorted(set(own) & set(view)) if tuple(own[key].shape) != tuple(view[key].shape)]
    if shapes:
        raise DataError(f"loading into {type(module).__name__}: {len(shapes)} tensor(s) differ in shape: " + "; ".join(shapes), where)
    module.load_state_dict({k: v for k, v in view.items() if k in own}, strict=False)
    log_rounded(path, "load_state_dict", "the module", {k: (view[k].dtype, own[k].dtype) for k in sorted(set(own) & set(view))})
