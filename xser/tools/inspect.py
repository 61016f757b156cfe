"""A view of any saved model without importing its component classes.

It reads a checkpoint's spec text (every tag kept as written) and its data directory, says
where the spec came from and whether the top-level file is in step, and (``verify``) checks
every checkpoint: checksums, and that its spec and its data belong together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..api import retrying
from ..errors import CheckpointError, DataError, Location
from ..spec import Tagged, children, format_path
from ..storage.dtypes import find
from ..spec.saved import MODEL_PATH, SavedModel, hand_edit, open_saved, top_level_state, with_edit, with_spec
from ..storage.layout import models_in, slot_of
from ..storage.listing import Checkpoint, checkpoints, scan
from ..storage.scanned import common_training
from ..storage.objects.commit import RemoteScan, data_root, record_path
from ..storage.objects.opened import RemoteDir
from ..storage.stores import is_url, store_for
from ..storage.stores import options as storage_context
from .convert import spec_subcols
from .ranks import rank_lines, ranks_json
from .reader import tensor_lines  # noqa: F401 - the CLI imports it from here
from .where import is_dir, is_file, join, same_path

__all__ = ["ModelView", "foreign_kind", "json_text", "not_a_model_directory", "open_model", "verify_model"]

_TOP = {
    "in step": "the top-level spec file equals this checkpoint's spec",
    "edited": "the top-level spec file was edited by hand since this checkpoint was saved; load builds it, checked "
    "against this checkpoint's data, and a save of the loaded model stores it",
    "out of step": "the top-level spec file is another checkpoint's spec (a save was interrupted, or is running); "
    "the checkpoint's own spec is used, and the next save rewrites the file",
    "missing": "there is no top-level spec file (a save was interrupted); the checkpoint's own spec is used",
    "no copy": "this checkpoint (format_version 1) has no spec of its own; the top-level file is its spec",
    "unreadable": "the top-level spec file cannot be read; the checkpoint's own spec is used",
}


def remote_layout(s: Any) -> dict[str, Any] | None:
    """Where a model on an object store is (None for a local model): ``{store, commit, record, checkpoints}``, the
    store's scheme, the number and URL of the commit record read, and the prefix of each checkpoint it lists, newest
    first (docs/format.md, section 6)."""
    if not isinstance(s, RemoteScan):
        return None
    store, path = s.store, s.spec_path
    root = data_root(store, path)
    return {
        "store": store.scheme,
        "commit": s.seq,
        "record": record_path(store, path, s.seq) if s.record is not None else None,
        "checkpoints": [store.join(root, p) + "/" for p in s.prefixes],
    }


class ModelView:
    def __init__(self, path: str, saved: SavedModel, ckpts: list[Checkpoint], others: list[str],
                 remote: dict[str, Any] | None = None) -> None:
        self.path = path
        self.tree = saved.doc.tree
        self.data = saved.data
        self.spec_file = saved.spec_file
        self.top = top_level_state(path, saved.data)
        self.edit = hand_edit(path, saved.data) if self.top == "edited" else None
        self.checkpoints = ckpts
        self.others = others  # notes on slots that are not this model's checkpoints
        self.remote = remote  # a model on an object store: remote_layout()
        self.components: list[tuple[str, Tagged]] = []
        exp = self.tree.get("experiment") if isinstance(self.tree, dict) else None
        self._walk(exp, ())

    def _walk(self, node: Any, path: tuple) -> None:
        if isinstance(node, Tagged) and node.tag == MODEL_PATH:
            return  # a path inside the model's directory (a value, not a component)
        if isinstance(node, Tagged):
            self.components.append((format_path(path), node))
            if node.tag == "!Ref":
                return
        for k, v in children(node):
            self._walk(v, path + (k,))

    def links(self, rel: str) -> int:
        """How many directory entries share the file (hard links between checkpoints and converted models)."""
        if isinstance(self.data, RemoteDir):  # objects have no links (and asking would cost a request per file)
            return 1
        try:
            with self.data.open_file(rel) as f:
                return os.fstat(f.fileno()).st_nlink
        except Exception:  # noqa: BLE001 - a listing must not fail on one unreadable file
            return 1

    @property
    def spec_subcols(self) -> dict[str, str]:
        return {
            t.args["xser_subcol_name"]: p
            for p, t in self.components
            if t.tag != "!Ref" and isinstance(t.args.get("xser_subcol_name"), str)
        }

    def bytes_on_disk(self) -> int:
        """What the checkpoint's parameter files weigh, each file once (tied parameters, safetensors files)."""
        subs = self.data.subcollections
        return sum(b.bytes for b in _files(e for p in subs.values() for e in p.values()).values())

    def params(self) -> list[tuple[str, str | None, list[tuple[Any, dict[str, Any]]]]]:
        """Per subcollection: (name, the component path that uses it or None, [(entry, record)]); a record is
        ``{name, shape, dtype, format, bytes, trainable, blocks, file, stored_with, links}`` (see ``as_json``)."""
        owners = self.spec_subcols
        first_of: dict = {}  # a parameter's blocks -> the first parameter stored in them (tied weights)
        out = []
        for sub, params in self.data.subcollections.items():
            records = []
            for pname, e in params.items():
                packed = e.blocks[0].key is not None  # one tensor of a file that holds several
                formats = sorted({b.format for b in e.blocks})
                same = first_of.setdefault(e.blocks, f"{sub}/{pname}")
                records.append((e, {
                    "name": pname,
                    "shape": list(e.shape),
                    "dtype": _dtype_name(e.dtype),
                    "format": formats[0] if len(formats) == 1 else formats,
                    "bytes": e.nbytes if packed else sum(b.bytes for b in e.blocks),
                    "trainable": bool(e.trainable),
                    "blocks": len(e.blocks),
                    "file": e.blocks[0].file.rpartition("/")[2] if packed else None,
                    "stored_with": None if same == f"{sub}/{pname}" else same,
                    "links": self.links(e.blocks[0].file),
                }))
            out.append((sub, owners.get(sub), records))
        return out

    def as_json(self) -> dict[str, Any]:
        """This checkpoint's contents as JSON data (the schema is in the README, "xser inspect --json")."""
        meta = self.data.meta
        name = self.tree.get("name") if isinstance(self.tree, dict) else None
        return {
            "model": self.path,
            "experiment": name if isinstance(name, str) else None,
            "checkpoint": {"directory": os.path.basename(self.data.path), "id": meta.get("id"), "step": meta.get("step"),
                           "created": meta.get("created"), "xser_version": meta.get("xser_version"),
                           "format_version": meta.get("format_version")},
            "spec": {"file": self.spec_file, "top_level": self.top},
            "training": self.training,
            "custom": meta.get("custom") or {},
            "world_size": len(self.data.manifest.ranks) or 1,
            "ranks": ranks_json(self.data),
            "components": [
                {"path": path, "tag": t.tag, "subcollection": t.args.get("xser_subcol_name") if t.tag != "!Ref" else None}
                | ({"ref": t.args.get("name") or t.args.get("path")} if t.tag == "!Ref" else {})
                for path, t in self.components
            ],
            "subcollections": [
                {"name": sub, "component": where, "params": [r for _, r in records]} for sub, where, records in self.params()
            ],
            "bytes_on_disk": self.bytes_on_disk(),
        } | ({"remote": self.remote} if self.remote is not None else {})

    @property
    def training(self) -> dict:
        """The checkpoint's ``training`` dict; of one saved by several ranks, the entries every rank saved alike."""
        return common_training(self.data.manifest.ranks)[0] | dict(self.data.meta.get("training") or {})

    def lines(self) -> list[str]:
        meta = self.data.meta
        name = self.tree.get("name") if isinstance(self.tree, dict) else None
        out = [
            f"model {self.path}",
            f"  experiment: {'(no name)' if name is None else name}",
            f"  saved: {meta.get('created')} by xser {meta.get('xser_version')} (format {meta.get('format_version')})",
            f"  checkpoint: {os.path.basename(self.data.path)}" + (f" (id {meta['id']})" if meta.get("id") else ""),
            f"  spec: {self.spec_file}",
            f"  top-level spec: {self.top}: {_TOP.get(self.top, '')}",
        ]
        if self.edit is not None:
            out.append(f"  edit: {self.edit.difference()}")
        if self.remote is not None:
            out.extend(remote_lines(self.remote))
        if self.data.manifest.ranks:
            out.append(f"  saved by: {len(self.data.manifest.ranks)} ranks (world size {len(self.data.manifest.ranks)})")
        for key in ("training", "custom"):
            value = self.training if key == "training" else meta.get(key)
            if value:
                text = str(value)
                if len(text) > 300:  # e.g. an imported model's original spec text
                    text = text[:300] + f"... ({len(text)} characters in the manifest)"
                out.append(f"  {key}: {text}")
        out.append("")
        out.append("components:")
        for path, t in self.components:
            depth = path.count(".") + 1 if path else 0
            pad = "  " * (depth + 1)
            if t.tag == "!Ref":
                target = t.args.get("name") or t.args.get("path")
                out.append(f"{pad}{path or '(root)'} -> {target}")
                continue
            extra = []
            if "xser_subcol_name" in t.args:
                extra.append(f"[{t.args['xser_subcol_name']}]")
            if "xser_id" in t.args:
                extra.append(f"(xser_id: {t.args['xser_id']})")
            out.append(f"{pad}{path or '(root)'}: {t.tag} {' '.join(extra)}".rstrip())
        subs = self.data.subcollections
        n_params = sum(len(p) for p in subs.values())
        out.append("")
        out.append(f"subcollections: {len(subs)}, {n_params} params, {self.bytes_on_disk():,} bytes on disk")
        for sub, where, params in self.params():
            out.append(f"  {sub}  ({'not used by the spec' if where is None else 'at ' + (where or 'the root')})")
            width = max((len(r["name"]) for _, r in params), default=0)
            for e, r in params:
                flag = "" if r["trainable"] else "  (not trainable)"
                if r["blocks"] > 1:
                    flag += f"  ({r['blocks']} blocks)"
                if r["file"] is not None:
                    flag += f"  (in {r['file']})"
                if r["stored_with"] is not None:
                    flag += f"  (stored once with {r['stored_with']})"
                if r["links"] > 1:
                    flag += f"  ({r['links']} links: shared with other checkpoints or models)"
                shape = repr(tuple(e.shape))
                out.append(f"    {r['name']:<{width}}  {shape:<14} {str(e.dtype):<8} {r['bytes']:>12,} B{flag}")
        out.extend(rank_lines(self.data))
        if len(self.checkpoints) > 1 or any(c.step is not None or c.metrics for c in self.checkpoints):
            out.append("")
            out.extend(checkpoint_table(self.checkpoints))
        if self.others:
            out.append("")
            out.extend(self.others)
        missing = sorted(set(self.spec_subcols) - set(subs))
        if missing:
            out.append("")
            out.append(f"warning: named in the spec but missing on disk: {', '.join(missing)}")
        return out


