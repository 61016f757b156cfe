"""The commit-record protocol of a model on an object store: names, listing, staging, commit, clean-up.

For a model at ``U`` (``s3://bucket/run/model.yaml``)::

    U                                          the spec (a copy of the newest checkpoint's spec.yaml)
    U.data/commits/00000000000000000007.json   commit records, one per save; the highest number is the model
    U.data/00000000000000000007-<id>/...       a checkpoint: manifest.json, spec.yaml, the arrays; written once

A save that starts from commit N writes its checkpoint under ``U.data/<N+1>-<id>/`` (manifest last),
then creates ``commits/<N+1>.json`` with a conditional write: the record lists the checkpoints the
model keeps, newest first, each with its manifest's size and checksum. That write is the commit: a
second saver that started from N finds the name taken and fails (``CheckpointError``), without a
record. After the commit, the saver writes the top-level spec, deletes the checkpoints the record
dropped, then every prefix numbered N+1 or lower that no record lists (left by killed or losing
saves), and commit records older than ``KEEP_RECORDS``. A prefix numbered above the newest record is
a save in progress (or killed before its commit): the next commit makes it removable.
"""

from __future__ import annotations

import logging
import json
import re
from typing import Any

import attrs

from ...errors import CheckpointError, DataError, Location, StorageError, XserError
from ..jsonlimit import loads_limited
from ..scanned import Scan, record_of
from ..manifest import MANIFEST, NewerFormatError
from ..stores.base import Store
from ..stores.local import AlreadyExists
from .opened import RemoteDir

__all__ = [
    "COMMITS",
    "KEEP_RECORDS",
    "RemoteScan",
    "commit",
    "clean_up",
    "data_root",
    "record_json",
    "remote_scan",
]

_log = logging.getLogger("xser")
COMMITS = "commits"
KEEP_RECORDS = 3  # commit records kept after a commit (older ones are deleted; readers hold the one they read)
MAX_RECORD = 16 << 20  # bytes: a record larger than this is refused before it is read
RECORD_FORMAT = "xser-commit"
RECORD_VERSION = 1
ATTEMPTS = 20  # a listing is taken again when a checkpoint of the record it read is deleted meanwhile
_SEQ = re.compile(r"^(\d{20})\.json$")
_PREFIX = re.compile(r"^(\d{20})-([0-9a-f]{32})$")


def data_root(store: Store, spec_path: str) -> str:
    return spec_path + ".data"


def _records_dir(store: Store, spec_path: str) -> str:
    return store.join(data_root(store, spec_path), COMMITS)


def record_path(store: Store, spec_path: str, seq: int) -> str:
    return store.join(_records_dir(store, spec_path), f"{seq:020d}.json")


def prefix_name(seq: int, id: str) -> str:
    return f"{seq:020d}-{id}"


# ---------------------------------------------------------------- reading


def _record_numbers(store: Store, spec_path: str) -> list[int]:
    names = store.listdir(_records_dir(store, spec_path))
    return sorted(int(m.group(1)) for n in names if (m := _SEQ.match(store.basename(n))))


def read_record(store: Store, spec_path: str, seq: int) -> dict | None:
    """Commit record ``seq``, checked; None if it is gone (deleted after newer ones were written)."""
    where = record_path(store, spec_path, seq)
    try:
        raw = store.read_bytes(where, "commit record", limit=MAX_RECORD)
    except DataError:
        if store.size(where) is None:
            return None
        raise
    return check_record(raw, where, seq)


def check_record(raw: bytes, where: str, seq: int) -> dict:
    rec = loads_limited(raw, where, "commit record")
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise DataError(f"not an xser commit record (expected \"format\": \"{RECORD_FORMAT}\")", Location(where))
    version = rec.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise DataError(f"commit record: version must be an int, got {version!r}", Location(where))
    if version > RECORD_VERSION:
        raise NewerFormatError(f"commit record version {version} is newer than this xser reads ({RECORD_VERSION})",
                               Location(where), version)
    if rec.get("seq") != seq:
        raise DataError(f"commit record says seq {rec.get('seq')!r}, its name says {seq}", Location(where))
    cks = rec.get("checkpoints")
    if not isinstance(cks, list):
        raise DataError("commit record: checkpoints must be a list", Location(where))
    for i, c in enumerate(cks):
        ok = (isinstance(c, dict) and isinstance(c.get("dir"), str) and _PREFIX.match(c["dir"])
              and isinstance(c.get("bytes"), int) and isinstance(c.get("checksum"), list) and len(c["checksum"]) == 2
              and all(isinstance(x, str) for x in c["checksum"]))
        if not ok:
            raise DataError(f"commit record: checkpoints[{i}] must be {{\"dir\": \"<seq>-<id>\", \"bytes\": int, "
                            f"\"checksum\": [algorithm, hex]}}, got {c!r}", Location(where))
        if int(c["dir"][:20]) > seq:
            raise DataError(f"commit record {seq} lists checkpoint {c['dir']}, written after it", Location(where))
    if not isinstance(rec.get("model"), str):
        raise DataError("commit record: model must be a string", Location(where))
    return rec


