"""Building experiments: references, placeholders, !LoadSerialized, arguments, errors."""

from __future__ import annotations

import enum
import os
import pathlib
import shutil

import attrs
import numpy as np
import pytest

import xser
from components import Counter, Linear, Node, Norm
from helpers import edit_spec
from xser.model.serialize import to_tree


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def build_text(tmp_path, text, exp="e", **kw):
    return xser.build(xser.load_config(write(tmp_path, text))[exp], **kw)


# (config text, exception class, exact message with {f} for the file)
ERRORS = [
    ("e:\n  model: !TLinearr {in_dim: 2, out_dim: 3}\n", xser.SpecError,
     "{f}:2:10: unknown component '!TLinearr'; did you mean '!TLinear'?"),
    ("e:\n  model: !TLinear {in_dim: 2, out_dimm: 3}\n", xser.SpecError,
     "{f}:2:31: model.out_dimm: unknown argument 'out_dimm' of !TLinear; did you mean 'out_dim'?"),
    ("e:\n  model: !TLinear {in_dim: 2}\n", xser.SpecError,
     "{f}:2:10: model: !TLinear is missing required argument 'out_dim'"),
    ("e:\n  model: !TLinear {}\n", xser.SpecError,
     "{f}:2:10: model: !TLinear is missing required arguments 'in_dim', 'out_dim'"),
    ("e:\n  model: !TLinear {in_dim: '256x', out_dim: 3}\n", xser.SpecError,
     "{f}:2:28: model.in_dim: expected int, got str '256x'"),
    ("e:\n  model: !TLinear {in_dim: true, out_dim: 3}\n", xser.SpecError,
     "{f}:2:28: model.in_dim: expected int, got bool True"),
    ("e:\n  model: !TModel {encoder: 1, activation: gelu}\n", xser.SpecError,
     "{f}:2:43: model.activation: expected one of 'relu', 'tanh', got str 'gelu'"),
    ("e:\n  model: !TModel {encoder: 1, sizes: [1, x]}\n", xser.SpecError,
     "{f}:2:42: model.sizes.1: expected int, got str 'x'"),
    ("e:\n  model: !TModel {encoder: 1, name: 3}\n", xser.SpecError,
     "{f}:2:37: model.name: expected str | None, got int 3"),
    ("e:\n  a: 1\n  b: !Ref {path: a.c}\n", xser.SpecError,
     "{f}:3:6: b: !Ref path 'a.c' not found: a is int 1, not a mapping or list"),
    ("e:\n  a: {x: 1}\n  b: !Ref {path: a.y}\n", xser.SpecError,
     "{f}:3:6: b: !Ref path 'a.y' not found: a has no key 'y'"),
    ("e:\n  a: {xx: 1}\n  b: !Ref {path: a.x}\n", xser.SpecError,
     "{f}:3:6: b: !Ref path 'a.x' not found: a has no key 'x'; did you mean 'xx'?"),
    ("e:\n  a: [1, 2]\n  b: !Ref {path: a.2}\n", xser.SpecError,
     "{f}:3:6: b: !Ref path 'a.2' not found: a has 2 items; no index 2"),
    ("e:\n  a: !TNode {xser_id: foo}\n  b: !Ref {name: fo}\n", xser.SpecError,
     "{f}:3:6: b: !Ref to unknown name 'fo': no component has this xser_id; did you mean 'foo'?"),
    ("e:\n  a: !Ref {path: b}\n  b: !Ref {path: a}\n", xser.SpecError,
     "{f}:2:6: a: reference cycle: a chain of !Ref never reaches a value"),
    ("e:\n  a: !TNode {value: !Ref {path: a}}\n", xser.SpecError,
     "{f}:2:21: a.value: reference cycle: a contains a !Ref to itself"),
    ("e:\n  a: !TNode {children: [!TNode {value: !Ref {path: a}}]}\n", xser.SpecError,
     "{f}:2:40: a.children.0.value: reference cycle: a contains a !Ref to itself"),
    ("e:\n  a: !Ref {path: b, name: c}\n", xser.SpecError,
     "{f}:2:6: a: !Ref needs exactly one of 'path' and 'name'"),
    ("e:\n  a: !Ref {pth: b}\n", xser.SpecError,
     "{f}:2:6: a: !Ref takes path or name, and default; unknown key 'pth'"),
    ("e:\n  a: !TNode {xser_id: x}\n  b: !TNode {xser_id: x}\n", xser.SpecError,
     "{f}:3:23: xser_id 'x' is used twice (also at a)"),
    ("e:\n  a: '{EXPDIR}/x'\n", xser.SpecError,
     "{f}:2:6: unknown placeholder {{EXPDIR}} (known: EXP, EXP_DIR, PID); did you mean 'EXP_DIR'?"),
    ("e:\n  a: !TLinear {in_dim: 1, out_dim: 1, xser_subcol_name: foo}\n", xser.SpecError,
     "{f}:2:57: a.xser_subcol_name: xser_subcol_name must be 'ClassName.<8 lowercase hex>', got 'foo'"),
    ("e:\n  a: !TLinear {in_dim: 1, out_dim: 1, xser_subcol_name: TLinear.0000000a}\n"
     "  b: !TLinear {in_dim: 1, out_dim: 1, xser_subcol_name: TLinear.0000000a}\n", xser.SpecError,
     "{f}:3:57: b.xser_subcol_name: subcollection name TLinear.0000000a is used twice: here and at {f}:2:6: a"),
    ("e:\n  a: !TVocab {vocab_file: /nonexistent/v.txt}\n", xser.SpecError,
     "{f}:2:6: a: !TVocab could not be built: FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/v.txt'"),
    ("e:\n  a: !LoadSerialized {filename: nope.yaml}\n", xser.SpecError,
     "{f}:2:6: !LoadSerialized 'nope.yaml': {d}/nope.yaml: file not found"),
    ("e:\n  a: !LoadSerialized {filename: nope.yaml, pat: x}\n", xser.SpecError,
     "{f}:2:44: !LoadSerialized: unknown argument 'pat'; did you mean 'path'?"),
    ("e:\n  a: !LoadSerialized {path: x}\n", xser.SpecError,
     "{f}:2:6: !LoadSerialized needs filename: the saved model's .yaml file"),
    ("e:\n  a: !TNode {xser_version: 3}\n", xser.SpecError,
     "{f}:2:6: a: !TNode was saved by version 3 of its class; this code has version 1"),
    ("e:\n  a: !Ref\n", xser.SpecError,
     "{f}:2:6: a: !Ref needs exactly one of 'path' and 'name'"),
]


