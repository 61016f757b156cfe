"""The ``xser`` command line. The only module that prints or exits.

Exit codes: 0 success, 1 an ``XserError`` (printed as ``error: <message>``),
2 a usage error. ``--debug`` shows the traceback of an ``XserError``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from . import __version__
from .errors import XserError

__all__ = ["main"]


def _default_config() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "configs", "demo.yaml"), os.path.join(os.path.dirname(here), "configs", "demo.yaml")):
        if os.path.isfile(candidate):
            return candidate
    return os.path.join("configs", "demo.yaml")


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    demo.run(args.config or _default_config(), args.outdir, args.experiment)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import open_model

    view = open_model(args.model, args.checkpoint)
    print("\n".join(view.lines()))
    if args.verify:
        view.data.read_all(verify=True)
        n = sum(len(p) for p in view.data.subcollections.values())
        print(f"\nverified: {n} files match their checksums")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("outdir", help="directory for the saved model")
    p.add_argument("--config", help="config file (default: the bundled configs/demo.yaml)")
    p.add_argument("--experiment", help="experiment name in the config (default: the first)")


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model spec, e.g. out/model.yaml")
    p.add_argument("--verify", action="store_true", help="check every file against its checksum")
    p.add_argument("--checkpoint", type=int, default=0, metavar="K", help="show checkpoint K (0 = newest)")


COMMANDS["demo"] = ("train, save, load and evaluate the bundled example experiment", _demo_args, cmd_demo)
COMMANDS["inspect"] = ("show a saved model's components, subcollections and metadata", _inspect_args, cmd_inspect)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xser", description="Save and inspect machine-learning experiments.")
    ap.add_argument("--version", action="version", version=f"xser {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_args, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(func=func)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except XserError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0


def main_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())
