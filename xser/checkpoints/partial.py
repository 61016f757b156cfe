"""Partial saves: write a large parameter in row blocks as they are ready, then commit once.

For long trainings that produce a matrix label by label (DiSMEC++'s ``PartialModelSaver``) and
for several workers each writing its own rows. Blocks go to ``<model>.data.partial/``, each as a
complete ``.npy`` file plus a small JSON note (written after the file, both by rename), so an
interrupted run loses at most the block being written and a new ``PartialSaver`` on the same
path resumes where it stopped (``missing()`` says what is left). ``finalize()`` refuses gaps
and overlaps and publishes one checkpoint with the same all-or-nothing commit as a save.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from ..errors import DataError, Location, did_you_mean, shape_str
from ..model.serialize import to_tree
from ..model.registry import info_for
from ..storage.disk.commit import remove_tree, write_text_atomic
from ..storage.formats.npy import describe_dtype, parse_dtype
from ..storage.stores import LOCAL
from ..storage.write import put_array
from ..storage.fsutil import fsync_dir, makedirs_durable, open_regular
from ..storage.layout import data_dir_of
from ..storage.opened import DirHandle
from ..storage.payloads import FromFile, FromFiles
from ..storage.stores import is_url, store_for
from ..storage.stores import options as storage_context
from .partial_remote import RemoteStagingArea

__all__ = ["PartialSaver"]


LAYOUT = "layout.json"
MAX_LAYOUT = 64 << 20  # bytes of layout.json read at most
MAX_NOTE = 1 << 16


def _note(path: str, note: Any = None) -> dict:
    """A block's note (read from ``path``, or ``note`` as read from an object store), checked: ``{"first", "count",
    "file", "bytes", "xxh3_64", "worker"}``."""
    try:
        if note is None:
            with open_regular(path, "a block note") as f:
                note = json.loads(f.read(MAX_NOTE))
        ok = isinstance(note, dict) and all(type(note.get(k)) is int and note[k] >= 0 for k in ("first", "count", "bytes"))
        if not ok or not all(isinstance(note.get(k), str) for k in ("file", "xxh3_64", "worker")) or note["count"] < 1:
            raise ValueError(f"not a block note: {str(note)[:200]}")
        stem = path.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1][: -len(".block.json")]
        if note["file"] != stem + ".npy" and not re.fullmatch(re.escape(stem) + r"\.[0-9a-f]{16}\.npy", note["file"]):
            raise ValueError(f"the note names file {note['file']!r}")  # (on a store: <stem>.<token>.npy, see write_block)
    except (OSError, ValueError) as e:
        raise DataError(f"unreadable block note: {e}", Location(path)) from None
    return note


class _Decl:
    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


@attrs.frozen
class _Component:
    """What identifies one component's parameters across processes: its place in the object graph, its
    class, and its parameters' names, shapes and dtypes (never its subcollection name, drawn at random
    when the object is built)."""

    path: str  # "the root", "encoder", "layers[2]"
    cls: str  # the component's registered tag
    params: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype descr), sorted by name

    def describe(self) -> str:
        return f"{self.cls} at {self.path} with " + ", ".join(f"{n} {shape_str(s)} {np.dtype(d) if isinstance(d, str) else d}"
                                                                for n, s, d in self.params)


def _components(obj: Any) -> dict[str, _Component]:
    """``{subcollection name: _Component}`` of an object."""
    _, subcols = to_tree(obj)
    out = {}
    for name, (sub, where) in subcols.items():
        info = info_for(sub.owner)
        params = tuple(sorted((d.name, tuple(d.shape), str(describe_dtype(d.dtype))) for d in sub.decls.values()))
        out[name] = _Component(where, info.tag if info is not None else type(sub.owner).__qualname__, params)
    return out


def _adopt(mine: dict[str, _Component], theirs: dict[str, _Component]) -> dict[str, str] | str:
    """``{this object's subcollection: the partial save's}`` matching components by place, class and parameters;
    or what differs (a sentence)."""
    by_path = {c.path: name for name, c in theirs.items()}
    mapping, problems = {}, []
    for name, c in sorted(mine.items(), key=lambda kv: kv[1].path):
        other = by_path.get(c.path)
        if other is None:
            problems.append(f"this object has {c.describe()}, the partial save has no component there")
        elif theirs[other] != c:
            problems.append(f"this object has {c.describe()}, the partial save has {theirs[other].describe()}")
        else:
            mapping[name] = other
    for path in sorted(set(by_path) - {c.path for c in mine.values()}):
        problems.append(f"the partial save has {theirs[by_path[path]].describe()}, this object has no component there")
    return "; ".join(problems[:3]) if problems else mapping


class PartialSaver:
    """Collect row blocks of ``obj``'s parameters under ``path``, then ``finalize()``.

    The first ``PartialSaver`` on a path records, for every component of the object, its place in
    the object graph, its class and its parameters' names, shapes and dtypes, with its subcollection
    name (``<model>.data.partial/layout.json``). A later ``PartialSaver`` on the same path, in any
    process, resumes it: the object's components are matched to the recorded ones by place, class and
    parameters, not by name, so a script that was killed and is run again (building its object afresh,
    with new random subcollection names) goes on where it stopped; keys may use either name. Workers in
    other processes pass such an object too, or join without one: ``PartialSaver.join(path)``.
    One process that holds the object calls ``finalize``; parameters that never got a block are saved
    whole from ``obj`` then.

    ``path`` may be a URL (``storage_options`` for its filesystem): the blocks are then immutable objects under
    the ``.data.partial/`` prefix and ``finalize`` commits like a save on that store (``partial_remote``).
    """

    def __init__(self, path: str | os.PathLike, obj: Any = None, *, worker: str | None = None, durable: bool = True,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.path = os.fspath(path)
        self.obj = obj
        self.durable = durable
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}"
        self.staging = self.path + ".data.partial"
        self._names: dict[str, str] = {}  # this object's subcollection name -> the partial save's (where they differ)
        self._options = storage_options
        self._area: RemoteStagingArea | None = None
        with storage_context(storage_options):
            if is_url(self.path):
                self._area = RemoteStagingArea(store_for(self.path), self.staging)
            self._start(obj)

    def _start(self, obj: Any) -> None:
        durable = self.durable
        recorded, components = self._read_layout()
        if obj is None:
            if recorded is None:
                raise DataError("no partial save in progress to join (make the first PartialSaver with the model object)", Location(self.staging))
            self.decls = recorded
            return
        mine = _components(obj)
        _, subcols = to_tree(obj)
        self.decls = {f"{n}/{d.name}": _Decl(d.shape, d.dtype) for n, (sub, _) in subcols.items() for d in sub.decls.values()}
        if recorded is not None:
            self._resume(mine, recorded, components)
            return
        layout = {"version": 2, "subcollections": {
            n: {"path": c.path, "class": c.cls, "params": {p: {"shape": list(shape), "dtype": dt} for p, shape, dt in c.params}}
            for n, c in mine.items()}}
        if self._area is not None:
            if not self._area.create_layout(LAYOUT, layout):  # another process started it meanwhile: resume it
                recorded, components = self._read_layout()
                self._resume(mine, recorded, components)  # type: ignore[arg-type]
            return
        try:
            makedirs_durable(self.staging, durable=durable)
            for key in self.decls:
                makedirs_durable(os.path.join(self.staging, key.split("/")[0]), durable=False)
            write_text_atomic(os.path.join(self.staging, LAYOUT), json.dumps(layout) + "\n", durable=durable)
        except OSError as e:
            raise DataError(f"cannot start a partial save: {e.strerror or e}", Location(self.staging)) from None

    def _resume(self, mine: dict[str, _Component], recorded: dict[str, _Decl], components: dict[str, _Component] | None) -> None:
        """Take over the partial save in progress: the same names, or (matched by place, class and parameters) its names."""
        same = {k: (d.shape, d.dtype) for k, d in self.decls.items()} == {k: (d.shape, d.dtype) for k, d in recorded.items()}
        if same and (components is None or all(components.get(n) == c for n, c in mine.items())):
            return
        found = _adopt(mine, components) if components is not None else None
        if not isinstance(found, dict):
            detail = found or "the subcollection names differ, and this older partial save does not record the components' places"
            raise DataError(
                f"the object's parameters differ from the partial save in progress ({detail}); build the object as the "
                "run that started it did, or use PartialSaver.join(path)",
                Location(self.staging),
            )
        self._names = {m: t for m, t in found.items() if m != t}
        self.decls = recorded

    @classmethod
    def join(cls, path: str | os.PathLike, *, worker: str | None = None, durable: bool = True,
             storage_options: Mapping[str, Any] | None = None) -> PartialSaver:
        """A worker's saver for a partial save another process started (no model object needed)."""
        return cls(path, None, worker=worker, durable=durable, storage_options=storage_options)

    def _read_layout(self) -> tuple[dict[str, _Decl] | None, dict[str, _Component] | None]:
        """(``{"sub/param": _Decl}``, ``{sub: _Component}`` or None for a layout written before components were recorded)."""
        lpath = os.path.join(self.staging, LAYOUT) if self._area is None else self._area.where(LAYOUT)
        try:
            if self._area is not None:
                text = self._area.read_layout(LAYOUT, MAX_LAYOUT)
                if text is None:
                    return None, None
                raw = json.loads(text)
                raw.pop("run", None)
            else:
                with open_regular(lpath, "the partial save's layout") as f:
                    raw = json.loads(f.read(MAX_LAYOUT + 1))
            if not isinstance(raw, dict):
                raise ValueError("not a mapping")
            if raw.get("version") != 2:  # the first layout: {"sub/param": {"shape", "dtype"}}
                return {k: _Decl(tuple(v["shape"]), parse_dtype(v["dtype"])) for k, v in raw.items()}, None
            decls, comps = {}, {}
            for sub, c in raw["subcollections"].items():
                params = []
                for p, v in c["params"].items():
                    decls[f"{sub}/{p}"] = _Decl(tuple(v["shape"]), parse_dtype(v["dtype"]))
                    params.append((p, tuple(v["shape"]), str(v["dtype"])))
                comps[sub] = _Component(str(c["path"]), str(c["class"]), tuple(sorted(params)))
            return decls, comps
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise DataError(f"unreadable partial-save layout: {e}", Location(lpath)) from None

    def _key(self, key: str) -> str:
        """A key in the partial save's names (this object's names are translated)."""
        sub, sep, name = key.partition("/")
        return f"{self._names.get(sub, sub)}{sep}{name}"

    def _shown(self, key: str) -> str:
        """A key in this object's names (what the caller knows)."""
        back = {t: m for m, t in self._names.items()}
        sub, sep, name = key.partition("/")
        return f"{back.get(sub, sub)}{sep}{name}"

    def _decl(self, key: str) -> Any:
        decl = self.decls.get(self._key(key))
        if decl is None:
            known = [self._shown(k) for k in self.decls]
            raise DataError(f"no parameter {key!r}{did_you_mean(key, known)}", Location(self.path))
        return decl

    def _written(self) -> dict[str, list[dict]]:
        """The blocks on disk, per ``"sub/param"`` in the partial save's names, sorted by first row."""
        out: dict[str, list[dict]] = {}
        listed: dict[str, dict[str, str]] = {}
        for key in self.decls:
            sub, name = key.split("/")
            d = os.path.join(self.staging, sub)
            notes = []
            pattern = re.compile(re.escape(name) + r"@[0-9]+-[0-9]+\.block\.json")
            if self._area is not None:
                found = listed[sub] if sub in listed else listed.setdefault(sub, self._area.notes(sub))
                for f, url in sorted(found.items()):
                    if pattern.fullmatch(f) and (note := self._area.read_note(url, MAX_NOTE)) is not None:
                        notes.append(_note(url, note))
                if notes:
                    out[key] = sorted(notes, key=lambda n: n["first"])
                continue
            for f in LOCAL.listdir(d):
                if pattern.fullmatch(f):
                    notes.append(_note(os.path.join(d, f)))
            if notes:
                out[key] = sorted(notes, key=lambda n: n["first"])
        return out

    def written(self) -> dict[str, list[dict]]:
        """The blocks on disk, per ``"sub/param"`` (this object's names), sorted by first row (from every worker)."""
        return {self._shown(k): v for k, v in self._written().items()}

    def _missing(self) -> dict[str, list[tuple[int, int]]]:
        out = {}
        for key, notes in self._written().items():
            gaps, nxt = [], 0
            for n in notes:
                if n["first"] > nxt:
                    gaps.append((nxt, n["first"]))
                nxt = max(nxt, n["first"] + n["count"])
            rows = self.decls[key].shape[0]
            if nxt < rows:
                gaps.append((nxt, rows))
            if gaps:
                out[key] = gaps
        return out

    def missing(self) -> dict[str, list[tuple[int, int]]]:
        """Row ranges ``(first, stop)`` not written yet, for every parameter written in blocks (this object's names)."""
        return {self._shown(k): v for k, v in self._missing().items()}

    def write_rows(self, key: str, first: int, rows: Any) -> str:
        """Write rows ``first .. first + len(rows)`` of parameter ``key`` as one block file; returns its path."""
        decl = self._decl(key)
        rows = np.asarray(rows)
        where = Location(self.path, path=key)
        if not decl.shape:
            raise DataError("a scalar parameter has no rows", where)
        if rows.dtype != decl.dtype or rows.shape[1:] != decl.shape[1:] or rows.ndim != len(decl.shape):
            raise DataError(
                f"rows are {shape_str(rows.shape)} {rows.dtype}; the parameter is {shape_str(decl.shape)} {decl.dtype}", where
            )
        stop = first + rows.shape[0]
        if not (0 <= first < stop <= decl.shape[0]):
            raise DataError(f"rows ({first}, {stop}) are outside the parameter's {decl.shape[0]} rows", where)
        key = self._key(key)
        for n in self._written().get(key, []):
            if first < n["first"] + n["count"] and n["first"] < stop:
                raise DataError(
                    f"rows ({first}, {stop}) overlap the block ({n['first']}, {n['first'] + n['count']}) written by {n['worker']}", where
                )
        sub, name = key.split("/")
        fname = f"{name}@{first}-{stop}.npy"
        if self._area is not None:
            note = {"first": first, "count": stop - first, "file": fname, "worker": self.worker}
            return self._area.write_block(sub, fname, rows, note)[0]
        full = os.path.join(self.staging, sub, fname)
        size, digest = put_array(LOCAL, full, rows, durable=self.durable)
        note = {"first": first, "count": stop - first, "file": fname, "bytes": size, "xxh3_64": digest, "worker": self.worker}
        write_text_atomic(full[: -len(".npy")] + ".block.json", json.dumps(note) + "\n", durable=self.durable)
        return full

    def _blocks(self, written: dict[str, list[dict]], src: Any, size_of: Any) -> dict[str, FromFiles]:
        """The blocked parameters as files of ``src`` to link (each file's size checked against its note)."""
        replace = {}
        for key, notes in written.items():
            decl = self.decls[key]
            sub = key.split("/")[0]
            files = []
            for n in notes:
                rel = f"{sub}/{n['file']}"
                actual = size_of(rel)
                if actual is None:
                    raise DataError("the block file its note names is missing", Location(src.where(rel)))
                if actual != n["bytes"]:
                    raise DataError(f"block file has {actual} bytes, its note says {n['bytes']}", Location(src.where(rel)))
                files.append(FromFile(src, rel, decl.dtype, (n["count"],) + decl.shape[1:], n["bytes"],
                                      ("xxh3_64", n["xxh3_64"]), (n["first"],) + (0,) * (len(decl.shape) - 1)))
            replace[self._shown(key)] = FromFiles(decl.dtype, decl.shape, tuple(files))
        return replace

    def finalize(self, *, training: dict | None = None, custom: dict | None = None, name: str | None = None) -> None:
        """Check every blocked parameter is covered exactly once, then publish one checkpoint."""
        from .saver import SaveOptions, save_model

        if self.obj is None:
            raise DataError("finalize needs the model object: call it on a PartialSaver made with one", Location(self.staging))
        written = self._written()
        problems = []
        for key, notes in written.items():
            nxt = 0
            for n in notes:
                if n["first"] < nxt:
                    problems.append(f"{self._shown(key)}: blocks overlap at row {n['first']}")
                nxt = max(nxt, n["first"] + n["count"])
        for key, gaps in self.missing().items():
            problems.append(f"{key}: rows {', '.join(f'{a}-{b - 1}' for a, b in gaps)} are missing")
        if problems:
            raise DataError("cannot finalize: " + "; ".join(problems), Location(self.staging))
        if self._area is not None:
            area = self._area
            with storage_context(self._options):
                sizes = area.sizes()
                replace = self._blocks(written, area.source(), lambda rel: sizes.get(area.where(rel)))
                save_model(self.obj, self.path, SaveOptions(self.durable), name=name, training=training, custom=custom, replace=replace)
                area.remove(LAYOUT)  # the layout first: the partial save is gone at once, then its blocks
            return

        def size_of(rel: str) -> int:
            with src.open_file(rel) as fh:
                return os.fstat(fh.fileno()).st_size

        with DirHandle.open_dir(self.staging) as src:
            replace = self._blocks(written, src, size_of)
            save_model(self.obj, self.path, SaveOptions(self.durable), name=name, training=training, custom=custom, replace=replace)
        # one rename takes the blocks away (a kill while deleting them never leaves a partial save with holes), then delete
        try:
            remove_tree(self.staging, data_dir_of(self.path, 0))
        except OSError as e:
            raise DataError(f"the model is saved, but the partial save's blocks could not be moved away: {e.strerror or e} "
                            "(they are whole; remove the directory)", Location(self.staging)) from None
        if self.durable:
            try:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            except OSError as e:
                raise DataError(f"cannot sync the model's directory: {e.strerror or e}", Location(self.path)) from None
