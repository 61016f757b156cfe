"""The npy weight format (xser/storage/formats/npy.py)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import xser
from strategies import arrays, as_stored, bit_equal
from xser.storage.formats.npy import NPY, describe_dtype, parse_dtype


class TestNpy:
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(a=arrays())
    def test_write_read(self, tmp_path_factory, a):
        """write then read gives a bit-equal array; numpy reads the file too; the digest verifies."""
        p = str(tmp_path_factory.mktemp("n") / "a.npy")
        size, digest = NPY.write(p, a)
        for mmap in (False, True):
            with open(p, "rb") as f:
                back = NPY.read(f, p, a.dtype, a.shape, size, mmap=mmap, verify=("xxh3_64", digest))
            assert bit_equal(back, a)
        with open(p, "rb") as f:  # the streaming reader gives the same elements in C order
            pieces = [c.copy() for c in NPY.chunks(f, p, a.dtype, a.shape, size, 3)]
        assert all(c.dtype == a.dtype and 0 < c.size <= 3 for c in pieces)
        flat = np.concatenate(pieces).astype(a.dtype) if pieces else np.empty(0, a.dtype)
        assert bit_equal(flat, a.reshape(-1))
        assert bit_equal(np.load(p, allow_pickle=False), as_stored(a))

    def test_dtype_descr_round_trip(self):
        """Manifest dtypes survive JSON (tuples become lists)."""
        import json

        for dt in [np.dtype("<f4"), np.dtype(">i8"), np.dtype([("a", "<i4", (2,)), (("t", "b"), [("c", "u1")])])]:
            assert parse_dtype(json.loads(json.dumps(describe_dtype(dt)))) == dt

    def test_object_arrays_refused(self, tmp_path):
        """Object arrays would need pickle: refused on write."""
        with pytest.raises(xser.DataError, match="object dtypes need pickle"):
            NPY.write(str(tmp_path / "o.npy"), np.array([object()]))

    def test_object_file_refused(self, tmp_path):
        """An .npy holding pickled objects is never loaded."""
        p = tmp_path / "o.npy"
        np.save(p, np.array([1, "a"], dtype=object), allow_pickle=True)
        with pytest.raises(xser.DataError, match="object arrays need pickle"):
            with open(p, "rb") as f:
                NPY.read(f, str(p), np.dtype("f4"), (2,), p.stat().st_size, mmap=False, verify=None)

    def test_non_contiguous_written_contiguously(self, tmp_path):
        """A strided view is written as its values."""
        a = np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2]
        size, _ = NPY.write(str(tmp_path / "v.npy"), a)
        with open(tmp_path / "v.npy", "rb") as f:
            assert np.array_equal(NPY.read(f, str(tmp_path / "v.npy"), a.dtype, a.shape, size, mmap=False, verify=None), a)
