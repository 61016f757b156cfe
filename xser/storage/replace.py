"""Export outputs put in place whole: every exporter (safetensors, RecIS, Angel, DiSMEC++, XNMT) writes each output
path under a temporary name beside it and then moves it to its name, replacing what was there.

Where the OS swaps two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``, as a checkpoint's publish does),
an output path is never missing and never half written, at any kill point: before the swap it holds the old
output, after it the new one, and the old one sits at the temporary name until it is removed. Elsewhere the old
output is first renamed to ``OUT.old-<pid>-<hex>``, so a kill between the two renames leaves ``OUT`` missing
and the old output whole at that name. The next export to the same name removes what a killed one left
(``OUT.tmp-*`` and ``OUT.old-*`` of processes no longer running; a running export's temporaries are left alone).

An export of several paths (DiSMEC++'s weight files and metadata, XNMT's model file and data directories)
replaces them one at a time, the file that names the others last: each path is whole at every kill point,
but a kill between two of them leaves some old and some new.

On an object store (a URL destination: ``s3://``, ``gs://``, ``memory://``, ...) there is no rename to put a
directory in place with. The exporter still writes its files into a local temporary directory (``TMPDIR``; as
much space as the export's size), then each file is uploaded to its name (``Store.put_file``: one object each,
whole or not there, a large one in parallel parts), the files that name the others last; then the objects of an
old output that the new one does not have are deleted. A kill during the uploads leaves the destination with some
new objects and the old ones not yet overwritten: each object is whole, but the output as a set is not (a
multi-file export is not atomic there). Export again with ``force`` to finish it. See docs/interop.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

from .disk import commit
from .spool import alive, spool_dir
from .fsutil import makedirs_durable
from .layout import OLD_MARK, TMP_MARK, temp_name

__all__ = ["output_exists", "output_leftovers", "put_in_place", "remove_output_leftovers", "replaced_output", "replaced_outputs"]

_PID = re.compile(r"([0-9]+)-[0-9a-f]+")


def output_leftovers(out: str) -> list[str]:
    """What killed exports to ``out`` left beside it: ``OUT.tmp-*`` and ``OUT.old-*`` whose process is gone
    (names without a process id, written by xser 0.1, count as gone)."""
    parent = os.path.dirname(os.path.abspath(out))
    base = os.path.basename(os.path.abspath(out))
    try:
        names = os.listdir(parent)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        for mark in (TMP_MARK, OLD_MARK):
            if name.startswith(base + mark):
                m = _PID.fullmatch(name[len(base + mark):])
                if m is None or not alive(int(m.group(1))):
                    found.append(os.path.join(parent, name))
    return sorted(found)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def remove_output_leftovers(out: str) -> list[str]:
    found = output_leftovers(out)
    for path in found:
        _remove(path)
    return found


def put_in_place(staged: str, out: str) -> None:
    """Move the finished ``staged`` to ``out``, replacing what is there (by an atomic swap where the OS has one),
    then remove the old output."""
    if not os.path.lexists(out):
        os.rename(staged, out)
        return
    if commit.exchange(staged, out):  # looked up at each call (the crash tests count it)
        _remove(staged)  # the old output, now at the temporary name
        return
    if not os.path.isdir(staged) and not os.path.isdir(out):
        os.replace(staged, out)  # a file over a file: atomic anyway
        return
    old = temp_name(out, OLD_MARK)
    os.rename(out, old)
    os.rename(staged, out)
    _remove(old)


def _store(path: str, store: Any) -> Any:
    from .stores import store_for

    return store if store is not None else store_for(path)


def output_exists(path: str, store: Any = None) -> bool:
    """Something is at the output path ``path``: a file, a directory or a dangling link on this machine; an object,
    or objects under it as a prefix, on an object store."""
    st = _store(path, store)
    if st.local_path(path) == path:
        return os.path.lexists(path)
    return st.exists(path) or st.isdir(path)


@contextlib.contextmanager
def replaced_outputs(outs: Sequence[str], dirs: Sequence[bool], store: Any = None, *, last: Sequence[str] = ()) -> Iterator[list[str]]:
    """Temporary local names for the output paths ``outs`` (an empty directory made for each ``dirs`` entry that is
    true; files are for the caller to create); when the block ends without an error they are put in place in order,
    else removed. Leftovers of killed exports to these names are removed first.

    ``store`` holds the outputs (by default the one their paths name). On an object store they are uploaded instead
    (``_upload``), the files of a directory named in ``last`` after its others."""
    st = _store(outs[0], store) if outs else None
    if st is not None and any(st.local_path(out) != out for out in outs):
        with _uploaded_outputs(st, outs, dirs, last) as staged:
            yield staged
        return
    outs = [os.path.normpath(out) for out in outs]  # "dir/" is "dir": its temporaries go beside it, not into it
    for out in outs:
        remove_output_leftovers(out)
        makedirs_durable(os.path.dirname(os.path.abspath(out)), durable=False)
    staged: list[str] = []
    try:
        for out, is_dir in zip(outs, dirs):
            staged.append(temp_name(out))
            if is_dir:
                os.mkdir(staged[-1])
        yield list(staged)
        for s, out in zip(staged, outs):
            if os.path.lexists(s):
                put_in_place(s, out)
    except BaseException:
        for s in staged:
            if os.path.lexists(s):
                _remove(s)
        raise


@contextlib.contextmanager
def replaced_output(out: str, *, directory: bool = True, store: Any = None, last: Sequence[str] = ()) -> Iterator[str]:
    """``replaced_outputs`` for one path."""
    with replaced_outputs([out], [directory], store, last=last) as staged:
        yield staged[0]


@contextlib.contextmanager
def _uploaded_outputs(store: Any, outs: Sequence[str], dirs: Sequence[bool], last: Sequence[str]) -> Iterator[list[str]]:
    """``replaced_outputs`` on an object store: the caller writes into a local temporary directory; when the block
    ends without an error each output is uploaded (``_upload``) in order, and the temporary directory is removed
    either way. Nothing is uploaded when the block fails."""
    tmp = spool_dir("export")
    try:
        staged = []
        for i, is_dir in enumerate(dirs):
            staged.append(os.path.join(tmp, str(i)))
            if is_dir:
                os.mkdir(staged[-1])
        yield list(staged)
        for s, out in zip(staged, outs):
            if os.path.lexists(s):
                _upload(store, s, out, last)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _upload(store: Any, staged: str, out: str, last: Sequence[str]) -> None:
    """Put the local file or directory ``staged`` at ``out`` on ``store``: every new file first (a directory's files
    in name order, those named in ``last`` after the others), then the objects of the old output at ``out`` that the
    new one does not have are deleted."""
    old = set(store.list(out)) if output_exists(out, store) else set()
    new: set[str] = set()
    if os.path.isdir(staged):
        files = []
        for root, ds, names in os.walk(staged):
            ds.sort()
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), staged)
                files.append(rel.split(os.sep))
        files.sort(key=lambda parts: (parts[-1] in last, parts))
        for parts in files:
            dest = store.join(out, *parts)
            store.put_file(os.path.join(staged, *parts), dest)
            new.add(dest)
    else:
        store.put_file(staged, out)
        new.add(out)
    gone = sorted(old - set(new))
    if gone:
        store.delete(gone)


def staged_file(path: str, *, text: bool = False) -> Any:
    """A new file at ``path`` inside a staging directory that ``replaced_output(s)`` gave (binary, or UTF-8 text):
    the one way exporters write, so every byte of an export goes through the storage layer."""
    return open(path, "w", encoding="utf-8") if text else open(path, "wb")
