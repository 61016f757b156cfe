"""A model's checkpoints, listed as one consistent snapshot even while a saver rotates them.

Every slot (``.data``, ``.data.1``, ...) is opened (``OpenedDir``: a descriptor plus its
manifest); the listing is taken again until nothing moved while it was read, so a rotation in
another process never makes a checkpoint appear twice or out of order. Each checkpoint keeps
its descriptor, so what a caller reads afterwards is the checkpoint it listed.

Checkpoints of one model share the manifest's ``model`` id. Valid checkpoints carrying another
id were left by an interrupted replacement of the model (``restart=True``, ``--force``); they
are not listed, and the next save removes them. A slot whose manifest is written by a newer
xser is an error naming the version, never silently skipped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any


from ..errors import CheckpointError, DataError, Location, XserError
from .layout import data_dir_of, slot_names, slot_of
from .disk.lock import ListingLock
from .manifest import NewerFormatError
from .opened import MissingDir, OpenedDir
from .stores import is_url, options, store_for

__all__ = ["Best", "Checkpoint", "Scan", "best_n", "checkpoints", "open_checkpoint", "refuse_slot", "scan", "score", "selector"]

if TYPE_CHECKING:
    from .scanned import Best, Checkpoint, Scan, best_n, score  # noqa: F401
_SCANNED = frozenset({"Best", "Checkpoint", "Scan", "best_n", "score"})


def __getattr__(name: str) -> Any:
    """The listing's records (``scanned``), imported on first use: opening the newest checkpoint needs none of them."""
    if name in _SCANNED:
        from . import scanned

        return getattr(scanned, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_best(checkpoint: Any) -> bool:
    scanned = sys.modules.get(f"{__package__}.scanned")  # (no Best exists before its module is imported)
    return scanned is not None and isinstance(checkpoint, scanned.Best)

ATTEMPTS = 200  # listings retried until stable; a rotation step takes microseconds to milliseconds


def scan(spec_path: str | os.PathLike, *, saver: bool = False) -> Scan:
    """Open every slot of the model and sort them into checkpoints, foreign and damaged ones.

    A reader lists under the shared listing lock (``lock.ListingLock``: no rotation is half done
    meanwhile) and pins every checkpoint it opens (no saver deletes it while it is open). ``saver``:
    the caller holds the model lock, so nothing moves; its checkpoints are opened unpinned.
    """
    spec_path = os.fspath(spec_path)
    from .scanned import Scan, record_of

    if is_url(spec_path):  # an object store: the newest commit record says what the model holds
        from .objects.commit import remote_scan  # (the object-store protocol is imported by its first URL)

        return remote_scan(store_for(spec_path), spec_path)
    for attempt in range(ATTEMPTS):
        with contextlib.nullcontext() if saver else ListingLock(spec_path, exclusive=False):
            slots, opened, damaged, moved = _open_slots(spec_path, pin=not saver)
        if (not moved and (saver or _stable(spec_path, slots, opened))) or attempt == ATTEMPTS - 1:
            # (a saver holds the model lock: nothing renames its slots meanwhile, no second listing needed)
            break  # (the last attempt is taken as it is: one checkpoint twice is dropped below)
        for _, d in opened:
            d.close()
        time.sleep(min(0.01, 0.0002 * (attempt + 1)))
    seen: set[str] = set()
    mine: list[OpenedDir] = []
    foreign: list[OpenedDir] = []
    lineage = None
    for _, d in opened:  # by slot: the newest first
        if d.id is not None and d.id in seen:
            d.close()
            continue
        if d.id is not None:
            seen.add(d.id)
        if lineage is None:
            lineage = d.manifest.model or ""
        if d.manifest.model and lineage and d.manifest.model != lineage:
            foreign.append(d)
        else:
            mine.append(d)
    listed = [(record_of(i, d), d) for i, d in enumerate(mine)]
    return Scan(spec_path, listed, foreign, damaged, {p: s for s, p in slots})


def _open_slots(spec_path: str, *, pin: bool) -> tuple[list[tuple[int, str]], list[tuple[int, OpenedDir]], list[tuple[str, str]], bool]:
    """(slots, opened checkpoints, damaged slots, whether one moved away while listing) of one pass over the slots."""
    slots = slot_names(spec_path)
    opened: list[tuple[int, OpenedDir]] = []
    damaged: list[tuple[str, str]] = []
    for slot, path in slots:
        try:
            opened.append((slot, OpenedDir.open(path, pin=pin)))
        except NewerFormatError as e:
            for _, d in opened:
                d.close()
            raise CheckpointError(
                f"checkpoint {os.path.basename(path)} was written by a newer xser (format_version {e.version}); "
                "upgrade xser to read or save this model",
                Location(path),
            ) from None
        except MissingDir:
            return slots, opened, damaged, True  # renamed away while listing (a saver without the lock)
        except DataError as e:
            damaged.append((path, e.message))
    return slots, opened, damaged, False


def _stable(spec_path: str, slots: list[tuple[int, str]], opened: list[tuple[int, OpenedDir]]) -> bool:
    if slot_names(spec_path) != slots:
        return False
    for _, d in opened:
        try:
            st = os.stat(d.path, follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != d.ino:
            return False
    return True


def checkpoint_record(d: OpenedDir) -> Checkpoint:
    """The listing record of one opened checkpoint (its index is unknown here: 0)."""
    from .scanned import record_of

    return record_of(0, d)


def checkpoints_exist(path: str | os.PathLike) -> bool:
    """Whether any data slot (``.data``, ``.data.1``, ...) exists for the model at ``path`` (on an object store: any
    commit record)."""
    if is_url(os.fspath(path)):
        from .objects.commit import latest

        return latest(store_for(os.fspath(path)), os.fspath(path))[1] is not None
    return bool(slot_names(os.fspath(path)))


def checkpoints(path: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None) -> list[Checkpoint]:
    """The checkpoints of a saved model, newest first, with step, time and metrics.

    Directories without a valid manifest are not checkpoints and are not listed; a checkpoint
    written by a newer xser is a ``CheckpointError``.
    """
    with options(storage_options), scan(path) as s:
        return s.checkpoints


def selector(checkpoint: Any = 0, metric: str | None = None, mode: str = "max", path: str = "") -> int | Best:
    """One checkpoint selection from the public arguments: an index (0 = newest), ``"last"``, ``"best"``
    with ``metric`` (and ``mode``), or a ``Best``."""
    if checkpoint == "best" or _is_best(checkpoint):
        from .scanned import Best

        if isinstance(checkpoint, Best):
            return checkpoint
        if metric is None:
            raise CheckpointError('checkpoint="best" needs metric= (the metric recorded with the checkpoints, e.g. metric="dev_bleu")',
                                  Location(path) if path else None)
        return Best(metric, mode)
    if metric is not None:
        raise CheckpointError(f'metric= only applies to checkpoint="best" (got checkpoint={checkpoint!r})', Location(path) if path else None)
    return 0 if checkpoint == "last" else check_index(path, checkpoint)


def check_index(path: str, checkpoint: Any) -> Any:
    if _is_best(checkpoint):
        return checkpoint
    if not isinstance(checkpoint, int) or isinstance(checkpoint, bool) or checkpoint < 0:
        raise CheckpointError(f'checkpoint must be an int >= 0, "last" or "best" (with metric=), got {checkpoint!r}', Location(path))
    return checkpoint


def refuse_slot(path: str) -> None:
    """A checkpoint directory (``m.yaml.data``) given where the model's file belongs: say which file to give."""
    if is_url(path):
        return
    slot = slot_of(path) if os.path.isdir(path) and not os.path.lexists(data_dir_of(path, 0)) else None
    if slot is None:
        return
    spec = slot[0]
    try:
        index = next((c.index for c in checkpoints(spec) if os.path.samefile(c.path, path)), None)
    except (OSError, XserError):
        index = None
    which = f", with checkpoint={index}" if index else ""
    raise DataError(f"a checkpoint directory of the model {spec}, not a model: give the model's file, {spec!r}{which}", Location(path))


def open_checkpoint(path: str | os.PathLike, checkpoint: Any = 0, *, lazy: bool = False) -> OpenedDir:
    """Open checkpoint ``checkpoint`` (0 = newest, ``"last"``, or a ``Best``) of the model at ``path``; the caller closes it.

    The result's ``index`` is the checkpoint's place in the listing it was chosen from (0 = newest). ``lazy``: the
    newest checkpoint's parameter entries are checked when first looked up (``OpenedDir.open``)."""
    path = os.fspath(path)
    checkpoint = 0 if checkpoint == "last" else check_index(path, checkpoint)
    refuse_slot(path)
    if checkpoint == 0 and not is_url(path):
        try:
            d = OpenedDir.open(data_dir_of(path, 0), lazy=lazy)  # slot 0 is the newest whenever it exists
            d.index = 0
            return d
        except MissingDir:
            pass  # none, or a saver is shifting it to .data.1 right now: the listing says what is newest
    with scan(path) as s:
        return s.take(checkpoint)