class TestErrors:
    @pytest.mark.parametrize("text, exc, message", ERRORS, ids=[m for _, _, m in ERRORS])
    def test_error_table(self, tmp_path, text, exc, message):
        """Each bad config raises exactly this error class and message, with file:line:col."""
        f = write(tmp_path, text)
        with pytest.raises(exc) as info:
            build_text(tmp_path, text)
        assert str(info.value) == message.format(f=f, d=str(tmp_path))

    def test_errors_are_value_errors(self, tmp_path):
        """SpecError is also a ValueError, so generic handlers catch it."""
        with pytest.raises(ValueError):
            build_text(tmp_path, "e:\n  a: !Nope {}\n")

    def test_constructor_exception_is_chained(self, tmp_path):
        """The original exception from a constructor is kept as __cause__."""
        with pytest.raises(xser.SpecError) as info:
            build_text(tmp_path, "e:\n  a: !TVocab {vocab_file: /nonexistent/v.txt}\n")
        assert isinstance(info.value.__cause__, FileNotFoundError)


class TestReferences:
    def test_path_ref_takes_value(self, tmp_path):
        """!Ref {path} takes a value from elsewhere in the same experiment."""
        exp = build_text(tmp_path, "e:\n  dim: 5\n  l: !TLinear {in_dim: !Ref {path: dim}, out_dim: 2}\n")
        assert exp["l"].in_dim == 5

    def test_ref_to_component_shares_identity(self, tmp_path):
        """The same component reached twice is built once."""
        exp = build_text(
            tmp_path,
            "e:\n  a: !TLinear {in_dim: 2, out_dim: 3}\n  b: !Ref {path: a}\n  c: [!Ref {path: a}]\n",
        )
        assert exp["a"] is exp["b"] is exp["c"][0]

    def test_named_ref(self, tmp_path):
        """!Ref {name} refers to the component marked with xser_id."""
        exp = build_text(
            tmp_path,
            "e:\n  m: !TModel\n    encoder: !TLinear {in_dim: 2, out_dim: 3, xser_id: emb}\n"
            "    decoder: !Ref {name: emb}\n",
        )
        assert exp["m"].encoder is exp["m"].decoder

    def test_ref_through_ref(self, tmp_path):
        """A path may pass through another reference."""
        exp = build_text(
            tmp_path,
            "e:\n  a: !TLinear {in_dim: 2, out_dim: 3}\n  b: !Ref {path: a}\n  c: !Ref {path: b.out_dim}\n",
        )
        assert exp["c"] == 3

    def test_ref_to_class_default(self, tmp_path):
        """A path to an argument left at its class default gives the default."""
        exp = build_text(tmp_path, "e:\n  m: !TModel {encoder: 1}\n  d: !Ref {path: m.dropout}\n")
        assert exp["d"] == 0.1

    def test_ref_default(self, tmp_path):
        """A missing path or name falls back to default when one is given."""
        exp = build_text(
            tmp_path, "e:\n  a: !Ref {path: nope.x, default: 4}\n  b: !Ref {name: nope, default: null}\n"
        )
        assert exp["a"] == 4 and exp["b"] is None

    def test_ref_to_list_item(self, tmp_path):
        """Paths index lists with integers."""
        exp = build_text(tmp_path, "e:\n  xs: [!TNode {value: 1}, !TNode {value: 2}]\n  y: !Ref {path: xs.1}\n")
        assert exp["y"] is exp["xs"][1]

    def test_ref_later_in_file(self, tmp_path):
        """References may point forward."""
        exp = build_text(tmp_path, "e:\n  a: !Ref {path: b}\n  b: !TNode {value: 1}\n")
        assert exp["a"] is exp["b"]


