"""Parameters stored as blocks of rows or tiles, and partial (row-range) loads.

(The code is spread over storage/plan.py, storage/manifest.py and storage/opened.py; these tests are about the one feature.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xser
from components import Linear
from strategies import bit_equal, leaf_of

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def blocked_cases(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9))
    arr = draw(hnp.arrays(st.sampled_from([np.float32, np.int16, np.dtype(">f8")]), shape))
    block = tuple(draw(st.integers(1, 10)) for _ in range(draw(st.integers(1, len(shape)))))
    first = draw(st.integers(0, shape[0] - 1))
    stop = draw(st.integers(first + 1, shape[0]))
    return arr, block, (first, stop)


class TestBlocks:
    @SETTINGS
    @given(case=blocked_cases())
    def test_round_trip_and_row_ranges(self, tmp_path_factory, case):
        """Any block size: load gives the array back; a row range gives exactly those rows."""
        arr, block, rows = case
        path = str(tmp_path_factory.mktemp("b") / "m.yaml")
        leaf = leaf_of({"x": arr})
        name = xser.params(leaf).name
        xser.save(leaf, path, durable=False, blocks={"*/x": block})
        assert bit_equal(xser.params(xser.load(path, verify=True))["x"], arr)
        part = xser.read_params(path, rows={f"{name}/x": rows})[name]["x"]
        assert bit_equal(part, arr[rows[0] : rows[1]])

    def test_files_and_manifest(self, tmp_path):
        """Row blocks are files <param>@<start>.npy (named by their start) with start and shape in the manifest; each is plain .npy."""
        lin = Linear(4, 10)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path, blocks={"*/W": 4})
        sub = xser.params(lin).name
        entry = json.loads(Path(path + ".data/manifest.json").read_text())["subcollections"][sub]["W"]
        assert [(b["file"], b["start"], b["shape"]) for b in entry["blocks"]] == [
            (f"{sub}/W@0_0.npy", [0, 0], [4, 4]), (f"{sub}/W@4_0.npy", [4, 0], [4, 4]), (f"{sub}/W@8_0.npy", [8, 0], [2, 4])
        ]
        assert np.array_equal(np.load(Path(path + ".data", sub, "W@8_0.npy")), lin.W[8:])
        assert "blocks" in Path(path + ".data/manifest.json").read_text()

    def test_unchanged_blocks_are_linked(self, tmp_path):
        """Between checkpoints only the blocks that changed are written."""
        lin = Linear(4, 12)
        path = str(tmp_path / "m.yaml")
        with xser.CheckpointSaver(path, keep=2, blocks={"*/W": 4}) as saver:
            saver.save(lin, step=1)
            lin.W[0, 0] += 1.0
            report = saver.save(lin, step=2)
        assert (report.written, report.linked) == (1, 3)  # W@0_0 written; W@4_0, W@8_0 and b linked

    def test_load_rows(self, tmp_path):
        """xser.load(rows=...) gives the component only those rows of that parameter."""
        lin = Linear(4, 10)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path, blocks={"*/W": 3})
        sub = xser.params(lin).name
        part = xser.load(path, rows={f"{sub}/W": (2, 7)})
        assert np.array_equal(part.W, lin.W[2:7]) and np.array_equal(part.b, lin.b)

    def test_partial_read_reads_only_those_bytes(self, tmp_path):
        """Reading 1% of the rows of a single-file matrix reads about 1% of its bytes."""
        if not os.path.exists("/proc/self/io"):
            pytest.skip("needs /proc/self/io")
        lin = Linear(1000, 1000)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path, durable=False)
        sub = xser.params(lin).name

        def rchar():
            return int(next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar")).split()[1])

        before = rchar()
        part = xser.read_params(path, rows={f"{sub}/W": (500, 510)})[sub]["W"]
        used = rchar() - before
        assert np.array_equal(part, lin.W[500:510])
        assert used < 200_000  # 10 rows = 40 kB of data, plus headers, the manifest and the small b


class TestBadBlocks:
    def edit(self, tmp_path, fn):
        lin = Linear(4, 10)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path, blocks={"*/W": 4})
        mp = Path(path + ".data/manifest.json")
        m = json.loads(mp.read_text())
        fn(m["subcollections"][xser.params(lin).name]["W"]["blocks"])
        mp.write_text(json.dumps(m))
        return path, mp, xser.params(lin).name

    @pytest.mark.parametrize("edit, message", [
        (lambda bs: bs.pop(1), "blocks cover 24 of 40 elements: rows or columns are missing"),
        (lambda bs: bs[1].update(start=[2, 0]), "blocks at [0, 0] and [2, 0] overlap"),
        (lambda bs: bs[2].update(shape=[4, 4]), "block at [8, 0] of shape [4, 4] reaches outside shape [10, 4]"),
        (lambda bs: bs[0].pop("start"), "block start must be a list of non-negative ints, got None"),
        (lambda bs: bs[0].update(start=[0]), "block start [0] and shape [4, 4] must have 2 dimensions"),
        (lambda bs: bs[0].update(start=[0, -1]), "block start must be a list of non-negative ints, got [0, -1]"),
        (lambda bs: bs[0].update(format="npz"), "unknown weight format 'npz' (known: binary-column, colid-value-binary, colid-value-text, dense-text, dynet-text, npy, raw, rowid-colid-value-binary, rowid-colid-value-text, safetensors, sparse-text, text-column, value-binary, value-text); did you mean 'npy'?"),
    ])
    def test_table(self, tmp_path, edit, message):
        """Gaps, overlaps and malformed blocks are refused with the manifest's location."""
        path, mp, sub = self.edit(tmp_path, edit)
        with pytest.raises(xser.DataError) as info:
            xser.load(path)
        got = str(info.value)
        assert got.startswith(f"{mp}: corrupt manifest: {sub}/W: ") and got.endswith(message), got

    def test_bad_rows(self, tmp_path):
        """Unknown parameters, empty or outside ranges, and scalars are clear errors."""
        lin = Linear(4, 10)
        path = str(tmp_path / "m.yaml")
        xser.save(lin, path)
        sub = xser.params(lin).name
        with pytest.raises(xser.DataError, match=rf"rows: no parameter '{sub}/w'; did you mean '{sub}/W'\?"):
            xser.read_params(path, rows={f"{sub}/w": (0, 1)})
        with pytest.raises(xser.DataError, match=r"rows \(5, 20\) are outside the parameter's 10 rows"):
            xser.read_params(path, rows={f"{sub}/W": (5, 20)})
        with pytest.raises(xser.DataError, match=r"rows \(3, 3\) are outside"):
            xser.read_params(path, rows={f"{sub}/W": (3, 3)})
        with pytest.raises(xser.DataError, match=r"rows must be \(first, stop\), got 3"):
            xser.read_params(path, rows={f"{sub}/W": 3})

    def test_bad_block_size(self, tmp_path):
        """Block sizes must be positive ints; nothing is written otherwise."""
        with pytest.raises(xser.DataError, match="block size for '\\*/W' must be an int >= 1"):
            xser.save(Linear(2, 2), tmp_path / "m.yaml", blocks={"*/W": 0})
        assert not (tmp_path / "m.yaml").exists()


