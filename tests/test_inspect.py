"""The class-free model view behind `xser inspect`."""

import xser
from components import Linear, Model
from xser.tools.inspect import open_model


def test_lines_list_refs_and_missing(tmp_path):
    """Shared components show as references; names in the spec without data are flagged."""
    enc = Linear(2, 3)
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=enc, decoder=enc), path)
    view = open_model(path)
    lines = view.lines()
    assert "    decoder -> encoder" in lines
    name = xser.params(enc).name
    text = path.read_text().replace(name, "Linear.deadbeef")
    path.write_text(text)
    lines = open_model(path).lines()
    assert f"  {name}  (not used by the spec)" in lines
    assert lines[-1] == "warning: named in the spec but missing on disk: Linear.deadbeef"


def test_unknown_tags_are_fine(tmp_path):
    """The view needs no component classes: unknown tags are shown as written."""
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=1), path)
    path.write_text(path.read_text().replace("!TModel", "!SomethingNotRegistered"))
    assert "(root): !SomethingNotRegistered" in "\n".join(open_model(path).lines())


def test_long_metadata_is_shortened(tmp_path):
    """A huge training mapping (an imported model keeps its original spec there) is cut in the listing."""
    path = tmp_path / "m.yaml"
    xser.save(Model(encoder=1), path, training={"text": "x" * 1000})
    line = next(l for l in open_model(path).lines() if l.startswith("  training:"))
    assert line.endswith("... (1012 characters in the manifest)") and len(line) < 400
