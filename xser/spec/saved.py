"""The saved-model file: its envelope, its header, writing it and reading it back.

A saved model's spec is ``xser_format``, ``name`` and ``experiment``. Every checkpoint carries
its own copy (``<data dir>/spec.yaml``, named with its checksum in the manifest), and the
top-level ``<model>.yaml`` is a copy of the newest one, written *after* the data is published.
Readers take the spec from the checkpoint they opened, so spec and arrays always belong
together, with one exception: a top-level file *edited by hand* (it equals the spec of no
checkpoint of the model) is what the user asked for, so ``open_saved`` builds it instead, checked
against the opened checkpoint's data, and says so once (logger ``xser``). A top-level file that
equals another checkpoint's spec was left by an interrupted save (or is being rewritten by one):
it is not an edit, and the checkpoint's own spec is used. ``inspect`` reports both; a save keeps
an edit it would overwrite (``hand_edit``, ``edit_lost``). Checkpoints written before
format_version 2 have no copy; their spec is the top-level file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import attrs

from ..errors import DataError, Location, SpecError
from ..storage.checksums import digest_bytes
from ..storage.listing import open_checkpoint, scan
from ..storage.stores import beside, is_url, parent_of, store_for
from ..storage.manifest import SPEC_FILE
from ..storage.opened import OpenedDir
from .dumping import dump
from .yamlio import Doc, Tagged, parse, read, read_text, rewrite_children

__all__ = [
    "MODEL_PATH", "SPEC_FORMAT", "HandEdit", "SavedModel", "absolute_paths", "edit_lost", "hand_edit", "relative_paths", "is_saved",
    "open_saved", "render_saved", "spec_header", "top_level_state", "with_edit", "with_spec",
]

_log = logging.getLogger("xser")

SPEC_FORMAT = 1
_HEADER = "# xser saved model: the spec of one experiment; its parameters are in {data}/\n"


def spec_header(path: str) -> str:
    return _HEADER.format(data=os.path.basename(path) + ".data")


MODEL_PATH = "!ModelPath"


def relative_paths(tree: Any, path: str) -> Any:
    """A copy of ``tree`` where every string that is an absolute path inside the model's directory (the
    directory of ``path``) is a ``!ModelPath {path: relative}``: the model directory can move."""
    remote = is_url(path)
    base = parent_of(path)

    def walk(v: Any) -> Any:
        if remote and isinstance(v, str) and is_url(v):  # a URL inside the model's folder on the same store
            if v.startswith(base.rstrip("/") + "/") and ".." not in v[len(base):].split("/"):
                return Tagged(MODEL_PATH, {"path": v[len(base.rstrip("/")) + 1:]})
            return v
        if not remote and isinstance(v, str) and os.path.isabs(v):
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
    of ``path`` (where the model is now; on an object store, the URL of that folder). The relative path must stay
    inside that directory."""
    base = parent_of(path)

    def resolve(v: Any) -> Any:
        if isinstance(v, Tagged) and v.tag == MODEL_PATH:
            rel = v.args.get("path")
            where = doc.where(v) if doc is not None else Location(path)
            if set(v.args) != {"path"} or not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
                raise SpecError(f"{MODEL_PATH} takes one relative 'path' inside the model's directory, got {v.args!r}", where)
            return base if rel == "." else beside(path, rel) if is_url(path) else os.path.join(base, *rel.split("/"))
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
    #: the checkpoint's own spec file when ``spec_file`` is a top-level file edited by hand since (see ``hand_edit``)
    sealed: str | None = None

    @property
    def edited(self) -> tuple[str, str] | None:
        """(the edited file, the checkpoint's own spec) when the spec came from a hand edit, else None."""
        return None if self.sealed is None else (self.spec_file, self.sealed)

    def close(self) -> None:
        self.data.close()

    def __enter__(self) -> SavedModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _not_saved(path: str) -> SpecError:
    return SpecError("not a saved xser model (no xser_format key); is this a config file? Build and save it first: a saved "
                     "model is the MODEL.yaml that xser.save writes beside MODEL.yaml.data/", Location(path, 1, 1))


def open_saved(path: str | os.PathLike, checkpoint: Any = 0, *, edits: bool = True) -> SavedModel:
    """Open checkpoint ``checkpoint`` of the saved model at ``path`` with the spec it was saved with or, when the
    top-level file at ``path`` was edited by hand since (``hand_edit``; ``edits=False`` never), with that file: the
    edit is what the user asked for. Using an edit logs one warning that names both files and the first line that
    differs; whether the edit still matches the checkpoint's data is checked when it is built."""
    path = os.fspath(path)
    try:
        data = open_checkpoint(path, checkpoint)
    except DataError:
        store = store_for(path)
        if not store.exists(path):
            read(path)  # no model and no spec file: the spec file's own error (file not found)
        if not is_url(path) and store.is_file(path) and not is_saved(read(path)):
            raise _not_saved(path) from None
        raise
    try:
        saved = with_spec(path, data)
        return with_edit(saved) if edits else saved
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