class TestPlaceholders:
    def test_builtin_placeholders(self, tmp_path):
        """{EXP}, {EXP_DIR} and {PID} are filled."""
        exp = build_text(tmp_path, "run1:\n  a: '{EXP_DIR}/{EXP}.{PID}'\n", exp="run1")
        assert exp["a"] == f"{tmp_path}/run1.{os.getpid()}"

    def test_user_placeholders_and_escape(self, tmp_path):
        """Extra values come from build(placeholders=...); {{X}} is a literal {X}."""
        exp = build_text(
            tmp_path, "e:\n  a: '{DATA}/x'\n  b: '{{DATA}}'\n  n: '{DIM}'\n  c: '{lower} {x'\n",
            placeholders={"DATA": "/d", "DIM": 7},
        )
        assert exp["a"] == "/d/x" and exp["b"] == "{DATA}" and exp["n"] == 7 and exp["c"] == "{lower} {x"

    def test_saved_model_is_not_substituted(self, tmp_path):
        """A saved spec is fully resolved: loading it never fills placeholders again."""
        exp = build_text(tmp_path, "e:\n  a: !TNode {value: '{{EXP}}'}\n")
        path = str(tmp_path / "m.yaml")
        xser.save(exp, path)
        assert xser.load(path)["a"].value == "{EXP}"


class TestArguments:
    def test_none_accepted_when_default_none(self, tmp_path):
        """A field whose default is None accepts None whatever its annotation."""
        exp = build_text(tmp_path, "e:\n  m: !TModel {encoder: 1, decoder: null, name: null}\n")
        assert exp["m"].decoder is None and exp["m"].name is None

    def test_int_accepted_for_float(self, tmp_path):
        """An int given for a float field becomes a float."""
        exp = build_text(tmp_path, "e:\n  m: !TModel {encoder: 1, dropout: 1}\n")
        assert exp["m"].dropout == 1.0 and isinstance(exp["m"].dropout, float)

    def test_no_params_no_subcol(self, tmp_path):
        """A component that never calls xser.params has no subcollection name when saved."""
        exp = build_text(tmp_path, "e:\n  n: !TNode {value: 1}\n")
        tree, subcols = to_tree(exp)
        assert "xser_subcol_name" not in tree["n"].args and subcols == {}

    def test_subcol_name_kept(self, tmp_path):
        """A component built from YAML that carries xser_subcol_name keeps it."""
        exp = build_text(tmp_path, "e:\n  l: !TLinear {in_dim: 1, out_dim: 2, xser_subcol_name: TLinear.0123abcd}\n")
        assert xser.params(exp["l"]).name == "TLinear.0123abcd"

    def test_fresh_names_are_unique_and_well_formed(self, tmp_path):
        """Fresh names are the class name, a dot and 8 lowercase hex digits."""
        exp = build_text(tmp_path, "e:\n  ls: [" + ", ".join(["!TLinear {in_dim: 1, out_dim: 1}"] * 50) + "]\n")
        names = [xser.params(x).name for x in exp["ls"]]
        assert len(set(names)) == 50
        assert all(n.startswith("Linear.") and len(n) == 15 and int(n[7:], 16) >= 0 and n[7:] == n[7:].lower() for n in names)

    def test_seed_makes_init_repeatable(self, tmp_path):
        """build(seed=...) draws the same initial values every time."""
        text = "e:\n  l: !TLinear {in_dim: 3, out_dim: 4}\n"
        a = build_text(tmp_path, text, seed=5)["l"].W
        b = build_text(tmp_path, text, seed=5)["l"].W
        assert np.array_equal(a, b)

    def test_build_plain_tree(self):
        """build() also takes a plain tree made in Python."""
        from xser.spec import Tagged

        obj = xser.build({"n": Tagged("!TNode", {"value": 3})})
        assert isinstance(obj["n"], Node) and obj["n"].value == 3


@xser.serializable(tag="!TVersioned", version=2, migrate=lambda args, v: {"size": args.pop("dim"), **args})
class Versioned:
    size: int
    extra: int = 0


