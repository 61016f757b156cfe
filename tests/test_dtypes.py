"""The dtype table (xser/storage/dtypes.py): every dtype round-trips or is refused; averaging rounds once."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xser
from strategies import as_stored, bit_equal, leaf_of
from xser.storage import dtypes
from xser.storage.dtypes import DTYPES, round_into
from xser.tools.average import average

TABLE = sorted(DTYPES)
EXTENSIONS = sorted(t for t, d in DTYPES.items() if d.extension)


def numpy_dtype(tag: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, tag)) if DTYPES[tag].extension else np.dtype(tag)


def sample(tag: str, shape=(3, 4), seed=0) -> np.ndarray:
    """Every bit pattern is fair game: NaN payloads, -0.0, subnormals."""
    dt = numpy_dtype(tag)
    raw = np.random.default_rng(seed).integers(0, 256, size=shape + (dt.itemsize,), dtype=np.uint8)
    if tag == "bool":
        raw &= 1
    return raw.view(dt).reshape(shape)


class TestTable:
    def test_every_row(self):
        """Storage, safetensors and torch names are consistent with the dtype's size; the averaged ones are floats."""
        import safetensors.numpy  # noqa: F401  (the package is a test dependency)

        for tag, d in DTYPES.items():
            dt = numpy_dtype(tag)
            assert d.storage.itemsize == dt.itemsize, tag
            assert d.extension == (dt.type.__module__ == "ml_dtypes"), tag
            assert (d.average is not None) == (tag.startswith(("float", "bfloat", "complex"))), tag
            assert dtypes.find(dt) is d and dtypes.resolve(tag) == dt
        assert sorted(d.safetensors for d in DTYPES.values() if d.safetensors) == sorted(
            ["F16", "F32", "F64", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I8", "I16", "I32", "I64", "U8", "U16",
             "U32", "U64", "BOOL", "C64"]
        )

    def test_every_dtype_torch_and_safetensors_share(self):
        """The table holds every torch dtype that safetensors writes and reads back, under safetensors' own name; the
        rest (complex32, float8_e8m0fnu, float4, sub-byte and quantized types) torch cannot pass through safetensors."""
        torch = pytest.importorskip("torch")
        import safetensors.torch

        shared = {}
        for name in dir(torch):
            dt = getattr(torch, name)
            if not isinstance(dt, torch.dtype) or str(dt) != f"torch.{name}":
                continue
            try:
                with warnings.catch_warnings():  # complex32 is "experimental"
                    warnings.simplefilter("ignore")
                    t = torch.zeros(2, 3, dtype=torch.uint8).view(dt) if dt.itemsize == 1 else torch.zeros(2, 3, dtype=dt)
                    data = safetensors.torch.save({"a": t})
                    back = safetensors.torch.load(data)["a"]
            except (KeyError, RuntimeError, TypeError, ValueError):
                continue
            assert back.dtype == dt and back.shape == t.shape, name
            header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
            shared[name] = header["a"]["dtype"]
        assert {t: d.safetensors for t, d in DTYPES.items() if d.safetensors} == shared
        assert {t for t, d in DTYPES.items() if d.safetensors is None} == {"complex128"}
        for tag, d in DTYPES.items():
            assert d.torch == tag and isinstance(getattr(torch, d.torch), torch.dtype), tag

    def test_big_endian_numpy_dtypes_are_found(self):
        assert dtypes.find(np.dtype(">f4")) is DTYPES["float32"]
        assert dtypes.find(np.dtype("V2")) is None and dtypes.find(np.dtype([("a", "<f4")])) is None