def latest(store: Store, spec_path: str) -> tuple[int, dict | None]:
    """(number, record) of the newest commit record; (0, None) when the model has none."""
    for _ in range(ATTEMPTS):
        numbers = _record_numbers(store, spec_path)
        if not numbers:
            return 0, None
        rec = read_record(store, spec_path, numbers[-1])
        if rec is not None:
            return numbers[-1], rec
    raise CheckpointError("the model's commit records keep changing while they are read", Location(spec_path))


@attrs.define
class RemoteScan(Scan):
    """A model on an object store as one commit record lists it (checkpoints opened, newest first)."""

    store: Any = None
    seq: int = 0
    record: dict | None = None
    prefixes: list[str] = attrs.field(factory=list)  # the prefix names of the listed checkpoints (newest first)
    entries: list[dict] = attrs.field(factory=list)  # their entries in the record (damaged ones left out)


def remote_scan(store: Store, spec_path: str) -> RemoteScan:
    """The newest commit record and its checkpoints, each opened (manifest read and checked against the record).

    A checkpoint is deleted only after a newer record stops naming it, so a missing one means either that a newer
    record exists (a rotation ran since: the listing starts over from it) or, when none does, that the checkpoint was
    damaged or deleted by hand: it is left out of the listing (``damaged``, with a warning) and the next save commits
    a record without it."""
    for _ in range(ATTEMPTS):
        seq, rec = latest(store, spec_path)
        if rec is None:
            return RemoteScan(spec_path, [], store=store, seq=seq)
        root = data_root(store, spec_path)
        opened: list[tuple[dict, RemoteDir]] = []
        damaged: list[tuple[str, str]] = []
        moved = False
        for c in rec["checkpoints"]:
            where = store.join(root, c["dir"])
            try:
                opened.append((c, RemoteDir.open_remote(store, where, (c["bytes"], tuple(c["checksum"])))))
            except NewerFormatError as e:
                for _, d in opened:
                    d.close()
                raise CheckpointError(
                    f"checkpoint {where} was written by a newer xser (format_version {e.version}); "
                    "upgrade xser to read or save this model", Location(spec_path)) from None
            except DataError as e:  # MissingDir included
                if _record_numbers(store, spec_path)[-1:] != [seq]:
                    moved = True  # a newer record: this one's checkpoints may be gone, list again
                    break
                damaged.append((where, e.message))
        if moved:
            for _, d in opened:
                d.close()
            continue
        for where, why in damaged:
            _log.warning("%s: checkpoint %s named by commit record %d cannot be read (%s); it is left out, and the next "
                         "save commits a record without it", spec_path, where, seq, why)
        listed = [(record_of(i, d), d) for i, (_, d) in enumerate(opened)]
        return RemoteScan(spec_path, listed, damaged=damaged, store=store, seq=seq, record=rec,
                          prefixes=[c["dir"] for c, _ in opened], entries=[c for c, _ in opened])
    raise CheckpointError(f"the model's commit records kept changing while its checkpoints were listed ({ATTEMPTS} times)",
                          Location(spec_path))


# ---------------------------------------------------------------- committing


def record_json(seq: int, model: str, checkpoints: list[tuple[str, int, tuple[str, str]]], created: str) -> bytes:
    rec = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "seq": seq,
        "model": model,
        "created": created,
        "checkpoints": [{"dir": d, "bytes": n, "checksum": list(c)} for d, n, c in checkpoints],
    }
    return (json.dumps(rec, indent=1) + "\n").encode("utf-8")


def entry_of_listed(scan: RemoteScan, index: int) -> tuple[str, int, tuple[str, str]]:
    c = scan.entries[index]
    return c["dir"], c["bytes"], (c["checksum"][0], c["checksum"][1])


