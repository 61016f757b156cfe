"""Fuzzing: mutated model files, specs, headers and importer inputs give a result or an XserError.

Every test takes a real file (one xser wrote, or a fixture another system wrote, in
``tests/data/``), mutates its bytes (truncation, flipped bytes, inserted or replaced tokens) and
checks the property the README promises for untrusted input: the call returns or raises an
``XserError``; it finishes within the deadline; it allocates at most ``MEMORY_CAP`` bytes; and it
opens no file outside the model (Python's own files aside). The default run is short; a longer
one is ``pytest tests/test_fuzz.py --hypothesis-profile=fuzz`` (5,000 examples per target).
"""

from __future__ import annotations

import builtins
import copy
import json
import os
import re
import shutil
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xser
from test_recis import write_worked_example
from components import Linear, Model, Norm
from xser.interop.angel import FORMATS as ANGEL_FORMATS
from xser.interop.angel import export_angel, import_angel, read_angel
from xser.interop.dismec import import_dismec
from xser.interop.xnmt import import_xnmt

DATA = Path(__file__).parent / "data"
MEMORY_CAP = 256 << 20
FUZZ = settings(deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def fewer(n: int) -> settings:
    """FUZZ with ``n`` examples in the default run (a target that costs about a second an example under tracemalloc);
    a profile asking for more (``--hypothesis-profile=fuzz``) gets its own count."""
    return settings(FUZZ, max_examples=max(n, settings.default.max_examples) if settings.default.max_examples > 100 else n,
                    deadline=5000)
TOKENS = [b"-1", b"0", b"1e308", b"99999999999999999999", b"9223372036854775807", b"[", b"{", b"null", b"\xff\xfe",
          b"\x00", b"'", b'"', b"\n", b"!!python/object:os.system", b"*a", b"&a", b"../", b"/etc/passwd", b"NaN"]


@st.composite
def mutated(draw, raw: bytes) -> bytes:
    """``raw`` with one to three edits."""
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "replace"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "truncate":
            del data[pos:]
        elif kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        else:
            end = min(len(data), pos + draw(st.integers(1, 8)))
            data[pos:end] = draw(st.sampled_from(TOKENS))
    return bytes(data)


HOSTILE = [-1, 0, 2**31, 2**63, -(2**63) - 1, 10**12, 10**6, 1e308, -0.0, 1.5, float("inf"), "x", "", "../x", None, True, [],
           {}, [1, 2], {"a": 1}]
NUMBERS = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


@st.composite
def renumbered(draw, raw: bytes) -> bytes:
    """``raw`` with one to three of its numbers replaced by hostile ones (huge, negative, 2^31, 2^63, not numbers)."""
    data = raw
    for _ in range(draw(st.integers(1, 3))):
        found = list(NUMBERS.finditer(data))
        if not found:
            break
        m = draw(st.sampled_from(found))
        data = data[: m.start()] + draw(st.sampled_from(TOKENS + [b"2147483648", b"4294967296", b"-9223372036854775809",
                                                                   b"1e-400", b"1" * 40, b"65536"])) + data[m.end():]
    return data


@st.composite
def json_edited(draw, obj: Any) -> Any:
    """``obj`` (parsed JSON) with one to three values replaced by hostile ones (or keys removed)."""
    obj = copy.deepcopy(obj)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_json_paths(obj))
        if not paths:
            break
        depth = draw(st.sampled_from(sorted({len(p) for p in paths})))  # every level as often: top keys, partitions, rows
        path = draw(st.sampled_from([p for p in paths if len(p) == depth]))
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and draw(st.integers(0, 6)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))  # a copy: a later edit may go inside it
    return obj


def _json_paths(obj: Any, prefix: tuple = ()) -> Any:
    for k, v in (obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []):
        yield prefix + (k,)
        yield from _json_paths(v, prefix + (k,))