class TestVersions:
    def test_old_arguments_are_migrated(self, tmp_path):
        """A spec written by version 1 is passed through migrate()."""
        exp = build_text(tmp_path, "e:\n  v: !TVersioned {dim: 4, extra: 1}\n")
        assert exp["v"].size == 4 and exp["v"].extra == 1

    def test_current_version_is_written(self, tmp_path):
        """Saved specs record the class version."""
        exp = build_text(tmp_path, "e:\n  v: !TVersioned {size: 4, xser_version: 2}\n")
        tree, _ = to_tree(exp)
        assert tree["v"].args == {"size": 4, "extra": 0, "xser_version": 2}


class TestSaveHook:
    def test_vocab_file_saved_as_list(self, tmp_path):
        """xser_saved_args replaces what is saved: a vocabulary file becomes an explicit list."""
        vocab = tmp_path / "v.txt"
        vocab.write_text("a\nb\nc\n")
        exp = build_text(tmp_path, f"e:\n  v: !TVocab {{vocab_file: {vocab}}}\n")
        path = str(tmp_path / "m.yaml")
        xser.save(exp, path)
        vocab.unlink()
        again = xser.load(path)
        assert again["v"].words == ["a", "b", "c"] and again["v"].vocab_file is None


class TestLoadSerialized:
    def saved(self, tmp_path, name="old"):
        exp = build_text(
            tmp_path,
            "e:\n  model: !TModel\n    encoder: !TLinear {in_dim: 2, out_dim: 3, xser_id: enc}\n"
            "    decoder: !Ref {name: enc}\n    dropout: 0.3\n  other: !TLinear {in_dim: 5, out_dim: 5}\n",
        )
        path = str(tmp_path / name / "model.yaml")
        xser.save(exp, path)
        return exp, path

    def test_component_with_parameters(self, tmp_path):
        """!LoadSerialized takes a component and its parameters out of a saved model."""
        old, path = self.saved(tmp_path)
        exp = build_text(tmp_path, f"e:\n  enc: !LoadSerialized {{filename: {path}, path: model.encoder}}\n")
        assert np.array_equal(exp["enc"].W, old["model"].encoder.W)
        assert xser.params(exp["enc"]).name == xser.params(old["model"].encoder).name

    def test_relative_filename_is_relative_to_config(self, tmp_path):
        """A relative filename is resolved against the config file's directory."""
        old, _ = self.saved(tmp_path)
        exp = build_text(tmp_path, "e:\n  enc: !LoadSerialized {filename: old/model.yaml, path: model.encoder}\n")
        assert np.array_equal(exp["enc"].W, old["model"].encoder.W)

    def test_whole_experiment_with_overwrite(self, tmp_path):
        """An empty path takes the whole experiment; overwrite changes values inside it."""
        old, path = self.saved(tmp_path)
        exp = build_text(
            tmp_path,
            f"e: !LoadSerialized\n  filename: {path}\n  overwrite:\n  - {{path: model.dropout, val: 0.5}}\n"
            "  - {path: extra, val: 1}\n",
        )
        assert exp["model"].dropout == 0.5 and exp["extra"] == 1
        assert exp["model"].decoder is exp["model"].encoder
        assert np.array_equal(exp["other"].W, old["other"].W)

    def test_overwrite_through_a_wrong_key_suggests(self, tmp_path):
        """A misspelt intermediate key of an overwrite path is named, with the key it probably meant."""
        _, path = self.saved(tmp_path)
        with pytest.raises(xser.SpecError) as info:
            build_text(tmp_path, f"e: !LoadSerialized\n  filename: {path}\n  overwrite:\n  - {{path: modle.dropout, val: 0.5}}\n")
        assert str(info.value).endswith("overwrite path 'modle.dropout': root has no key 'modle'; did you mean 'model'?")

    def test_refs_inside_are_rerooted(self, tmp_path):
        """Refs inside the loaded subtree point to the new place; sharing is preserved."""
        _, path = self.saved(tmp_path)
        exp = build_text(tmp_path, f"e:\n  wrap:\n    m: !LoadSerialized {{filename: {path}, path: model}}\n")
        assert exp["wrap"]["m"].decoder is exp["wrap"]["m"].encoder

    def test_same_model_twice_gets_fresh_names(self, tmp_path):
        """Loading one saved model twice works: the second copy gets fresh subcollection names."""
        old, path = self.saved(tmp_path)
        exp = build_text(
            tmp_path,
            f"e:\n  a: !LoadSerialized {{filename: {path}, path: model}}\n"
            f"  b: !LoadSerialized {{filename: {path}, path: model}}\n",
        )
        na, nb = xser.params(exp["a"].encoder).name, xser.params(exp["b"].encoder).name
        assert na != nb
        assert np.array_equal(exp["a"].encoder.W, exp["b"].encoder.W)
        assert exp["a"].encoder is not exp["b"].encoder
        out = str(tmp_path / "both.yaml")
        xser.save(exp, out)
        again = xser.load(out)
        assert np.array_equal(again["b"].encoder.W, old["model"].encoder.W)

    def test_each_load_reads_its_own_file(self, tmp_path):
        """Two saved models with the same subcollection names: each component reads its own file."""
        old, path = self.saved(tmp_path, "one")
        xser.params(old["model"].encoder)["W"][...] = 42.0
        path2 = str(tmp_path / "two" / "model.yaml")
        xser.save(old, path2)
        exp = build_text(
            tmp_path,
            f"e:\n  a: !LoadSerialized {{filename: {path}, path: model.encoder}}\n"
            f"  b: !LoadSerialized {{filename: {path2}, path: model.encoder}}\n",
        )
        assert not np.all(exp["a"].W == 42.0) and np.all(exp["b"].W == 42.0)

    def test_missing_data_is_an_error(self, tmp_path):
        """A saved model whose data directory is gone is an error, never a random init."""
        _, path = self.saved(tmp_path)
        os.rename(path + ".data", path + ".moved")
        with pytest.raises(xser.DataError, match="data directory not found"):
            build_text(tmp_path, f"e:\n  a: !LoadSerialized {{filename: {path}, path: model.encoder}}\n")

    def test_bad_path(self, tmp_path):
        """A path that is not in the saved model names the file and the missing key."""
        _, path = self.saved(tmp_path)
        with pytest.raises(xser.SpecError, match="path 'model.encodr' not found in .*model.yaml: model .* has no argument 'encodr'"):
            build_text(tmp_path, f"e:\n  a: !LoadSerialized {{filename: {path}, path: model.encodr}}\n")

    def test_config_is_not_a_saved_model(self, tmp_path):
        """Pointing !LoadSerialized at a config file is an error that says so."""
        cfg = write(tmp_path, "e:\n  a: 1\n", "cfg.yaml")
        with pytest.raises(xser.SpecError, match="not a saved xser model"):
            build_text(tmp_path, f"e:\n  a: !LoadSerialized {{filename: {cfg}}}\n")

    def test_overwrite_shape_change_is_caught(self, tmp_path):
        """An overwrite that changes a parameter shape fails with both shapes named."""
        _, path = self.saved(tmp_path)
        with pytest.raises(xser.DataError, match=r"param 'W': shape \(4, 2\) in spec, \(3, 2\) on disk"):
            build_text(
                tmp_path,
                f"e:\n  a: !LoadSerialized {{filename: {path}, path: model.encoder, overwrite: [{{path: out_dim, val: 4}}]}}\n",
            )

    def test_loads_never_initialise(self, tmp_path):
        """Parameters of a loaded component come from disk; the initialiser is never called."""
        exp = build_text(tmp_path, "e:\n  c: !TCounter {}\n")
        path = str(tmp_path / "m.yaml")
        xser.save(exp, path)
        before = Counter.calls
        xser.load(path)
        build_text(tmp_path, f"e:\n  c: !LoadSerialized {{filename: {path}, path: c}}\n")
        assert Counter.calls == before


