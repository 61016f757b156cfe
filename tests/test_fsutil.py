"""Durability helpers of the storage layer (xser/storage/fsutil.py)."""

from __future__ import annotations

import errno
import os

import pytest

from xser.storage import fsutil


def _files(tmp_path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x" * i)
        paths.append(str(p))
    return paths


def test_sync_files_makes_one_syncfs_call_where_linux_has_it(tmp_path, monkeypatch):
    if fsutil._SYNCFS is None:
        pytest.skip("no syncfs here")
    calls, fsyncs = [], []
    real = fsutil._SYNCFS
    monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: calls.append(os.fstat(fd).st_ino) or real(fd))
    monkeypatch.setattr(fsutil, "fsync_file", fsyncs.append)
    fsutil.sync_files(str(tmp_path), _files(tmp_path, 5))
    assert calls == [os.stat(tmp_path).st_ino] and fsyncs == []


@pytest.mark.parametrize("err", [None, errno.ENOSYS, errno.EINVAL])
def test_sync_files_falls_back_to_an_fsync_of_each_file(tmp_path, monkeypatch, err):
    """No syncfs (another OS), or one that the filesystem refuses: every file is fsynced instead."""
    fsyncs: list[str] = []
    if err is None:
        monkeypatch.setattr(fsutil, "_SYNCFS", None)
    else:
        monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: -1)
        monkeypatch.setattr(fsutil.ctypes, "get_errno", lambda: err)
    monkeypatch.setattr(fsutil, "fsync_file", fsyncs.append)
    paths = _files(tmp_path, 3)
    fsutil.sync_files(str(tmp_path), paths)
    assert fsyncs == paths


def test_a_writeback_error_of_syncfs_is_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: -1)
    monkeypatch.setattr(fsutil.ctypes, "get_errno", lambda: errno.EIO)
    with pytest.raises(OSError) as e:
        fsutil.sync_files(str(tmp_path), _files(tmp_path, 2))
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path)
