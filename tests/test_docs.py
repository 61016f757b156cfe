"""The repository reads on its own: no file points outside it, and the paths its documents name exist.

The documents (README.md, docs/, the notes beside test data), code comments and docstrings once referred to
folders next to the repository (research fixtures, tools) that a reader of a release or a clone does not have.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = (".md", ".py", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".in", ".json", ".java", ".sh")

#: What points outside the repository: its neighbours (written here in pieces, so that this file does not match).
OUTSIDE = [
    ("a neighbour folder", re.compile(r"\.\./" + "shared" + r"\b")),
    ("a neighbour folder", re.compile(r"(?<![\w.-])" + "shared" + r"/(?:fixtures|tools|research|seeds|hooks)\b")),
    ("a neighbour folder", re.compile("formats" + r"_fixtures\b")),
    ("a path on the machine the repository was made on", re.compile(r"(?<![\w.])/" + "work" + r"(?:/|\b)")),
    ("a home directory", re.compile(r"(?<![\w.])~" + "/")),
]


def tracked() -> list[str]:
    """The repository's text files (tracked, or new and not ignored), relative to its root."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return sorted({f for f in out if f.endswith(TEXT) and os.path.isfile(os.path.join(ROOT, f))})


def read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def test_there_are_files_to_check():
    files = tracked()
    assert "README.md" in files and "docs/format.md" in files and "xser/cli.py" in files and "tests/test_docs.py" in files


def test_nothing_points_outside_the_repository():
    """No file names a neighbour folder, a machine path or a home directory, and no relative path climbs out."""
    found = []
    for rel in tracked():
        text = read(rel)
        for what, pattern in OUTSIDE:
            for m in pattern.finditer(text):
                found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {what}: {m.group(0)!r}")
        here = os.path.dirname(os.path.join(ROOT, rel))
        for m in re.finditer(r"(?<![\w./-])((?:\.\./)+)[\w.-]+", text):  # one or more "..": resolved from the file's folder
            if not os.path.abspath(os.path.join(here, m.group(1))).startswith(ROOT):
                found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: a path above the repository: {m.group(0)!r}")
    assert found == []


def documents() -> list[str]:
    return [f for f in tracked() if f.endswith(".md")]


def test_markdown_links_stay_inside_and_exist():
    """Relative links of every Markdown file resolve to a file or folder of the repository."""
    bad = []
    for rel in documents():
        for m in re.finditer(r"\]\(([^)\s]+)\)", read(rel)):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):  # #anchors, https:, mailto:
                continue
            path = os.path.abspath(os.path.join(ROOT, os.path.dirname(rel), target))
            if not path.startswith(ROOT + os.sep) or not os.path.exists(path):
                bad.append(f"{rel}: {target}")
    assert bad == []


def test_repository_paths_named_in_documents_exist():
    """A path into the repository that a document names (`tests/data/dismec/NOTES.md`, `xser/cli.py`) is there,
    read from the root or from the document's folder (globs and other projects' paths with wildcards aside)."""
    bad = []
    tops = "|".join(sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")))
    pattern = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % tops)
    for rel in documents():
        for m in pattern.finditer(read(rel)):
            ref = m.group(1)
            if any(os.path.exists(os.path.join(base, ref)) for base in (ROOT, os.path.join(ROOT, os.path.dirname(rel)))):
                continue
            if glob.glob(os.path.join(ROOT, ref + "*")):  # `scripts/avg_checkpoints` and the like: a name's start
                continue
            bad.append(f"{rel}: {ref}")
        for m in re.finditer(r"(?<![\w./-])((?:\.\./)+[\w./-]*[\w/])", read(rel)):  # relative to the document's folder
            if not os.path.exists(os.path.join(ROOT, os.path.dirname(rel), m.group(1))):
                bad.append(f"{rel}: {m.group(1)}")
    assert bad == []


@pytest.mark.parametrize("text, hits", [
    ("see ../" + "shared/" + "fixtures/dismec", 2),
    ("made in /" + "work/shared", 1),
    ("`" + "formats" + "_fixtures/dismec/`", 1),
    ("in ~" + "/src", 1),
    ("a file shared by two checkpoints; shared/linked; /workspace; network/work", 0),
])
def test_the_patterns(text, hits):
    """The patterns find what they are for, and not ordinary words."""
    assert sum(len(p.findall(text)) for _, p in OUTSIDE) == hits
