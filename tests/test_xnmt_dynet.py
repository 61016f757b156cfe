"""XNMT exports loaded by DyNet itself (`dynet38`), the way XNMT loads them: a ParameterCollection with the
component's parameters and lookup parameters, then `populate(file)`. Skipped where DyNet is not installed.

DyNet runs in a child process: importing it turns on floating-point traps in the process (numpy's overflow
warnings become SIGFPE-style errors), which would change every later test."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xser
from xser.interop.xnmt import export_xnmt, import_xnmt, read_dynet_text
from xser.tools.average import average
from xser.tools.convert import convert
from xser.tools.ensemble import ensemble

if importlib.util.find_spec("dynet") is None:
    pytest.skip("DyNet (dynet38) is not installed", allow_module_level=True)

CHILD = r"""
import json, sys
import numpy as np
import dynet as dy
jobs = json.loads(sys.argv[1])
out = {}
for k, (path, records) in enumerate(jobs):
    pc = dy.ParameterCollection()
    made = []
    for r in records:  # the file's order is DyNet's: parameters first, then lookup parameters
        dims = tuple(r["dims"])
        made.append(pc.add_lookup_parameters((dims[-1],) + dims[:-1]) if r["kind"] == "LookupParameter" else pc.add_parameters(dims))
    pc.populate(path)
    for i, p in enumerate(made):
        out[f"{k}_{i}"] = p.as_array()
np.savez(sys.argv[2], **out)
"""

SAVE_CHILD = r"""
import sys
import dynet as dy
pc = dy.ParameterCollection()
p = pc.add_parameters((2, 3))
lk = pc.add_lookup_parameters((4, 2))
dy.renew_cg()
loss = dy.sum_elems(p * dy.inputVector([1, 2, 3])) + dy.sum_elems(lk[1])
loss.backward()
pc.save(sys.argv[1])
"""

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "data", "xnmt", "trained")


def populate(path: str, records: list[dict]) -> dict:
    """A ParameterCollection built as XNMT's components build theirs (parameters in order, lookups after), populated
    by DyNet in a child process; ``{name: array}``. DyNet's refusal is a failed child, with its message."""
    jobs = [(path, [{"kind": r["kind"], "dims": r["dims"]} for r in records])]
    out = os.path.join(os.path.dirname(path), f".populated-{os.path.basename(path)}.npz")
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs), out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    with np.load(out) as z:
        got = {rec["name"]: z[f"0_{i}"] for i, rec in enumerate(records)}
    os.unlink(out)
    return got


def expected_records(fixture_dir: str) -> dict[str, list[dict]]:
    return {sub: read_dynet_text(os.path.join(fixture_dir, sub)) for sub in sorted(os.listdir(fixture_dir))}


@pytest.fixture
def imported(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "in")
    out = str(tmp_path / "m.yaml")
    import_xnmt(tmp_path / "in" / "tiny-train.mod", out, durable=False)
    return out


def same_values(got: np.ndarray, r: dict) -> bool:
    """DyNet gives a lookup table as (entries, dim); the record holds it as DyNet's dims (dim, entries)."""
    want = r["array"]
    return np.array_equal(got.T if r["kind"] == "LookupParameter" else got, want)


