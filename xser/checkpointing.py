"""Checkpoints: ``.data`` (newest), ``.data.1``, ``.data.2``, ...; retention as a pure plan.

Order is by directory index; every published directory is a complete checkpoint with its
own manifest. A rotation moves directories one rename at a time in an order that never
changes their relative order, so a crash at any point leaves a list of whole checkpoints,
newest first, possibly with a gap that the next saver closes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from .commit import ModelLock, clean_temporaries, fsync_dir, plain_json, publish, stage, temp_name, write_text_atomic
from .errors import CheckpointError, DataError, Location
from .serialize import to_tree
from .spec import dump
from .store import OLD_MARK, DataDir, ParamEntry, data_dir_of, read_manifest, siblings

__all__ = [
    "AnyOf",
    "Checkpoint",
    "CheckpointSaver",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "Policy",
    "SaveReport",
    "checkpoints",
    "load_training_state",
    "plan",
]


_log = logging.getLogger("xser")

# ---------------------------------------------------------------- listing


@attrs.frozen
class Checkpoint:
    """One published checkpoint, as its manifest describes it."""

    index: int  # position in the list, 0 = newest
    path: str  # its data directory
    step: int | None
    created: str
    metrics: dict = attrs.field(factory=dict)
    training: dict = attrs.field(factory=dict)
    custom: dict = attrs.field(factory=dict)
    has_training_state: bool = False


def _slots(spec_path: str) -> list[tuple[int, str]]:
    """(slot number, directory) of every ``<model>.data[.N]`` directory, by slot."""
    parent, base, names = siblings(spec_path)
    pattern = re.compile(re.escape(base + ".data") + r"(?:\.([0-9]+))?")
    out = []
    for name in names:
        m = pattern.fullmatch(name)
        if m and os.path.isdir(os.path.join(parent, name)):
            slot = int(m.group(1)) if m.group(1) is not None else 0
            if m.group(1) is None or (m.group(1) == str(slot) and slot > 0):
                out.append((slot, os.path.join(parent, name)))
    return sorted(out)


def _listing(spec_path: str) -> list[tuple[Checkpoint, DataDir]]:
    """Every checkpoint with its opened data directory (each manifest is read once)."""
    out: list[tuple[Checkpoint, DataDir]] = []
    for _, path in _slots(spec_path):
        try:
            meta, entries = read_manifest(path)
        except DataError:
            continue  # not a checkpoint
        ck = Checkpoint(
            len(out), path, meta.get("step"), meta.get("created", ""), dict(meta.get("metrics") or {}),
            dict(meta.get("training") or {}), dict(meta.get("custom") or {}), "training_state" in meta,
        )
        out.append((ck, DataDir(path, meta, entries)))
    return out


def checkpoints(path: str | os.PathLike) -> list[Checkpoint]:
    """The checkpoints of a saved model, newest first, with step, time and metrics.

    Directories without a valid manifest are not checkpoints and are not listed.
    """
    return [ck for ck, _ in _listing(os.fspath(path))]


def checkpoint_dir(path: str | os.PathLike, checkpoint: int) -> str:
    """The data directory of checkpoint ``checkpoint`` (0 = newest)."""
    path = os.fspath(path)
    if not isinstance(checkpoint, int) or isinstance(checkpoint, bool) or checkpoint < 0:
        raise CheckpointError(f"checkpoint must be an int >= 0, got {checkpoint!r}", Location(path))
    direct = data_dir_of(path, checkpoint)
    if checkpoint == 0 and os.path.isdir(direct):
        return direct  # slot 0 exists: it is the newest, no listing needed
    found = checkpoints(path)
    if checkpoint < len(found):
        return found[checkpoint].path
    if not found:
        return direct  # opening it gives the precise error (missing directory, bad manifest)
    raise CheckpointError(
        f"no checkpoint {checkpoint}: the model has {len(found)} (0 to {len(found) - 1})", Location(path)
    )


# ---------------------------------------------------------------- retention


class Policy(Protocol):
    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        """Indices (into ``ckpts``, newest first) this policy wants kept."""
        ...


class _Combinable:
    def __or__(self, other: Policy) -> AnyOf:
        return AnyOf((self, other))


@attrs.frozen
class KeepLast(_Combinable):
    """Keep the newest ``n``."""

    n: int = attrs.field(validator=attrs.validators.ge(0))

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        return set(range(min(self.n, len(ckpts))))


@attrs.frozen
class KeepBest(_Combinable):
    """Keep the ``n`` best by ``metric`` (``mode="max"`` or ``"min"``); ties go to the newer."""

    n: int = attrs.field(validator=attrs.validators.ge(0))
    metric: str = attrs.field(validator=attrs.validators.instance_of(str))
    mode: str = attrs.field(default="max", validator=attrs.validators.in_(("max", "min")))

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        scored = [(c.metrics[self.metric], i) for i, c in enumerate(ckpts) if _number(c.metrics.get(self.metric))]
        sign = -1 if self.mode == "max" else 1
        scored.sort(key=lambda t: (sign * t[0], t[1]))
        return {i for _, i in scored[: self.n]}


@attrs.frozen
class KeepEvery(_Combinable):
    """Keep every checkpoint whose step is a multiple of ``k``."""

    k: int = attrs.field(validator=attrs.validators.ge(1))

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        return {i for i, c in enumerate(ckpts) if isinstance(c.step, int) and c.step % self.k == 0}


@attrs.frozen
class AnyOf(_Combinable):
    """Keep what any of the policies keeps (``KeepLast(3) | KeepBest(2, "bleu")``)."""

    policies: tuple

    def keep(self, ckpts: Sequence[Checkpoint]) -> set[int]:
        out: set[int] = set()
        for p in self.policies:
            out |= p.keep(ckpts)
        return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def plan(ckpts: Sequence[Checkpoint], policy: Policy) -> list[int]:
    """The indices to keep, newest first: what the policy keeps, and always the newest."""
    if not ckpts:
        return []
    keep = {i for i in policy.keep(ckpts) if 0 <= i < len(ckpts)} | {0}
    return sorted(keep)


def as_policy(keep: int | Policy | None) -> Policy:
    if keep is None:
        return KeepLast(1)
    if isinstance(keep, bool) or (isinstance(keep, int) and keep < 1):
        raise CheckpointError(f"keep must be an int >= 1 or a policy, got {keep!r}")
    if isinstance(keep, int):
        return KeepLast(keep)
    if not callable(getattr(keep, "keep", None)):
        raise CheckpointError(f"keep must be an int >= 1 or a policy, got {keep!r}")
    return keep


# ---------------------------------------------------------------- saving


@attrs.frozen
class SaveReport:
    """What a checkpoint save did."""

    skipped: bool  # the arrays equalled the newest checkpoint's: nothing was written
    path: str | None  # the new checkpoint's directory (None when skipped)
    written: int = 0  # array files written
    linked: int = 0  # array files hard-linked from the previous checkpoint
    removed: tuple[str, ...] = ()  # checkpoints the policy dropped (their directories, before removal)
    spec_written: bool = False


def _structure(arrays: Mapping[str, Mapping[str, tuple[np.ndarray, bool]]]) -> dict:
    return {s: {n: (a.dtype, tuple(a.shape)) for n, (a, _) in ps.items()} for s, ps in arrays.items()}


def _disk_structure(entries: Mapping[str, Mapping[str, ParamEntry]]) -> dict:
    return {s: {n: (e.dtype, e.shape) for n, e in ps.items()} for s, ps in entries.items()}


def _mismatch(new: dict, old: dict) -> str | None:
    if new == old:
        return None
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if gone or added:
        parts = []
        if added:
            parts.append(f"new subcollections {', '.join(added)}")
        if gone:
            parts.append(f"missing subcollections {', '.join(gone)}")
        return "; ".join(parts)
    for sub in sorted(new):
        if new[sub] != old[sub]:
            for name in sorted(set(new[sub]) | set(old[sub])):
                a, b = new[sub].get(name), old[sub].get(name)
                if a != b:
                    def show(t):
                        return "absent" if t is None else f"{tuple(t[1])!r} {t[0]}"
                    return f"{sub}: param {name!r} is {show(a)} in the model, {show(b)} in the checkpoint"
    return "differs"


def _render_spec(tree: Any, name: str | None, path: str) -> str:
    from .api import SPEC_FORMAT, spec_header

    return spec_header(path) + dump({"xser_format": SPEC_FORMAT, "name": name, "experiment": tree})


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _remove_dir(path: str, parent: str) -> None:
    """Make a checkpoint disappear in one rename, then delete it."""
    trash = temp_name(os.path.join(parent, os.path.basename(path)), OLD_MARK)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _rotate(spec_path: str, new_dir: str, keep_dirs: list[str], drop_dirs: list[str], durable: bool) -> None:
    """Drop, shift and publish so that slot 0 is ``new_dir`` and slots 1.. are ``keep_dirs`` in order.

    Every rename moves one directory into a free slot without passing another, so the
    relative order of published checkpoints never changes, whatever step a crash stops at.
    """
    parent = os.path.dirname(os.path.abspath(spec_path))
    newest = data_dir_of(spec_path, 0)
    for d in drop_dirs:
        if os.path.abspath(d) != os.path.abspath(newest):  # the newest is swapped out atomically below
            _remove_dir(d, parent)
    slot_of = {path: slot for slot, path in _slots(spec_path)}
    moves = [(slot_of[d], i + 1, d) for i, d in enumerate(keep_dirs)]
    up = sorted((m for m in moves if m[1] > m[0]), key=lambda m: -m[0])
    down = sorted((m for m in moves if m[1] < m[0]), key=lambda m: m[0])
    for _, target, d in up + down:
        dest = data_dir_of(spec_path, target)
        if os.path.lexists(dest):
            raise CheckpointError(
                f"{dest} is in the way of checkpoint rotation and is not a checkpoint (no valid manifest); move it away",
                Location(dest),
            )
        os.rename(d, dest)
    old = publish(new_dir, newest)
    if durable:
        fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class CheckpointSaver:
    """Save a model again and again as rotating checkpoints of one spec.

    ``keep`` is an int (keep the last N) or a policy (``KeepLast``, ``KeepBest``,
    ``KeepEvery``, combined with ``|``); the newest checkpoint is always kept. ``blocks``
    maps ``"subcollection/param"`` patterns to a block size (rows, or a tuple of rows and
    columns): matching parameters are stored as several files; ``formats`` maps patterns to
    weight formats (see ``xser.save``). The saver
    holds ``<model>.lock`` from construction until ``close()`` (or the end of a ``with``
    block): a second saver on the same model gets a ``CheckpointError``. ``restart=True``
    starts a new model: the first save removes every existing checkpoint.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        keep: int | Policy = 5,
        *,
        durable: bool = True,
        restart: bool = False,
        blocks: Mapping[str, Any] | None = None,
        formats: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.blocks = dict(blocks or {})
        self.formats = dict(formats or {})
        self.policy = as_policy(keep)
        self.durable = durable
        self.restart = restart
        self._lock = ModelLock(self.path).acquire()
        self._checked = False
        try:
            clean_temporaries(self.path)
        except BaseException:
            self._lock.release()
            raise

    def close(self) -> None:
        self._lock.release()

    def __enter__(self) -> CheckpointSaver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    def save(
        self,
        obj: Any,
        *,
        step: int | None = None,
        metrics: Mapping[str, float] | None = None,
        training: Mapping | None = None,
        custom: Mapping | None = None,
        training_state: Any = None,
        name: str | None = None,
    ) -> SaveReport:
        """Publish ``obj`` as the newest checkpoint; shift and prune the older ones."""
        if not self._lock.held:
            raise CheckpointError("this CheckpointSaver is closed", Location(self.path))
        report = save_checkpoint(
            obj, self.path, policy=self.policy, durable=self.durable, restart=self.restart and not self._checked,
            step=step, metrics=metrics, training=training, custom=custom, training_state=training_state, name=name,
            check_all=not self._checked, skip_duplicates=True, blocks=self.blocks, formats=self.formats,
        )
        self._checked = True
        return report