class TestLoadSerializedKeepsTies:
    def test_shared_outside_target_stays_shared(self, tmp_path):
        """Two refs to one component outside the loaded path become one object, not two copies."""
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "e:\n"
            "  shared: !TLinear {in_dim: 2, out_dim: 2, xser_id: emb}\n"
            "  model: !TModel\n"
            "    encoder: !Ref {name: emb}\n"
            "    decoder: !Ref {name: emb}\n"
        )
        exp = xser.build(xser.load_config(cfg)["e"])
        assert exp["model"].encoder is exp["model"].decoder
        xser.save(exp, tmp_path / "m.yaml")
        loader = tmp_path / "l.yaml"
        loader.write_text(f"f:\n  model: !LoadSerialized {{filename: {tmp_path / 'm.yaml'}, path: model}}\n")
        got = xser.build(xser.load_config(loader)["f"])
        assert got["model"].encoder is got["model"].decoder  # one matrix to fine-tune, as in the source
        assert np.array_equal(got["model"].encoder.W, exp["shared"].W)
        xser.save(got, tmp_path / "n.yaml")
        again = xser.load(tmp_path / "n.yaml")
        assert again["model"].encoder is again["model"].decoder  # saved and loaded: still one object


# ---------------------------------------------------------------- models saved before the code changed


