"""Names on disk: a model's spec file, its checkpoint slots and the temporaries beside them.

```
model.yaml                        the spec (a copy of the newest checkpoint's spec.yaml)
model.yaml.data, .data.1, ...     checkpoint slots (0 = newest)
model.yaml.lock                   the saver lock
model.yaml.data.partial/          a PartialSaver's blocks in progress
model.yaml.tmp-<pid>-<hex>        a spec file being written
model.yaml.data.tmp-<pid>-<hex>   a data directory being staged
model.yaml.data.old-<pid>-<hex>   a checkpoint being deleted (renamed first, then removed)
model.yaml.data.damaged-<hex>     a slot that held no valid checkpoint, set aside (never deleted)
model.yaml.edited, .edited.2, ... a hand-edited spec file that a save replaced, kept (never deleted)
```
"""

from __future__ import annotations

import os
import re

__all__ = [
    "DAMAGED_MARK",
    "EDITED_MARK",
    "OLD_MARK",
    "TMP_MARK",
    "data_dir_of",
    "leftovers",
    "models_in",
    "siblings",
    "slot_names",
    "slot_of",
    "temp_name",
]

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"
DAMAGED_MARK = ".damaged-"
EDITED_MARK = ".edited"
PARTIAL = ".data.partial"


def data_dir_of(spec_path: str | os.PathLike, slot: int = 0) -> str:
    base = os.fspath(spec_path) + ".data"
    return base if slot == 0 else f"{base}.{slot}"


def temp_name(target: str, mark: str = TMP_MARK) -> str:
    import secrets  # (imported on use: readers never make temporary names)

    return f"{target}{mark}{os.getpid()}-{secrets.token_hex(4)}"


def siblings(spec_path: str | os.PathLike) -> tuple[str, str, list[str]]:
    """(parent directory, spec file name, names in the parent) for a model's spec path."""
    spec_path = os.fspath(spec_path)
    parent = os.path.dirname(os.path.abspath(spec_path))
    try:
        names = os.listdir(parent)
    except (FileNotFoundError, NotADirectoryError):
        names = []
    return parent, os.path.basename(spec_path), names


def slot_names(spec_path: str | os.PathLike, names: list[str] | None = None) -> list[tuple[int, str]]:
    """(slot, full path) of every ``<model>.data[.N]`` name in the parent (N without leading zeros), by slot."""
    parent, base, listed = siblings(spec_path)
    prefix = base + ".data"
    pattern = re.compile(re.escape(prefix) + r"(?:\.(0|[1-9][0-9]*))?")
    out = []
    for name in listed if names is None else names:
        m = pattern.fullmatch(name) if name.startswith(prefix) else None  # (a folder of many models: one test each)
        if m and m.group(1) != "0":
            out.append((int(m.group(1)) if m.group(1) else 0, os.path.join(parent, name)))
    return sorted(out)


def leftovers(spec_path: str | os.PathLike) -> list[str]:
    """What interrupted saves and prunes of this model left beside it (temporaries, trash)."""
    parent, base, names = siblings(spec_path)
    prefixes = (base + TMP_MARK, base + ".data" + TMP_MARK, base + ".data" + OLD_MARK)
    return sorted(os.path.join(parent, n) for n in names if n.startswith(prefixes))


_SLOT = re.compile(r"(.+)\.data(?:\.(0|[1-9][0-9]*))?")


def slot_of(path: str | os.PathLike) -> tuple[str, int] | None:
    """``(spec path, slot)`` when ``path`` is a checkpoint slot ``<model>.data[.N]`` (its spec file beside it, or a
    manifest inside), else None."""
    path = os.path.normpath(os.fspath(path))
    m = _SLOT.fullmatch(os.path.basename(path))
    if m is None:
        return None
    spec = os.path.join(os.path.dirname(path), m.group(1))
    if not (os.path.isfile(spec) or os.path.isfile(os.path.join(path, "manifest.json"))):
        return None
    return spec, int(m.group(2) or 0)


def models_in(directory: str | os.PathLike) -> list[str]:
    """The saved models in ``directory``: each file ``<name>`` with a ``<name>.data`` directory beside it, by name."""
    directory = os.fspath(directory)
    try:
        names = set(os.listdir(directory))
    except OSError:
        return []
    return sorted(
        os.path.join(directory, n) for n in names
        if n + ".data" in names and os.path.isfile(os.path.join(directory, n)) and os.path.isdir(os.path.join(directory, n + ".data"))
    )
