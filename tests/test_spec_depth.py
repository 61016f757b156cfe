"""Specs nested too deeply are refused before a parser recurses into them (libyaml's composer segfaulted).

Every case runs in a child process: a crash fails the test (its exit status) instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent

from xser.spec import dump
from xser.spec.yamlio import MAX_DEPTH, SAFE_BOUND, _depth_bound

HERE = os.path.dirname(os.path.abspath(__file__))
N = 30_000  # the depth: about 100 KB, SIGSEGV in libyaml's composer before

#: (name, text, where the refusal points: line, column)
FORMS = [
    ("flow sequences", "[" * N + "]" * N, (1, MAX_DEPTH + 1)),
    ("flow mappings", "{a: " * N + "1" + "}" * N, (1, 4 * MAX_DEPTH + 1)),
    ("block sequences on one line", "- " * N + "x\n", (1, 2 * MAX_DEPTH + 1)),
    ("complex keys", "? " * N + "x\n", (1, 2 * MAX_DEPTH + 1)),
    ("anchors", "".join("&a [" for _ in range(N)) + "]" * N, (1, 4 * MAX_DEPTH + 1)),
    ("tags", "!T [" * N + "]" * N, (1, 4 * MAX_DEPTH + 1)),
    ("block then flow", "- " * 100 + "[" * N + "]" * N, (1, 2 * 100 + MAX_DEPTH - 100 + 1)),
    ("block mappings", "".join(" " * i + "a:\n" for i in range(SAFE_BOUND + 50)) + " " * (SAFE_BOUND + 50) + "b\n",
     (MAX_DEPTH + 1, MAX_DEPTH + 1)),
    ("block mappings, shallow indentation", "".join(" " * i + "a:\n" for i in range(MAX_DEPTH + 50)) + " " * (MAX_DEPTH + 50) + "b\n",
     (MAX_DEPTH + 1, MAX_DEPTH + 1)),
    ("under a key", "top:\n  x: " + "[" * N + "]" * N, (2, 4 + MAX_DEPTH)),  # two mappings are the first two levels
]

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {here!r})
    import xser
    from xser.spec import parse
    out = []
    for name, text in json.load(sys.stdin):
        try:
            parse(text, "f.yaml")
            out.append([name, "parsed"])
        except xser.XserError as e:
            out.append([name, type(e).__name__ + ": " + str(e)])
    print(json.dumps(out))
""")


def run(code: str, stdin: str = "", status: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == status, f"the child ended with status {proc.returncode} (-11: SIGSEGV): {proc.stderr[-2000:]}"
    return proc


def test_every_form_is_refused_at_its_line_and_column():
    proc = run(CHILD.format(here=HERE), json.dumps([[name, text] for name, text, _ in FORMS]))
    got = dict(json.loads(proc.stdout))
    for name, _, (line, col) in FORMS:
        assert got[name] == f"SpecError: f.yaml:{line}:{col}: nested more than {MAX_DEPTH} levels deep", name


@pytest.mark.parametrize("entry", ["load_config", "override", "load", "inspect"])
def test_every_entry_point_refuses_it(tmp_path, entry):
    """load_config, an override value, load (a model file edited to it) and `xser inspect`: a SpecError, no crash."""
    deep = "[" * N + "]" * N
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import xser, components
        tmp, entry, deep = {str(tmp_path)!r}, {entry!r}, {deep!r}
        try:
            if entry == "load_config":
                open(tmp + "/c.yaml", "w").write("e:\\n  x: " + deep + "\\n")
                xser.load_config(tmp + "/c.yaml")
            elif entry == "override":
                open(tmp + "/c.yaml", "w").write("e:\\n  x: 1\\n")
                xser.load_config(tmp + "/c.yaml", overrides=["e.x=" + deep])
            else:
                xser.save(components.Linear(2, 3), tmp + "/m.yaml")
                open(tmp + "/m.yaml", "w").write("xser_format: 1\\nexperiment: " + deep + "\\n")
                if entry == "load":
                    xser.load(tmp + "/m.yaml")
                else:
                    from xser.cli import main
                    sys.exit(main(["inspect", tmp + "/m.yaml"]))
            print("no error")
        except xser.SpecError as e:
            print(e)
    """)
    proc = run(code, status=1 if entry == "inspect" else 0)  # the CLI: exit status 1 and the error
    where = {"load_config": f"{tmp_path}/c.yaml:2:{4 + MAX_DEPTH}", "override": "override 1 'e.x=" + deep + "'"}
    if entry == "override":
        assert proc.stdout.strip().endswith(f"(character {MAX_DEPTH + 1}): nested more than {MAX_DEPTH} levels deep")
    elif entry == "inspect":
        assert proc.stderr == f"error: {tmp_path}/m.yaml:2:{12 + MAX_DEPTH}: nested more than {MAX_DEPTH} levels deep\n"
    else:
        where["load"] = f"{tmp_path}/m.yaml:2:{12 + MAX_DEPTH}"  # the mapping around it is the first level
        assert proc.stdout.strip() == f"{where[entry]}: nested more than {MAX_DEPTH} levels deep"


def depth_of(text: str) -> int:
    deepest = depth = 0
    for event in YAML(typ="safe", pure=True).parse(text):
        if isinstance(event, CollectionStartEvent):
            depth += 1
            deepest = max(deepest, depth)
        elif isinstance(event, CollectionEndEvent):
            depth -= 1
    return deepest


def nested(leaves):
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", min_size=1, max_size=2), inner, max_size=3),
                        max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=nested(st.integers() | st.text(max_size=4)), indent=st.integers(2, 6), flow=st.booleans())
def test_the_bound_is_never_below_the_real_depth(tree, indent, flow):
    """_depth_bound over-estimates: whatever the layout (block, flow, indentation), the events are never deeper."""
    y = YAML(typ="safe", pure=True)
    y.indent(mapping=indent, sequence=indent + 2, offset=indent)
    y.default_flow_style = flow
    import io

    out = io.StringIO()
    y.dump(tree, out)
    for text in (out.getvalue(), dump(tree)):
        assert _depth_bound(text) >= depth_of(text)


def test_usual_specs_are_not_scanned_twice():
    """A spec like the ones people write stays under SAFE_BOUND: no event pass before composing."""
    with open(os.path.join(HERE, "data", "golden", "model.yaml"), encoding="utf-8") as f:
        assert _depth_bound(f.read()) < SAFE_BOUND
