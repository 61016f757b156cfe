"""Resource files (xser.resources(self).add(path)): saved with the model, given back as the checkpoint's copy."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import xser
from xser.tools.average import average


@xser.serializable(tag="!TokenizerUser")
class TokenizerUser:
    model_file: str

    def __attrs_post_init__(self):
        self.tokenizer = xser.resources(self).add(self.model_file, name="spm.model")
        self.W = xser.params(self).add("W", (2,), init="ones")


def test_a_resource_travels_with_the_model(tmp_path):
    src = tmp_path / "spm.model"
    src.write_bytes(b"\x00tokenizer\xffbytes\n" * 100)
    obj = TokenizerUser(str(src))
    assert obj.tokenizer == str(src)
    xser.save(obj, tmp_path / "run" / "m.yaml")
    src.unlink()  # the original is gone: the model does not need it
    shutil.move(tmp_path / "run", tmp_path / "elsewhere")
    back = xser.load(tmp_path / "elsewhere" / "m.yaml", verify=True)
    sub = xser.params(back).name
    assert back.tokenizer == str(tmp_path / "elsewhere" / "m.yaml.data" / sub / "resource.spm.model")
    with open(back.tokenizer, "rb") as f:
        assert f.read() == b"\x00tokenizer\xffbytes\n" * 100
    arrays = xser.read_params(tmp_path / "elsewhere" / "m.yaml")[sub]
    assert arrays["resource.spm.model"].tobytes() == b"\x00tokenizer\xffbytes\n" * 100  # no classes needed


def test_unchanged_resources_are_linked_between_checkpoints_and_survive_tools(tmp_path):
    (tmp_path / "v.txt").write_bytes(b"a\nb\nc\n")
    obj = TokenizerUser(str(tmp_path / "v.txt"))
    with xser.CheckpointSaver(tmp_path / "m.yaml", keep=3) as saver:
        for step in (1, 2, 3):
            obj.W[...] = step
            saver.save(obj, step=step)
    back = xser.load(tmp_path / "m.yaml")
    assert os.stat(back.tokenizer).st_nlink == 3  # one file, three checkpoints
    average(tmp_path / "m.yaml", tmp_path / "avg.yaml")
    avg = xser.load(tmp_path / "avg.yaml")
    with open(avg.tokenizer, "rb") as f:
        assert f.read() == b"a\nb\nc\n" and np.allclose(avg.W, 2.0)


def test_resource_errors(tmp_path):
    with pytest.raises(xser.DataError) as info:
        TokenizerUser(str(tmp_path / "missing.model"))
    assert "resource 'spm.model': cannot read the file: No such file or directory" in str(info.value)
    (tmp_path / "d").mkdir()
    with pytest.raises(xser.DataError, match="resource 'spm.model': not a regular file"):
        TokenizerUser(str(tmp_path / "d"))


def test_a_resource_added_since_the_save(tmp_path):
    @xser.serializable(tag="!LateResource")
    class LateResource:
        def __attrs_post_init__(self):
            self.W = xser.params(self).add("W", (2,), init="ones")

    xser.save(LateResource(), tmp_path / "m.yaml")
    (tmp_path / "vocab.txt").write_bytes(b"x\n")

    @xser.serializable(tag="!LateResource")
    class LateResource:  # noqa: F811 - the class as it is now
        def __attrs_post_init__(self):
            self.W = xser.params(self).add("W", (2,), init="ones")
            self.vocab = xser.resources(self).add(str(tmp_path / "vocab.txt"))

    with pytest.raises(xser.DataError, match="resource 'vocab.txt' is not in the checkpoint"):
        xser.load(tmp_path / "m.yaml")
    assert xser.load(tmp_path / "m.yaml", missing="init").vocab == str(tmp_path / "vocab.txt")
