"""Reading and writing the model files of other systems: DiSMEC++, Angel, XNMT.

The top layer beside ``tools``: may import everything below the CLI. The codecs themselves
(DyNet text, Angel partitions) live in ``storage.formats`` so that weight formats can use them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..errors import CheckpointError, DataError, Location, did_you_mean

F = TypeVar("F", bound=Callable[..., Any])


def writes_files(fn: F) -> F:
    """An exporter's OS failures (a read-only or missing directory, a file in the way) as ``DataError``s."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OSError as e:
            raise DataError(f"cannot write the export: {e.strerror or e}", Location(e.filename if isinstance(e.filename, str) else None)) from None

    return wrapper  # type: ignore[return-value]


def read_param(model: str | os.PathLike, param: str, checkpoint: Any = 0) -> np.ndarray:
    """One parameter of a saved model: ``"<subcollection>/<param>"`` or its component path (``model.out.W``), as
    ``xser inspect`` lists them."""
    from ..api import retrying
    from ..model.serialize import flat_keys
    from ..spec.saved import open_saved

    def once() -> np.ndarray:
        with open_saved(model, checkpoint) as saved:
            data = saved.data
            sub, _, name = param.partition("/")
            entry = data.subcollections.get(sub, {}).get(name) if name else None
            flat = flat_keys(saved.experiment, data.subcollections) if entry is None else {}
            if param in flat:
                sub, name = flat[param]
                entry = data.subcollections[sub][name]
            if entry is None:
                known = list(flat) + [f"{s}/{n}" for s, ps in data.subcollections.items() for n in ps]
                raise DataError(f"no parameter {param!r}{did_you_mean(param, known)}", Location(os.fspath(model)))
            return np.asarray(data.read(entry))

    return retrying(os.fspath(model), once)


def refuse_existing(path: str, force: bool, store: Any = None) -> None:
    """An export never overwrites silently: an existing output (a dangling link too; on an object store, an object or
    a prefix of some) is an error unless ``force``."""
    from ..storage.replace import output_exists

    if not force and output_exists(path, store):
        raise CheckpointError("the output exists; remove it or pass --force to replace it", Location(path))


def takes_storage_options(fn: F) -> F:
    """A public import or export function's ``storage_options=`` go to every URL it reads or writes (its sources, its
    outputs, a remote xser model): ``stores.options`` for the call."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..storage.stores import options

        with options(kwargs.get("storage_options")):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def where_from(path: str) -> str:
    """How an import records its source: a local path made absolute, a URL as given."""
    from ..storage.stores import is_url

    return path if is_url(path) else os.path.abspath(path)
