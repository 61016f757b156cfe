"""Structuring config values: xser's typecheck against cattrs (issue 14, point 7).

Times checking/structuring typical argument values (a nested ``dict[str, dict[str, float]]``, a
``tuple[int, ...]``, a ``list[Path]``) with ``xser.model.typecheck.check_at`` and with
``cattrs.Converter().structure``, in the same run, and shows what each says about a bad element.

    python benchmarks/bench_typecheck.py [--n 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

from bench_save_load import machine_header
from xser.model.typecheck import Mismatch, check_at

try:
    import cattrs
except ImportError:  # pragma: no cover - the comparison needs it
    cattrs = None


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    cases = [
        ("dict[str, dict[str, float]]", dict[str, dict[str, float]], {f"opt{i}": {"beta": 1, "eps": 1e-8} for i in range(args.n)}),
        ("tuple[int, ...]", tuple[int, ...], list(range(args.n))),
        ("list[Path]", list[pathlib.Path], [f"data/{i}.txt" for i in range(args.n)]),
    ]
    print(machine_header())
    print(f"# {args.n} elements per value, {args.repeats} repeats")
    print("\n| value | xser ms | cattrs ms | xser / cattrs |")
    print("|---|---|---|---|")
    conv = cattrs.Converter() if cattrs else None
    for label, tp, value in cases:
        ours = timed(lambda: check_at(value, tp), args.repeats)
        theirs = timed(lambda: conv.structure(value, tp), args.repeats) if conv else float("nan")
        print(f"| {label} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} |")
    bad = {"adam": {"beta": "high"}}
    try:
        check_at(bad, dict[str, dict[str, float]])
    except Mismatch as m:
        print(f"\nxser on a bad element: at {'.'.join(map(str, m.where))}: expected {m.expected}, got {m.value!r}")
    if conv:
        try:
            conv.structure(bad, dict[str, dict[str, float]])
        except Exception as e:  # noqa: BLE001 - whatever cattrs raises is what is being shown
            print(f"cattrs on a bad element: {type(e).__name__}: {e!s}"[:300])


if __name__ == "__main__":
    main()
