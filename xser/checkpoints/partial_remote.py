"""A partial save on an object store (``PartialSaver`` on a URL): blocks as immutable objects, no rename.

Under ``<model>.data.partial/`` (a prefix): ``layout.json``, created once with a conditional write
(a second first ``PartialSaver`` finds it there and resumes it), carries a ``run`` id; each block is
an object ``<sub>/<param>@<first>-<stop>.npy`` (uploaded whole: a block object is there entirely or
not at all), then its note ``<param>@<first>-<stop>.block.json`` created with a conditional write
(two workers writing the same rows: the second is refused), carrying the same ``run``. A block
counts once its note exists; a kill leaves at most a block object without a note, ignored and
overwritten when the rows are written again. Notes of another run (left by a finalize killed while
it deleted the prefix) are ignored. ``finalize`` publishes the checkpoint with the store's commit
record (blocks copied on the server), then deletes ``layout.json`` first (the partial save is gone
at once) and the rest of the prefix.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ..errors import DataError, Location
from ..storage.objects.opened import RemoteDir
from ..storage.write import put_array
from ..storage.stores import Store
from ..storage.stores.local import AlreadyExists

__all__ = ["RemoteStagingArea"]


class RemoteStagingArea:
    """The ``.data.partial`` prefix of a model on an object store."""

    def __init__(self, store: Store, staging: str) -> None:
        self.store = store
        self.staging = staging
        self.run: str | None = None  # the run id of the layout in force

    def where(self, *parts: str) -> str:
        return self.store.join(self.staging, *parts)

    def read_layout(self, name: str, limit: int) -> bytes | None:
        """The layout's bytes, or None when there is no partial save in progress."""
        lpath = self.where(name)
        try:
            raw = self.store.read_bytes(lpath, "the partial save's layout", limit=limit)
        except DataError:
            if self.store.size(lpath) is None:
                return None
            raise
        try:
            run = json.loads(raw).get("run")
        except (ValueError, AttributeError):
            run = None
        self.run = run if isinstance(run, str) else None
        return raw

    def create_layout(self, name: str, layout: dict) -> bool:
        """Create the layout (with a new ``run`` id); False when another process created one first."""
        run = secrets.token_hex(16)
        try:
            self.store.put(self.where(name), (json.dumps({**layout, "run": run}) + "\n").encode("utf-8"), create_only=True)
        except AlreadyExists:
            return False
        self.run = run
        return True

    def notes(self, sub: str) -> dict[str, str]:
        """``{note file name: its URL}`` of the notes under ``sub/``."""
        return {n: self.where(sub, n) for n in self.store.listdir(self.where(sub)) if n.endswith(".block.json")}

    def read_note(self, url: str, limit: int) -> dict | None:
        """A note of this run (parsed, unchecked), or None for a note another run left."""
        try:
            note = json.loads(self.store.read_bytes(url, "a block note", limit=limit))
        except ValueError as e:
            raise DataError(f"unreadable block note: {e}", Location(url)) from None
        if isinstance(note, dict) and note.get("run") != self.run:
            return None
        if isinstance(note, dict):
            note.pop("run", None)
        return note

    def write_block(self, sub: str, fname: str, rows: Any, note: dict) -> tuple[str, dict]:
        """Upload the block under a name of its own (``<stem>.<token>.npy``: two workers writing the same rows never
        overwrite each other's bytes), then create its note, which names it (the first note wins: conditional);
        (the block's URL, the note)."""
        stem = fname[: -len(".npy")]
        full = self.where(sub, f"{stem}.{secrets.token_hex(8)}.npy")
        size, digest = put_array(self.store, full, rows)
        note = {**note, "file": full.rsplit("/", 1)[-1], "bytes": size, "xxh3_64": digest}
        notepath = self.where(sub, stem + ".block.json")
        try:
            self.store.put(notepath, (json.dumps({**note, "run": self.run}) + "\n").encode("utf-8"), create_only=True)
        except AlreadyExists:
            raise DataError(f"rows ({note['first']}, {note['first'] + note['count']}) were written meanwhile by another worker",
                            Location(notepath)) from None
        return full, note

    def sizes(self) -> dict[str, int]:
        """Every object under the prefix with its size."""
        return self.store.list(self.staging)

    def source(self) -> RemoteDir:
        """The prefix as a directory the blocks are copied from (on the server, onto the same store)."""
        return RemoteDir(self.store, self.staging, None)  # type: ignore[arg-type]  # no manifest: only open_file/where

    def remove(self, layout: str) -> None:
        """The layout first (the partial save is then gone at once), then everything else under the prefix."""
        self.store.delete([self.where(layout)])
        self.store.delete_prefix(self.staging)