def save_checkpoint(
    obj: Any,
    path: str,
    *,
    policy: Policy | None,
    durable: bool,
    restart: bool = False,
    step: int | None = None,
    metrics: Mapping | None = None,
    training: Mapping | None = None,
    custom: Mapping | None = None,
    training_state: Any = None,
    name: str | None = None,
    check_all: bool = True,
    skip_duplicates: bool = False,
    blocks: Mapping[str, Any] | None = None,
    formats: Mapping[str, Any] | None = None,
    replace: Mapping[str, Any] | None = None,
) -> SaveReport:
    """The one save path. ``policy=None`` replaces the newest checkpoint (``xser.save``).

    ``replace`` maps ``"sub/param"`` to what to store instead of the object's array (files
    already written, for ``PartialSaver``).
    """
    from .api import experiment_name

    tree, subcols = to_tree(obj)
    arrays = {sub_name: sub.current() for sub_name, (sub, _) in subcols.items()}
    for key, item in (replace or {}).items():
        sub_name, _, name = key.partition("/")
        arrays[sub_name][name] = (item, arrays[sub_name][name][1])
    declared = {f"{n}/{d.name}": d.format for n, (sub, _) in subcols.items() for d in sub.decls.values() if d.format}
    formats = dict(formats or {})  # patterns are tried in order: what save() says wins over the declaration
    for key, fmt in declared.items():
        formats.setdefault(key, fmt)
    meta = {
        "step": _step(step),
        "metrics": _metrics(metrics),
        "training": plain_json(dict(training or {}), "training"),
        "custom": plain_json(dict(custom or {}), "custom"),
    }
    spec_text = _render_spec(tree, name if name is not None else experiment_name(obj), path)
    listed = _listing(path)
    existing = [ck for ck, _ in listed]
    opened = {ck.path: d for ck, d in listed}
    structure = _structure(arrays)
    if not restart:
        if policy is None:
            against = existing[1:]  # xser.save replaces the newest: the older ones must still match
        else:
            against = existing if check_all else existing[:1]
        for ck in against:
            problem = _mismatch(structure, _disk_structure(opened[ck.path].subcollections))
            if problem is not None:
                fix = "CheckpointSaver(..., restart=True)" if policy is not None else "xser.CheckpointSaver(..., restart=True)"
                raise CheckpointError(
                    f"the model no longer matches checkpoint {ck.path}: {problem}; to start a new model use {fix}",
                    Location(path),
                )
    previous = opened[existing[0].path] if existing and not restart else None
    if skip_duplicates and not blocks and not formats and previous is not None and _disk_structure(previous.subcollections) == structure:
        if _same_bytes(arrays, previous):
            _log.info("%s: arrays equal the newest checkpoint %s; save skipped", path, previous.path)
            return SaveReport(True, None)
    staged = stage(
        data_dir_of(path, 0), arrays, durable=durable, previous=previous, meta=meta, training_state=training_state,
        blocks=blocks, formats=formats,
    )
    with staged.discarded_on_error("cannot publish checkpoint", path):
        spec_written = False
        if _read_text(path) != spec_text:
            write_text_atomic(path, spec_text, durable=durable)
            spec_written = True
        if policy is None:
            keep_dirs = [c.path for c in existing[1:]]
            drop = [existing[0].path] if existing else []
        else:
            new = Checkpoint(0, staged.path, meta["step"], staged.manifest["created"], meta["metrics"])
            listed = [new] + [attrs.evolve(c, index=i + 1) for i, c in enumerate(existing)]
            kept = plan(listed, policy) if not restart else [0]
            keep_dirs = [listed[i].path for i in kept if i > 0]
            drop = [c.path for c in existing if c.path not in keep_dirs]
        _rotate(path, staged.path, keep_dirs, drop, durable)
    return SaveReport(False, data_dir_of(path, 0), staged.written, staged.linked, tuple(drop), spec_written)