def commit(store: Store, spec_path: str, seq: int, model: str, checkpoints: list[tuple[str, int, tuple[str, str]]],
           created: str) -> None:
    """Create commit record ``seq`` (conditional: fails if another saver created it first).

    The name can also be free because other savers committed ``seq`` and newer records meanwhile and the clean-up
    deleted ``seq`` (this saver stalled for a while): a record numbered above ``seq``, listed after the create, makes
    this save fail the same way, its record deleted again (readers and savers take the highest record: it was never
    the model)."""
    where = record_path(store, spec_path, seq)
    data = record_json(seq, model, checkpoints, created)
    try:
        store.put(where, data, create_only=True)
    except AlreadyExists:
        ours = _is_ours(store, where, data)  # (ours: a create whose reply was lost, retried by a layer below)
        if ours is None:
            raise _unknown(spec_path, seq) from None
        if not ours:
            raise _lost(spec_path, seq) from None
    except XserError as e:
        ours = _is_ours(store, where, data)  # the create failed, or its answer was lost and it was applied
        if ours is None:
            e.keep_prefix = True  # type: ignore[attr-defined]
            raise
        if not ours:
            try:
                taken = store.size(where) is not None
            except XserError:
                e.keep_prefix = True  # type: ignore[attr-defined]
                raise e from None
            if taken:  # another saver's record: this save lost the race (the store's error was about that)
                raise _lost(spec_path, seq) from None
            raise
    if not store.conditional and _is_ours(store, where, data) is False:
        raise _lost(spec_path, seq)  # check-then-write: another saver's record replaced this one meanwhile
    try:
        newer = [n for n in _record_numbers(store, spec_path) if n > seq]
    except XserError as e:  # committed, but whether it is the newest (this saver may have stalled) is unknown
        e.keep_prefix = True  # type: ignore[attr-defined]
        raise
    if newer:
        store.delete([where])
        raise _lost(spec_path, newer[-1])


def _is_ours(store: Store, where: str, data: bytes) -> bool | None:
    """Whether record ``where`` holds ``data``: True, False (another record, or none), None when it cannot be read."""
    try:
        return store.read_bytes(where, "commit record", limit=MAX_RECORD) == data
    except StorageError:
        return None
    except DataError:  # missing, or larger than any record of ours
        return False


def _unknown(spec_path: str, seq: int) -> CheckpointError:
    e = CheckpointError(f"commit {seq} exists but could not be read back to tell whether it is this save's; this save's "
                        "objects are kept (the next save or listing tells)", Location(spec_path))
    e.keep_prefix = True  # type: ignore[attr-defined]
    return e


def _lost(spec_path: str, seq: int) -> CheckpointError:
    return CheckpointError(f"another process saved this model meanwhile (commit {seq} exists); this save was not "
                           "committed and its objects are removed", Location(spec_path))


def clean_up(store: Store, spec_path: str, seq: int, keep: list[str]) -> list[str]:
    """After commit ``seq``: delete every checkpoint prefix numbered ``seq`` or lower that the newest record does not
    list (dropped by this commit, or left by killed and losing saves), and commit records older than ``KEEP_RECORDS``.
    Returns the prefixes removed. Prefixes numbered above ``seq`` belong to saves in progress and stay.

    The newest record is read again first: only when it is ``seq`` is anything deleted, and what it names is kept
    (``keep`` must agree with it). A newer record means another saver committed since (its own clean-up runs); a
    record ``seq`` with other contents means a store without conditional writes let another saver overwrite it: its
    checkpoints stay, this save's are the ones dropped. Either way no record ever names a deleted object."""
    newest, record = latest(store, spec_path)
    if newest != seq or record is None:
        return []
    keep = [c["dir"] for c in record["checkpoints"]]
    root = data_root(store, spec_path)
    removed = []
    kept = set(keep)
    for name in store.listdir(root):
        base = store.basename(name.rstrip("/"))
        m = _PREFIX.match(base)
        if m is None or base in kept or int(m.group(1)) > seq:
            continue
        store.delete([store.join(root, base, MANIFEST)])  # first: a reader that misses a file then sees it removed whole
        store.delete_prefix(store.join(root, base))
        removed.append(base)
    old = [n for n in _record_numbers(store, spec_path) if n <= seq - KEEP_RECORDS]
    store.delete([record_path(store, spec_path, n) for n in old])
    return removed


def pending(store: Store, spec_path: str, seq: int) -> list[str]:
    """Prefixes of saves that started after commit ``seq`` (in progress, or killed before committing)."""
    out = []
    for name in store.listdir(data_root(store, spec_path)):
        base = store.basename(name.rstrip("/"))
        m = _PREFIX.match(base)
        if m is not None and int(m.group(1)) > seq:
            out.append(base)
    return out
