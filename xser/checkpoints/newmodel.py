"""``write_new_model``: a complete new model from snapshots (the tools' and importers' outputs), under its lock."""

from __future__ import annotations

import contextlib
from typing import Any

from ..errors import CheckpointError, Location
from ..spec.saved import hand_edit
from ..storage.disk.commit import new_id, stage
from ..storage.disk.lock import ModelLock
from ..storage.layout import data_dir_of
from ..storage.listing import scan
from ..storage.stores import LOCAL, is_url
from .common import SaveOptions
from .publish import publish_new_model, recover, sync_spec
from .remote import write_new_model_remote
from .saver import _clear_spec, _write_into, os_errors, refuse_special_spec
from .snapshot import Snapshot

__all__ = ["write_new_model"]


def _stage_and_write(stack: contextlib.ExitStack, path: str, snap: Snapshot, options: SaveOptions, previous: Any, model: str) -> Any:
    """plan -> write -> finish into a staging directory that ``stack`` removes if anything fails."""
    staging = stack.enter_context(stage(data_dir_of(path, 0), durable=options.durable))
    return _write_into(staging, snap, options, previous, model)



def write_new_model(out: str, snaps: list[Snapshot], options: SaveOptions, *, force: bool) -> None:
    """Write a complete new model at ``out`` (one checkpoint per snapshot, newest first) under its lock.

    An existing model at ``out`` is an error unless ``force``; then it is replaced whole (its
    older checkpoints too), with the same commit point as every save.
    """
    if is_url(out):
        return write_new_model_remote(out, snaps, options, force=force)
    with ModelLock(out), os_errors(out):
        refuse_special_spec(out)
        with scan(out, saver=True) as s:
            recover(out, s, durable=options.durable)
            old = [c.path for c, _ in s.listed]
            if (LOCAL.size(out) is not None or old) and not force:
                raise CheckpointError("the output model exists; remove it or pass --force to replace it", Location(out))
            edit = hand_edit(out, s.listed[0][1], [d for _, d in s.listed]) if s.listed else None
            model = new_id()
            with contextlib.ExitStack() as stack:
                staged = [_stage_and_write(stack, out, snap, options, None, model) for snap in snaps]
                _clear_spec(out, snaps[0].spec_text, edit, options.durable)
                publish_new_model(out, [st.path for st in staged], old, options.durable)
        sync_spec(out, snaps[0].spec_text, options.durable)
