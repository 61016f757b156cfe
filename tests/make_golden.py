"""Regenerate tests/data/golden (only when the format changes on purpose; say so in the commit)."""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import components  # noqa: E402,F401
import xser  # noqa: E402
from test_api import GOLDEN, TestGoldenFormat  # noqa: E402

shutil.rmtree(GOLDEN, ignore_errors=True)
with tempfile.TemporaryDirectory() as d:
    cfg = os.path.join(d, "tiny.yaml")
    with open(cfg, "w") as f:
        f.write(TestGoldenFormat.SPEC)
    exp = xser.build(xser.load_config(cfg)["tiny"])
xser.save(exp, os.path.join(GOLDEN, "model.yaml"), training={"step": 10}, custom={"note": "golden"})
mp = os.path.join(GOLDEN, "model.yaml.data", "manifest.json")
m = json.load(open(mp))
text = open(mp).read().replace(m["created"], "CREATED")
text = text.replace(f'"xser_version": "{xser.__version__}"', '"xser_version": "VERSION"')
text = text.replace(m["id"], "ID").replace(m["model"], "MODEL")
open(mp, "w").write(text)