def remote_lines(remote: dict[str, Any]) -> list[str]:
    """The text lines of ``remote_layout``."""
    out = [f"  store: {remote['store']}:// (an object store: each checkpoint under its own prefix, published by a commit record)"]
    if remote["record"] is not None:
        out.append(f"  commit record {remote['commit']} ({remote['record']})")
    out.append("  checkpoint prefixes (newest first):")
    out.extend(f"    {i}  {p}" for i, p in enumerate(remote["checkpoints"]))
    return out


def _dtype_name(dtype: Any) -> str:
    """The dtype's name in xser's table (float32, bfloat16, ...), else numpy's description (records)."""
    d = find(dtype)
    return d.tag if d is not None else np.dtype(dtype).str


def _files(entries: Any) -> dict:
    """Each file the entries name, once (files shared by tied parameters or a safetensors file): file -> block."""
    return {b.file: b for e in entries for b in e.blocks}


def checkpoint_table(ckpts: list[Checkpoint]) -> list[str]:
    """The checkpoints as an aligned text table, newest first."""
    names = sorted({m for c in ckpts for m in c.metrics})
    ranks = any(c.world_size > 1 for c in ckpts)  # a column only where some checkpoint was saved by several ranks
    head = ["#", "directory", "step", "created"] + names + ["training state"] + (["ranks"] if ranks else [])
    rows = [
        [str(c.index), os.path.basename(c.path), "-" if c.step is None else str(c.step), c.created]
        + [_fmt(c.metrics.get(m)) for m in names]
        + ["yes" if c.has_training_state else "-"]
        + ([str(c.world_size)] if ranks else [])
        for c in ckpts
    ]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return [f"checkpoints: {len(ckpts)}", line(head)] + [line(r) for r in rows]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _others(s: Any) -> list[str]:
    out = [f"not listed: {d.path} is a checkpoint of another model (an interrupted replacement; the next save removes it)" for d in s.foreign]
    out += [f"not listed: {p} is not a checkpoint ({why}); the next save sets it aside" for p, why in s.damaged]
    return out


