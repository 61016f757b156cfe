"""Saves from many processes: every rank writes its part into one staging directory, rank 0 commits once.

Three rounds of the coordinator (``xser.dist.round_``; ``docs/distributed.md`` walks through them and what a
crash at each step leaves):

1. *planning the save*: each rank sends a summary of its model (components by place, each parameter's dtype,
   full shape and what the rank holds: rows, an id slice, or the whole array with its checksum). Rank 0 checks
   that the ranks agree (same components, same parameters, replicated copies equal, rows and id slices tiling
   without gaps or overlaps), maps each rank's subcollection names to its own (drawn at random per process),
   spreads the replicated arrays over the ranks, then, under the model lock, scans and recovers the model, checks
   the new checkpoint against the kept ones, and makes the staging directory and its subdirectories.
2. *writing its blocks*: each rank plans and writes its own files there (fsynced when durable); rank 0 puts the
   ranks' entries together into one manifest and writes it last, fsyncing every directory.
3. *publishing*: every rank says it is still there; rank 0 publishes (replace or rotate) and the report goes to
   every rank. A rank that failed or went silent in any round: nothing is published, the staging directory is
   removed (or, if rank 0 died, left for the next save to clean up), and every rank raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np

from ..dist import Coordinator, round_, turns
from ..errors import CheckpointError, DataError, Location
from ..model.tables import part_of
from ..storage.disk.commit import counts, finish_manifest, manifest_of, new_id, now
from ..storage.formats import FORMATS
from ..storage.fsutil import makedirs_durable, sync_files, syncfs_usable
from ..storage.manifest import STATE_DIR, new_manifest
from ..storage.payloads import Lazy
from ..storage.plan import place, plan_save
from ..storage.stores import is_url
from ..storage.write import write
from .common import SaveOptions, SaveReport
from .snapshot import Snapshot, growing

__all__ = ["HOOK", "refusing", "save_distributed"]

_log = logging.getLogger("xser")

#: tests: called on every rank with the name of each step ("planned", "written", "finished", "acknowledged",
#: "publishing") so that a test can kill a rank there
HOOK: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if HOOK is not None:
        HOOK(name)


@attrs.frozen
class _Whole:
    """What rank 0 knows of the checkpoint as a whole: what ``Prepared`` checks against the kept checkpoints."""

    spec_text: str
    structure: dict
    meta: dict
    formats: dict
    state_arrays: Any


def _digest(arr: Any) -> str:
    if isinstance(arr, Lazy):
        arr = arr.take()
    if not isinstance(arr, np.ndarray):
        raise DataError(f"a save from several processes stores arrays, got a {type(arr).__name__}")
    return FORMATS["npy"].digest(arr)[1]


def _summary(snap: Snapshot, path: str) -> dict:
    """What rank 0 needs to know of this rank's part: names, shapes, and what the rank holds of each parameter."""
    params: dict[str, dict] = {}
    for sub, items in snap.arrays.items():
        _, _, held, slices = snap.layout[sub]
        out = {}
        for name, spec in items.items():
            arr, trainable = spec[0], spec[1]
            table = part_of(name)
            if table is not None and table[0] in slices:
                sl = slices[table[0]]
                kind: tuple = ("slice", (sl.begin, sl.end, sl.size), int(arr.shape[0]))
                shape = tuple(arr.shape[1:])
            elif name in held:
                a, b, full = held[name]
                kind, shape = ("rows", (a, b)), tuple(full)
            else:
                kind, shape = ("whole", _digest(arr), int(np.prod(arr.shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize), tuple(arr.shape)
            out[name] = (kind, np.dtype(arr.dtype).str, shape, bool(trainable))
        params[sub] = out
    return {
        "path": os.path.abspath(path),
        "components": {sub: (where, cls) for sub, (where, cls, _, _) in snap.layout.items()},
        "params": params,
        "step": snap.meta["step"],
        "state": snap.state_arrays is not None,
    }


def _names(sums: list[dict]) -> list[dict[str, str]]:
    """Each rank's subcollection names mapped to rank 0's, matching components by place and class."""
    first = {where: (sub, cls) for sub, (where, cls) in sums[0]["components"].items()}
    out = []
    for r, s in enumerate(sums):
        mine = {where: (sub, cls) for sub, (where, cls) in s["components"].items()}
        extra, absent = sorted(set(mine) - set(first)), sorted(set(first) - set(mine))
        if extra or absent:
            what = f"has components at {', '.join(extra)} that rank 0's has not" if extra else f"lacks the components at {', '.join(absent)}"
            raise CheckpointError(f"rank {r}'s model {what}: every rank must save the same model")
        names = {}
        for where, (sub, cls) in mine.items():
            if cls != first[where][1]:
                raise CheckpointError(f"the component at {where} is a {first[where][1]} on rank 0 and a {cls} on rank {r}")
            names[sub] = first[where][0]
        out.append(names)
    return out


def _tile(key: str, full: int, held: list[tuple[int, int, int]], what: str) -> None:
    """``held`` ((start, stop, rank), ...) must cover ``[0, full)`` exactly."""
    at = 0
    for a, b, r in sorted(held):
        if b <= a:
            continue
        if a > at:
            raise CheckpointError(f"{key}: {what} {at}:{a} are held by no rank ({_shown(held)})")
        if a < at:
            owners = [str(q) for x, y, q in held if x < min(at, b) and y > a and q != r]
            raise CheckpointError(f"{key}: {what} {a}:{min(at, b)} are held by rank {' and rank '.join(owners + [str(r)])} ({_shown(held)})")
        at = b
    if at < full:
        raise CheckpointError(f"{key}: {what} {at}:{full} are held by no rank ({_shown(held)})")


def _shown(held: list[tuple[int, int, int]]) -> str:
    return ", ".join(f"rank {r} holds {a}:{b}" for a, b, r in sorted(held, key=lambda t: t[2]))


def _decide(sums: list[dict]) -> dict:
    """Rank 0: check that the ranks' parts make one model; who writes what, and where each part goes."""
    n = len(sums)
    paths = {s["path"] for s in sums}
    if len(paths) > 1:
        r = next(i for i, s in enumerate(sums) if s["path"] != sums[0]["path"])
        raise CheckpointError(f"rank {r} saves to {sums[r]['path']}, rank 0 to {sums[0]['path']}: every rank must name the same model")
    steps = [s["step"] for s in sums]
    if len(set(steps)) > 1:
        raise CheckpointError(f"the ranks save different steps: {', '.join(f'rank {r}: {s}' for r, s in enumerate(steps))}")
    names = _names(sums)
    back = [{v: k for k, v in m.items()} for m in names]  # rank 0's name -> the rank's own
    writes: list[list[tuple[str, str]]] = [[] for _ in range(n)]  # (the rank's own sub, param)
    at: list[dict] = [{} for _ in range(n)]  # "sub0/param" -> (first row, full shape)
    load = [0] * n
    whole = []
    slices: dict[str, list] = {}  # "sub0/table" -> [(begin, end, size, first row, rows) per rank]
    order = {sub0: list(ps) for sub0, ps in sums[0]["params"].items()}
    structure: dict = {}
    for sub0, pnames in order.items():
        structure[sub0] = {}
        pset = set(pnames)
        extra = [f"{back[r][sub0]}/{p}" for r in range(n) for p in sums[r]["params"].get(back[r][sub0], {}) if p not in pset]
        if extra:
            raise CheckpointError(f"{extra[0]}: rank 0 has no such parameter")
        for name in pnames:
            key = f"{sub0}/{name}"
            got = []
            for r in range(n):
                entry = sums[r]["params"].get(back[r][sub0], {}).get(name)
                if entry is None:
                    raise CheckpointError(f"{key}: rank {r} has no such parameter (rank 0 has)")
                got.append(entry)
            kinds = {g[0][0] for g in got}
            if len(kinds) > 1:
                shown = ", ".join(f"rank {r}: {g[0][0]}" for r, g in enumerate(got))
                raise CheckpointError(f"{key}: the ranks hold it in different ways ({shown}); every rank must declare it alike")
            dtypes, shapes = {g[1] for g in got}, {g[2] for g in got}
            if len(dtypes) > 1 or len(shapes) > 1:
                shown = ", ".join(f"rank {r}: {g[2]} {np.dtype(g[1])}" for r, g in enumerate(got))
                raise CheckpointError(f"{key}: the ranks declare different shapes or dtypes ({shown})")
            kind, dtype, shape = got[0][0][0], np.dtype(got[0][1]), got[0][2]
            if kind == "whole":
                digests = {}
                for r, g in enumerate(got):
                    digests.setdefault(g[0][1], []).append(r)
                if len(digests) > 1:
                    groups = "; ".join("rank " + ", ".join(map(str, rs)) for rs in digests.values())
                    raise CheckpointError(f"{key}: the ranks hold different values of this replicated parameter ({groups} agree); "
                                          "make them equal, or declare each rank's rows with add(..., rows=)")
                whole.append((got[0][0][2], sub0, name))
                full = shape
            elif kind == "rows":
                held = [(g[0][1][0], g[0][1][1], r) for r, g in enumerate(got)]
                _tile(key, shape[0], held, "rows")
                for a, b, r in held:
                    if b > a:
                        writes[r].append((back[r][sub0], name))
                        at[r][key] = (a, shape)
                if shape[0] == 0:
                    writes[0].append((back[0][sub0], name))
                full = shape
            else:
                table = part_of(name)[0]
                sizes = {g[0][1][2] for g in got}
                if len(sizes) > 1:
                    raise CheckpointError(f"{sub0}/{table}: the ranks' id slices have different sizes ({', '.join(f'rank {r}: {g[0][1]}' for r, g in enumerate(got))})")
                _tile(f"{sub0}/{table}", sizes.pop(), [(g[0][1][0], g[0][1][1], r) for r, g in enumerate(got)], "id buckets")
                counts = [g[0][2] for g in got]
                offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
                full = (offsets[-1],) + tuple(shape)
                for r in range(n):
                    if counts[r] or (offsets[-1] == 0 and r == 0):
                        writes[r].append((back[r][sub0], name))
                        if offsets[-1]:
                            at[r][key] = (offsets[r], full)
                slices.setdefault(f"{sub0}/{table}", [(*g[0][1], offsets[r], counts[r]) for r, g in enumerate(got)])
            structure[sub0][name] = (dtype, growing(name, tuple(full)))
    for _, sub0, name in sorted(whole, key=lambda t: -t[0]):  # replicated arrays: the largest first, to the least loaded rank
        r = min(range(n), key=lambda q: (load[q], q))
        load[r] += sums[r]["params"][back[r][sub0]][name][0][2]
        writes[r].append((back[r][sub0], name))
    dirs = list(order) + ([STATE_DIR] if any(s["state"] for s in sums) else [])
    return {"names": names, "writes": writes, "at": at, "order": order, "slices": slices, "structure": structure, "dirs": dirs}


def _write_part(rank: int, snap: Snapshot, decision: dict, options: SaveOptions) -> dict:
    """This rank's files, written into the staging directory; returns their manifest entries."""
    names = decision["names"][rank]
    mine = set(map(tuple, decision["writes"][rank]))
    arrays = {names[sub]: {n: spec for n, spec in items.items() if (sub, n) in mine} for sub, items in snap.arrays.items()}
    formats = {}
    for pattern, fmt in snap.formats.items():  # declared formats name this rank's subcollections: rank 0's names instead
        head, slash, tail = pattern.partition("/")
        formats[f"{names.get(head, head)}{slash}{tail}"] = fmt
    state = None if snap.state_arrays is None else {f"rank{rank}-{k}": v for k, v in snap.state_arrays.items()}
    plan = plan_save(arrays, spec_text=snap.spec_text if rank == 0 else None, state_tree=snap.state_tree, state_arrays=state,
                     formats=formats, blocks=options.blocks, shards=options.shards, pack=options.pack)
    plan = place(plan, decision["at"][rank], f"rank{rank:05d}")
    _step("planned")
    # durable: one syncfs for the rank's files (where it is usable: syncfs_usable) instead of one fsync each; rank 0
    # fsyncs the directories after every rank wrote (finish_manifest)
    batch = options.durable and syncfs_usable(decision["staging"])
    results = write(decision["staging"], plan, durable=options.durable and not batch,
                    threads=max(options.threads, options.shards or 0), make_dirs=False)
    if batch:
        sync_files(decision["staging"], [os.path.join(decision["staging"], r.rel) for r in results if not r.linked])
    _step("written")
    m = manifest_of(plan, results, {}, id="-", model="-")
    ts = m.get("training_state")
    if ts is not None:
        ts = {"tree": ts["tree"], "arrays": {k[len(f"rank{rank}-"):]: e for k, e in ts["arrays"].items()}}
    written, linked = counts(plan, results)
    return {"subs": m["subcollections"], "spec": m.get("spec"), "state": ts, "training": snap.meta["training"],
            "written": written, "linked": linked}


def _merge(decision: dict, parts: list[dict]) -> dict:
    """The subcollections of the manifest: every rank's entries of each parameter put together, blocks by start."""
    subs: dict[str, dict] = {}
    for sub0, pnames in decision["order"].items():
        subs[sub0] = {}
        for name in pnames:
            entries = [p["subs"][sub0][name] for p in parts if name in p["subs"].get(sub0, {})]
            entry = dict(entries[0])
            if len(entries) > 1:
                entry["blocks"] = sorted((b for e in entries for b in e["blocks"]), key=lambda b: b["start"])
            sliced = decision["slices"].get(f"{sub0}/{(part_of(name) or ('',))[0]}")
            if sliced is not None and name.endswith("@id"):
                entry["attrs"] = dict(entry.get("attrs") or {}) | {"xser": {"slices": [list(map(int, s)) for s in sliced]}}
            subs[sub0][name] = entry
    return subs


def _heard(c: Coordinator) -> None:
    """Rank 0 returns once every rank has the report: where rank 0 holds the job's store (``init_method="tcp://..."``),
    a rank 0 that exits at once must not take the store away before the others read the outcome. A rank that died
    after the commit is only logged: the checkpoint is published."""
    if c.world_size == 1:
        return
    try:
        got = c.gather(True, "reading the report")
    except CheckpointError as e:  # the checkpoint is published: this rank returns it, whatever befell the others
        _log.warning("after the commit: %s", e.message)
        return
    late = [r for r, v in enumerate(got or []) if v is not True]
    if late:
        _log.warning("rank %s did not confirm the published checkpoint (it died after the commit?)", ", ".join(map(str, late)))
        if getattr(c, "_broken", None) is not None:  # a late rank after the commit: the next save finds out for itself
            c._broken = None  # type: ignore[attr-defined]


@contextlib.contextmanager
def refusing(c: Coordinator | None) -> Iterator[None]:
    """Around what a rank does before a save's first round (its snapshot, its async copy): if it fails on a rank of
    a job, that rank still takes part in the first round, with its error, so that the others raise at once, naming
    it, instead of waiting for it until the timeout. The error is raised on this rank either way."""
    try:
        yield
    except Exception as e:
        if c is not None and c.world_size > 1:
            error = e

            def fail() -> None:
                raise error

            with turns(c).turn():
                round_(c, "planning the save", fail, lambda _: None)  # (raises e again, once the round is over)
        raise


def save_distributed(c: Coordinator, snap: Snapshot, path: str, options: SaveOptions, *, prepare: Callable[[Any], Any],
                     ticket: int | None = None) -> SaveReport:
    """One checkpoint from every rank of ``c``. ``prepare(whole)`` (rank 0, lock held) scans the model and stages the
    new checkpoint (a ``saver.Prepared``); every rank returns the report, or every rank raises. ``ticket``: this save's
    place among the saves through ``c`` (``xser.dist.turns``), taken when the program asked for it; None: now."""
    prepared: Any = None

    def plan(sums: list[dict]) -> dict:
        nonlocal prepared
        decision = _decide(sums)
        whole = _Whole(snap.spec_text, decision["structure"], dict(snap.meta, training={}), snap.formats,
                       snap.state_arrays if snap.state_arrays is not None else None)
        prepared = prepare(whole)
        staging = prepared.staging.path
        for sub in decision["dirs"]:
            makedirs_durable(os.path.join(staging, sub), durable=options.durable)
        return decision | {"staging": staging}

    def finish(parts: list[dict]) -> bool:
        for r, p in enumerate(parts):  # a backstop: each rank wrote what rank 0 asked of it, no more, no less
            got = sorted((sub, name) for sub, ps in p["subs"].items() for name in ps)
            want = sorted((decision["names"][r][sub], name) for sub, name in decision["writes"][r])
            if got != want:
                raise CheckpointError(f"rank {r} wrote {len(got)} entries, asked for {len(want)}: the ranks are out of step")
        staging = prepared.staging
        meta = dict(snap.meta, training={})
        manifest = new_manifest(meta, id=new_id(), model=prepared.model, created=now())
        manifest["spec"] = parts[0]["spec"]
        manifest["world_size"] = c.world_size
        manifest["ranks"] = [{"training": p["training"]} | ({"training_state": p["state"]} if p["state"] is not None else {})
                             for p in parts]
        manifest["subcollections"] = _merge(decision, parts)
        staging.written, staging.linked = sum(p["written"] for p in parts), sum(p["linked"] for p in parts)
        finish_manifest(staging, manifest, decision["dirs"])
        _step("finished")
        return True

    def publish(_: list) -> SaveReport:
        _step("publishing")
        return prepared.publish()

    with turns(c).turn(ticket):  # one save at a time through a coordinator, in program order on every rank
        if is_url(path):
            raise CheckpointError("a save from several processes goes to a local or shared filesystem; object stores "
                                  "(URLs) are not supported for it yet", Location(path))
        try:
            decision = round_(c, "planning the save", lambda: _summary(snap, path), plan)
            round_(c, "writing its blocks", lambda: _write_part(c.rank, snap, decision, options), finish)
            report = round_(c, "publishing", lambda: _step("acknowledged"), publish, final=True)
        finally:
            if prepared is not None:
                prepared.close()
        _heard(c)
        return report
