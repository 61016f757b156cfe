"""Hugging Face interop against transformers itself (tiny configs built here, nothing downloaded): export keys that
from_pretrained loads (path=), config and tokenizer files kept through import and export, checkpoint selection."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face tests need torch")
transformers = pytest.importorskip("transformers", reason="the Hugging Face tests need transformers (the test extra installs it)")
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertTokenizer  # noqa: E402

import xser  # noqa: E402
from xser.cli import main  # noqa: E402
from xser.interop.recis import export_recis, import_recis  # noqa: E402
from xser.interop.safetensors import export_safetensors, import_safetensors  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "xs", "##er"]


def bert_config(layers: int = 1) -> BertConfig:
    return BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=16,
                      max_position_embeddings=16)


@xser.serializable(tag="!HFWrap")
class HFWrap(torch.nn.Module):
    """A component holding a transformers model as a plain submodule, as a user's training script would."""

    layers: int = 1

    def __attrs_post_init__(self) -> None:
        torch.manual_seed(self.layers)
        self.lm = BertForMaskedLM(bert_config(self.layers))


@xser.serializable(tag="!HFHead")
class HFHead(torch.nn.Module):
    width: int = 3

    def __attrs_post_init__(self) -> None:
        self.proj = torch.nn.Linear(self.width, 2)


def _loaded(out: Path, like: torch.nn.Module) -> None:
    """from_pretrained(out) loads every tensor of ``like``, none missing or unexpected, bit for bit."""
    m, info = BertForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    got, want = m.state_dict(), like.state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


class TestPath:
    @pytest.mark.parametrize("layers", [1, 2])
    def test_path_exports_keys_from_pretrained_loads(self, tmp_path, layers):
        """A wrapped BertForMaskedLM exported with path="model.lm": keys relative to it, loaded by from_pretrained."""
        w = {"model": HFWrap(layers), "head": HFHead()}
        xser.save(w, tmp_path / "m.yaml", durable=False)
        report = export_safetensors(tmp_path / "m.yaml", tmp_path / "hf", path="model.lm")
        assert report.keys == len(w["model"].lm.state_dict())
        w["model"].lm.config.save_pretrained(tmp_path / "hf")
        _loaded(tmp_path / "hf", w["model"].lm)

    def test_cli_path(self, tmp_path, capsys):
        w = {"model": HFWrap()}
        xser.save(w, tmp_path / "m.yaml", durable=False)
        assert main(["export", "safetensors", str(tmp_path / "m.yaml"), str(tmp_path / "hf"), "--path", "model.lm"]) == 0
        assert capsys.readouterr().out == f"wrote {tmp_path / 'hf' / 'model.safetensors'}\n"
        w["model"].lm.config.save_pretrained(tmp_path / "hf")
        _loaded(tmp_path / "hf", w["model"].lm)

    def test_a_component_path_and_sharded(self, tmp_path):
        """path= a component: keys relative to it (the wrapper's own state_dict); shards load too."""
        w = {"model": HFWrap()}
        xser.save(w, tmp_path / "m.yaml", durable=False)
        export_safetensors(tmp_path / "m.yaml", tmp_path / "hf", path="model", max_shard_size=2000)
        assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
        from safetensors.torch import load_file

        got = {}
        for f in sorted((tmp_path / "hf").glob("model-*.safetensors")):
            got.update(load_file(str(f)))
        want = w["model"].state_dict()
        assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)

    def test_unloadable_keys_warn(self, tmp_path, caplog):
        """The issue's case: keys model.lm.bert... load nothing; the export says so and names the path to use."""
        xser.save({"model": HFWrap()}, tmp_path / "m.yaml", durable=False)
        with caplog.at_level(logging.WARNING, logger="xser"):
            export_safetensors(tmp_path / "m.yaml", tmp_path / "hf")
        assert [r.getMessage() for r in caplog.records] == [WARNINGS["one module"].format(out=tmp_path / "hf")]
        m, info = BertForMaskedLM.from_pretrained(str(tmp_path / "hf"), config=bert_config(), output_loading_info=True)
        assert len(info["missing_keys"]) == len(info["unexpected_keys"]) > 20  # what the warning is about

    @pytest.mark.parametrize("tree, path, which", [
        (lambda: {"model": HFWrap(), "head": HFHead()}, "", "two"),
        (lambda: {"outer": {"model": HFWrap()}}, "outer", "nested"),
        (lambda: HFWrap(), "", None),  # a component: its state_dict has these keys
        (lambda: {"model": HFWrap()}, "model", None),
        (lambda: {"model": HFWrap()}, "model.lm", None),
    ])
    def test_warning_cases(self, tmp_path, caplog, tree, path, which):
        xser.save(tree(), tmp_path / "m.yaml", durable=False)
        with caplog.at_level(logging.WARNING, logger="xser"):
            export_safetensors(tmp_path / "m.yaml", tmp_path / "hf", path=path)
        expected = [] if which is None else [WARNINGS[which].format(out=tmp_path / "hf")]
        assert [r.getMessage() for r in caplog.records] == expected

    def test_unknown_path(self, tmp_path):
        xser.save({"model": HFWrap()}, tmp_path / "m.yaml", durable=False)
        with pytest.raises(xser.DataError) as info:
            export_safetensors(tmp_path / "m.yaml", tmp_path / "hf", path="model.ml")
        assert info.value.message == ERRORS["unknown path"]
        assert not (tmp_path / "hf").exists()


