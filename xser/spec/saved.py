"""The saved-model file: its envelope, its header, writing it and reading it back.

A saved model's spec is ``xser_format``, ``name`` and ``experiment``. Every checkpoint carries
its own copy (``<data dir>/spec.yaml``, named with its checksum in the manifest), and the
top-level ``<model>.yaml`` is a copy of the newest one, written *after* the data is published.
Readers take the spec from the checkpoint they opened, so spec and arrays always belong
together: a top-level file left out of step by a crash (or edited by hand) is never mixed with
another checkpoint's data. ``inspect`` reports such a file and the next save rewrites it.
Checkpoints written before format_version 2 have no copy; their spec is the top-level file.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from ..errors import DataError, Location, SpecError
from ..storage.checksums import digest_bytes
from ..storage.fsutil import open_regular
from ..storage.listing import open_checkpoint
from ..storage.manifest import SPEC_FILE
from ..storage.opened import OpenedDir
from .yamlio import MAX_SPEC_BYTES, Doc, Tagged, dump, parse, read, rewrite_children

__all__ = ["MODEL_PATH", "SPEC_FORMAT", "SavedModel", "absolute_paths", "relative_paths", "is_saved", "open_saved", "render_saved", "spec_header", "top_level_state", "with_spec"]

SPEC_FORMAT = 1
_HEADER = "# xser saved model: the spec of one experiment; its parameters are in {data}/\n"


def spec_header(path: str) -> str:
    return _HEADER.format(data=os.path.basename(path) + ".data")


MODEL_PATH = "!ModelPath"


def relative_paths(tree: Any, path: str) -> Any:
    """A copy of ``tree`` where every string that is an absolute path inside the model's directory (the
    directory of ``path``) is a ``!ModelPath {path: relative}``: the model directory can move."""
    base = os.path.dirname(os.path.abspath(path))

    def walk(v: Any) -> Any:
        if isinstance(v, str) and os.path.isabs(v):
            norm = os.path.normpath(v)
            if norm == base or norm.startswith(base + os.sep):
                return Tagged(MODEL_PATH, {"path": os.path.relpath(norm, base).replace(os.sep, "/")})
            return v
        if isinstance(v, Tagged):
            return Tagged(v.tag, {k: walk(x) for k, x in v.args.items()}, v.origin)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(tree)


def absolute_paths(tree: Any, path: str, doc: Doc | None = None) -> Any:
    """``tree`` with each ``!ModelPath {path: rel}`` replaced, in place, by the absolute path under the directory
    of ``path`` (where the model is now). The relative path must stay inside that directory."""
    base = os.path.dirname(os.path.abspath(path))

    def resolve(v: Any) -> Any:
        if isinstance(v, Tagged) and v.tag == MODEL_PATH:
            rel = v.args.get("path")
            where = doc.where(v) if doc is not None else Location(path)
            if set(v.args) != {"path"} or not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
                raise SpecError(f"{MODEL_PATH} takes one relative 'path' inside the model's directory, got {v.args!r}", where)
            return base if rel == "." else os.path.join(base, *rel.split("/"))
        if isinstance(v, (Tagged, dict, list)):
            rewrite_children(v, lambda _k, x: resolve(x))
        return v

    return resolve(tree)


def render_saved(experiment: Any, name: str | None, path: str) -> str:
    """The text of a saved model's spec (header, ``xser_format``, ``name``, ``experiment``); paths inside the
    model's directory are written relative to it (``!ModelPath``)."""
    return spec_header(path) + dump({"xser_format": SPEC_FORMAT, "name": name, "experiment": relative_paths(experiment, path)})


def is_saved(doc: Doc) -> bool:
    return isinstance(doc.tree, dict) and "xser_format" in doc.tree


def check_saved(doc: Doc) -> tuple[str | None, Any]:
    """(name, experiment) of a saved model's spec document, after checking its envelope."""
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
    return tree.get("name"), tree["experiment"]


@attrs.define(eq=False)
class SavedModel:
    """One checkpoint of a saved model, opened: its spec document and its data directory."""

    path: str  # the model's spec path
    name: str | None
    experiment: Any
    doc: Doc
    data: OpenedDir
    spec_file: str  # where the spec text came from (the checkpoint's spec.yaml, or the top-level file)

    def close(self) -> None:
        self.data.close()

    def __enter__(self) -> SavedModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _not_saved(path: str) -> SpecError:
    return SpecError("not a saved xser model (no xser_format key); is this a config file? Build and save it first: a saved "
                     "model is the MODEL.yaml that xser.save writes beside MODEL.yaml.data/", Location(path, 1, 1))


def open_saved(path: str | os.PathLike, checkpoint: int = 0) -> SavedModel:
    """Open checkpoint ``checkpoint`` of the saved model at ``path`` with the spec it was saved with."""
    path = os.fspath(path)
    try:
        data = open_checkpoint(path, checkpoint)
    except DataError:
        if not os.path.lexists(path):
            read(path)  # no model and no spec file: the spec file's own error (file not found)
        if os.path.isfile(path) and not is_saved(read(path)):
            raise _not_saved(path) from None
        raise
    try:
        return with_spec(path, data)
    except BaseException:
        data.close()
        raise


def with_spec(path: str, data: OpenedDir) -> SavedModel:
    """An opened checkpoint of the model at ``path`` with the spec it was saved with (the caller owns ``data``)."""
    text = data.spec_text()
    if text is None:  # format_version 1: the top-level file is the spec
        doc, source = read(path), path
    else:
        source = os.path.join(data.path, SPEC_FILE)
        doc = parse(text, source)
    if not is_saved(doc):
        raise _not_saved(source)
    name, experiment = check_saved(doc)
    return SavedModel(path, name, experiment, doc, data, source)


def top_level_state(path: str, data: OpenedDir) -> str:
    """How the top-level spec file relates to a checkpoint's own spec: "in step", "out of step", "missing", "no copy"
    or "unreadable". A FIFO, device or directory in its place is a ``SpecError`` (never opened for a read that could block)."""
    block = data.manifest.spec
    if block is None:
        return "no copy"
    try:
        with open_regular(path, "the spec", SpecError) as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "unreadable"
    return "in step" if len(raw) == block.bytes and digest_bytes(raw, block.checksum[0]) == block.checksum[1] else "out of step"