def within_the_rules(call, root: Path) -> None:
    """Run ``call``: a result or an XserError, bounded memory, no file opened outside ``root``."""
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def track(path):
        if isinstance(path, (str, os.PathLike)):
            full = os.path.abspath(os.fspath(path))
            if not (full.startswith(str(root)) or full.startswith(sys.prefix) or full.startswith(sys.base_prefix) or full.startswith("/proc/")):
                opened.append(full)

    def b_open(file, *a, **kw):
        track(file)
        return real_open(file, *a, **kw)

    def o_open(path, *a, **kw):
        if kw.get("dir_fd") is None:
            track(path)
        return real_os_open(path, *a, **kw)

    builtins.open, os.open = b_open, o_open
    tracemalloc.start()
    try:
        call()
    except xser.XserError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        builtins.open, os.open = real_open, real_os_open
    assert peak < MEMORY_CAP, f"allocated {peak} bytes"
    assert opened == [], opened


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved model with a blocked parameter, a text-format parameter, a safetensors file and training state, as bytes per file."""
    d = tmp_path_factory.mktemp("saved")
    path = d / "m.yaml"
    m = Model(encoder=Linear(4, 6), decoder=Norm(6))
    with xser.CheckpointSaver(path, keep=2, blocks={"*/W": 4}, formats={"*/b": "dense-text", "Norm*": "safetensors"}) as saver:
        saver.save(m, step=1, metrics={"bleu": 1.5}, training_state={"step": 1, "m": np.arange(3.0)})
    files = {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    return files


def materialise(files: dict, root: Path, victim: str, data: bytes) -> Path:
    if root.exists():
        shutil.rmtree(root)
    for rel, raw in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if rel == victim else raw)
    return root / "m.yaml"


def fix_spec_checksum(path: Path) -> None:
    """After mutating spec.yaml, record its checksum so the mutated YAML is parsed (not just refused by checksum)."""
    import xxhash

    spec = Path(str(path) + ".data") / "spec.yaml"
    mp = Path(str(path) + ".data") / "manifest.json"
    m = json.loads(mp.read_text())
    raw = spec.read_bytes()
    m["spec"] = {"file": "spec.yaml", "bytes": len(raw), "xxh3_64": xxhash.xxh3_64_hexdigest(raw)}
    mp.write_text(json.dumps(m))


class TestSavedModels:
    @FUZZ
    @given(data=st.data())
    def test_manifest(self, saved, tmp_path_factory, data):
        """Mutated manifests: load, read_params (with rows), training state and the listing."""
        root = tmp_path_factory.mktemp("f")
        path = materialise(saved, root, "m.yaml.data/manifest.json", data.draw(mutated(saved["m.yaml.data/manifest.json"])))
        within_the_rules(lambda: xser.load(path), root)
        within_the_rules(lambda: xser.read_params(path, rows=None), root)
        within_the_rules(lambda: xser.load_training_state(path), root)
        within_the_rules(lambda: xser.checkpoints(path), root)

    @FUZZ
    @given(data=st.data())
    def test_spec(self, saved, tmp_path_factory, data):
        """Mutated saved specs (with a matching checksum, so the YAML itself is parsed)."""
        root = tmp_path_factory.mktemp("f")
        path = materialise(saved, root, "m.yaml.data/spec.yaml", data.draw(mutated(saved["m.yaml.data/spec.yaml"])))
        fix_spec_checksum(path)
        within_the_rules(lambda: xser.load(path), root)

    @FUZZ
    @given(data=st.data())
    def test_data_files(self, saved, tmp_path_factory, data):
        """Mutated .npy headers and bodies, text files and training state: load, verify and row reads."""
        victims = sorted(k for k in saved if k.startswith("m.yaml.data/") and not k.endswith((".json", ".yaml")))
        victim = data.draw(st.sampled_from(victims))
        root = tmp_path_factory.mktemp("f")
        raw = saved[victim]
        head = raw[:160] if victim.endswith((".npy", ".safetensors")) and data.draw(st.booleans()) else raw  # often the header
        path = materialise(saved, root, victim, data.draw(mutated(head)) + (raw[160:] if head is not raw else b""))
        within_the_rules(lambda: xser.load(path), root)
        within_the_rules(lambda: xser.load(path, verify=True, mmap=True), root)
        within_the_rules(lambda: xser.load_training_state(path), root)
        sub = json.loads(saved["m.yaml.data/manifest.json"])["subcollections"]
        lin = next(s for s, ps in sub.items() if "W" in ps)
        within_the_rules(lambda: xser.read_params(path, rows={f"{lin}/W": (1, 5)}), root)

    @FUZZ
    @given(text=st.data())
    def test_config(self, tmp_path_factory, text):
        """Mutated configs: load_config and build."""
        raw = b"e:\n  model: !TModel\n    encoder: !TLinear {in_dim: 2, out_dim: 3, xser_id: x}\n    decoder: !Ref {name: x}\n  n: [1, 2.5, {a: b}]\n"
        root = tmp_path_factory.mktemp("f")
        cfg = root / "c.yaml"
        cfg.write_bytes(text.draw(mutated(raw)))

        def run():
            for spec in xser.load_config(cfg).values():
                xser.build(spec)

        within_the_rules(run, root)


class TestImporters:
    @FUZZ
    @given(data=st.data(), folder=st.sampled_from(["DenseTXT", "SparseTXT", "DenseNPY", "split-DenseNPY"]))
    def test_dismec(self, tmp_path_factory, data, folder):
        """DiSMEC++ metadata and weight files written by DiSMEC++ (every fixture), their bytes or numbers mutated, or the
        metadata's values replaced by hostile ones; imported whole and with --partial."""
        root = tmp_path_factory.mktemp("f")
        src = root / "in"
        shutil.copytree(DATA / "dismec" / folder, src)
        victim = data.draw(st.sampled_from(sorted(p.name for p in src.iterdir())))
        raw = (src / victim).read_bytes()
        how = data.draw(st.sampled_from(["bytes", "numbers", "json"] if victim == "model.json" else ["bytes", "numbers"]))
        if how == "json":
            (src / victim).write_text(json.dumps(data.draw(json_edited(json.loads(raw)))))
        else:
            (src / victim).write_bytes(data.draw(mutated(raw[:4000]) if how == "bytes" else renumbered(raw[:4000])) + raw[4000:])
        partial = data.draw(st.booleans())
        within_the_rules(lambda: import_dismec(src / "model.json", root / "out.yaml", durable=False, partial=partial), root)

    @fewer(25)
    @given(data=st.data())
    def test_xnmt(self, tmp_path_factory, data):
        """An XNMT model and its DyNet text files, written by XNMT, bytes or numbers (dimensions too) mutated."""
        root = tmp_path_factory.mktemp("f")
        src = root / "in"
        shutil.copytree(DATA / "xnmt" / "trained", src)
        files = sorted(p for p in src.rglob("*") if p.is_file())
        victim = data.draw(st.sampled_from(files))
        raw = victim.read_bytes()
        edit = mutated if data.draw(st.booleans()) else renumbered
        victim.write_bytes(data.draw(edit(raw[:3000])) + raw[3000:])
        within_the_rules(lambda: import_xnmt(src / "tiny-train.mod", root / "out.yaml", durable=False), root)

    @FUZZ
    @given(data=st.data())
    def test_safetensors(self, tmp_path_factory, data):
        """A safetensors file written by the safetensors package, mutated (header often), imported."""
        import safetensors.numpy

        from xser.interop.safetensors import import_safetensors

        root = tmp_path_factory.mktemp("f")
        src = root / "in.safetensors"
        safetensors.numpy.save_file({"a.w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.int64)}, str(src))
        raw = src.read_bytes()
        src.write_bytes(data.draw(mutated(raw[:200])) + raw[200:])
        within_the_rules(lambda: import_safetensors(src, root / "out.yaml", durable=False), root)

    @FUZZ
    @given(data=st.data())
    def test_recis(self, tmp_path_factory, data):
        """A RecIS directory (formats.md section 3.4's), one of its files mutated, imported and read."""
        from xser.interop.recis import import_recis

        root = tmp_path_factory.mktemp("f")
        src = root / "ck"
        write_worked_example(src)
        victim = data.draw(st.sampled_from(sorted(p.name for p in src.iterdir())))
        raw = (src / victim).read_bytes()
        (src / victim).write_bytes(data.draw(mutated(raw)))
        within_the_rules(lambda: import_recis(src, root / "out.yaml", durable=False), root)

        def read_all():
            with xser.CheckpointReader(src) as r:
                for n in r.tensor_names():
                    r.read_tensor(n)

        within_the_rules(read_all, root)

    @FUZZ
    @given(data=st.data(), rt=st.sampled_from([0, 7, 9, 10, 12, 5, 14, 19, 21, 26]))
    def test_angel(self, tmp_path_factory, data, rt):
        """Angel matrix directories in every format and row type (dense, sparse, long keys; double, float, long, int),
        several partitions and files: bytes or numbers of a file mutated, or _meta values replaced by hostile ones;
        imported, and read with separators given as regexes."""
        from strategies import leaf_of
        from xser.storage.formats.angel_codec import row_type

        vtype, _, dense = row_type(rt)
        fmt = data.draw(st.sampled_from(sorted(f for f in ANGEL_FORMATS if dense or not f.startswith("value"))))
        root = tmp_path_factory.mktemp("f")
        w = (np.arange(12).reshape(4, 3) - 3).astype(vtype.newbyteorder("="))
        if not dense:
            w[:, 1] = 0
        leaf = leaf_of({"w": w})
        xser.save(leaf, root / "m.yaml", durable=False)
        export_angel(root / "m.yaml", f"{xser.params(leaf).name}/w", root / "out", format=fmt, row_type=rt,
                     block_rows=data.draw(st.sampled_from([1, 2, 4])), per_file=data.draw(st.sampled_from([1, 5])))
        mdir = root / "out" / "w"
        victim = data.draw(st.sampled_from(sorted(mdir.iterdir())))
        raw = victim.read_bytes()
        how = data.draw(st.sampled_from(["bytes", "numbers", "json"] if victim.name == "_meta" else ["bytes", "numbers"]))
        if how == "json":
            body = json.dumps(data.draw(json_edited(json.loads(raw[4:])))).encode()
            victim.write_bytes(struct.pack(">i", len(body)) + body)
        else:
            victim.write_bytes(data.draw(mutated(raw) if how == "bytes" else renumbered(raw)))
        within_the_rules(lambda: import_angel(mdir, root / "i.yaml", durable=False), root)
        sep = data.draw(st.sampled_from([",", "|", "(", ",+", "\\d", "[,;]"]))
        within_the_rules(lambda: read_angel(mdir, sep=sep), root)
