"""Publishing checkpoints on a local disk: recovery, rotation, replacement (the slot renames of ``docs/format.md`` section 4).

Every step here moves a *whole* directory with one rename (or one atomic exchange), in an
order chosen so that a kill between any two steps leaves ``load(path)`` the whole old state or
the whole new one. All of it runs under the model lock. (On an object store, ``objects/commit.py``
publishes by commit records instead.)
"""

from __future__ import annotations

import logging
import os

from ...errors import CheckpointError, Location
from .commit import discard, publish, remove_leftovers, to_trash
from ..fsutil import fsync_dir
from ..layout import DAMAGED_MARK, data_dir_of, temp_name
from .lock import ListingLock
from .trash import defer
from ..scanned import Scan

__all__ = ["publish_new_model", "recover", "replace_newest", "rotate"]

_log = logging.getLogger("xser")


def _trash_base(spec_path: str) -> str:
    return data_dir_of(spec_path, 0)


def _discard_all(dirs: list[str | None], later: bool = False) -> None:
    """Delete directories that are no longer checkpoints (after the renames: outside the listing lock); ``later``:
    on the deleter thread (``trash.py``), after the save returns. One a reader still has open stays under its trash
    name until a later save (``commit.discard``)."""
    if later:
        defer(dirs, discard)
        return
    for d in dirs:
        if d is not None:
            discard(d)


def recover(spec_path: str, scan: Scan, *, durable: bool) -> tuple[str, ...]:
    """Clean up after interrupted saves (lock held): leftovers and other models' checkpoints go,
    slots without a valid manifest are set aside under ``<model>.data.damaged-*`` and returned."""
    remove_leftovers(spec_path)
    trashed: list[str | None] = []
    aside = []
    if scan.foreign or scan.damaged:
        with ListingLock(spec_path, exclusive=True):
            for d in scan.foreign:  # left by an interrupted replacement of the model: never listed, now removed
                d.close()
                trashed.append(to_trash(d.path, _trash_base(spec_path)))
            for path, why in scan.damaged:
                slot = scan.slots.get(path, 0)
                target = temp_name(f"{data_dir_of(spec_path, 0)}{DAMAGED_MARK}{slot}", "-")
                os.rename(path, target)
                _log.warning("%s is not a valid checkpoint (%s); set aside as %s", path, why, target)
                aside.append(target)
    scan.foreign.clear()
    scan.damaged.clear()
    if aside and durable:
        fsync_dir(os.path.dirname(os.path.abspath(spec_path)))
    _discard_all(trashed)
    return tuple(aside)


def rotate(spec_path: str, new_dir: str, keep_dirs: list[str], drop_dirs: list[str], slots: dict[str, int], durable: bool,
           *, later: bool = False) -> None:
    """Prune, shift and publish so that slot 0 is ``new_dir`` and slots 1.. are ``keep_dirs`` in order.

    Dropped checkpoints disappear first (one rename each to a trash name), then the kept ones
    move up one rename at a time, highest first, so no directory passes another; then the new
    checkpoint takes slot 0. A kill at any point leaves whole checkpoints in their order (at
    worst a gap, or slot 0 empty for a moment: then the newest that exists is the old newest).
    Readers never see those moments: the renames hold the listing lock (``storage.lock``), and
    the dropped checkpoints are deleted after it, unless a reader still reads them (``later``: by the deleter thread).
    """
    parent = os.path.dirname(os.path.abspath(spec_path))
    with ListingLock(spec_path, exclusive=True):
        trashed: list[str | None] = [to_trash(d, _trash_base(spec_path)) for d in drop_dirs]
        moves = [(slots[d], i + 1, d) for i, d in enumerate(keep_dirs)]
        up = sorted((m for m in moves if m[1] > m[0]), key=lambda m: -m[0])
        down = sorted((m for m in moves if m[1] < m[0]), key=lambda m: m[0])
        for _, target, d in up + down:
            dest = data_dir_of(spec_path, target)
            if os.path.lexists(dest):
                raise CheckpointError(f"{dest} is in the way of checkpoint rotation; move it away", Location(dest))
            os.rename(d, dest)
        trashed.append(publish(new_dir, data_dir_of(spec_path, 0), _trash_base(spec_path)))
    if durable:
        fsync_dir(parent)
    _discard_all(trashed, later)


def replace_newest(spec_path: str, new_dir: str, durable: bool, *, later: bool = False) -> None:
    """Put ``new_dir`` at slot 0 by one atomic exchange (or a rename into the empty slot); ``later``: the old one
    is deleted by the deleter thread."""
    with ListingLock(spec_path, exclusive=True):
        old = publish(new_dir, data_dir_of(spec_path, 0), _trash_base(spec_path))
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(spec_path)))
    _discard_all([old], later)


def publish_new_model(spec_path: str, new_dirs: list[str], old_dirs: list[str], durable: bool) -> None:
    """Replace a whole model: ``new_dirs`` (newest first) become slots 0, 1, ...; ``old_dirs`` go.

    The new newest is exchanged into slot 0 first: from that moment the model is the new one
    (the old checkpoints carry another model id, so listings ignore them). Then the old slots
    are removed and the new older checkpoints move in.
    """
    newest = data_dir_of(spec_path, 0)
    with ListingLock(spec_path, exclusive=True):
        trashed = [publish(new_dirs[0], newest, _trash_base(spec_path))]
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(spec_path)))
    with ListingLock(spec_path, exclusive=True):
        for d in old_dirs:
            if os.path.abspath(d) != os.path.abspath(newest) and os.path.lexists(d):
                trashed.append(to_trash(d, _trash_base(spec_path)))
        for k, d in enumerate(new_dirs[1:], start=1):
            os.rename(d, data_dir_of(spec_path, k))
    if durable and len(new_dirs) > 1:
        fsync_dir(os.path.dirname(os.path.abspath(spec_path)))
    _discard_all(trashed)