class TestRoundTrip:
    @pytest.mark.parametrize("tag", TABLE)
    def test_model_round_trip(self, tmp_path, tag):
        """Each dtype of the table saves and loads bit for bit; extension dtypes are their bits on disk with the tag
        in the manifest."""
        a = sample(tag)
        leaf = leaf_of({"w": a})
        path = str(tmp_path / "m.yaml")
        xser.save(leaf, path, durable=False)
        sub = xser.params(leaf).name
        for mmap in (False, True):
            back = xser.params(xser.load(path, mmap=mmap))["w"]
            assert bit_equal(back, a), (tag, mmap)
        assert bit_equal(xser.read_params(path)[sub]["w"], a)
        manifest = json.loads(Path(path + ".data/manifest.json").read_text())
        assert manifest["format_version"] == 3
        recorded = manifest["subcollections"][sub]["w"]["dtype"]
        assert recorded == (tag if DTYPES[tag].extension else np.lib.format.dtype_to_descr(a.dtype))
        on_disk = np.load(f"{path}.data/{sub}/w.npy", allow_pickle=False)
        assert on_disk.dtype == DTYPES[tag].storage and bit_equal(on_disk, as_stored(a))

    def test_float8_e5m2_manifest_is_readable(self, tmp_path):
        """0.2 wrote numpy's '<f1' for float8_e5m2, which no reader parses; the tag is written now."""
        path = str(tmp_path / "m.yaml")
        xser.save(leaf_of({"w": sample("float8_e5m2")}), path, durable=False)
        assert '"dtype": "float8_e5m2"' in Path(path + ".data/manifest.json").read_text()
        assert xser.checkpoints(path)[0].step is None

    @pytest.mark.parametrize("tag", EXTENSIONS)
    def test_training_state_holds_extension_dtypes(self, tmp_path, tag):
        path = str(tmp_path / "m.yaml")
        m = sample(tag, (5,))
        with xser.CheckpointSaver(path, durable=False) as saver:
            saver.save(leaf_of({}), training_state={"moment": m})
        assert bit_equal(xser.load_training_state(path)["moment"], m)

    @pytest.mark.parametrize(
        "value, message",
        [
            (np.zeros(2, "V4"), "training_state.m: raw void dtype |V4 cannot be saved"),
            (np.zeros(2, ml_dtypes.int4), "training_state.m: ml_dtypes.int4 is not supported"),
        ],
    )
    def test_training_state_refuses_what_cannot_round_trip(self, tmp_path, value, message):
        path = str(tmp_path / "m.yaml")
        with pytest.raises(xser.DataError) as info, xser.CheckpointSaver(path, durable=False) as saver:
            saver.save(leaf_of({}), training_state={"m": value})
        assert str(info.value).startswith(message)
        assert not (tmp_path / "m.yaml").exists()

    def test_without_ml_dtypes_a_bf16_model_names_the_package(self, tmp_path, monkeypatch):
        """A model holding bfloat16 opened where ml_dtypes is missing: an error at the manifest that says what to install."""
        path = str(tmp_path / "m.yaml")
        leaf = leaf_of({"w": sample("bfloat16")})
        xser.save(leaf, path, durable=False)
        monkeypatch.setitem(sys.modules, "ml_dtypes", None)
        monkeypatch.setattr(dtypes, "_ML", {})
        from xser.storage import manifest

        monkeypatch.setattr(manifest, "_DTYPES", {})  # a process without ml_dtypes never parsed bfloat16
        with pytest.raises(xser.DataError) as info:
            xser.read_params(path)
        sub = xser.params(leaf).name
        assert str(info.value) == (
            f"{path}.data/manifest.json: {sub}/w: dtype bfloat16 needs the ml_dtypes package in numpy: pip install ml_dtypes"
        )


def finite_values(dt: np.dtype) -> np.ndarray:
    """Every finite value of a dtype of at most 2 bytes, sorted, as float64 (exactly)."""
    bits = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        values = bits.view(dt).astype(np.float64)
    return np.unique(values[np.isfinite(values)])


