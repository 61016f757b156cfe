"""The ``xser`` command line. The only module that prints or exits.

Exit codes: 0 success, 1 an ``XserError`` (printed as ``error: <message>``),
2 a usage error. ``--debug`` shows the traceback of an ``XserError``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ._version import __version__
from ._cli_options import (_add_storage_options, _default_config, _no_model_directories, _ranges, _avg_usage, _checked, _culling, _dismec_usage, _inspect_usage, _int_list, _positive,
                           _precision, _size, _storage_options, _weight_list, _which)
from .errors import XserError
from .storage.fsutil import to_devnull

__all__ = ["main"]


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo

    demo.run(args.config or _default_config(), args.outdir, args.experiment)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .errors import CheckpointError, Location
    from .tools.inspect import foreign_kind, json_text, open_model, tensor_lines, verify_model

    so = _storage_options(args)
    kind = foreign_kind(args.model, storage_options=so)
    if kind is not None:  # not an xser model: its tensors, by name
        for given, opt in ((args.json, "--json"), (args.plot, "--plot"), (args.verify, "--verify"), (args.checkpoint is not None, "--checkpoint")):
            if given:
                raise CheckpointError(f"{opt} reads saved xser models (MODEL.yaml); this is a {kind} model, whose tensors "
                                      "inspect lists without it", Location(args.model))
        print("\n".join(tensor_lines(args.model, storage_options=so)))
        return 0
    checkpoint = 0 if args.checkpoint is None else args.checkpoint
    if args.json or args.plot:
        from .tools.trajectory import plot, trajectory

        report = trajectory(args.model, verify=args.verify, storage_options=so)
        if args.plot:
            plot(report, args.plot, storage_options=so)
        if args.json:
            view = open_model(args.model, checkpoint, storage_options=so)
            try:
                contents = view.as_json()
            finally:
                view.data.close()
            print(json_text({**contents, **report, "model": args.model}))
            return 0
        print(f"wrote {args.plot}: metrics over steps and each checkpoint's relative L2 distance to the newest")
        return 0
    view = open_model(args.model, checkpoint, storage_options=so)
    try:
        print("\n".join(view.lines()))
    finally:
        view.data.close()
    if args.verify:
        print("")
        for line in verify_model(args.model, storage_options=so):
            print(f"verified {line}")
    return 0


def cmd_avg(args: argparse.Namespace) -> int:
    from .tools.average import average

    report = average(  # a progress bar on a terminal (storage.progress), as every long operation has
        args.model, args.out, last=args.last, checkpoints=args.checkpoints, best=args.best, metric=args.metric,
        mode=args.mode or "max", weights=args.weights, accumulate=args.accumulate, force=args.force,
        verify=not args.no_verify, missing=args.missing, drop_slots=args.drop_slots, storage_options=_storage_options(args),
    )
    used = ", ".join(
        f"{os.path.basename(c.path)} (step {c.step if c.step is not None else '-'}, weight {w:g})"
        for c, w in zip(report.checkpoints, report.weights)
    )
    print(f"averaged {len(report.checkpoints)} checkpoints of {args.model}: {used}")
    print(f"  {len(report.averaged)} arrays averaged in {args.accumulate}")
    for note in report.notes:
        print(f"  note: {note}")
    for name in report.copied:
        print(f"  copied, not averaged: {name}")
    print(f"wrote {report.out} and {report.out}.data/")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .tools.convert import convert, convert_all

    kw = dict(keep_training_state=args.keep_training_state, force=args.force, verify=not args.no_verify,
              storage_options=_storage_options(args))
    reports = convert_all(args.model, args.out, **kw) if args.all else [convert(args.model, args.out, checkpoint=args.checkpoint, **kw)]
    for r in reports:
        print(f"{os.path.basename(r.source)} -> {r.out} ({len(r.renamed)} subcollections renamed)")
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    from .tools.ensemble import ensemble

    r = ensemble(args.models, args.out, rename=args.rename, path=args.path, name=args.name, force=args.force,
                 verify=not args.no_verify, storage_options=_storage_options(args))
    print(f"wrote {r.out}: an !Ensemble of {len(r.members)} members")
    for (i, old), new in sorted(r.renamed.items()):
        print(f"  member {i}: {old} renamed to {new}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    so = _storage_options(args)
    if args.system == "dismec":
        from .interop.dismec import import_dismec

        name = import_dismec(args.source, args.out, force=args.force, partial=args.partial, storage_options=so)
        print(f"imported {args.source} as {args.out} (parameter {name}/weights)")
    elif args.system == "angel":
        from .interop.angel import import_angel

        name = import_angel(args.source, args.out, force=args.force, sep=args.sep, storage_options=so)
        print(f"imported {args.source} as {args.out} (parameter {name}/values)")
    elif args.system == "recis":
        from .interop.recis import import_recis

        name = import_recis(args.source, args.out, force=args.force, storage_options=so)
        print(f"imported {args.source} as {args.out} (subcollection {name})")
    elif args.system == "safetensors":
        from .interop.safetensors import import_safetensors

        name = import_safetensors(args.source, args.out, force=args.force, format=args.format, storage_options=so)
        print(f"imported {args.source} as {args.out} (subcollection {name})")
    else:
        from .interop.xnmt import import_xnmt

        dirs = import_xnmt(args.source, args.out, force=args.force, storage_options=so)
        print(f"imported {args.source} as {args.out} with {len(dirs)} checkpoints ({', '.join(d.rstrip('/').rsplit('/', 1)[-1] for d in dirs)})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    so = _storage_options(args)
    if args.system == "dismec":
        from .interop.dismec import export_dismec

        written = export_dismec(
            args.model, args.param, args.out, format=args.format, precision=args.precision, culling=args.culling,
            split_files=args.split_files, checkpoint=args.checkpoint, layout=args.layout, ranges=args.ranges, force=args.force,
            storage_options=so,
        )
    elif args.system == "angel":
        from .interop.angel import export_angel

        written = export_angel(
            args.model, args.param, args.out, format=args.format, matrix_name=args.name, block_rows=args.block_rows,
            sep=args.sep, checkpoint=args.checkpoint, per_file=args.per_file, row_type=args.row_type, force=args.force,
            storage_options=so,
        )
    elif args.system == "recis":
        from .interop.recis import export_recis

        written = export_recis(args.model, args.out, checkpoint=args.checkpoint, shards=args.shards, parallel=args.parallel,
                               force=args.force, storage_options=so)
    elif args.system == "safetensors":
        from .interop.safetensors import export_safetensors

        report = export_safetensors(
            args.model, args.out, path=args.path, checkpoint=args.checkpoint, max_shard_size=args.max_shard_size, force=args.force,
            verify=not args.no_verify, storage_options=so,
        )
        written = list(report.files)
    else:
        from .interop.xnmt import export_xnmt

        written = export_xnmt(args.model, args.out, force=args.force, storage_options=so)
    for path in written:
        print(f"wrote {path}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("outdir", help="directory for the saved model")
    p.add_argument("--config", help="config file (default: the bundled configs/demo.yaml)")
    p.add_argument("--experiment", help="experiment name in the config (default: the first)")


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model spec, e.g. out/model.yaml")
    p.add_argument("--verify", action="store_true", help="check every file against its checksum")
    p.add_argument("--checkpoint", type=_which, metavar="K|last|best:METRIC[:min]", help="show checkpoint K (0 = newest, the default); last; or the best by a recorded metric")
    p.add_argument("--json", action="store_true",
                   help="per checkpoint: step, time, metrics and the relative L2 distance of its weights to the newest, as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="draw the metrics over steps and those distances (needs matplotlib: xser[plot])")
    _add_storage_options(p)
    _checked(p, _inspect_usage)


def _avg_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model whose checkpoints (.data, .data.1, ...) are averaged")
    p.add_argument("--out", required=True, help="the new model's spec path (its data goes to OUT.data/)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--last", type=_positive, metavar="N", help="the N newest checkpoints (the model must have N)")
    sel.add_argument("--checkpoints", type=_int_list, metavar="I,J,...", help="these checkpoints (0 = newest)")
    sel.add_argument("--best", type=_positive, metavar="N", help="the N best by --metric (at least N checkpoints must record it)")
    p.add_argument("--metric", help="metric recorded with the checkpoints, for --best")
    p.add_argument("--mode", choices=("max", "min"), help="for --best: higher (max, the default) or lower (min) is better")
    p.add_argument("--weights", type=_weight_list, metavar="W0,W1,...",
                   help="weighted mean, one weight (finite, >= 0, not all 0) per selected checkpoint, newest first")
    p.add_argument("--accumulate", choices=("float64", "float32"), default="float64", help="sum in this precision (float32 is faster)")
    p.add_argument("--missing", choices=("present", "zero"), default="present",
                   help="hash tables: a row is the mean over the checkpoints that hold its id (present) or over all, absent rows as zeros")
    p.add_argument("--drop-slots", action="store_true", help="hash tables: leave the optimizer slots out of the average")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--no-verify", action="store_true", help="skip checking the inputs' checksums (they are checked by default)")
    _add_storage_options(p)
    _checked(p, _avg_usage)


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="saved model")
    p.add_argument("--out", required=True, help="the new model's spec path (with --all: OUT.0.yaml, OUT.1.yaml, ...)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=_which, default=0, metavar="K|last|best:METRIC[:min]", help="the checkpoint to convert (0 = newest); last; or the best by a recorded metric")
    which.add_argument("--all", action="store_true", help="convert every checkpoint")
    p.add_argument("--keep-training-state", action="store_true", help="keep the checkpoint's training_state (dropped by default)")
    p.add_argument("--force", action="store_true", help="replace outputs that exist")
    p.add_argument("--no-verify", action="store_true", help="skip checking the inputs' checksums (they are checked by default)")
    _add_storage_options(p)


def _ensemble_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", help="saved models, the members in this order")
    p.add_argument("--out", required=True, help="the ensemble's spec path")
    p.add_argument("--rename", action="store_true", help="give members fresh subcollection names where they clash")
    p.add_argument("--path", default="", help="dotted path of the part of each model to use (default: the whole experiment)")
    p.add_argument("--name", help="the ensemble's experiment name (default: OUT's file name without .yaml)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--no-verify", action="store_true", help="skip checking the inputs' checksums (they are checked by default)")
    _add_storage_options(p)


def _import_args(p: argparse.ArgumentParser) -> None:
    systems = p.add_subparsers(dest="system", metavar="SYSTEM", required=True)
    for name, source in (
        ("dismec", "DiSMEC++ metadata JSON file"),
        ("angel", "Angel matrix directory (the one holding _meta)"),
        ("xnmt", "XNMT saved model file (e.g. tiny.mod)"),
        ("safetensors", "safetensors file, or a Hugging Face directory (model.safetensors or a sharded index)"),
        ("recis", "RecIS checkpoint directory (index, tensorkey.json, model-*-of-*.safetensors)"),
    ):
        q = systems.add_parser(name, help=f"import a {source.split(' ')[0].rstrip(',')} model", description=f"import a {source}")
        q.add_argument("source", help=source)
        q.add_argument("out", help="the xser model to write (spec path)")
        q.add_argument("--force", action="store_true", help="replace OUT if it exists")
        if name == "safetensors":
            q.add_argument("--format", default="npy", choices=("npy", "safetensors"), help="weight format of the new model")
        if name == "angel":
            q.add_argument("--sep", help="separator of the text formats, a regular expression as Angel's reader takes it "
                           "(text.format.filed.sep; default: found in the files)")
        _add_storage_options(q)
        if name == "dismec":
            q.add_argument("--partial", action="store_true", help="import the label ranges present when some are missing (a checkpoint of an unfinished run)")


def _export_args(p: argparse.ArgumentParser) -> None:
    systems = p.add_subparsers(dest="system", metavar="SYSTEM", required=True)
    q = systems.add_parser("dismec", help="one matrix as DiSMEC++ metadata and weight files")
    q.add_argument("model", help="saved xser model")
    q.add_argument("param", help="SUBCOLLECTION/PARAM or the component path (model.out.W), as `xser inspect` lists them")
    q.add_argument("out", help="the metadata JSON file to write (weight files go beside it)")
    q.add_argument("--force", action="store_true", help="replace existing files")
    q.add_argument("--format", default=None, help="DenseTXT, SparseTXT or DenseNPY (default: as recorded at import, else DenseTXT)")
    q.add_argument("--layout", default="auto", choices=("auto", "split", "cli"),
                   help="file names and ranges: as recorded at import (auto), save_model's -K-of-N (split) or train's -<first>-<last> (cli)")
    q.add_argument("--ranges", type=_ranges, metavar="F:C,...", help="explicit label ranges, first:count pairs from label 0")
    q.add_argument("--precision", type=_precision, default=None,
                   help="significant digits in text formats (default: as found in the imported files, else DiSMEC++'s 6; lower than the data needs warns)")
    q.add_argument("--culling", type=_culling, default=0.0, help="SparseTXT: write only |w| > this")
    q.add_argument("--split-files", type=_positive, default=4096, help="labels per weight file, as DiSMEC++ splits them")
    q.add_argument("--checkpoint", type=_which, default=0, metavar="K|last|best:METRIC[:min]", help="export checkpoint K (0 = newest); last; or the best by a recorded metric")
    _checked(q, _dismec_usage)
    q = systems.add_parser("angel", help="one matrix as an Angel matrix directory (_meta and partition files)")
    q.add_argument("model", help="saved xser model")
    q.add_argument("param", help="SUBCOLLECTION/PARAM or the component path (model.out.W), as `xser inspect` lists them")
    q.add_argument("out", help="directory to write the matrix directory into")
    q.add_argument("--force", action="store_true", help="replace an existing matrix directory")
    q.add_argument("--format", help="value-binary, colid-value-binary, rowid-colid-value-binary, value-text, colid-value-text, "
                   "rowid-colid-value-text, binary-column or text-column (default: as imported, else colid-value-text)")
    q.add_argument("--name", help="matrix name (default: as imported, else the parameter's name)")
    q.add_argument("--block-rows", type=_positive, help="rows per partition (default: the imported partitions, else one partition)")
    q.add_argument("--per-file", type=_positive, metavar="N",
                   help="partitions per data file at most, grouped by halving as Angel's PS does "
                   "(angel.ps.max.partition.number.single.file; default: the imported files, else 5)")
    q.add_argument("--sep", help="separator of the text formats (default: as imported, else Angel's ,)")
    q.add_argument("--row-type", type=int, metavar="N",
                   help="Angel's RowType number: 0-6 double, 7-13 float, 14-20 long, 21-27 int values; dense, sparse (+3), "
                   "long keys (default: as imported, else dense with int keys)")
    q.add_argument("--checkpoint", type=_which, default=0, metavar="K|last|best:METRIC[:min]", help="export checkpoint K (0 = newest); last; or the best by a recorded metric")
    q = systems.add_parser("xnmt", help="the model and all checkpoints as XNMT's YAML and DyNet text files")
    q.add_argument("model", help="saved xser model")
    q.add_argument("out", help="the XNMT model file to write (data goes to OUT.data, OUT.data.1, ...)")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q = systems.add_parser("recis", help="the model as a RecIS checkpoint directory (hash tables and dense tensors)")
    q.add_argument("model", help="saved xser model")
    q.add_argument("out", help="directory to write (appears whole, by a rename)")
    q.add_argument("--shards", type=_positive, default=1, help="RecIS's number of shards (GPUs): ids split by id %% 65536")
    q.add_argument("--parallel", type=_positive, default=4, help="writer threads per shard (files per shard, at most)")
    q.add_argument("--checkpoint", type=_which, default=0, metavar="K|last|best:METRIC[:min]", help="export checkpoint K (0 = newest); last; or the best by a recorded metric")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q = systems.add_parser("safetensors", help="the model as Hugging Face safetensors (model.safetensors, or shards and an index)")
    q.add_argument("model", help="saved xser model")
    q.add_argument("out", help="directory to write (appears whole, by a rename)")
    q.add_argument("--path", default="", metavar="COMPONENT",
                   help="dotted path of the component or submodule to export, keys relative to it (model.lm gives bert.embeddings... "
                   "for model.lm.bert.embeddings...; default: the whole experiment)")
    q.add_argument("--max-shard-size", type=_size, metavar="SIZE", help="write shards of at most SIZE (5GB, 500MB, 2GiB) and model.safetensors.index.json")
    q.add_argument("--checkpoint", type=_which, default=0, metavar="K|last|best:METRIC[:min]", help="export checkpoint K (0 = newest); last; or the best by a recorded metric")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.add_argument("--no-verify", action="store_true", help="skip checking the checkpoint's checksums")
    for q in systems.choices.values():
        _add_storage_options(q)


COMMANDS["demo"] = ("train, save, load and evaluate the bundled example experiment", _demo_args, cmd_demo)
COMMANDS["avg"] = ("write a model whose parameters are the mean of a model's checkpoints", _avg_args, cmd_avg)
COMMANDS["convert"] = ("make a checkpoint an independent model with fresh subcollection names", _convert_args, cmd_convert)
COMMANDS["ensemble"] = ("write one model whose !Ensemble members are the given models", _ensemble_args, cmd_ensemble)
COMMANDS["import"] = ("make an xser model of another system's model files (DiSMEC++, Angel, XNMT, safetensors, RecIS)", _import_args, cmd_import)
COMMANDS["export"] = ("write a model or a parameter in another system's format (DiSMEC++, Angel, XNMT, safetensors, RecIS)", _export_args, cmd_export)
COMMANDS["inspect"] = ("show a saved model's components, subcollections and metadata", _inspect_args, cmd_inspect)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xser", description="Save and inspect machine-learning experiments.")
    ap.add_argument("--version", action="version", version=f"xser {__version__}")
    ap.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_args, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors")
        add_args(p)
        p.set_defaults(func=func)
    return _described(ap)


def _described(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give each subcommand without a description its one-line help as one, at every depth (``--help`` shows it)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    sub.description = helps[name]
                _described(sub)
    return p


def command_parser(name: str, prog: str) -> argparse.ArgumentParser:
    """A stand-alone parser for one subcommand (for the scripts in scripts/)."""
    help_text, add_args, func = COMMANDS[name]
    p = argparse.ArgumentParser(prog=prog, description=help_text)
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    add_args(p)
    p.set_defaults(func=func)
    return _described(p)


def main(argv: list[str] | None = None, *, command: str | None = None, prog: str | None = None) -> int:
    """Run the CLI; with ``command``, run only that subcommand (as ``prog``)."""
    ap = parser() if command is None else command_parser(command, prog or f"xser {command}")
    args = ap.parse_args(argv)
    if getattr(args, "_check", None) is not None:  # option combinations: a usage error (exit 2), before any work
        args._check(args)
    try:
        _no_model_directories(args)
        return args.func(args)
    except XserError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head & co. (before OSError, of which it is one)
        to_devnull(sys.stdout.fileno())  # the interpreter's last flush at exit then goes nowhere
        return 0
    except OSError as e:  # a path the command was given cannot be made or written (a file in the way, /proc, ...)
        if args.debug:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main_exit() -> None:
    """Console-script entry point."""
    sys.exit(main())


def _command_exit(command: str) -> None:
    sys.exit(main(sys.argv[1:], command=command, prog=f"xser-{command}"))


def avg_exit() -> None:
    """``xser-avg``: the same as ``xser avg`` (and ``scripts/avg_checkpoints.py``)."""
    _command_exit("avg")


def convert_exit() -> None:
    """``xser-convert``: the same as ``xser convert`` (and ``scripts/conv_checkpoints_to_model.py``)."""
    _command_exit("convert")


def ensemble_exit() -> None:
    """``xser-ensemble``: the same as ``xser ensemble``."""
    _command_exit("ensemble")


def inspect_exit() -> None:
    """``xser-inspect``: the same as ``xser inspect``."""
    _command_exit("inspect")