class TestDynetLoads:
    def test_export_of_the_import(self, imported, tmp_path):
        """The round trip gives DyNet's own bytes, and DyNet populates every file."""
        export_xnmt(imported, tmp_path / "x.mod")
        for sub in os.listdir(os.path.join(FIXTURE, "tiny-train.mod.data")):
            a = Path(FIXTURE, "tiny-train.mod.data", sub).read_bytes()
            assert Path(tmp_path, "x.mod.data", sub).read_bytes() == a
            rs = read_dynet_text(os.path.join(FIXTURE, "tiny-train.mod.data", sub))
            got = populate(str(tmp_path / "x.mod.data" / sub), rs)
            assert all(same_values(got[r["name"]], r) for r in rs)

    def test_after_avg(self, imported, tmp_path):
        """`xser avg` keeps each array's DyNet kind: the lookup table is still #LookupParameter# and populates (it was
        written as #Parameter# and DyNet refused it: 'Too many parameters to load')."""
        average(imported, tmp_path / "avg.yaml", durable=False)
        export_xnmt(tmp_path / "avg.yaml", tmp_path / "a.mod")
        ref = expected_records(os.path.join(FIXTURE, "tiny-train.mod.data"))
        lookups = [sub for sub, rs in ref.items() if any(r["kind"] == "LookupParameter" for r in rs)]
        assert lookups
        for sub, rs in ref.items():
            text = Path(tmp_path, "a.mod.data", sub).read_bytes()
            assert text.startswith(f"#{rs[0]['kind']}# /{sub}/".encode())
            populate(str(tmp_path / "a.mod.data" / sub), rs)

    def test_after_convert_and_ensemble(self, imported, tmp_path):
        """Renamed subcollections: files and keys follow the new names, kinds stay; DyNet populates them."""
        report = convert(imported, tmp_path / "c.yaml", verify=True)
        export_xnmt(tmp_path / "c.yaml", tmp_path / "c.mod")
        ref = expected_records(os.path.join(FIXTURE, "tiny-train.mod.data"))
        for old, new in report.renamed.items():
            rs = ref[old]
            text = Path(tmp_path, "c.mod.data", new).read_text()
            assert text.startswith(f"#{rs[0]['kind']}# /{new}/")
            got = populate(str(tmp_path / "c.mod.data" / new), rs)
            assert all(same_values(got[r["name"]], r) for r in rs)
        ensemble([imported, str(tmp_path / "c.yaml")], tmp_path / "e.yaml", durable=False)
        from xser.storage.listing import open_checkpoint

        with open_checkpoint(str(tmp_path / "e.yaml")) as d:  # the ensemble's entries keep the DyNet kinds
            kinds = {e.attrs["dynet"]["kind"] for ps in d.subcollections.values() for e in ps.values()}
        assert kinds == {"Parameter", "LookupParameter"}

    def test_full_grad_round_trip(self, tmp_path):
        """DyNet writes FULL_GRAD (values and gradients) after a backward pass: imported and exported byte for byte."""
        d = tmp_path / "in"
        (d / "m.mod.data").mkdir(parents=True)
        subprocess.run([sys.executable, "-c", SAVE_CHILD, str(d / "m.mod.data" / "Comp-0000abcd")], check=True)
        raw = (d / "m.mod.data" / "Comp-0000abcd").read_bytes()
        assert b"FULL_GRAD" in raw
        (d / "m.mod").write_text("!Experiment\n  model: !Comp {xnmt_subcol_name: Comp-0000abcd}\n")
        import_xnmt(d / "m.mod", tmp_path / "m.yaml", durable=False)
        export_xnmt(tmp_path / "m.yaml", tmp_path / "x.mod")
        assert (tmp_path / "x.mod.data" / "Comp-0000abcd").read_bytes() == raw


def test_empty_file_where_other_checkpoints_have_parameters(tmp_path):
    """DyNet's populate fails on an empty file for a component with parameters: refused at import, with the file."""
    shutil.copytree(FIXTURE, tmp_path / "in")
    sub = sorted(os.listdir(tmp_path / "in" / "tiny-train.mod.data"))[0]
    (tmp_path / "in" / "tiny-train.mod.data.1" / sub).write_bytes(b"")
    with pytest.raises(xser.DataError) as info:
        import_xnmt(tmp_path / "in" / "tiny-train.mod", tmp_path / "m.yaml")
    assert str(info.value) == (
        f"{tmp_path}/in/tiny-train.mod.data.1/{sub}: empty file, but other checkpoints hold this component's parameters: "
        "DyNet's populate (and so XNMT) cannot load it"
    )

