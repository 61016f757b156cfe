"""Argument types and option checks of the command line (``xser/cli.py``).

A value that is wrong by itself (a count below 1, a negative weight) or options that do not go
together (``--best`` without ``--metric``) are usage errors: argparse's message with the
subcommand's usage line, exit 2, before anything is read or written. What depends on the model
(more checkpoints asked for than it has) is the tools' ``XserError``, exit 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any

from .errors import XserError
from .storage.stores import LOCAL, is_url

__all__: list[str] = []


def _which(text: str) -> Any:
    """--checkpoint: K (0 = newest), last, or best:METRIC[:max|min]."""
    from .storage.listing import Best

    if text == "last":
        return 0
    if text.startswith("best:"):
        metric, _, mode = text[5:].partition(":")
        try:
            return Best(metric, mode or "max")
        except XserError as e:
            raise argparse.ArgumentTypeError(e.message) from None
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 0:
        raise argparse.ArgumentTypeError(f"expected K (0 = newest), last or best:METRIC[:max|min], got {text!r}")
    return k


def _whole(text: str, low: int, high: int | None = None) -> int:
    """A whole number from ``low`` (to ``high``); anything else is a usage error."""
    try:
        n = int(text)
    except ValueError:
        n = low - 1
    if n < low or (high is not None and n > high):
        span = f">= {low}" if high is None else f"from {low} to {high}"
        raise argparse.ArgumentTypeError(f"expected a whole number {span}, got {text!r}")
    return n


def _positive(text: str) -> int:
    """A count of at least one (--last, --best, --shards, ...)."""
    return _whole(text, 1)


def _precision(text: str) -> int:
    """--precision: significant digits of a text format, 1 to 17 (17 round-trips every double)."""
    return _whole(text, 1, 17)


def _culling(text: str) -> float:
    """--culling: a finite threshold >= 0."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return x


def _size(text: str) -> str:
    """--max-shard-size: checked as the exporter reads it (5GB, 500MB, 2GiB or bytes, at least 1)."""
    from .interop.safetensors import parse_size

    try:
        parse_size(text)
    except XserError as e:
        raise argparse.ArgumentTypeError(e.message) from None
    return text


def _int_list(text: str) -> list[int]:
    """--checkpoints: distinct checkpoint numbers, 0 = newest."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        ks = []
    if not ks or min(ks) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated checkpoint numbers (0 = newest), got {text!r}")
    seen: set[int] = set()
    for k in ks:
        if k in seen:
            raise argparse.ArgumentTypeError(f"checkpoint {k} is given twice")
        seen.add(k)
    return ks


def _weight_list(text: str) -> list[float]:
    """--weights: finite, non-negative, not all zero (the tools check the same; here it is a usage error)."""
    try:
        ws = [float(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        ws = []
    if not ws:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not all(math.isfinite(w) for w in ws):
        raise argparse.ArgumentTypeError(f"weights must be finite numbers, got {text!r}")
    if any(w < 0 for w in ws):
        raise argparse.ArgumentTypeError(f"weights must not be negative, got {text!r}")
    if sum(ws) == 0:
        raise argparse.ArgumentTypeError(f"weights sum to zero: {text!r}")
    return ws


def _checked(p: argparse.ArgumentParser, check: Callable[[argparse.Namespace], str | None]) -> None:
    """Check option combinations after parsing: a message from ``check`` is a usage error (exit 2) of ``p``."""

    def run(args: argparse.Namespace) -> None:
        why = check(args)
        if why:
            p.error(why)

    p.set_defaults(_check=run)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _avg_usage(args: argparse.Namespace) -> str | None:
    if args.best is not None and args.metric is None:
        return "--best needs --metric"
    if args.best is None and args.metric is not None:
        return "--metric is only used with --best"
    if args.best is None and args.mode is not None:
        return "--mode is only used with --best"
    if args.weights is not None:
        for opt, n, given in (("--last", args.last, args.last), ("--best", args.best, args.best),
                              ("--checkpoints", len(args.checkpoints or ()), ",".join(map(str, args.checkpoints or ())))):
            if given is not None and given != "" and n != len(args.weights):
                return f"--weights gives {_count(len(args.weights), 'weight')} for the {_count(n, 'checkpoint')} of {opt} {given}"
    return None


def _inspect_usage(args: argparse.Namespace) -> str | None:
    if args.checkpoint is not None and args.plot and not args.json:
        return "--checkpoint does not change --plot, which draws every checkpoint"
    return None


def _dismec_usage(args: argparse.Namespace) -> str | None:
    if args.culling and args.format is not None and args.format != "SparseTXT":
        return f"--culling applies to SparseTXT only, not {args.format}"
    return None


def _storage_option(text: str) -> tuple[str, Any]:
    """--storage-option KEY=VALUE: the value as JSON when it parses as JSON (``true``, ``5``, ``{"a": 1}``), else the
    string as given (``http://localhost:5000``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or key != key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. anon=true, endpoint_url=http://localhost:5000), got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


class _StorageOptions(argparse.Action):
    """Collects repeated --storage-option KEY=VALUE into one dict; a key given twice is a usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        found = dict(getattr(namespace, self.dest, None) or {})
        key, value = values
        if key in found:
            parser.error(f"--storage-option {key} is given twice")
        found[key] = value
        setattr(namespace, self.dest, found)


def _add_storage_options(p: argparse.ArgumentParser) -> None:
    """--storage-option KEY=VALUE (repeatable) on a subcommand: ``args.storage_options`` is a dict, or None when none
    is given (options of the fsspec filesystem of the command's URLs: s3://, gs://, hdfs://, ...)."""
    p.add_argument("--storage-option", dest="storage_options", type=_storage_option, action=_StorageOptions, default=None,
                   metavar="KEY=VALUE",
                   help="an option of the filesystem of the URLs given (s3://, gs://, hdfs://, ...), e.g. "
                   "endpoint_url=http://localhost:5000 or anon=true; VALUE is read as JSON when it is JSON, else as text; repeatable")


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The --storage-option pairs of a parsed command line (None when none was given)."""
    return getattr(args, "storage_options", None) or None


def _default_config() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "configs", "demo.yaml"), os.path.join(os.path.dirname(here), "configs", "demo.yaml")):
        if LOCAL.is_file(candidate):
            return candidate
    return os.path.join("configs", "demo.yaml")

def _ranges(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"ranges are first:count pairs separated by commas, got {text!r}") from None

def _no_model_directories(args: argparse.Namespace) -> None:
    """Every command's model argument: a directory of saved models, or a checkpoint directory, is refused with the
    model file to give instead (a Hugging Face or RecIS directory passes to the command)."""
    paths = ([args.model] if isinstance(getattr(args, "model", None), str) else []) + list(getattr(args, "models", None) or [])
    if any(is_url(p) or LOCAL.isdir(p) for p in paths):
        from .tools.inspect import not_a_model_directory

        for p in paths:  # a URL's prefix is asked of its store (with the command's --storage-option)
            not_a_model_directory(p, checkpoint_option="checkpoint" in vars(args),
                                  storage_options=_storage_options(args) if is_url(p) else None)