def open_model(path: str | os.PathLike, checkpoint: int = 0, *, storage_options: Mapping[str, Any] | None = None) -> ModelView:
    """The class-free view of checkpoint ``checkpoint`` of a saved model (the caller closes ``view.data``). A model on an
    object store (a URL; ``storage_options`` for its filesystem) also shows where it is (``view.remote``)."""
    path = os.fspath(path)

    def once() -> ModelView:
        with scan(path) as s:  # the checkpoint shown comes from the listing shown (one snapshot)
            ckpts, others, remote = s.checkpoints, _others(s), remote_layout(s)
            try:
                data = s.take(checkpoint)
            except DataError:
                data = None
        if data is None:
            saved = open_saved(path, checkpoint)  # nothing to take: its error says why (no model, not a saved spec...)
        else:
            try:
                saved = with_edit(with_spec(path, data))  # a top-level file edited by hand is what load builds
            except BaseException:
                data.close()
                raise
        try:
            return ModelView(path, saved, ckpts, others, remote)
        except BaseException:
            saved.close()
            raise

    with storage_context(storage_options):
        return retrying(path, once)


def belong_together(saved: SavedModel) -> None:
    """The spec names exactly the subcollections the data holds; a ``DataError`` says which differ."""
    named = set(spec_subcols(saved.experiment))
    held = set(saved.data.subcollections)
    missing, unused = sorted(named - held), sorted(held - named)
    if missing or unused:
        parts = []
        if missing:
            parts.append(f"the spec names {', '.join(missing)}, which the data lacks")
        if unused:
            parts.append(f"the data holds {', '.join(unused)}, which the spec does not name")
        raise DataError(f"spec and data do not belong together: {'; '.join(parts)}", Location(saved.data.path))


