"""Spec tree -> object graph: references, shared objects, placeholders, and
components loaded out of saved models (``!LoadSerialized``).

Objects are built bottom-up, each at its *canonical path*; every ``!Ref`` to the
same path gets the same object, so sharing in the spec is identity in Python.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import attrs
import numpy as np

from . import typecheck
from ..errors import DataError, Location, RegistryError, SpecError, XserError, did_you_mean
from .adapters import LOAD
from .params import BUILD, PRESET_NAME, PRESET_SOURCE, PRESET_WHERE, SUBCOL_RE, BuildState, fresh_name
from .refs import NotFound, Resolver, dedupe_ids, inline, parse_path
from .registry import info_for, lookup
from ..spec import Doc, Tagged, format_path, iter_tagged, rewrite_children
from ..spec.saved import absolute_paths, open_saved
from ..storage.stores import beside, is_url, parent_of
from ..storage.opened import OpenedDir
from ..storage.progress import progress
from .placeholders import substitute
from .sources import Store, _Origin, _Source
from .sugar import expand_sugar, random_args

_log = logging.getLogger("xser")

__all__ = ["Experiment", "ExperimentSpec", "Store", "build", "build_spec", "experiment_name"]


@attrs.frozen
class ExperimentSpec:
    """One unbuilt experiment: its name, its tree, and where it came from."""

    name: str | None
    tree: Any = attrs.field(repr=False)
    doc: Doc = attrs.field(repr=False, eq=False)
    file: str | None = None
    #: the opened data directory of a saved model (its parameters are loaded, not initialised)
    data: OpenedDir | None = attrs.field(default=None, eq=False, repr=False)
    sealed: str | None = None  # the checkpoint's own spec when ``tree`` is a top-level file edited by hand since


# ---------------------------------------------------------------- the builder


class Builder:
    def __init__(
        self, spec: ExperimentSpec, *, mmap: bool = False, verify: bool = False, seed: Any = None, rows: dict | None = None,
        tables: dict | None = None, missing: str = "error", copy: bool = False,
    ) -> None:
        self.missing, self.copy = missing, copy
        self.spec = spec
        self.doc = Doc(None, spec.file)
        self.doc.adopt(spec.doc)
        self.mmap = mmap
        self.verify = verify
        self.rows = rows
        self.tables = tables
        key = repr(seed) if isinstance(seed, (int, str)) and not isinstance(seed, bool) else None
        self.state = BuildState(np.random.default_rng(seed), unsaved=[] if spec.data is not None else None, missing=missing,
                                seed_key=key)
        self.stores: dict[Any, Store] = {}
        self.opened: list[Any] = []
        self.saved: dict[str, tuple[Any, Resolver, Store]] = {}
        self.memo: dict[tuple, Any] = {}
        self.active: set[tuple] = set()
        self.resolver: Resolver | None = None
        self.draws: dict[tuple, list] = {}

    # -- stores and saved models

    def store(self, datadir: OpenedDir, edited: tuple | None = None) -> Store:
        key = datadir.ino
        if key not in self.stores:
            main = self.spec.data is not None and key == self.spec.data.ino
            self.stores[key] = Store(datadir, mmap=self.mmap, verify=self.verify, rows=self.rows if main else None,
                                     tables=self.tables if main else None, missing=self.missing if main else "error",
                                     edited=(self.spec.file, self.spec.sealed) if main and self.spec.sealed else edited, copy=self.copy)
        return self.stores[key]

    def cancel(self) -> None:
        for store in self.stores.values():
            store.cancel()

    def close(self) -> None:
        """Close the saved models this build opened for ``!LoadSerialized`` (not the caller's)."""
        for saved in self.opened:
            saved.close()
        self.opened.clear()

    def mark_origin(self, node: Any, store: Store) -> set[str]:
        """Give every component of a loaded subtree its data source; return the names used."""
        names: set[str] = set()
        for n in iter_tagged(node):
            if n.tag != "!Ref":
                name = n.args.get("xser_subcol_name")
                n.origin = _Origin(store, name if isinstance(name, str) else None)
                if isinstance(name, str):
                    names.add(store.mark(name, n.tag))
        return names

    # -- !LoadSerialized

    def expand_loads(self, node: Any, path: tuple, outer_ids: set[str]) -> Any:
        if isinstance(node, Tagged) and node.tag == "!LoadSerialized":
            return self._load_serialized(node, path, outer_ids)
        rewrite_children(node, lambda k, v: self.expand_loads(v, path + (k,), outer_ids))
        return node

    def _load_serialized(self, node: Tagged, path: tuple, outer_ids: set[str]) -> Any:
        loc = self.doc.where(node)
        args = node.args
        unknown = set(args) - {"filename", "path", "overwrite"}
        if unknown:
            key = sorted(unknown, key=str)[0]
            hint = did_you_mean(str(key), ["filename", "path", "overwrite"])
            raise SpecError(f"!LoadSerialized: unknown argument {key!r}{hint}", self.doc.where(node, key, of_key=True))
        fname = args.get("filename")
        if not isinstance(fname, str) or not fname:
            raise SpecError("!LoadSerialized needs filename: the saved model's .yaml file", loc)
        fname = beside(self.spec.file or os.path.join(os.getcwd(), "-"), fname)  # relative to the config (a URL too)
        key = fname if is_url(fname) else os.path.realpath(fname)
        if key not in self.saved:
            try:
                saved = open_saved(fname)
            except XserError as e:  # the same kind of error, placed at the config line that asked for the file
                raise type(e)(f"!LoadSerialized {args.get('filename')!r}: {e}", loc) from None
            self.opened.append(saved)
            self.doc.adopt(saved.doc)
            experiment = absolute_paths(saved.experiment, fname, saved.doc)
            self.saved[key] = (experiment, Resolver(experiment, saved.doc), self.store(saved.data, saved.edited))
        tree, resolver, store = self.saved[key]
        sub_path = parse_path(args.get("path", ""), self.doc.where(node, "path"))
        try:
            canon = resolver.canonical(sub_path, loc)
        except NotFound as e:
            raise SpecError(f"!LoadSerialized: path {args.get('path')!r} not found in {fname}: {e.why}", loc) from None
        new = inline(resolver, canon, path)
        _refuse_loads(new, self.doc)
        names = self.mark_origin(new, store)
        dedupe_ids(new, outer_ids)
        overwrite = args.get("overwrite", [])
        if not isinstance(overwrite, list):
            raise SpecError("!LoadSerialized: overwrite must be a list of {path, val}", self.doc.where(node, "overwrite"))
        for i, item in enumerate(overwrite):
            iloc = self.doc.where(overwrite, i)
            if not isinstance(item, dict) or set(item) != {"path", "val"}:
                raise SpecError("!LoadSerialized: each overwrite item must be exactly {path: ..., val: ...}", iloc)
            new = self._overwrite(new, parse_path(item["path"], iloc), item["val"], iloc)
        store.prefetch(names)
        return self.expand_loads(new, path, outer_ids)

    def _overwrite(self, root: Any, path: tuple, val: Any, loc: Location | None) -> Any:
        if not path:
            return val
        node = root
        for i, seg in enumerate(path):
            last = i == len(path) - 1
            container = node.args if isinstance(node, Tagged) else node
            if isinstance(container, dict):
                key = seg if seg in container or not (seg.isdigit() and int(seg) in container) else int(seg)
                if last:
                    container[key] = val
                elif key not in container:
                    near = did_you_mean(str(seg), [str(k) for k in container if k not in ("xser_subcol_name", "xser_id", "xser_version")])
                    raise SpecError(f"overwrite path {format_path(path)!r}: {format_path(path[:i]) or 'root'} has no key {seg!r}{near}", loc)
                else:
                    node = container[key]
            elif isinstance(container, list):
                try:
                    idx = int(seg)
                    container[idx] if not (last and idx == len(container)) else None
                except (ValueError, IndexError):
                    raise SpecError(f"overwrite path {format_path(path)!r}: no index {seg!r} in a list of {len(container)}", loc) from None
                if last:
                    if idx == len(container):
                        container.append(val)
                    else:
                        container[idx] = val
                else:
                    node = container[idx]
            else:
                raise SpecError(f"overwrite path {format_path(path)!r}: {format_path(path[:i])} is not a mapping or list", loc)
        return root

    # -- building

    def run(self, tree: Any, placeholders: dict[str, Any] | None) -> Any:
        if self.spec.data is None:
            values = {
                "EXP": self.spec.name if self.spec.name is not None else "",
                "EXP_DIR": parent_of(self.spec.file) if self.spec.file else os.getcwd(),
                "PID": str(os.getpid()),
            }
            values.update(placeholders or {})
            tree = substitute(tree, values, self.doc, Location(self.spec.file))
            tree, self.draws = expand_sugar(tree, self.doc, self.state.rng)  # !Repeat, !RandomParam
        else:
            _refuse_loads(tree, self.doc)  # a saved spec never makes a load read another file
            tree = absolute_paths(tree, self.spec.file, self.doc)  # paths inside the model's directory, where it is now
            tree, self.draws = expand_sugar(tree, self.doc, self.state.rng)  # saved: the drawn values again
            store = self.store(self.spec.data)
            store.prefetch(self.mark_origin(tree, store))
        outer = Resolver(tree, self.doc)
        tree = self.expand_loads(tree, (), set(outer.ids))
        self.resolver = Resolver(tree, self.doc)
        token = BUILD.set(self.state)
        try:
            return self.build_node(tree, ())
        finally:
            BUILD.reset(token)

    def build_node(self, node: Any, path: tuple, loc: Location | None = None) -> Any:
        if path in self.memo:
            return self.memo[path]
        if isinstance(node, Tagged):
            here = (loc or self.doc.where(node) or Location(self.spec.file)).with_path(format_path(path))
            if node.tag == "!Ref":
                kind, target = self.resolver.target(node, here)
                if kind == "value":
                    return copy.deepcopy(target)
                if target in self.active or target == path:
                    raise SpecError(f"reference cycle: {format_path(target) or 'the experiment'} contains a !Ref to itself", here)
                out = self.build_node(self.resolver.node_at(target), target)
            elif node.tag == "!LoadSerialized":
                raise SpecError("!LoadSerialized inside a saved model is not allowed", here)
            else:
                self.active.add(path)
                try:
                    out = self.construct(node, path, here)
                finally:
                    self.active.discard(path)
        elif isinstance(node, dict):
            self.active.add(path)
            try:
                out = (Experiment if path == () else dict)(
                    (k, self.build_node(v, path + (k,), self.doc.where(node, k))) for k, v in node.items()
                )
            finally:
                self.active.discard(path)
        elif isinstance(node, list):
            self.active.add(path)
            try:
                out = [self.build_node(v, path + (i,), self.doc.where(node, i)) for i, v in enumerate(node)]
            finally:
                self.active.discard(path)
        else:
            return node
        self.memo[path] = out
        return out

    def construct(self, node: Tagged, path: tuple, here: Location) -> Any:
        info = lookup(node.tag, here.with_path(None) if here.file else here)
        args = dict(node.args)
        subcol = args.pop("xser_subcol_name", None)
        xid = args.pop("xser_id", None)
        version = args.pop("xser_version", None)
        args = self._migrate(info, args, version, node, here)
        saved_version = version if isinstance(version, int) else 1
        if subcol is not None and (not isinstance(subcol, str) or not SUBCOL_RE.fullmatch(subcol)):
            raise SpecError(
                f"xser_subcol_name must be 'ClassName.<8 lowercase hex>', got {subcol!r}",
                self._arg_loc(node, "xser_subcol_name", path),
            )
        fields = {f.alias: f for f in info.fields}
        for key in args:
            if key not in fields:
                hint = did_you_mean(str(key), fields)
                raise SpecError(f"unknown argument {key!r} of {info.tag}{hint}", self._arg_loc(node, key, path, of_key=True))
        missing = [a for a, f in fields.items() if a not in args and f.default is attrs.NOTHING]
        if missing:
            raise SpecError(f"{info.tag} is missing required argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}", here)
        kwargs = {}
        for key, raw in args.items():
            value = self.build_node(raw, path + (key,), self.doc.where(node, key))
            f = fields[key]
            tp = info.field_type(f)
            if tp is not None and f.converter is None and not (value is None and f.default is None):
                try:
                    value = typecheck.check_at(value, tp)
                except typecheck.Mismatch as m:
                    hint = ""
                    tag = getattr(info_for(m.tp), "tag", None) if isinstance(m.tp, type) else None
                    if tag is not None and isinstance(m.value, dict):
                        hint = f"; a component needs its tag: {tag} {{...}}"
                    raise SpecError(f"expected {m.expected}, got {typecheck.describe(m.value)}{hint}",
                                    self._element_loc(node, key, path, m.where)) from None
            kwargs[key] = value
        obj = info.cls.__new__(info.cls)
        d = obj.__dict__
        d[PRESET_WHERE] = here
        if subcol is not None:
            if subcol in self.state.names:
                if node.origin is None:
                    raise SpecError(
                        f"subcollection name {subcol} is used twice: here and at {self.state.names[subcol]}",
                        self._arg_loc(node, "xser_subcol_name", path),
                    )
                subcol = fresh_name(info.cls, format_path(path))  # a second copy of a loaded component
            d[PRESET_NAME] = subcol
        elif self.state.seed_key is not None:
            d[PRESET_NAME] = fresh_name(info.cls, format_path(path) or "(root)")
        if node.origin is not None and isinstance(node.args.get("xser_subcol_name"), str):
            node.origin.store.named.setdefault(node.args["xser_subcol_name"], str(here))
        if node.origin is not None:
            old = info.migrate_params is not None and saved_version < (info.version or 1)
            d[PRESET_SOURCE] = _Source(node.origin, here, (info.migrate_params, saved_version, info.tag) if old else None)
        if xid is not None:
            d["_xser_id"] = xid
        drawn = random_args(self.draws, path, args)
        if drawn:
            d["_xser_random"] = drawn
        try:
            obj.__init__(**kwargs)
        except RegistryError as e:  # e.g. a shape from these arguments that cannot be: say which config line made it
            raise SpecError(f"{info.tag} built from these arguments: {e.message}", here) from None
        except XserError:
            raise
        except Exception as e:
            raise SpecError(f"{info.tag} could not be built: {type(e).__name__}: {e}", here) from e
        return obj

    def _element_loc(self, node: Tagged, key: Any, path: tuple, inner: tuple) -> Location:
        """Where an element inside argument ``key`` is: its line when the YAML has it, and its dotted path."""
        loc = self._arg_loc(node, key, path)
        container, last = node, key
        raw = node.args.get(key)
        for k in inner:
            if isinstance(raw, (dict, list)) and (k in raw if isinstance(raw, dict) else isinstance(k, int) and k < len(raw)):
                container, last, raw = raw, k, raw[k]
            else:
                break
        found = self.doc.where(container, last) if container is not node else None
        return (found or loc).with_path(format_path(path + (key,) + inner))

    def _arg_loc(self, node: Tagged, key: Any, path: tuple, *, of_key: bool = False) -> Location:
        base = self.doc.where(node, key, of_key=of_key) or Location(self.spec.file)
        return base.with_path(format_path(path + (key,)))

    def _migrate(self, info: Any, args: dict, version: Any, node: Tagged, here: Location) -> dict:
        current = info.version or 1
        if version is None:
            version = 1
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SpecError(f"xser_version must be an int >= 1, got {version!r}", here)
        if version > current:
            raise SpecError(f"{info.tag} was saved by version {version} of its class; this code has version {current}", here)
        if version < current and info.migrate is None and info.migrate_params is not None:
            return args  # only the parameters changed: migrate_params handles them when they are read
        if version < current:
            if info.migrate is None:
                raise SpecError(
                    f"{info.tag} was saved by version {version}; version {current} has no migrate= to read it: add "
                    f"@xser.serializable(version={current}, migrate=fn) with fn(args, old_version) -> the arguments of version "
                    f"{current} (and migrate_params=fn(arrays, old_version) if parameters were renamed)", here)
            try:
                args = info.migrate(dict(args), version)
            except Exception as e:
                raise SpecError(f"{info.tag}: migration from version {version} failed: {type(e).__name__}: {e}", here) from e
            if not isinstance(args, dict):
                raise SpecError(f"{info.tag}: migrate must return a dict of arguments, got {type(args).__name__}", here)
        return args


def _refuse_loads(tree: Any, doc: Doc) -> None:
    """A saved spec holds only components and values: ``!LoadSerialized`` there is refused, with its line."""
    for node in iter_tagged(tree):
        if node.tag == "!LoadSerialized":
            raise SpecError(
                "!LoadSerialized is not allowed in a saved model: a saved spec holds only components and values, "
                "and loading it never reads another file",
                doc.where(node),
            )


def build(
    spec: ExperimentSpec | Any,
    *,
    placeholders: dict[str, Any] | None = None,
    seed: Any = None,
) -> Any:
    """Build the object graph of one experiment (parameters are numpy arrays)."""
    if not isinstance(spec, ExperimentSpec):
        doc = Doc(spec, None)
        spec = ExperimentSpec(None, spec, doc)
    return build_spec(spec, placeholders=placeholders, seed=seed)


def build_spec(
    spec: ExperimentSpec,
    *,
    placeholders: dict[str, Any] | None = None,
    seed: Any = None,
    mmap: bool = False,
    verify: bool = False,
    strict: bool = False,
    rows: dict | None = None,
    device: Any = None,
    tables: dict | None = None,
    missing: str = "error", copy: bool = False,
) -> Any:
    if missing not in ("error", "init"):
        raise DataError(f'missing must be "error" or "init", got {missing!r}')
    builder = Builder(spec, mmap=mmap, verify=verify, seed=seed, rows=rows, tables=tables, missing=missing, copy=copy)
    options = LOAD.set({"mmap": mmap, "device": device})
    total = 0 if spec.data is None or mmap else sum(e.nbytes for ps in spec.data.subcollections.values() for e in ps.values())
    with progress(total, "loading"):
        try:
            tree = builder.doc.copy(spec.tree)
            obj = builder.run(tree, placeholders)
            if strict and spec.data is not None:
                builder.store(spec.data).check_all_used()
            if spec.data is not None and (builder.store(spec.data).initialised or builder.state.unsaved):
                _log.warning("%s: not in the saved data, started from their declared init (missing=\"init\"): %s",
                             spec.data.path, ", ".join(builder.store(spec.data).initialised + (builder.state.unsaved or [])))
        finally:
            LOAD.reset(options)
            builder.cancel()  # prefetches nobody asked for (strict=False), or all of them after a failure
            builder.close()
    _name_root(obj, spec.name)
    return obj


class Experiment(dict):
    """A built experiment that is a plain mapping; remembers its name for ``save``."""

    name: str | None = None


def experiment_name(obj: Any) -> str | None:
    """The experiment name a built object remembers (``{EXP}``), for ``save``."""
    if isinstance(obj, Experiment):
        return obj.name
    return getattr(obj, "__dict__", {}).get("_xser_experiment")


def _name_root(obj: Any, name: str | None) -> None:
    if isinstance(obj, Experiment):
        obj.name = name
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        obj.__dict__["_xser_experiment"] = name
