"""Whole models by their spec path: ``remove_model`` (the spec, every checkpoint, a partial save in progress and what
interrupted saves left) and ``touch_spec`` (the spec's modification time made now, its bytes unchanged).

``remove_model(path)`` is what deleting a model by hand should be (``XserCheckpointIO.remove_checkpoint`` calls it).
On a local disk it takes the model's lock (a saver working on the model is a ``CheckpointError``), removes the spec
file first (from then on the model is gone for anything that looks for it by name), then moves every checkpoint
slot and the partial save to trash names under the listing lock (readers never see half a listing) and deletes them;
one a reader still has open stays under its trash name until that reader is done and a later save at the same path
clears it (``discard``). Set-aside slots (``.data.damaged-*``) and hand-edited spec files kept aside
(``.edited``) stay: xser never deletes those. On an object store: the spec object, then every object under
``<path>.data/`` (commit records and checkpoints) and ``<path>.data.partial/``.

``touch_spec(path)``: a save whose spec text equals the file's leaves the file as it is (``sync_spec``), so its
modification time is that of the first save. Tools that pick "the newest checkpoint file" by that time (Lightning's
``ckpt_path="last"``) call this after each save: a local file's time is set to now; an object is written again with
the same bytes (one PUT; the object never disappears). Imports only the storage layer.
"""

from __future__ import annotations

import os

from ..errors import CheckpointError
from .disk.commit import discard, remove_file, remove_leftovers, to_trash
from .disk.lock import ListingLock, ModelLock
from .fsutil import fsync_dir, os_error
from .layout import PARTIAL, data_dir_of, leftovers, slot_names
from .stores import store_for

__all__ = ["remove_model", "touch_spec"]


def remove_model(path: str | os.PathLike) -> list[str]:
    """Remove the model whose spec is ``path`` (nothing there is no error); returns what it removed (on an object
    store: the objects)."""
    path = os.fspath(path)
    store = store_for(path)
    if store.remote:
        removed = [path] if store.exists(path) else []
        store.delete([path])  # the spec first: the model is gone for anything that looks for it by name
        for prefix in (data_dir_of(path), path + PARTIAL):
            listed = list(store.list(prefix))
            store.delete_prefix(prefix)
            removed += listed
        return removed
    partial = path + PARTIAL
    if not slot_names(path) and not os.path.lexists(path) and not os.path.lexists(partial) and not leftovers(path):
        return []  # no lock taken: nothing to remove, and no directory made for the lock file
    with ModelLock(path):
        try:
            removed = [path] if os.path.lexists(path) else []
            remove_file(path, durable=False)  # the spec first: the model is gone for anything that looks for it by name
            with ListingLock(path, exclusive=True):  # under the lock: no saver moves the slots now
                gone = [d for _, d in slot_names(path)] + ([partial] if os.path.lexists(partial) else [])
                trashed = [to_trash(d, data_dir_of(path)) for d in gone]
            fsync_dir(os.path.dirname(os.path.abspath(path)))
            for d in trashed:
                discard(d)  # a checkpoint a reader still has open stays under its trash name (see above)
            return removed + gone + remove_leftovers(path)
        except OSError as e:
            raise os_error(e, "cannot remove the model", path, CheckpointError) from None


def touch_spec(path: str | os.PathLike) -> None:
    """Make the modification time of the spec file ``path`` now, its bytes unchanged (see above)."""
    path = os.fspath(path)
    store = store_for(path)
    if store.remote:
        store.put(path, store.read_bytes(path, "the spec"))
        return
    try:
        os.utime(path)
    except OSError as e:
        raise os_error(e, "cannot set the spec's modification time", path, CheckpointError) from None