def verify_model(path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Check every checkpoint (checksums of every file, its spec against its data); one line per checkpoint.

    The checkpoints come from one listing and are checked through its opened directories (on an object store:
    every object is read, in ranged chunks)."""
    path = os.fspath(path)

    def once() -> list[str]:
        lines = []
        with scan(path) as s:
            for c, data in s.listed:
                saved = with_spec(path, data)
                data.read_all(verify=True)
                data.read_state_arrays(verify=True)
                ranks = [e for _, _, es in data.manifest.ranks for e in es.values()]  # each rank's training state
                for e in ranks:
                    data.read(e, verify=True)
                belong_together(saved)
                entries = [e for p in data.subcollections.values() for e in p.values()] + list(data.manifest.state_entries.values()) + ranks
                n = len(_files(entries)) + (data.manifest.spec is not None)
                lines.append(f"checkpoint {c.index} ({os.path.basename(data.path)}): {n} files match their checksums; "
                             "spec and data belong together")
        return lines

    with storage_context(storage_options):
        return retrying(path, once)


def foreign_kind(path: str, *, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """What ``xser inspect`` reads ``path`` as when it is no xser model file: "RecIS", "safetensors" (a file or a
    Hugging Face directory), or None (an xser model's spec file). ``path`` may be a URL (a prefix is a directory)."""
    with storage_context(storage_options):
        if is_dir(path):
            return "RecIS" if is_file(join(path, "index")) else "safetensors"
    return "safetensors" if path.endswith(".safetensors") else None


def not_a_model_directory(path: str, checkpoint_option: bool = True, *, storage_options: Mapping[str, Any] | None = None) -> None:
    """A directory that holds saved xser models, or is one's checkpoint directory, given where a model's file belongs:
    a ``CheckpointError`` naming the model file to give instead (and ``--checkpoint K`` where the command has the
    option). Other directories (safetensors, RecIS, anything else) pass. On an object store (a URL) a prefix is a
    directory: the model's data prefix, one of its checkpoint prefixes, or a prefix holding models."""
    if is_url(path):
        with storage_context(storage_options):
            _not_a_remote_model_directory(path, checkpoint_option)
        return
    if not is_dir(path) or is_file(os.path.join(path, "index")) or any(
        is_file(os.path.join(path, n)) for n in ("model.safetensors", "model.safetensors.index.json")
    ):
        return
    slot = slot_of(path)
    if slot is not None:
        spec = slot[0]
        try:
            index = next((c.index for c in checkpoints(spec) if same_path(c.path, path)), None)
        except (OSError, DataError, CheckpointError):
            index = None
        which = "" if not index else f" with --checkpoint {index}" if checkpoint_option else f" (this is its checkpoint {index})"
        raise CheckpointError(f"a checkpoint directory of the model {spec}; give the model's file instead: {spec}{which}",
                              Location(path))
    models = models_in(path)
    if len(models) == 1:
        raise CheckpointError(f"a directory that holds a saved model, not a model; give its model file instead: {models[0]}",
                              Location(path))
    if models:
        raise CheckpointError(f"a directory that holds saved models, not a model; give one of its model files instead: "
                              f"{', '.join(models)}", Location(path))


def _not_a_remote_model_directory(path: str, checkpoint_option: bool) -> None:
    """``not_a_model_directory`` for a URL: ``<model>.data/`` (or a prefix under it), or a prefix holding models."""
    store = store_for(path)
    base = path.rstrip("/")
    head, sep, rest = base.partition(".data/")
    spec = head if sep else (base[: -len(".data")] if base.endswith(".data") else None)
    if spec is not None and store.listdir(store.join(spec + ".data", "commits")):
        which = ""
        prefix = rest.split("/", 1)[0] if sep else ""
        if prefix:
            try:
                index = next((c.index for c in checkpoints(spec) if c.path.rstrip("/") == store.join(spec + ".data", prefix)), None)
            except (DataError, CheckpointError):
                index = None
            which = "" if not index else f" with --checkpoint {index}" if checkpoint_option else f" (this is its checkpoint {index})"
        what = "a checkpoint prefix" if prefix else "the data prefix"
        raise CheckpointError(f"{what} of the model {spec}; give the model's file instead: {spec}{which}", Location(path))
    if not store.isdir(path):
        return
    names = set(store.listdir(path))
    if "index" in names or names & {"model.safetensors", "model.safetensors.index.json"}:
        return
    models = sorted(store.join(path, n) for n in names if n + ".data" in names and store.size(store.join(path, n)) is not None)
    if len(models) == 1:
        raise CheckpointError(f"a directory that holds a saved model, not a model; give its model file instead: {models[0]}",
                              Location(path))
    if models:
        raise CheckpointError(f"a directory that holds saved models, not a model; give one of its model files instead: "
                              f"{', '.join(models)}", Location(path))


def json_text(report: Any) -> str:
    """``report`` as strict JSON (indented): non-finite numbers (a NaN metric) become null."""
    import json

    def strict(v: Any) -> Any:
        if isinstance(v, float) and not np.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: strict(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [strict(x) for x in v]
        return v

    return json.dumps(strict(report), indent=2, allow_nan=False)
