"""Local scratch space for work on object stores: spool directories named after their process.

A remote save writes each file in a spool directory before uploading it, and an export to a URL stages
its files there. A process killed mid-way leaves its directory behind; the next one to make a spool of
the same kind removes the directories of processes that no longer run. Single files copied to be mapped
(``mmap=True``) are unlinked as soon as they are mapped and need none of this.
"""

from __future__ import annotations

import os
import shutil
import tempfile

__all__ = ["alive", "spool_dir"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists (another user's)
        return True
    return True


def spool_dir(kind: str) -> str:
    """A new directory ``xser-<kind>-<pid>-*`` in the temporary directory; the leftovers of dead processes go first."""
    base = tempfile.gettempdir()
    prefix = f"xser-{kind}-"
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if name.startswith(prefix) and pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)