def exact_nearest_even(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The reference: every finite value of ``dt`` (at most 65536), the nearest to each x by exact comparison,
    ties to the even bit pattern; beyond the largest finite value as the dtype's own conversion does."""
    bits = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        values = bits.view(dt).astype(np.float64)
    ok = np.isfinite(values)
    order = np.argsort(values[ok], kind="stable")
    vals, pats = values[ok][order], bits[ok][order]
    vals, first = np.unique(vals, return_index=True)  # -0.0 and 0.0 compare equal: keep the first (the sign is handled below)
    pats = pats[first]
    out = np.empty(x.shape, dt)
    outbits = out.view(pats.dtype)
    for i, v in enumerate(x):
        if abs(v) > vals[-1]:
            raise AssertionError("the reference covers finite values of the dtype only")
        j = np.searchsorted(vals, v)
        if j < len(vals) and vals[j] == v:
            outbits[i] = pats[j]
        else:
            lo, hi = vals[j - 1], vals[j]
            dlo, dhi = v - lo, hi - v  # exact: float64 differences of nearby values
            if dlo < dhi or (dlo == dhi and pats[j - 1] % 2 == 0):
                outbits[i] = pats[j - 1]
            else:
                outbits[i] = pats[j]
        if out[i].astype(np.float64) == 0:  # zero keeps the sign of what rounded to it
            out[i] = np.array([np.copysign(0.0, v)]).astype(dt)[0]
    return out


class TestRounding:
    @pytest.mark.parametrize("tag", EXTENSIONS + ["float16"])
    @settings(max_examples=60, deadline=None)
    @given(data=st.data())
    def test_round_into_is_nearest_even_once(self, tag, data):
        """float64 -> low precision rounds once to nearest, ties to even: ties, near-ties, subnormals, both signs."""
        dt = numpy_dtype(tag)
        vals = finite_values(dt)
        n = len(vals)
        picks = data.draw(st.lists(st.integers(0, n - 2), min_size=1, max_size=24))
        fracs = data.draw(st.lists(
            st.sampled_from([0.0, 0.5, 0.25, 0.75, 0.5 + 2**-30, 0.5 - 2**-30, 2**-40, 1 - 2**-40]) | st.floats(0, 1),
            min_size=len(picks), max_size=len(picks)))
        x = np.array([vals[i] + f * (vals[i + 1] - vals[i]) for i, f in zip(picks, fracs)])
        out = np.empty(x.shape, dt)
        round_into(out, x)
        assert bit_equal(out, exact_nearest_even(x, dt))

    def test_double_rounding_case(self):
        """The case that rounds twice through float32: 1 + 2**-8 + 2**-30 is above the tie, so up."""
        out = np.empty(1, ml_dtypes.bfloat16)
        round_into(out, np.array([1 + 2**-8 + 2**-30]))
        assert out.astype(np.float64)[0] == 1 + 2**-7


class TestAverage:
    @pytest.mark.parametrize("tag", EXTENSIONS + ["float16"])
    @pytest.mark.parametrize("accumulate", ["float64", "float32"])
    def test_low_precision_mean(self, tmp_path, tag, accumulate):
        """bf16/fp16/fp8 are averaged in float32 or float64 and written back rounded once to the stored dtype;
        integers and bools are copied from the newest checkpoint."""
        dt = numpy_dtype(tag)
        rng = np.random.default_rng(3)
        path = str(tmp_path / "m.yaml")
        values = [rng.uniform(-4, 4, (6, 7)).astype(dt) for _ in range(3)]
        counts = [np.full(2, i, np.int64) for i in range(3)]
        leaf = leaf_of({"w": values[0].copy(), "n": counts[0].copy(), "mask": np.array([True, False])})
        with xser.CheckpointSaver(path, keep=5) as saver:
            for i, (v, c) in enumerate(zip(values, counts)):
                xser.params(leaf)["w"][...] = v
                xser.params(leaf)["n"][...] = c
                saver.save(leaf, step=i)
        v = [x.astype(np.float64) for x in values[::-1]]  # newest first, as the weights
        mean = (v[0] * 3 + v[1] + v[2]) / 5
        report = average(path, tmp_path / "avg.yaml", weights=[3.0, 1.0, 1.0], accumulate=accumulate)
        got = xser.params(xser.load(tmp_path / "avg.yaml"))
        if accumulate == "float64":
            assert bit_equal(got["w"], exact_nearest_even(mean.reshape(-1), dt).reshape(mean.shape))
        else:
            w = [x.astype(np.float32) for x in values[::-1]]
            m32 = (w[0] * np.float32(3) + w[1] * np.float32(1) + w[2] * np.float32(1)) / np.float32(5)
            assert bit_equal(got["w"], m32.astype(dt))
        assert got["n"].tolist() == [2, 2] and got["mask"].tolist() == [True, False]
        assert sorted(report.averaged)[-1].endswith("/w") and len(report.copied) == 2
