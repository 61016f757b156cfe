"""Saving: ``save_model`` (``xser.save``), ``CheckpointSaver`` and ``write_new_model`` (tools).

All three run the same steps: snapshot (``snapshot.py``) -> plan -> write (N threads) ->
finish (manifest last) -> publish (``publish.py``), then the top-level spec file is brought in
step. They differ only in the publish step: replace the newest checkpoint, rotate under a
retention policy, or replace the whole model.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, overload

import attrs

from ..errors import CheckpointError, Location
from ..spec.saved import hand_edit
from ..storage.disk.commit import finish, new_id, remove_leftovers, stage
from ..storage.objects.commit import latest
from ..storage.stores import is_url, options, store_for
from ..storage.fsutil import os_error, refuse_special
from ..storage.layout import data_dir_of
from ..storage.listing import Checkpoint, scan
from ..storage.disk import trash
from ..storage.disk.lock import ModelLock
from ..storage.plan import plan_save
from ..storage.write import write
from .common import SMALL_PLAN, SaveOptions, SaveReport, before_writing, plan_bytes
from .policy import Policy, as_policy, metrics_of, retain
from .remote import save_remote
from .publish import clear_spec, publish_new_model, recover, replace_newest, rotate, spec_equals, sync_spec
from .asyncsave import HostBuffer, PendingSave
from .distributed import refusing, save_distributed
from .snapshot import Snapshot, snapshot
from ..dist import Local, round_, turns

__all__ = ["CheckpointSaver", "SaveOptions", "SaveReport", "save_model"]

_log = logging.getLogger("xser")


def _clear_spec(path: str, text: str, edit: Any, durable: bool) -> None:
    """``clear_spec`` before publishing; a hand edit it keeps aside is a warning that names where it is."""
    kept = clear_spec(path, text, edit, durable)
    if kept is not None and edit is not None:
        _log.warning("%s was edited by hand since the last save and this save replaces it with the spec of the object "
                     "saved; the edited file is kept as %s (%s). To use an edit, load the edited file and save that "
                     "object", path, kept, attrs.evolve(edit, path=kept).difference())


def _write_into(staging: Any, snap: Snapshot, options: SaveOptions, previous: Any, model: str) -> Any:
    """plan -> write -> finish into a staging directory."""
    plan = plan_save(
        snap.arrays, spec_text=snap.spec_text, state_tree=snap.state_tree, state_arrays=snap.state_arrays,
        formats=snap.formats, blocks=options.blocks, previous=previous, shards=options.shards, pack=options.pack,
    )
    # each file is fsynced by its writer (one syncfs of the filesystem was measured: 4 ms against 8 for 10 small
    # files on a quiet disk, but it waits for every other process's dirty data there: 315 ms with 400 MiB of it)
    small = plan_bytes(plan, SMALL_PLAN) < SMALL_PLAN
    threads = max(options.threads, options.shards or 0) if options.durable or not small else 1
    results = write(staging.path, plan, durable=options.durable, threads=threads)
    finish(staging, plan, results, snap.meta, id=new_id(), model=model)
    return staging


def refuse_special_spec(path: str) -> None:
    """A save writes the model's spec file at ``path`` (replacing it): a FIFO, socket, device or directory there (or
    named by a link there) is refused first."""
    refuse_special(path, "the spec", CheckpointError)


@contextlib.contextmanager
def os_errors(path: str) -> Iterator[None]:
    """Any OS failure of a save (full disk, permissions, a vanished directory) as a ``CheckpointError``."""
    try:
        yield
    except OSError as e:
        raise os_error(e, "cannot save the model", path, CheckpointError) from None


class Prepared:
    """A local save between its first and last step (model lock held): the model's checkpoints scanned and
    recovered, the new one checked against them, and a staging directory to write it into. ``publish()``
    makes the staged checkpoint the newest (replace, rotate, or start a new model); ``close()`` without it
    removes the staging directory. A distributed save holds one on rank 0 while every rank writes."""

    def __init__(self, path: str, snap: Any, options: SaveOptions, *, policy: Policy | None, restart: bool,
                 check_all: bool, skip_duplicates: bool) -> None:
        self.path, self.snap, self.options, self.policy, self.restart = path, snap, options, policy, restart
        self.stack = contextlib.ExitStack()
        self.staging: Any = None
        self.later = False  # the checkpoints it replaces or prunes deleted by the deleter thread (CheckpointSaver)
        self.published = False
        try:
            refuse_special_spec(path)
            self.s = self.stack.enter_context(scan(path, saver=True))
            self.aside = recover(path, self.s, durable=options.durable)
            self.existing = self.s.listed
            self.edit = hand_edit(path, self.existing[0][1], [d for _, d in self.existing]) if self.existing else None
            newest = os.path.abspath(data_dir_of(path, 0))
            self.previous, self.model, self.skip = before_writing(
                path, snap, options, self.existing, replaced=lambda c: os.path.abspath(c.path) == newest, policy=policy,
                restart=restart, check_all=check_all, skip_duplicates=skip_duplicates)
            if not self.skip:
                self.staging = self.stack.enter_context(stage(data_dir_of(path, 0), durable=options.durable))
        except BaseException:
            self.stack.close()
            raise

    def close(self) -> None:
        """Done, or given up: a staging directory not published is removed."""
        try:
            if self.staging is not None and not self.published:
                self.staging.discard()
        finally:
            self.stack.close()

    def publish(self) -> SaveReport:
        """Publish the staged checkpoint (its manifest written), then bring the top-level spec file in step."""
        if self.skip:
            self.close()
            return SaveReport(True, None, set_aside=self.aside)
        path, staging, existing, options, s = self.path, self.staging, self.existing, self.options, self.s
        s.close()  # (the checkpoints' descriptors: closed while they are still checkpoints, so the one that closes a
        # deleted directory, and frees it, is the deleter thread's)
        same = spec_equals(path, self.snap.spec_text)
        if not same:
            _clear_spec(path, self.snap.spec_text, self.edit, options.durable)
        if self.restart:
            drop = [c.path for c, _ in existing]
            publish_new_model(path, [staging.path], drop, options.durable)
        elif self.policy is None:
            drop = [c.path for c, _ in existing if os.path.abspath(c.path) == os.path.abspath(data_dir_of(path, 0))]
            replace_newest(path, staging.path, options.durable, later=self.later)
        else:
            meta = staging.manifest
            new = Checkpoint(0, staging.path, meta["step"], meta["created"], meta["metrics"])
            listed = [new] + [attrs.evolve(c, index=i + 1) for i, (c, _) in enumerate(existing)]
            kept = retain(listed, self.policy)
            keep_dirs = [listed[i].path for i in kept if i > 0]
            drop = [c.path for c, _ in existing if c.path not in keep_dirs]
            rotate(path, staging.path, keep_dirs, drop, s.slots, options.durable, later=self.later)
        self.published = True
        removed = tuple(attrs.evolve(c, path=data_dir_of(path, s.slots[c.path])) for c, _ in existing if c.path in drop)
        self.stack.close()
        spec_written = not same and sync_spec(path, self.snap.spec_text, options.durable)
        return SaveReport(
            False, data_dir_of(path, 0), staging.written, staging.linked, removed, spec_written, staging.manifest["id"],
            self.aside,
        )


def save_locked(
    path: str,
    snap: Snapshot,
    options: SaveOptions,
    *,
    policy: Policy | None,
    restart: bool = False,
    check_all: bool = True,
    skip_duplicates: bool = False,
    since: list[int] | None = None,
    later: bool = False,
) -> SaveReport:
    """The one save path (lock held). ``policy=None`` replaces the newest checkpoint (``xser.save``). ``since``: see
    ``save_remote`` (object stores only). ``later``: what the save replaces or prunes is deleted by the deleter
    thread after it returns (``storage/disk/trash.py``; a ``CheckpointSaver`` waits for it when closed)."""
    if is_url(path):
        return save_remote(path, snap, options, policy=policy, restart=restart, check_all=check_all,
                           skip_duplicates=skip_duplicates, since=since)
    prepared = Prepared(path, snap, options, policy=policy, restart=restart, check_all=check_all,
                        skip_duplicates=skip_duplicates)
    prepared.later = later
    try:
        if not prepared.skip:
            _write_into(prepared.staging, snap, options, prepared.previous, prepared.model)
        return prepared.publish()
    finally:
        prepared.close()


class _LockedPrepared(Prepared):
    """``Prepared`` that takes the model lock first and lets it go when done (``xser.save`` from several ranks: rank 0
    takes it once it knows the ranks agree)."""

    def __init__(self, path: str, *args: Any, **kw: Any) -> None:
        self.lock = ModelLock(path).acquire()
        try:
            with os_errors(path):
                super().__init__(path, *args, **kw)
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.lock.release()


def save_model(obj: Any, path: str, options: SaveOptions, *, name: str | None = None, training: Any = None,
               custom: Any = None, replace: Mapping[str, Any] | None = None, coordinator: Any = None) -> SaveReport:
    """``xser.save``: snapshot, then replace the newest checkpoint under the model lock."""
    with refusing(coordinator):
        snap = snapshot(obj, path, name=name, training=training, custom=custom, formats=options.formats, replace=replace)
    if coordinator is not None and coordinator.world_size > 1:
        with os_errors(path):
            return save_distributed(coordinator, snap, path, options, prepare=lambda whole: _LockedPrepared(
                path, whole, options, policy=None, restart=False, check_all=True, skip_duplicates=False))
    snap.refuse_parts()
    if is_url(path):
        return save_remote(path, snap, options, policy=None)
    with ModelLock(path), os_errors(path):
        return save_locked(path, snap, options, policy=None)


class _Unlocked:
    """A saver's "lock" on an object store, which has none: each save's conditional commit is what excludes others."""

    held = True

    def release(self) -> None:
        self.held = False


class CheckpointSaver:
    """Save a model again and again as rotating checkpoints.

    ``keep`` is an int (keep the last N) or a policy (``KeepLast``, ``KeepBest``,
    ``KeepEvery``, combined with ``|``); the newest checkpoint is always kept. ``blocks``
    maps ``"subcollection/param"`` patterns to a block size (rows, or a tuple of rows and
    columns): matching parameters are stored as several files; ``formats`` maps patterns to
    weight formats (see ``xser.save``). ``threads`` writer threads write files in parallel;
    ``shards=N`` packs the arrays into at most N safetensors containers; ``pack`` says which small arrays are packed
    by default (see ``xser.save``).
    The saver holds ``<model>.lock`` from construction until ``close()`` (or the end of a
    ``with`` block): a second saver on the same model gets a ``CheckpointError``.
    ``restart=True`` starts a new model: the first save replaces every existing checkpoint.
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
        threads: int = 2,
        shards: int | None = None,
        pack: int | bool = True,
        storage_options: Mapping[str, Any] | None = None,
        coordinator: Any = None,
    ) -> None:
        self.path = os.fspath(path)
        self.coordinator = coordinator if coordinator is not None else Local()
        self.storage_options = None if storage_options is None else dict(storage_options)
        #: on an object store (no lock to hold): the newest commit when the saver started, then its own last commit;
        #: a save that finds a newer one is a CheckpointError (another process saves this model too)
        self._since: list[int] | None = None
        if is_url(self.path):
            with options(self.storage_options):
                self._since = [latest(store_for(self.path), self.path)[0]]
        self.options = SaveOptions(durable, blocks, formats, threads, shards, pack)
        self.policy = as_policy(keep)
        self.restart = restart
        self._warned: set[tuple[str, str]] = set()
        self._checked = False
        self._pending: PendingSave | None = None  # the async save in progress
        self._buffer: HostBuffer | None = None  # its host arrays, reused save after save
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        if self.coordinator.world_size > 1:  # rank 0 holds the lock for all; every rank learns if it could not
            self._lock: Any = _Unlocked()

            def take(_: list) -> None:
                self._lock = self._open()

            with turns(self.coordinator).turn():
                round_(self.coordinator, "opening the saver", lambda: None, take)
        else:
            self._lock = self._open()

    def _open(self) -> Any:
        """Take the model lock (none on an object store) and clean up after interrupted saves."""
        lock: Any = _Unlocked() if is_url(self.path) else ModelLock(self.path).acquire()
        try:
            with os_errors(self.path):
                if not is_url(self.path):
                    remove_leftovers(self.path)
        except BaseException:
            lock.release()
            raise
        return lock

    @property
    def durable(self) -> bool:
        return self.options.durable

    def _warn_about_metrics(self, metrics: Mapping | None) -> None:
        """A KeepBest metric that a save does not report, or reports as NaN, is said once (it never counts as best)."""
        for metric, _ in metrics_of(self.policy):
            value = (metrics or {}).get(metric)
            if value is None and ("missing", metric) not in self._warned:
                self._warned.add(("missing", metric))
                known = ", ".join(sorted(metrics or {})) or "none"
                _log.warning("%s: KeepBest(%r) but this save reports no such metric (reported: %s); it never counts as best",
                             self.path, metric, known)
            elif isinstance(value, float) and value != value and ("nan", metric) not in self._warned:
                self._warned.add(("nan", metric))
                _log.warning("%s: metric %r is NaN; a NaN never counts as best", self.path, metric)

    def close(self) -> None:
        """Wait for a pending async save (raising its error), then let the model lock go. Never while a save runs: a
        wait interrupted by Ctrl-C keeps the lock and the save goes on (``close()`` again to finish)."""
        try:
            self.wait()
        except BaseException:
            if self._pending is not None:  # interrupted while the save still runs
                raise
            self._release()
            raise
        self._release()

    def _release(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        trash.drain()  # the checkpoints its saves replaced or pruned are deleted before the lock goes
        self._lock.release()
        self._buffer = None

    def wait(self) -> None:
        """Wait for the pending async save, if any; raise its error if nobody has seen it yet. An interrupted wait
        leaves it pending: the next save, ``wait()`` or ``close()`` waits for it again."""
        pending = self._pending
        if pending is not None:
            error = pending.wait()
            self._pending = None
            if error is not None:
                raise error

    def __enter__(self) -> CheckpointSaver:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
            return
        try:  # an exception is on its way out: a failed async save is logged, never put in its place
            self.close()
        except Exception as e:  # noqa: BLE001
            _log.error("%s: the async save still running when the with block failed failed too: %s", self.path, e)

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    @overload
    def save(self, obj: Any, *, step: int | None = ..., metrics: Mapping[str, float] | None = ..., training: Mapping | None = ...,
             custom: Mapping | None = ..., training_state: Any = ..., name: str | None = ...,
             blocking: Literal[True] = ...) -> SaveReport: ...
    @overload
    def save(self, obj: Any, *, step: int | None = ..., metrics: Mapping[str, float] | None = ..., training: Mapping | None = ...,
             custom: Mapping | None = ..., training_state: Any = ..., name: str | None = ...,
             blocking: Literal[False]) -> PendingSave: ...

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
        blocking: bool = True,
    ) -> SaveReport | PendingSave:
        """Publish ``obj`` as the newest checkpoint; shift and prune the older ones.

        ``blocking=False``: take the snapshot now (every array copied into a host buffer the saver reuses; device
        tensors copied off the device) and return a ``PendingSave`` at once; plan, write and publish run on a
        background thread. ``.result()`` gives the ``SaveReport`` or raises; the next save, ``close()`` and the end
        of a ``with`` block wait for it and raise its error if nobody has seen it. With a coordinator every rank
        takes its snapshot and rank 0 commits in the background.
        """
        if not self._lock.held:
            raise CheckpointError("this CheckpointSaver is closed", Location(self.path))
        self.wait()
        self._warn_about_metrics(metrics)
        with refusing(self.coordinator):  # the other ranks hear of a failure in the save's first round
            snap = snapshot(
                obj, self.path, name=name, step=step, metrics=metrics, training=training, custom=custom,
                training_state_value=training_state, formats=self.options.formats,
            )
        if self.coordinator.world_size == 1:
            snap.refuse_parts()
        if blocking:
            return self._save(snap)
        if self._buffer is None:
            self._buffer = HostBuffer()
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xser-save")
        with refusing(self.coordinator):
            snap = self._buffer.isolate(snap)
        # its place among the saves through the coordinator is taken now, in program order, not when the thread runs
        ticket = turns(self.coordinator).ticket() if self.coordinator.world_size > 1 else None
        self._pending = PendingSave(self._executor.submit(self._save, snap, ticket))
        return self._pending

    def _save(self, snap: Snapshot, ticket: int | None = None) -> SaveReport:
        """Every step after the snapshot (on the caller's thread, or the background one)."""
        restart, check_all = self.restart and not self._checked, not self._checked
        if self.coordinator.world_size > 1:
            with os_errors(self.path):
                report = save_distributed(self.coordinator, snap, self.path, self.options, prepare=lambda whole: Prepared(
                    self.path, whole, self.options, policy=self.policy, restart=restart, check_all=check_all, skip_duplicates=False),
                    ticket=ticket)
        else:
            with os_errors(self.path), options(self.storage_options, collect=False):
                report = save_locked(self.path, snap, self.options, policy=self.policy, restart=restart, check_all=check_all,
                                     skip_duplicates=True, since=self._since, later=True)
        self._checked = True
        return report