def with_edit(saved: SavedModel) -> SavedModel:
    """``saved`` with its top-level file's spec instead of the checkpoint's own when that file was edited by hand."""
    edit = hand_edit(saved.path, saved.data)
    if edit is None:
        return saved
    doc = parse(edit.text, saved.path)
    if not is_saved(doc):
        raise _not_saved(saved.path)
    name, experiment = check_saved(doc)
    _log.warning("%s", edit.warning(saved.data.path))
    return SavedModel(saved.path, name, experiment, doc, saved.data, saved.path, edit.sealed)


@attrs.frozen
class HandEdit:
    """A top-level spec file edited by hand: it equals the spec of no checkpoint of its model."""

    path: str  # the top-level file
    text: str  # its text
    sealed: str  # the checkpoint spec it was compared with (``<data dir>/spec.yaml``)
    line: int  # the first line that differs (1-based)
    here: str | None  # that line in the top-level file (None: the file ends before it)
    there: str | None  # that line in the checkpoint's spec

    def difference(self) -> str:
        """``first difference, line 5: 'a' in m.yaml, 'b' in m.yaml.data/spec.yaml``."""
        def show(text: str | None) -> str:
            return "the end of the file" if text is None else repr(text)

        return f"first difference, line {self.line}: {show(self.here)} in {self.path}, {show(self.there)} in {self.sealed}"

    def warning(self, checkpoint: str) -> str:
        return (f"{self.path}: edited since checkpoint {checkpoint} was saved; the edited file is used, not the "
                f"checkpoint's own {os.path.basename(self.sealed)} ({self.difference()})")


def _first_difference(a: str, b: str) -> tuple[int, str | None, str | None]:
    la, lb = a.splitlines(), b.splitlines()
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        if x != y:
            return i + 1, x, y
    return max(len(la), len(lb)) + 1, None, None  # only line ends differ (the last line's newline)


def _is_spec_of(raw: bytes, data: OpenedDir) -> bool:
    block = data.manifest.spec
    return block is not None and len(raw) == block.bytes and digest_bytes(raw, block.checksum[0]) == block.checksum[1]


def _top_text(path: str) -> str | None:
    try:
        return read_text(path)
    except SpecError:  # missing, unreadable, not a regular file: no edit to use (``top_level_state`` says which)
        return None


def hand_edit(path: str, data: OpenedDir, others: Iterable[OpenedDir] | None = None) -> HandEdit | None:
    """The top-level spec file at ``path`` if it was edited by hand, else None.

    Edited means it differs from the spec of checkpoint ``data`` and from that of every other checkpoint of the
    model (``others``; listed here when None). A file equal to another checkpoint's spec is xser's own copy, left
    by an interrupted save or about to be rewritten by a running one: not an edit. A missing, unreadable or
    irregular file is not one either, nor is anything beside a checkpoint without its own spec (format_version 1,
    where the top-level file is the spec)."""
    if data.manifest.spec is None:
        return None
    text = _top_text(path)
    if text is None:
        return None
    raw = text.encode("utf-8")
    if _is_spec_of(raw, data):
        return None
    if others is None:
        with scan(path) as s:
            if any(_is_spec_of(raw, d) for _, d in s.listed):
                return None
    elif any(_is_spec_of(raw, d) for d in others):
        return None
    sealed = data.spec_text() or ""
    line, here, there = _first_difference(text, sealed)
    return HandEdit(path, text, os.path.join(data.path, SPEC_FILE), line, here, there)


def edit_lost(edit: str, new: str) -> bool:
    """Whether writing the spec text ``new`` over the edited text ``edit`` loses something of the edit: their
    trees differ (comments and layout do not count), or the edit does not parse."""
    try:
        return parse(edit).tree != parse(new).tree
    except SpecError:
        return True


def top_level_state(path: str, data: OpenedDir) -> str:
    """How the top-level spec file relates to a checkpoint's own spec: "in step", "edited" (by hand: load builds it),
    "out of step" (another checkpoint's spec: an interrupted save), "missing", "unreadable", "no copy". A FIFO, device or
    directory in its place is a ``SpecError``."""
    if data.manifest.spec is None:
        return "no copy"
    store = store_for(path)
    if not store.exists(path):
        return "missing"
    text = _top_text(path)
    if text is None and not store.is_file(path):
        read_text(path)  # a FIFO, device or directory in its place: its SpecError (never opened for a read that could block)
    if text is None:
        return "unreadable"
    if _is_spec_of(text.encode("utf-8"), data):
        return "in step"
    return "out of step" if hand_edit(path, data) is None else "edited"