def _same_bytes(arrays: Mapping, previous: DataDir) -> bool:
    from .formats import FORMATS

    for sub, params in arrays.items():
        for name, (arr, _) in params.items():
            entry = previous.subcollections[sub][name]
            if len(entry.blocks) != 1 or entry.blocks[0].start is not None:
                return False
            block = entry.blocks[0]
            size, digest = FORMATS["npy"].digest(arr)
            if block.checksum != ("xxh3_64", digest) or block.bytes != size:
                return False  # usually the first array already differs: cheap
    return True


def _step(step: Any) -> int | None:
    if step is None:
        return None
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        return int(step)
    raise CheckpointError(f"step must be an int, got {step!r}")


def _metrics(metrics: Any) -> dict:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise CheckpointError(f"metrics must be a mapping of names to numbers, got {type(metrics).__name__}")
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise CheckpointError(f"metric names must be strings, got {k!r}")
        if isinstance(v, np.generic):
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise CheckpointError(f"metric {k!r} must be a number, got {v!r}")
        out[k] = v
    return out


def write_new_model(out: str, arrays: Mapping, spec_text: str, meta: Mapping, *, durable: bool, force: bool,
                    training_state: Any = None, blocks: Mapping | None = None) -> None:
    """Write a complete new model at ``out`` (spec + .data) all-or-nothing, under its lock.

    An existing model at ``out`` is an error unless ``force``; then it is replaced whole
    (its older checkpoints too).
    """
    with ModelLock(out):
        clean_temporaries(out)
        existing = [p for _, p in _slots(out)]
        if (os.path.exists(out) or existing) and not force:
            raise CheckpointError("the output model exists; remove it or pass --force to replace it", Location(out))
        staged = stage(data_dir_of(out, 0), arrays, durable=durable, meta=meta, training_state=training_state, blocks=blocks)
        with staged.discarded_on_error("cannot publish model", out):
            write_text_atomic(out, spec_text, durable=durable)
            _rotate(out, staged.path, [], existing, durable)


# ---------------------------------------------------------------- training state


def load_training_state(path: str | os.PathLike, *, checkpoint: int = 0, mmap: bool = False) -> Any:
    """The ``training_state`` saved with a checkpoint (arrays back as numpy arrays)."""
    d = checkpoint_dir(path, checkpoint)
    meta, _ = read_manifest(d)
    state = meta.get("training_state")
    if state is None:
        raise CheckpointError("this checkpoint was saved without training_state", Location(d))
    from .store import _check_manifest

    fake = {"format": "xser", "format_version": 1, "subcollections": {"training_state": state.get("arrays", {})}}
    _, entries = _check_manifest(fake, os.path.join(d, "manifest.json"))
    data = DataDir(d, meta, entries)
    arrays = {k: data.read(e, mmap=mmap) for k, e in entries["training_state"].items()}

    def build(v: Any) -> Any:
        if isinstance(v, dict):
            if set(v) == {"$array"}:
                return arrays[v["$array"]]
            return {k: build(x) for k, x in v.items()}
        if isinstance(v, list):
            return [build(x) for x in v]
        return v

    return build(state.get("tree"))