def brute_force_tiles(blocks, shape) -> bool:
    """Reference: every element covered exactly once (small shapes only)."""
    seen = np.zeros(shape, np.int64)
    for start, size in blocks:
        seen[tuple(slice(a, a + n) for a, n in zip(start, size))] += 1
    return bool(np.all(seen == 1))


@st.composite
def grid_layouts(draw):
    """Band layouts (what the check accepts by design), then maybe one block moved, grown or dropped."""
    rows = draw(st.integers(1, 8))
    cols = draw(st.integers(1, 8))
    row_cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=3))) if rows > 1 else []
    blocks = []
    bands = list(zip([0] + row_cuts, row_cuts + [rows]))
    for r0, r1 in bands:  # every band has its own column cuts
        col_cuts = sorted(draw(st.sets(st.integers(1, cols - 1), max_size=3))) if cols > 1 else []
        for c0, c1 in zip([0] + col_cuts, col_cuts + [cols]):
            blocks.append(((r0, c0), (r1 - r0, c1 - c0)))
    edit = draw(st.sampled_from(["none", "drop", "shift", "grow"]))
    i = draw(st.integers(0, len(blocks) - 1))
    (r0, c0), (n, m) = blocks[i]
    if edit == "drop" and len(blocks) > 1:
        blocks.pop(i)
    elif edit == "shift" and r0 > 0:
        blocks[i] = ((r0 - 1, c0), (n, m))
    elif edit == "grow" and c0 + m < cols:
        blocks[i] = ((r0, c0), (n, m + 1))
    return blocks, (rows, cols)


class TestTiling:
    @settings(max_examples=300, deadline=None)
    @given(layout=grid_layouts())
    def test_band_check_agrees_with_brute_force(self, layout):
        """For band layouts and their corruptions, the O(n log n) check accepts exactly the exact covers."""
        from xser.storage.manifest import Block, check_tiling

        blocks, shape = layout
        parsed = tuple(Block(f"b{k}", "npy", 0, ("xxh3_64", "0"), s, n) for k, (s, n) in enumerate(blocks))
        try:
            check_tiling(parsed, shape)
            ok = True
        except ValueError:
            ok = False
        assert ok == brute_force_tiles(blocks, shape)

    def test_many_tiles(self):
        """A manifest with 250,000 tiles (a 500 x 500 grid) is checked in O(n log n); a missing one is found."""
        from xser.storage.manifest import Block, check_tiling

        n = 500
        blocks = [Block("f", "npy", 0, ("xxh3_64", "0"), (r, c), (1, 2)) for r in range(n) for c in range(0, 2 * n, 2)]
        check_tiling(tuple(blocks), (n, 2 * n))
        with pytest.raises(ValueError, match=f"blocks cover {n * 2 * n - 2} of {n * 2 * n} elements"):
            check_tiling(tuple(blocks[:1000] + blocks[1001:]), (n, 2 * n))

    def test_straddling_blocks_are_refused(self):
        """A block that straddles another band's edge is refused with both blocks named."""
        from xser.storage.manifest import Block, check_tiling

        b = lambda s, n: Block("f", "npy", 0, ("xxh3_64", "0"), s, n)  # noqa: E731
        with pytest.raises(ValueError, match=r"blocks at \[0, 2\] and \[0, 0\] do not tile in bands"):
            check_tiling((b((0, 0), (2, 2)), b((0, 2), (1, 2)), b((1, 2), (1, 2))), (2, 4))
