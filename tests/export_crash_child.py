"""Kill an export with --force immediately before each filesystem-changing call, in turn (``crash_child.arm``).

Run as ``python export_crash_child.py EXPORTER WORKDIR`` by ``test_export_crash.py``. The work directory holds a
model and an older export of it at the output's names; the operation exports the newest checkpoint over it. After
each kill every output path must hold exactly its old or exactly its new content (never missing where it existed,
never half written); then the same export run again must succeed, give the new output and leave nothing
(``*.tmp-*``, ``*.old-*``) behind. Prints one JSON line: the exporter, its calls, the kills done, every problem.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import components  # noqa: E402
import xser  # noqa: E402
from crash_child import arm, in_child  # noqa: E402
from xser.interop.angel import export_angel  # noqa: E402
from xser.interop.dismec import export_dismec  # noqa: E402
from xser.interop.recis import export_recis  # noqa: E402
from xser.interop.safetensors import export_safetensors  # noqa: E402
from xser.interop.xnmt import export_xnmt  # noqa: E402

DATE = "2026-01-01 - 00:00:00"


def run(exporter: str, d: str, checkpoint: int = 0) -> None:
    src = f"{d}/src.yaml"
    if exporter == "safetensors":
        export_safetensors(src, f"{d}/hf", checkpoint=checkpoint, max_shard_size=40, force=True)
    elif exporter == "recis":
        export_recis(src, f"{d}/rc", checkpoint=checkpoint, parallel=2, force=True, model_pt=False)
    elif exporter == "angel":
        export_angel(src, "W", f"{d}/angel", checkpoint=checkpoint, matrix_name="W", block_rows=1, force=True)
    elif exporter == "dismec":
        export_dismec(src, "W", f"{d}/dm/model.json", checkpoint=checkpoint, date=DATE, split_files=2, layout="split", force=True)
    else:
        export_xnmt(src, f"{d}/x.mod", force=True)


#: the output paths of each exporter, relative to the work directory
OUTPUTS = {
    "safetensors": ["hf"], "recis": ["rc"], "angel": ["angel/W"],
    "dismec": ["dm/model.json", "dm/model.json.weights-1-of-2", "dm/model.json.weights-2-of-2"],
    "xnmt": ["x.mod", "x.mod.data", "x.mod.data.1"],
}


def setup(exporter: str, d: str) -> None:
    m = components.Linear(3, 4)
    with xser.CheckpointSaver(f"{d}/src.yaml", keep=2) as saver:
        m.W[...] = 1.0
        m.b[...] = 1.0
        saver.save(m, step=1)
        if exporter == "xnmt":
            run(exporter, d)  # the old export: one checkpoint
        m.W[...] = 2.0
        m.b[...] = 2.0
        saver.save(m, step=2)
    if exporter != "xnmt":
        run(exporter, d, checkpoint=1)  # the old export: the older checkpoint


def state(path: str):
    if not os.path.lexists(path):
        return None
    if os.path.isdir(path):
        out = {}
        for root, _, files in os.walk(path):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
        return ("dir", tuple(sorted(out.items())))
    with open(path, "rb") as fh:
        return ("file", fh.read())


def states(exporter: str, d: str) -> dict:
    return {p: state(os.path.join(d, p)) for p in OUTPUTS[exporter]}


def leftovers(d: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(r, n), d) for r, dirs, files in os.walk(d) for n in dirs + files
                  if re.search(r"\.(tmp|old)-", n))


def main(exporter: str, root: str) -> None:
    template, work = os.path.join(root, "template"), os.path.join(root, "work")
    os.makedirs(template)
    setup(exporter, template)
    old = states(exporter, template)
    shutil.copytree(template, work, symlinks=True)
    assert in_child(lambda: run(exporter, work)) == 0, "the export fails without any kill"
    new = states(exporter, work)
    assert any(new[p] != old[p] for p in OUTPUTS[exporter]), "the export changes nothing"
    problems, kills, limit = [], 0, 1
    while True:
        shutil.rmtree(work)
        shutil.copytree(template, work, symlinks=True)
        status = in_child(lambda: (arm(limit), run(exporter, work)))
        if status == 0:
            break  # the export makes fewer calls than `limit`
        if status != -signal.SIGKILL:
            problems.append(f"call {limit}: the export failed (status {status}) instead of being killed")
            break
        kills += 1
        got = states(exporter, work)
        for p in OUTPUTS[exporter]:
            if got[p] != old[p] and got[p] != new[p]:
                problems.append(f"kill before call {limit}: {p} is neither the old nor the new output: {str(got[p])[:200]}")
        status = in_child(lambda: run(exporter, work))  # the next run repairs: it works, and removes what the kill left
        if status != 0 or states(exporter, work) != new:
            problems.append(f"kill before call {limit}: the next export failed or differs (status {status})")
        elif leftovers(work):
            problems.append(f"kill before call {limit}: the next export left {leftovers(work)}")
        limit += 1
    print(json.dumps({"exporter": exporter, "calls": limit - 1, "kills": kills, "problems": problems}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
