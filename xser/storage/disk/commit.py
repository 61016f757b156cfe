"""The last two steps of a save: ``finish`` (the manifest, written last) and ``publish``.

``stage`` makes the temporary directory beside the target; ``write`` (``write.py``) fills it;
``finish`` writes ``manifest.json`` (the commit point of the directory) and fsyncs it, every
subdirectory and the directory itself; ``publish`` puts the directory at its name, by an atomic
exchange with the directory it replaces where the OS has one (Linux ``renameat2``). The lock
and the removal of leftovers are separate steps (``lock.py``, ``remove_leftovers``), so a later
multi-process save can run ``write`` on every process and ``finish``/``publish`` on one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

import attrs

from ...errors import DataError, Location, StorageError
from ..fsutil import fsync_dir, libc_function, makedirs_durable, os_error
from .dirhandle import O_DIR
from ..layout import OLD_MARK, leftovers, temp_name
from . import trash
from .lock import claim
from ..manifest import MANIFEST, block_json, new_manifest, param_json, render_manifest, spec_json
from ..plan import Plan
from ..stores.local import LOCAL
from ..write import READ_ONLY, WriteResult

__all__ = [
    "Staging",
    "counts",
    "exchange",
    "finish",
    "finish_manifest",
    "new_id",
    "now",
    "publish",
    "keep_aside",
    "manifest_of",
    "remove_file",
    "remove_leftovers",
    "remove_tree",
    "stage",
    "to_trash",
    "discard",
    "write_text_atomic",
]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_id() -> str:
    """A checkpoint or model id: 128 random bits as 32 lowercase hex digits."""
    return secrets.token_hex(16)


@attrs.define
class Staging:
    """A data directory being made under a temporary name beside its target."""

    path: str
    durable: bool
    manifest: dict = attrs.field(factory=dict)
    written: int = 0
    linked: int = 0

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def stage(target: str, *, durable: bool) -> Iterator[Staging]:
    """A new empty staging directory for ``target``; removed again if the block fails.

    OS errors inside the block become ``DataError``s that name the file.
    """
    parent = os.path.dirname(os.path.abspath(target))
    staging = Staging(temp_name(target), durable)
    try:
        makedirs_durable(parent, durable=durable)
        os.mkdir(staging.path)
    except OSError as e:
        raise os_error(e, "cannot write data directory", target) from None
    try:
        yield staging
    except OSError as e:
        staging.discard()
        raise os_error(e, "cannot write data directory", target) from None
    except BaseException:
        staging.discard()
        raise


def manifest_of(plan: Plan, results: list[WriteResult], meta: Mapping[str, Any], *, id: str, model: str) -> dict:
    """The manifest of a written plan (every file's size and checksum from its ``WriteResult``)."""
    manifest = new_manifest(meta, id=id, model=model, created=now())
    if plan.spec is not None:
        r = results[plan.spec]
        manifest["spec"] = spec_json(r.rel, r.bytes, r.checksum)

    def entry(p: Any) -> dict:
        blocks = []
        for index, start, shape, key in p.pieces:
            r = results[index]
            span = r.spans.get(key) if r.spans is not None else None
            blocks.append(block_json(r.rel, plan.pieces[index].format, r.bytes, r.checksum, start, shape, key, span))
        return param_json(p.dtype, p.shape, p.trainable, blocks, p.attrs)

    if plan.state is not None:
        manifest["training_state"] = {"tree": plan.state_tree, "arrays": {p.name: entry(p) for p in plan.state}}
    if meta.get("ranks") is not None:
        _per_rank(manifest, meta["ranks"])
    subs: dict[str, dict] = {s: {} for s in plan.subcollections}
    for p in plan.params:
        subs[p.sub][p.name] = entry(p)
    manifest["subcollections"] = subs
    return manifest


def _per_rank(manifest: dict, ranks: list) -> None:
    """A copy of a checkpoint saved by several ranks (``xser convert --keep-training-state``): ``meta["ranks"]`` holds
    each rank's ``training`` dict, the training state's tree is the list of the ranks' trees (None: a rank without)
    and its arrays are named ``rank<r>-<key>``; the manifest keeps them per rank, as a distributed save writes them."""
    ts = manifest.pop("training_state", None)
    trees = ts["tree"] if ts is not None else [None] * len(ranks)
    manifest["world_size"] = len(ranks)
    manifest["ranks"] = []
    for r, training in enumerate(ranks):
        entry: dict = {"training": dict(training)}
        if trees[r] is not None:
            prefix = f"rank{r}-"
            entry["training_state"] = {"tree": trees[r], "arrays": {k[len(prefix):]: e for k, e in ts["arrays"].items() if k.startswith(prefix)}}
        manifest["ranks"].append(entry)


def counts(plan: Plan, results: list[WriteResult]) -> tuple[int, int]:
    """(files written, files linked) among the parameter and training-state files of a written plan."""
    arrays = [r for i, r in enumerate(results) if i != plan.spec]
    return sum(not r.linked for r in arrays), sum(r.linked for r in arrays)


def finish(
    staging: Staging, plan: Plan, results: list[WriteResult], meta: Mapping[str, Any], *, id: str, model: str
) -> dict:
    """Write the manifest (last), fsync it and every directory of the staging area; return it."""
    manifest = manifest_of(plan, results, meta, id=id, model=model)
    staging.written, staging.linked = counts(plan, results)
    return finish_manifest(staging, manifest, plan.dirs)


def finish_manifest(staging: Staging, manifest: dict, dirs: Any) -> dict:
    """Write ``manifest`` (last) into the staging directory, fsync it, the directories ``dirs`` and the staging
    directory itself; return it."""
    path = os.path.join(staging.path, MANIFEST)
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(render_manifest(manifest))
            os.fchmod(f.fileno(), READ_ONLY)
            if staging.durable:
                f.flush()
                os.fsync(f.fileno())
        if staging.durable:
            for d in dirs:
                fsync_dir(os.path.join(staging.path, d))
            fsync_dir(staging.path)
    except OSError as e:
        raise os_error(e, "cannot write manifest", path) from None
    staging.manifest = manifest
    return manifest


# ---------------------------------------------------------------- publishing


_RENAMEAT2 = libc_function("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)


def publish(tmp: str, target: str, trash_base: str) -> str | None:
    """Put the complete directory ``tmp`` at ``target``; return where the old one went, if any.

    Where the OS can swap two directories atomically, ``target`` is never missing, even for a
    moment, and the old directory ends up at ``tmp``'s name (a temporary: removed by the next
    save if a crash comes first). Elsewhere the old directory is first renamed to a trash name
    (``trash_base`` + ``.old-*``), so a crash between the two renames leaves ``target`` missing
    and the old checkpoint out of the listing: the next save removes it.
    """
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return None
    if exchange(tmp, target):
        return tmp  # which now holds the old directory
    old = temp_name(trash_base, OLD_MARK)
    os.rename(target, old)
    os.rename(tmp, target)
    return old


def to_trash(path: str, trash_base: str) -> str:
    """Make a directory disappear from its name in one rename, to a trash name (``trash_base.old-*``); return it."""
    trash = temp_name(trash_base, OLD_MARK)
    os.rename(path, trash)
    return trash


def remove_tree(path: str, trash_base: str) -> str:
    """Make a directory disappear in one rename (to a trash name), then delete it unless a reader has it
    pinned (``discard``). Returns the trash name."""
    trash = to_trash(path, trash_base)
    discard(trash)
    return trash


def discard(path: str) -> bool:
    """Delete a directory that is no longer a checkpoint (a trash or temporary name), unless a reader has it
    open (``lock.pin``): then it stays, and a later save removes it (``remove_leftovers``). True if deleted."""
    try:
        fd = os.open(path, O_DIR)
    except FileNotFoundError:
        return True
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
    try:
        if not claim(fd):
            return False
        shutil.rmtree(path, ignore_errors=True)  # under the exclusive lock: no reader pins it meanwhile
        return True
    finally:
        os.close(fd)


def write_text_atomic(path: str, text: str, *, durable: bool = True) -> None:
    """Write a small text file by temporary file + ``os.replace`` (+ fsync of file and parent): ``LocalStore.put``,
    its failures as ``DataError``s."""
    try:
        LOCAL.put(path, text.encode("utf-8"), durable=durable)
    except StorageError as e:
        raise DataError(e.message, e.location) from None


def keep_aside(path: str, mark: str, *, durable: bool = True) -> str:
    """Rename ``path`` to the first free name of ``path + mark``, ``path + mark + ".2"``, ... (never over a file);
    return that name. Call while holding the model's lock."""
    n = 1
    while os.path.lexists(target := path + mark + ("" if n == 1 else f".{n}")):
        n += 1
    try:
        os.rename(path, target)
        if durable:
            fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        raise DataError(f"cannot rename file: {e.strerror or e}", Location(e.filename or path)) from None
    return target


def remove_file(path: str, *, durable: bool = True) -> None:
    """Remove the file ``path`` (gone already is fine)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise DataError(f"cannot remove file: {e.strerror or e}", Location(e.filename or path)) from None
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def remove_leftovers(spec_path: str) -> list[str]:
    """Remove what interrupted saves and prunes of this model left: ``*.tmp-*`` and ``*.old-*``, except
    checkpoints a reader still has open (``discard``). Returns what it removed.

    Call only while holding the model's lock (no live saver is using them then).
    """
    removed = []
    for full in leftovers(spec_path):
        if trash.pending(full):
            continue  # this process's deleter thread is removing it (trash.py)
        if os.path.isdir(full) and not os.path.islink(full):
            if not discard(full):
                continue  # a checkpoint a reader still reads (pruned or replaced under it): removed by a later save
        else:
            try:
                os.unlink(full)
            except FileNotFoundError:
                pass
        removed.append(full)
    return removed