def _net(extra: bool):
    @xser.serializable(tag="!EvolvingNet")
    class EvolvingNet:
        n: int = 2

        def __attrs_post_init__(self):
            p = xser.params(self)
            self.W = p.add("W", (self.n, self.n), init="ones")
            if extra:
                self.gate = p.add("gate", (self.n,), init=lambda shape, rng: np.full(shape, 7, np.float32))

    return EvolvingNet


def test_a_parameter_added_since_the_save(tmp_path, caplog):
    old = _net(False)()
    old.W[...] = 3
    xser.save(old, tmp_path / "m.yaml")
    _net(True)
    with pytest.raises(xser.DataError) as info:
        xser.load(tmp_path / "m.yaml")
    assert "param 'gate' is missing on disk (on disk: W); a parameter added since the save: " \
           'load(..., missing="init") starts it from its declared init' in str(info.value)
    sub = xser.params(old).name
    with caplog.at_level("WARNING", logger="xser"):
        new = xser.load(tmp_path / "m.yaml", missing="init")
    assert (new.W == 3).all() and (new.gate == 7).all()
    assert caplog.messages == [f'{tmp_path}/m.yaml.data: not in the saved data, started from their declared init (missing="init"): {sub}/gate']
    fresh = _net(True)()
    with caplog.at_level("WARNING", logger="xser"):
        xser.load_into(fresh, tmp_path / "m.yaml", missing="init")
    assert (fresh.W == 3).all() and (fresh.gate == 7).all() and "kept as the object holds them" in caplog.messages[-1]
    with pytest.raises(xser.DataError, match='missing must be "error" or "init", got \'yes\''):
        xser.load(tmp_path / "m.yaml", missing="yes")


def test_a_child_component_added_since_the_save(tmp_path, caplog):
    @xser.serializable(tag="!GrowingModel")
    class GrowingModel:
        enc: Linear

    xser.save(GrowingModel(Linear(2, 3)), tmp_path / "m.yaml")
    text = (tmp_path / "m.yaml").read_text()

    @xser.serializable(tag="!GrowingModel")
    class GrowingModel:  # noqa: F811 - the class as it is now: a new child with parameters
        enc: Linear
        norm: Norm = attrs.Factory(lambda: Norm(3))

    assert "norm" not in text
    with pytest.raises(xser.XserError):
        xser.load(tmp_path / "m.yaml")
    with caplog.at_level("WARNING", logger="xser"):
        m = xser.load(tmp_path / "m.yaml", missing="init")
    assert isinstance(m.norm, Norm) and xser.params(m.norm).name != xser.params(m.enc).name


def _renamed(version: int):
    def migrate_params(arrays, old):
        assert old == 1
        return {"W": arrays.pop("weight").T.copy(), **arrays}

    @xser.serializable(tag="!RenamedNet", version=version, migrate_params=migrate_params if version > 1 else None)
    class RenamedNet:
        def __attrs_post_init__(self):
            p = xser.params(self)
            if version == 1:
                self.weight = p.add("weight", (2, 3), init="zeros")
            else:
                self.W = p.add("W", (3, 2), init="zeros")
            self.b = p.add("b", (3,), init="zeros")

    return RenamedNet


def test_renamed_parameters_are_migrated(tmp_path):
    old = _renamed(1)()
    old.weight[...] = np.arange(6).reshape(2, 3)
    old.b[...] = 5
    xser.save(old, tmp_path / "m.yaml")
    _renamed(2)
    new = xser.load(tmp_path / "m.yaml")
    assert np.array_equal(new.W, np.arange(6, dtype=np.float32).reshape(2, 3).T) and (new.b == 5).all()
    xser.save(new, tmp_path / "again.yaml")  # saved by version 2: loads without migrating
    assert np.array_equal(xser.load(tmp_path / "again.yaml").W, new.W)


@pytest.mark.parametrize("fn, message", [
    (lambda arrays, old: [1], "!BadMigration: migrate_params must return a dict of parameter names to numpy arrays, got list"),
    (lambda arrays, old: 1 / 0, "!BadMigration: migrate_params from version 1 failed: ZeroDivisionError: division by zero"),
    (lambda arrays, old: {"W": np.zeros((5,), np.float32)}, "param 'W': migrated to (5,) float32, declared (2,) float32"),
])
def test_migrate_params_errors(tmp_path, fn, message):
    def make(version, migrate_params=None):
        @xser.serializable(tag="!BadMigration", version=version, migrate_params=migrate_params)
        class BadMigration:
            def __attrs_post_init__(self):
                self.W = xser.params(self).add("W", (2,))

        return BadMigration

    xser.save(make(1)(), tmp_path / "m.yaml")
    make(2, fn)
    with pytest.raises(xser.DataError) as info:
        xser.load(tmp_path / "m.yaml")
    assert message in str(info.value)


