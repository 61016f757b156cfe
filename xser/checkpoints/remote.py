"""Saving to an object store (``storage/objects``): the checkpoint under a new prefix, then the next commit record
(conditional: a concurrent saver that committed first makes this save a ``CheckpointError``), then the clean-up."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import attrs

from ..errors import CheckpointError, Location, SpecError, StorageError
from ..spec import read_text
from ..spec.saved import edit_lost, hand_edit
from ..storage.disk.commit import counts, manifest_of, new_id
from ..storage.layout import EDITED_MARK
from ..storage.listing import Checkpoint, scan
from ..storage.objects.commit import RemoteScan, clean_up, commit, entry_of_listed
from ..storage.objects.staging import entry_of, finish_remote, stage_remote
from ..storage.plan import plan_save
from ..storage.stores import store_for
from ..storage.write import write
from .common import SaveOptions, SaveReport, before_writing
from .policy import Policy, retain
from .snapshot import Snapshot

__all__ = ["save_remote", "write_new_model_remote"]

_log = logging.getLogger("xser")


def save_remote(
    path: str, snap: Snapshot, options: SaveOptions, *, policy: Policy | None, restart: bool = False, check_all: bool = True,
    skip_duplicates: bool = False, since: list[int] | None = None,
) -> SaveReport:
    """``save_locked`` on an object store: write the checkpoint under a new prefix, then create the next commit record
    (conditional: a concurrent saver that committed first makes this a ``CheckpointError``), then clean up.

    ``since``: a ``CheckpointSaver``'s record of the commit it last saw (made or found), then the prefix of its last
    save; a newer commit (unless it lists that prefix first: this saver's own, whose outcome it could not tell) means
    another process saved this model since, which is a ``CheckpointError`` as a second saver is on a local disk (an
    object store has no lock to hold). It is updated to the commit this save makes."""
    store = store_for(path)
    with scan(path) as s:
        assert isinstance(s, RemoteScan)
        if since is not None and s.seq != since[0] and s.prefixes[:1] == since[1:2]:
            since[0] = s.seq  # this saver's last commit, whose outcome it could not tell, went through
        if since is not None and s.seq != since[0]:
            raise CheckpointError(
                f"another process saved this model since this saver's last commit ({since[0]}; the newest is {s.seq}): "
                "one saver per model", Location(path))
        existing = s.listed
        edit = hand_edit(path, existing[0][1], [d for _, d in existing]) if existing else None
        newest = existing[0][0] if existing else None
        previous, model, skip = before_writing(path, snap, options, existing, replaced=lambda c: c is newest, policy=policy,
                                               restart=restart, check_all=check_all, skip_duplicates=skip_duplicates)
        if skip:
            return SaveReport(True, None)
        seq = s.seq + 1
        with stage_remote(store, path, seq, new_id()) as staging:
            _write_remote(staging, snap, options, previous, model)
            new = Checkpoint(0, staging.path, staging.manifest["step"], staging.manifest["created"], staging.manifest["metrics"])
            olds = [c for c, _ in existing]
            if restart:
                keep = []
            elif policy is None:
                keep = list(range(1, len(olds)))
            else:
                listed = [new] + [attrs.evolve(c, index=i + 1) for i, c in enumerate(olds)]
                keep = [i - 1 for i in retain(listed, policy) if i > 0]
            entries = [entry_of(staging)] + [entry_of_listed(s, i) for i in keep]
            _clear_remote_spec(store, path, snap.spec_text, edit)
            if since is not None:
                since[1:] = [staging.dir]  # (if the commit's outcome stays unknown, the next save recognises it)
            commit(store, path, seq, model, entries, staging.manifest["created"])
            if since is not None:
                since[0] = seq
        removed = tuple(c for i, c in enumerate(olds) if i not in keep)
    spec_written = _sync_remote_spec(store, path, snap.spec_text)
    _clean_up(store, path, seq, [e[0] for e in entries])
    return SaveReport(False, staging.path, staging.written, staging.linked, removed, spec_written, staging.manifest["id"])


def _write_remote(staging: Any, snap: Snapshot, options: SaveOptions, previous: Any, model: str) -> None:
    """plan -> write (each file uploaded as soon as it is complete) -> the manifest, under the staging prefix."""
    plan = plan_save(
        snap.arrays, spec_text=snap.spec_text, state_tree=snap.state_tree, state_arrays=snap.state_arrays,
        formats=snap.formats, blocks=options.blocks, previous=previous, shards=options.shards, pack=options.pack,
    )
    threads = max(options.threads, options.shards or 0)
    staging.start(threads)  # as many uploads in flight as writer threads
    results = write(staging.spool, plan, durable=False, threads=threads, sink=staging)
    staging.flush()
    manifest = manifest_of(plan, results, snap.meta, id=staging.id, model=model)
    finish_remote(staging, manifest, *counts(plan, results))


def _clear_remote_spec(store: Any, path: str, text: str, edit: Any) -> None:
    """``clear_spec`` on an object store: before the commit, a top-level spec that the new checkpoint's would not match
    is removed (a hand edit the save would lose is first copied to ``<model>.yaml.edited``, with a warning)."""
    if edit is not None and edit_lost(edit.text, text):
        n = 1
        while store.exists(kept := path + EDITED_MARK + ("" if n == 1 else f".{n}")):
            n += 1
        store.copy(path, kept)
        store.delete([path])
        _log.warning("%s was edited by hand since the last save and this save replaces it with the spec of the object "
                     "saved; the edited file is kept as %s (%s). To use an edit, load the edited file and save that "
                     "object", path, kept, attrs.evolve(edit, path=kept).difference())
        return
    try:
        if read_text(path) == text:
            return
    except SpecError:
        return
    store.delete([path])


def _sync_remote_spec(store: Any, path: str, text: str) -> bool:
    """After the commit: the top-level spec becomes the new checkpoint's spec. True if written."""
    try:
        if read_text(path) == text:
            return False
    except SpecError:
        pass
    store.put(path, text.encode("utf-8"))
    return True


def write_new_model_remote(out: str, snaps: list[Snapshot], options: SaveOptions, *, force: bool) -> None:
    """``write_new_model`` on an object store: every checkpoint under its own prefix, one commit record for all."""
    store = store_for(out)
    with scan(out) as s:
        assert isinstance(s, RemoteScan)
        if (store.exists(out) or s.listed) and not force:
            raise CheckpointError("the output model exists; remove it or pass --force to replace it", Location(out))
        edit = hand_edit(out, s.listed[0][1], [d for _, d in s.listed]) if s.listed else None
        seq = s.seq + 1
        model = new_id()
        with contextlib.ExitStack() as stack:
            staged = []
            for snap in snaps:
                st = stack.enter_context(stage_remote(store, out, seq, new_id()))
                _write_remote(st, snap, options, None, model)
                staged.append(st)
            _clear_remote_spec(store, out, snaps[0].spec_text, edit)
            commit(store, out, seq, model, [entry_of(st) for st in staged], staged[0].manifest["created"])
    _sync_remote_spec(store, out, snaps[0].spec_text)
    _clean_up(store, out, seq, [st.dir for st in staged])


def _clean_up(store: Any, path: str, seq: int, keep: list[str]) -> None:
    """``clean_up`` after a commit, best effort: the save is committed whatever happens here, and what a failure leaves
    (objects no record names) the next save removes. A failure is a warning, not the save's error."""
    try:
        clean_up(store, path, seq, keep)
    except StorageError as e:
        _log.warning("%s: saved (commit %d), but removing what it replaced failed: %s; the next save removes it", path, seq, e)
