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


def test_sync_files_makes_one_syncfs_call_where_it_is_usable(tmp_path, monkeypatch):
    if not fsutil.syncfs_usable(str(tmp_path)):
        pytest.skip("no usable syncfs here")
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
        monkeypatch.setattr(fsutil, "syncfs_usable", lambda d: True)
    monkeypatch.setattr(fsutil, "fsync_file", fsyncs.append)
    paths = _files(tmp_path, 3)
    fsutil.sync_files(str(tmp_path), paths)
    assert fsyncs == paths


def test_a_writeback_error_of_syncfs_is_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: -1)
    monkeypatch.setattr(fsutil, "syncfs_usable", lambda d: True)
    monkeypatch.setattr(fsutil.ctypes, "get_errno", lambda: errno.EIO)
    with pytest.raises(OSError) as e:
        fsutil.sync_files(str(tmp_path), _files(tmp_path, 2))
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path)


@pytest.mark.parametrize("kind, release", [("fuse.juicefs", "6.1.0"), ("nfs4", "6.1.0"), ("ext4", "4.18.0-513.el8.x86_64")])
def test_syncfs_is_not_trusted_on_network_or_fuse_mounts_or_old_kernels(tmp_path, monkeypatch, kind, release):
    """A FUSE or network mount may not pass syncfs on; Linux before 5.8 returned 0 after writeback errors: each file is
    fsynced instead."""
    monkeypatch.setattr(fsutil, "_SYNCFS", lambda fd: pytest.fail("syncfs called"))
    monkeypatch.setattr(fsutil, "fs_type", lambda path: kind)
    monkeypatch.setattr(fsutil.os, "uname", lambda: os.uname_result(("Linux", "h", release, "#1", "x86_64")))
    fsyncs: list[str] = []
    monkeypatch.setattr(fsutil, "fsync_file", fsyncs.append)
    paths = _files(tmp_path, 2)
    fsutil.sync_files(str(tmp_path), paths)
    assert fsyncs == paths


def test_fs_type_reads_the_mount_that_holds_a_path(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo")
    with open("/proc/self/mountinfo") as f:
        root = next(line.partition(" - ")[2].split()[0] for line in f if line.split()[4] == "/")
    kind = fsutil.fs_type(str(tmp_path))
    assert isinstance(kind, str) and kind
    assert fsutil.fs_type("/") == root
