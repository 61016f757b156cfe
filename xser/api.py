"""The public verbs: ``load_config``, ``save``, ``load``, ``read_params``."""

from __future__ import annotations

import os
from typing import Any


from .build import Experiment, ExperimentSpec, build_spec
from .errors import Location, SpecError
from .spec import Doc, read
from .store import DataDir, data_dir_of

__all__ = ["load", "load_config", "read_model_spec", "read_params", "save"]

SPEC_FORMAT = 1
_HEADER = "# xser saved model: the spec of one experiment; its parameters are in {data}/\n"


def spec_header(path: str) -> str:
    return _HEADER.format(data=os.path.basename(path) + ".data")


def _is_saved(doc: Doc) -> bool:
    return isinstance(doc.tree, dict) and "xser_format" in doc.tree


def _saved_spec(doc: Doc, path: str, data: str | None = None) -> ExperimentSpec:
    tree = doc.tree
    version = tree.get("xser_format")
    loc = doc.where(tree, "xser_format")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SpecError(f"xser_format must be an int, got {version!r}", loc)
    if version > SPEC_FORMAT:
        raise SpecError(f"xser_format {version} was written by a newer xser (this one reads <= {SPEC_FORMAT})", loc)
    unknown = set(tree) - {"xser_format", "name", "experiment"}
    if unknown:
        key = sorted(unknown, key=str)[0]
        raise SpecError(f"unknown top-level key {key!r} in a saved model", doc.where(tree, key, of_key=True))
    if "experiment" not in tree:
        raise SpecError("saved model has no 'experiment'", doc.where(tree))
    name = tree.get("name")
    return ExperimentSpec(name, tree["experiment"], doc, path, data or data_dir_of(path))


def read_model_spec(path: str | os.PathLike, checkpoint: int = 0) -> ExperimentSpec:
    """The one experiment of a saved model file (``xser_format`` at the top)."""
    from .checkpointing import checkpoint_dir

    path = os.fspath(path)
    doc = read(path)
    if not _is_saved(doc):
        raise SpecError("not a saved xser model (no xser_format key); is this a config file?", Location(path, 1, 1))
    return _saved_spec(doc, path, checkpoint_dir(path, checkpoint))


def load_config(path: str | os.PathLike) -> dict[str, ExperimentSpec]:
    """The experiments of a config file, ``{name: spec}`` in file order (unbuilt)."""
    path = os.fspath(path)
    doc = read(path)
    if _is_saved(doc):
        spec = _saved_spec(doc, path)
        return {spec.name if spec.name is not None else os.path.basename(path): spec}
    if doc.tree is None:
        return {}
    if not isinstance(doc.tree, dict):
        raise SpecError(
            f"a config file is a mapping of named experiments, got {type(doc.tree).__name__}", doc.where(doc.tree) or Location(path, 1, 1)
        )
    out = {}
    for name, tree in doc.tree.items():
        if not isinstance(name, str):
            raise SpecError(f"experiment names must be strings, got {name!r}", doc.where(doc.tree, name, of_key=True))
        out[name] = ExperimentSpec(name, tree, doc, path)
    return out


def experiment_name(obj: Any) -> str | None:
    if isinstance(obj, Experiment):
        return obj.name
    return getattr(obj, "__dict__", {}).get("_xser_experiment")


def save(
    obj: Any,
    path: str | os.PathLike,
    *,
    durable: bool = True,
    name: str | None = None,
    training: dict | None = None,
    custom: dict | None = None,
    blocks: dict | None = None,
    formats: dict | None = None,
) -> None:
    """Save ``obj`` as ``path`` (the spec) and ``path.data/`` (its parameters).

    ``blocks`` maps ``"subcollection/param"`` glob patterns to a block size: an int (rows per
    block) or a tuple (rows, columns, ...). Matching parameters are stored as blocks of
    contiguous rows (or tiles), one file each, so that row ranges load without reading the rest.
    ``formats`` maps patterns to a weight format name (``"dense-text"``, ``"sparse-text"``, a
    registered one), or to ``(name, {options})`` such as ``("sparse-text", {"threshold": 1e-3})``;
    it overrides the format a component declared with ``add(..., format=...)``.

    Replaces the newest checkpoint; older ones (``.data.1``, ...) are kept and must still
    match the model. ``training`` and ``custom`` are JSON mappings stored in the
    manifest; xser never writes ``custom`` itself. A durable save fsyncs files and
    directories before it returns; ``durable=False`` skips that.
    """
    from .checkpointing import save_checkpoint
    from .commit import ModelLock, clean_temporaries

    path = os.fspath(path)
    with ModelLock(path):
        clean_temporaries(path)
        save_checkpoint(
            obj, path, policy=None, durable=durable, name=name, training=training, custom=custom, blocks=blocks,
            formats=formats,
        )


def load(
    path: str | os.PathLike,
    *,
    mmap: bool = False,
    strict: bool = True,
    verify: bool = False,
    checkpoint: int = 0,
    rows: dict | None = None,
) -> Any:
    """Build a saved model; its parameters come from ``path.data/``.

    ``mmap=True`` maps arrays copy-on-write (lazy, fast open). ``strict=False``
    tolerates subcollections on disk that the spec does not use; a subcollection
    the spec needs but the data lacks is always an error. ``verify=True`` checks
    every file's checksum. ``checkpoint=k`` loads the k-th newest checkpoint (0 = ``.data``).
    ``rows={"subcol/param": (first, stop)}`` loads only those rows of those parameters (the
    component then holds a partial array: its first dimension is ``stop - first``).
    """
    spec = read_model_spec(path, checkpoint)
    return build_spec(spec, mmap=mmap, verify=verify, strict=strict, rows=rows)


def read_params(
    path: str | os.PathLike,
    *,
    mmap: bool = False,
    verify: bool = False,
    checkpoint: int = 0,
    rows: dict | None = None,
) -> dict[str, dict[str, Any]]:
    """``{subcollection: {param: array}}`` of a saved model, without building objects.

    ``rows={"subcol/param": (first, stop)}`` reads only those rows of those parameters: only
    the blocks that overlap them, and inside each only their bytes.
    """
    from .checkpointing import checkpoint_dir

    return DataDir.open(checkpoint_dir(path, checkpoint)).read_all(mmap=mmap, verify=verify, rows=rows)