def test_parameters_declared_late_are_named(tmp_path):
    @xser.serializable(tag="!LazyNet")
    class LazyNet:
        def forward(self):
            if not hasattr(self, "W"):
                self.W = xser.params(self).add("W", (2,), init="ones")
            return self.W

    net = LazyNet()
    net.forward()
    xser.save(net, tmp_path / "m.yaml")
    with pytest.raises(xser.DataError) as info:
        xser.load(tmp_path / "m.yaml")
    assert str(info.value).endswith(
        f"the component at {tmp_path}/m.yaml.data/spec.yaml:4:13 ({xser.params(net).name}) declared no parameters while it was "
        "built, but the checkpoint has them: declare parameters in __attrs_post_init__ (xser.params(self).add(...)), not later "
        "(for example on the first forward), so that loading fills them")


def test_seeded_builds_name_subcollections_deterministically(tmp_path):
    """build(seed=...) derives names from the seed and each component's path: two runs can be diffed."""
    (tmp_path / "c.yaml").write_text("m: !TModel\n  encoder: !TLinear {in_dim: 2, out_dim: 3}\n  decoder: !TLinear {in_dim: 3, out_dim: 2}\n")
    tree = xser.load_config(tmp_path / "c.yaml")["m"]
    names = []
    for seed in (0, 0, 1):
        built = xser.build(tree, seed=seed)
        names.append([xser.params(built.encoder).name, xser.params(built.decoder).name])
    assert names[0] == names[1] and names[0] != names[2]
    assert all(n.startswith("Linear.") and len(n) == len("Linear.") + 8 for n in names[0]) and len(set(names[0])) == 2
    assert xser.params(xser.build(tree).encoder).name not in names[0]  # no seed: random
    for k in (0, 1):
        xser.save(xser.build(tree, seed=0), tmp_path / f"{k}" / "m.yaml")
    assert (tmp_path / "0" / "m.yaml").read_text().split("\n", 3)[3] == (tmp_path / "1" / "m.yaml").read_text().split("\n", 3)[3]


@xser.serializable(tag="!PathHolder")
class PathHolder:
    data_dir: str
    other: str = "/etc/hostname"
    files: list = attrs.Factory(list)

    def __attrs_post_init__(self):
        self.W = xser.params(self).add("W", (2,), init="ones")


def test_paths_inside_the_model_directory_move_with_it(tmp_path):
    """{EXP_DIR} paths under the model's directory are saved relative to it: the directory can be moved or copied."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "exp.yaml").write_text("e: !PathHolder {data_dir: '{EXP_DIR}/data', files: ['{EXP_DIR}/vocab.txt', '{EXP_DIR}']}\n")
    obj = xser.build(xser.load_config(run / "exp.yaml")["e"])
    assert obj.data_dir == f"{run}/data"
    xser.save(obj, run / "m.yaml")
    text = (run / "m.yaml").read_text()
    assert "data_dir: !ModelPath {path: data}" in text and str(run) not in text and 'other: "/etc/hostname"' in text
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(run, moved)
    shutil.rmtree(run)
    back = xser.load(moved / "m.yaml")
    assert (back.data_dir, back.files, back.other) == (f"{moved}/data", [f"{moved}/vocab.txt", str(moved)], "/etc/hostname")
    from xser.tools.convert import convert

    convert(moved / "m.yaml", tmp_path / "conv" / "m.yaml")  # elsewhere: the files stay where they are
    assert xser.load(tmp_path / "conv" / "m.yaml").data_dir == f"{moved}/data"
    convert(moved / "m.yaml", moved / "again.yaml")  # in the same directory: still relative
    assert "!ModelPath {path: data}" in (moved / "again.yaml").read_text()


@pytest.mark.parametrize("args", ["{path: ../x}", "{path: /abs}", "{path: a, more: 1}", "{}"])
def test_model_path_must_stay_inside(tmp_path, args):
    xser.save(PathHolder("x"), tmp_path / "m.yaml")
    edit_spec(tmp_path / "m.yaml", lambda text: text.replace("data_dir: x", f"data_dir: !ModelPath {args}"))
    with pytest.raises(xser.XserError) as info:
        xser.load(tmp_path / "m.yaml")
    assert "!ModelPath takes one relative 'path' inside the model's directory" in str(info.value)


class Act(enum.Enum):
    RELU = "relu"
    TANH = 2


@xser.serializable(tag="!TypedLayer")
class TypedLayer:
    vocab: pathlib.Path
    act: Act = Act.RELU
    sizes: tuple[int, ...] = ()
    opt: dict[str, dict[str, float]] = attrs.Factory(dict)
    scale: float = attrs.field(default=1.0, converter=float)  # the converter decides what it takes


def test_field_types_users_write(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "l: !TypedLayer {vocab: data/v.txt, act: TANH, sizes: [1, 2, 3], opt: {adam: {beta: 1}}, scale: '2.5'}\n"
        "by_value: !TypedLayer {vocab: v, act: relu}\n"
    )
    cfg = xser.load_config(tmp_path / "c.yaml")
    layer = xser.build(cfg["l"])
    assert (layer.vocab, layer.act, layer.sizes, layer.opt, layer.scale) == (
        pathlib.Path("data/v.txt"), Act.TANH, (1, 2, 3), {"adam": {"beta": 1.0}}, 2.5)
    assert xser.build(cfg["by_value"]).act is Act.RELU
    xser.save(layer, tmp_path / "m.yaml")
    back = xser.load(tmp_path / "m.yaml")
    assert (back.vocab, back.act, back.sizes, back.opt, back.scale) == (layer.vocab, layer.act, layer.sizes, layer.opt, layer.scale)


@pytest.mark.parametrize("args, message", [
    ("{vocab: v, opt: {adam: {beta: high}}}", "{f}:1:46: opt.adam.beta: expected float, got str 'high'"),
    ("{vocab: v, act: GELU}", "{f}:1:32: act: expected Act (one of RELU, TANH), got str 'GELU'"),
    ("{vocab: 3}", "{f}:1:24: vocab: expected Path, got int 3"),
    ("{vocab: v, sizes: [1, two]}", "{f}:1:38: sizes.1: expected int, got str 'two'"),
])
def test_field_type_errors_point_at_the_element(tmp_path, args, message):
    (tmp_path / "c.yaml").write_text(f"l: !TypedLayer {args}\n")
    with pytest.raises(xser.SpecError) as info:
        xser.build(xser.load_config(tmp_path / "c.yaml")["l"])
    assert str(info.value) == message.format(f=tmp_path / "c.yaml")


REPEAT_CONFIG = """\
e:
  layers: !Repeat {times: 3, content: !TLinear {in_dim: 2, out_dim: !RandomParam {values: [4, 8, 16]}}}
  first: !Ref {path: layers.0}
