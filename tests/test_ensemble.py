"""Ensembles of saved models."""

from __future__ import annotations

import numpy as np
import pytest

import xser
from components import Linear, Model, Norm
from xser.tools.ensemble import Ensemble, ensemble


def saved(tmp_path, name, value):
    m = Model(encoder=Linear(4, 3), decoder=Norm(3))
    m.encoder.W[...] = value
    path = str(tmp_path / f"{name}.yaml")
    xser.save(m, path)
    return path, m


class TestEnsemble:
    def test_members_load_as_one_graph(self, tmp_path):
        """Independent models become the members of one loadable model."""
        a, _ = saved(tmp_path, "a", 1.0)
        b, _ = saved(tmp_path, "b", 2.0)
        ensemble([a, b], tmp_path / "ens.yaml")
        ens = xser.load(tmp_path / "ens.yaml")
        assert isinstance(ens, Ensemble) and [float(m.encoder.W.flat[0]) for m in ens.members] == [1.0, 2.0]

    def test_same_model_twice_needs_rename(self, tmp_path):
        """Shared subcollection names: an error that says how to fix it, or fresh names with rename."""
        a, m = saved(tmp_path, "a", 1.0)
        with pytest.raises(xser.CheckpointError) as info:
            ensemble([a, a], tmp_path / "ens.yaml")
        name = xser.params(m.encoder).name
        assert f"shares subcollection {name} with {a}; pass --rename" in str(info.value)
        assert "xser convert" in str(info.value)
        report = ensemble([a, a], tmp_path / "ens.yaml", rename=True)
        assert set(report.renamed) == {(1, name), (1, xser.params(m.decoder).name)}
        ens = xser.load(tmp_path / "ens.yaml")
        assert ens.members[0].encoder is not ens.members[1].encoder
        assert np.array_equal(ens.members[0].encoder.W, ens.members[1].encoder.W)

    def test_part_of_each_model(self, tmp_path):
        """path= takes one part of each model (here the encoders)."""
        a, _ = saved(tmp_path, "a", 1.0)
        b, _ = saved(tmp_path, "b", 2.0)
        ensemble([a, b], tmp_path / "ens.yaml", path="encoder")
        ens = xser.load(tmp_path / "ens.yaml")
        assert all(isinstance(m, Linear) for m in ens.members)

    def test_refs_and_sharing_inside_members(self, tmp_path):
        """A member with a shared component keeps the sharing, re-rooted under members.i."""
        enc = Linear(4, 3)
        m = Model(encoder=enc, decoder=enc)
        a = str(tmp_path / "a.yaml")
        xser.save(m, a)
        ensemble([a, a], tmp_path / "ens.yaml", rename=True)
        assert "decoder: !Ref {path: members.1.encoder}" in (tmp_path / "ens.yaml").read_text()
        ens = xser.load(tmp_path / "ens.yaml")
        assert all(mm.encoder is mm.decoder for mm in ens.members)

    def test_ref_leaving_the_part_is_inlined(self, tmp_path):
        """A part whose ref points outside it gets a copy, with its own fresh subcollection."""
        enc = Linear(4, 3)
        m = Model(encoder=enc, decoder=Model(encoder=enc))
        a = str(tmp_path / "a.yaml")
        xser.save(m, a)
        ensemble([a], tmp_path / "ens.yaml", path="decoder")
        ens = xser.load(tmp_path / "ens.yaml")
        assert np.array_equal(ens.members[0].encoder.W, enc.W)

    def test_errors(self, tmp_path):
        """No members, output among the inputs, an existing output: clear errors."""
        a, _ = saved(tmp_path, "a", 1.0)
        with pytest.raises(xser.CheckpointError, match="at least one model"):
            ensemble([], tmp_path / "e.yaml")
        with pytest.raises(xser.CheckpointError, match="the output is one of the input models"):
            ensemble([a], a)
        with pytest.raises(xser.SpecError, match="path 'nope' not found"):
            ensemble([a], tmp_path / "e.yaml", path="nope")


class TestName:
    def test_the_ensemble_is_named_after_its_file(self, tmp_path):
        """An ensemble's experiment gets a name (the output file's, or name=); its spec never says None or null."""
        a, _ = saved(tmp_path, "a", 1.0)
        b, _ = saved(tmp_path, "b", 2.0)
        ensemble([a, b], tmp_path / "demo.ensemble.yaml")
        text = (tmp_path / "demo.ensemble.yaml").read_text()
        assert "\nname: demo.ensemble\n" in text
        assert "None" not in text  # (the members' own field "name: null" is a YAML null, as saved)
        assert text == (tmp_path / "demo.ensemble.yaml.data" / "spec.yaml").read_text()
        ensemble([a, b], tmp_path / "e.yml", name="two")
        assert "\nname: two\n" in (tmp_path / "e.yml").read_text()

    def test_cli_name(self, tmp_path, capsys):
        """`xser ensemble --name`; `xser inspect` shows the name."""
        from xser.cli import main

        a, _ = saved(tmp_path, "a", 1.0)
        assert main(["ensemble", a, "--out", str(tmp_path / "e.yaml")]) == 0
        assert main(["inspect", str(tmp_path / "e.yaml")]) == 0
        assert "\n  experiment: e\n" in capsys.readouterr().out
        assert main(["ensemble", a, "--out", str(tmp_path / "f.yaml"), "--name", "best three"]) == 0
        assert "\nname: best three\n" in (tmp_path / "f.yaml").read_text()


def test_members_saved_by_several_ranks(tmp_path):
    """Members saved by 2 and by 3 ranks: the ensemble loads in one process and at world size 2, each rank holding
    each member's rows and ids."""
    from reshard_model import problems, save
    from threaded import run

    a = save(str(tmp_path / "a.yaml"), 2, steps=2, blocks={"*/emb@*": 5})
    b = save(str(tmp_path / "b.yaml"), 3, steps=2)
    ensemble([a, b], tmp_path / "ens.yaml", durable=False)
    whole = xser.load(tmp_path / "ens.yaml")
    assert [problems(m, xser.dist.Local(), 2) for m in whole.members] == [[], []]
    assert run(2, lambda c: [problems(m, c, 2) for m in xser.load(tmp_path / "ens.yaml", coordinator=c).members]) == [[[], []]] * 2
