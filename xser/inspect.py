"""A view of any saved model without importing its component classes.

It reads the spec text (every tag kept as written) and the data directory.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import SpecError
from .spec import Tagged, children, format_path, read
from .checkpointing import Checkpoint, checkpoint_dir, checkpoints
from .store import DataDir

__all__ = ["ModelView", "open_model"]


class ModelView:
    def __init__(self, path: str, doc: Any, data: DataDir, ckpts: list[Checkpoint]) -> None:
        self.path = path
        self.tree = doc.tree
        self.data = data
        self.checkpoints = ckpts
        self.components: list[tuple[str, Tagged]] = []
        exp = self.tree.get("experiment") if isinstance(self.tree, dict) else None
        self._walk(exp, ())

    def _walk(self, node: Any, path: tuple) -> None:
        if isinstance(node, Tagged):
            self.components.append((format_path(path), node))
            if node.tag == "!Ref":
                return
        for k, v in children(node):
            self._walk(v, path + (k,))

    @property
    def spec_subcols(self) -> dict[str, str]:
        return {
            t.args["xser_subcol_name"]: p
            for p, t in self.components
            if t.tag != "!Ref" and isinstance(t.args.get("xser_subcol_name"), str)
        }

    def lines(self) -> list[str]:
        meta = self.data.meta
        name = self.tree.get("name") if isinstance(self.tree, dict) else None
        out = [
            f"model {self.path}",
            f"  experiment: {name}",
            f"  saved: {meta.get('created')} by xser {meta.get('xser_version')} (format {meta.get('format_version')})",
        ]
        for key in ("training", "custom"):
            if meta.get(key):
                text = str(meta[key])
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
        n_bytes = sum(b.bytes for p in subs.values() for e in p.values() for b in e.blocks)
        out.append("")
        out.append(f"subcollections: {len(subs)}, {n_params} params, {n_bytes:,} bytes on disk")
        owners = self.spec_subcols
        for sub, params in subs.items():
            where = owners.get(sub)
            out.append(f"  {sub}  ({'not used by the spec' if where is None else 'at ' + (where or 'the root')})")
            width = max((len(n) for n in params), default=0)
            for pname, e in params.items():
                shape = repr(tuple(e.shape))
                flag = "" if e.trainable else "  (not trainable)"
                if len(e.blocks) > 1:
                    flag += f"  ({len(e.blocks)} blocks)"
                size = sum(b.bytes for b in e.blocks)
                out.append(f"    {pname:<{width}}  {shape:<14} {str(e.dtype):<8} {size:>12,} B{flag}")
        if len(self.checkpoints) > 1 or any(c.step is not None or c.metrics for c in self.checkpoints):
            out.append("")
            out.extend(checkpoint_table(self.checkpoints))
        missing = sorted(set(owners) - set(subs))
        if missing:
            out.append("")
            out.append(f"warning: named in the spec but missing on disk: {', '.join(missing)}")
        return out


def checkpoint_table(ckpts: list[Checkpoint]) -> list[str]:
    """The checkpoints as an aligned text table, newest first."""
    names = sorted({m for c in ckpts for m in c.metrics})
    head = ["#", "directory", "step", "created"] + names + ["training state"]
    rows = [
        [str(c.index), os.path.basename(c.path), "-" if c.step is None else str(c.step), c.created]
        + [_fmt(c.metrics.get(m)) for m in names]
        + ["yes" if c.has_training_state else "-"]
        for c in ckpts
    ]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return [f"checkpoints: {len(ckpts)}", line(head)] + [line(r) for r in rows]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def open_model(path: str | os.PathLike, checkpoint: int = 0) -> ModelView:
    path = os.fspath(path)
    doc = read(path)
    if not (isinstance(doc.tree, dict) and "xser_format" in doc.tree):
        raise SpecError("not a saved xser model (no xser_format key)", doc.where(doc.tree) if doc.tree is not None else None)
    return ModelView(path, doc, DataDir.open(checkpoint_dir(path, checkpoint)), checkpoints(path))