WARNINGS = {
    "one module": "{out}: the keys begin with the spec's structure ('model.'), not with a module's: no module's state_dict() has such "
                  "keys, so from_pretrained or load_state_dict would leave every tensor at its initial value; export the module "
                  "with --path model.lm (path= in the API)",
    "two": "{out}: the keys begin with the spec's structure ('head.'), not with a module's: no module's state_dict() has such keys, "
           "so from_pretrained or load_state_dict would leave every tensor at its initial value; export one component with "
           "--path (path= in the API): head, model",
    "nested": "{out}: the keys begin with the spec's structure ('outer.model.'), not with a module's: no module's state_dict() has "
              "such keys, so from_pretrained or load_state_dict would leave every tensor at its initial value; export the module "
              "with --path outer.model.lm (path= in the API)",
}
ERRORS = {
    "unknown path": "no component or submodule 'model.ml' holds parameters; did you mean 'model.lm'?",
}


def hf_dir(tmp_path: Path, name: str = "src", shard: str | None = None) -> tuple[Path, BertForMaskedLM, BertTokenizer]:
    torch.manual_seed(0)
    model = BertForMaskedLM(bert_config())
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)})
    d = tmp_path / name
    model.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
    tok.save_pretrained(d)
    (d / "special.model").write_bytes(b"\x00sentencepiece\xff")  # a binary tokenizer file, kept byte for byte
    return d, model, tok