"""


def test_repeat_and_random_param(tmp_path):
    (tmp_path / "c.yaml").write_text(REPEAT_CONFIG)
    spec = xser.load_config(tmp_path / "c.yaml")["e"]
    e = xser.build(spec, seed=0)
    assert len(e["layers"]) == 3 and e["first"] is e["layers"][0]
    assert len({xser.params(x).name for x in e["layers"]}) == 3 and len({id(x.W) for x in e["layers"]}) == 3
    dims = [x.out_dim for x in e["layers"]]
    assert set(dims) <= {4, 8, 16} and dims == [x.out_dim for x in xser.build(spec, seed=0)["layers"]]  # the seed decides
    assert len({tuple(x.out_dim for x in xser.build(spec, seed=s)["layers"]) for s in range(8)}) > 1
    xser.save(e, tmp_path / "m.yaml")
    text = (tmp_path / "m.yaml").read_text()
    assert text.count("out_dim: !RandomParam") == 3 and f"drawn: {dims[0]}" in text and "values: [4, 8, 16]" in text
    back = xser.load(tmp_path / "m.yaml")
    assert [x.out_dim for x in back["layers"]] == dims and all((a.W == b.W).all() for a, b in zip(back["layers"], e["layers"]))
    xser.save(back, tmp_path / "again.yaml")  # the record survives a second save
    assert (tmp_path / "again.yaml").read_text().count("!RandomParam") == 3


@pytest.mark.parametrize("text, message", [
    ("e: !Repeat {times: -1, content: 1}\n", "{f}:1:20: !Repeat: times must be an int from 0 to 100000, got -1"),
    ("e: !Repeat {times: 2}\n", "{f}:1:4: !Repeat needs content: the component (or value) to repeat"),
    ("e: !Repeat {times: 2, content: 1, extra: 3}\n", "{f}:1:4: !Repeat: unknown argument 'extra' (it takes times and content)"),
    ("e: !Repeat {times: 2, content: !TLinear {in_dim: 1, out_dim: 1, xser_id: a}}\n",
     "{f}:1:32: !Repeat: content marked xser_id 'a' would be 2 objects with one name; drop xser_id there (refer to a copy "
     "by path: !Ref {{path: ...N}})"),
    ("e: !RandomParam {values: []}\n", "{f}:1:26: !RandomParam: values must be a non-empty list of choices, got []"),
    ("e: !RandomParam {values: [1, 2], drawn: 3}\n", "{f}:1:41: !RandomParam: drawn value 3 is not one of the values [1, 2]"),
])
def test_repeat_and_random_param_errors(tmp_path, text, message):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(xser.SpecError) as info:
        xser.build(xser.load_config(tmp_path / "c.yaml")["e"])
    assert str(info.value) == message.format(f=tmp_path / "c.yaml")
