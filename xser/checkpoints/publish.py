"""Publishing checkpoints: the top-level spec file around a publish, and the slot renames (``storage/disk/slots.py``,
re-exported here). ``docs/format.md`` section 4 walks through every step; all of it runs under the model lock.
"""

from __future__ import annotations

from ..errors import SpecError
from ..spec import read_text
from ..spec.saved import HandEdit, edit_lost
from ..storage.disk.commit import keep_aside, remove_file, write_text_atomic
from ..storage.layout import EDITED_MARK
from ..storage.disk.slots import publish_new_model, recover, replace_newest, rotate

__all__ = ["clear_spec", "publish_new_model", "recover", "replace_newest", "rotate", "spec_equals", "sync_spec"]


def clear_spec(spec_path: str, text: str, edit: HandEdit | None, durable: bool) -> str | None:
    """Before publishing a checkpoint whose spec is ``text``: take away a top-level file that would be out of step
    with it, so that a kill before ``sync_spec`` leaves no file (readers then use the checkpoint's own spec), never
    an old spec that a reader would take for a hand edit. A hand edit (``edit``) that ``text`` would lose is kept
    aside as ``<model>.yaml.edited`` (its name is returned); any other differing file is removed."""
    if edit is not None and edit_lost(edit.text, text):
        return keep_aside(spec_path, EDITED_MARK, durable=durable)
    try:
        if read_text(spec_path) == text:
            return None
    except SpecError:  # missing, or not a readable regular file: sync_spec replaces whatever it is
        return None
    remove_file(spec_path, durable=durable)
    return None


def spec_equals(spec_path: str, text: str) -> bool:
    """Whether the top-level spec file holds ``text`` already (then neither ``clear_spec`` nor ``sync_spec`` has
    anything to do: a model saved again with an unchanged spec reads the file once, not twice)."""
    try:
        return read_text(spec_path) == text
    except SpecError:
        return False


def sync_spec(spec_path: str, text: str, durable: bool) -> bool:
    """Make the top-level spec file equal the newest checkpoint's spec (after publishing). True if written."""
    try:
        if read_text(spec_path) == text:
            return False
    except SpecError:  # missing, unreadable, not a regular file: replaced
        pass
    write_text_atomic(spec_path, text, durable=durable)
    return True