class TestRoundTrip:
    @pytest.mark.parametrize("fmt", ["npy", "safetensors"])
    def test_config_and_tokenizer_survive_import_and_export(self, tmp_path, fmt):
        src, model, tok = hf_dir(tmp_path)
        side = sorted(n for n in os.listdir(src) if n != "model.safetensors")
        assert "config.json" in side and "tokenizer_config.json" in side
        import_safetensors(src, tmp_path / "imp.yaml", format=fmt, durable=False)
        loaded = xser.load(tmp_path / "imp.yaml", verify=True)
        assert sorted(loaded.paths) == side
        assert all(Path(loaded.paths[n]).read_bytes() == (src / n).read_bytes() for n in side)
        report = export_safetensors(tmp_path / "imp.yaml", tmp_path / "out")
        assert sorted(os.listdir(tmp_path / "out")) == sorted(["model.safetensors", *side])  # one shard: no index
        assert [os.path.basename(f) for f in report.files] == ["model.safetensors", *side]
        assert all((tmp_path / "out" / n).read_bytes() == (src / n).read_bytes() for n in side)
        _loaded(tmp_path / "out", model)
        back = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
        assert back("hello xser world")["input_ids"] == tok("hello xser world")["input_ids"] == [2, 5, 7, 8, 6, 3]

    def test_sharded_source(self, tmp_path):
        src, model, _ = hf_dir(tmp_path, shard="2KB")
        assert (src / "model.safetensors.index.json").exists()
        import_safetensors(src, tmp_path / "imp.yaml", durable=False)
        export_safetensors(tmp_path / "imp.yaml", tmp_path / "out")
        assert "model.safetensors.index.json" not in os.listdir(tmp_path / "out")
        _loaded(tmp_path / "out", model)
        export_safetensors(tmp_path / "imp.yaml", tmp_path / "sh", max_shard_size="2KB")
        assert (tmp_path / "sh" / "config.json").read_bytes() == (src / "config.json").read_bytes()
        _loaded(tmp_path / "sh", model)

    def test_one_shard_is_model_safetensors(self, tmp_path):
        """max_shard_size larger than the model: model.safetensors and no index, as save_pretrained writes it."""
        src, model, _ = hf_dir(tmp_path)
        import_safetensors(src, tmp_path / "imp.yaml", durable=False)
        report = export_safetensors(tmp_path / "imp.yaml", tmp_path / "out", max_shard_size="5GB")
        assert report.files[0] == str(tmp_path / "out" / "model.safetensors")
        assert "model.safetensors.index.json" not in os.listdir(tmp_path / "out")

    def test_special_and_odd_side_files_are_left_out(self, tmp_path, caplog):
        src, _, _ = hf_dir(tmp_path)
        os.mkfifo(src / "notes.txt")
        (src / "bad name!.json").write_text("{}")
        (src / "pytorch_model.bin").write_bytes(b"weights in another format")
        with caplog.at_level(logging.WARNING, logger="xser"):
            import_safetensors(src, tmp_path / "imp.yaml", durable=False)  # the FIFO is never opened: no hang
        assert sorted(r.getMessage() for r in caplog.records) == [
            f"{src / 'bad name!.json'}: a file name xser cannot keep ('resource.bad name!.json' must match "
            r"[A-Za-z_][A-Za-z0-9_.\-]{0,99}), not imported",
            f"{src / 'notes.txt'}: not a regular file, not imported",
        ]
        assert "pytorch_model.bin" not in xser.load(tmp_path / "imp.yaml").paths


def _scored(tmp_path: Path) -> Path:
    """Three checkpoints of a tiny torch model; the middle one has the best accuracy."""
    path = tmp_path / "m.yaml"
    head = HFHead()
    with xser.CheckpointSaver(path, keep=3) as saver:
        for step, acc in ((1, 0.5), (2, 0.9), (3, 0.7)):
            with torch.no_grad():
                head.proj.weight.fill_(step)
            saver.save(head, step=step, metrics={"acc": acc})
    return path


class TestCheckpoint:
    @pytest.mark.parametrize("kwargs, value", [
        ({}, 3.0), ({"checkpoint": "last"}, 3.0), ({"checkpoint": 2}, 1.0), ({"checkpoint": "best", "metric": "acc"}, 2.0),
        ({"checkpoint": xser.Best("acc", "min")}, 1.0), ({"checkpoint": "best", "metric": "acc", "mode": "min"}, 1.0),
    ])
    def test_export_safetensors_and_recis_select_checkpoints(self, tmp_path, kwargs, value):
        path = _scored(tmp_path)
        export_safetensors(path, tmp_path / "hf", **kwargs)
        from safetensors.torch import load_file

        assert load_file(str(tmp_path / "hf" / "model.safetensors"))["proj.weight"].unique().tolist() == [value]
        export_recis(path, tmp_path / "recis", **kwargs)
        import_recis(tmp_path / "recis", tmp_path / "back.yaml", durable=False)
        assert np.unique(next(iter(xser.read_params(tmp_path / "back.yaml").values()))["proj.weight"]).tolist() == [value]

    def test_best_without_metric(self, tmp_path):
        path = _scored(tmp_path)
        with pytest.raises(xser.CheckpointError) as info:
            export_safetensors(path, tmp_path / "hf", checkpoint="best")
        assert info.value.message == 'checkpoint="best" needs metric= (the metric recorded with the checkpoints, e.g. metric="dev_bleu")'
