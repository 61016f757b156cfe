"""Blocks of one parameter must tile it exactly, in bands (a manifest's check of a parameter stored as several blocks)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manifest_records import Block

__all__ = ["check_tiling"]


def check_tiling(blocks: tuple[Block, ...], shape: tuple) -> None:
    """Blocks must cover the parameter exactly, in bands: no gaps, no overlaps.

    O(n log n) in the number of blocks: along the first dimension the blocks form bands (each
    block lies inside one band), and inside each band they tile the remaining dimensions the
    same way. Every layout xser, DiSMEC++, Angel and RecIS write is of this kind (row blocks,
    grids of tiles); a block that straddles another's edge is refused.
    """
    if len(blocks) == 1 and blocks[0].start is None:
        return
    if any(b.start is None for b in blocks):
        raise ValueError("when a parameter has several blocks, each needs start and shape")
    total = math.prod(shape)
    covered = sum(math.prod(b.shape) for b in blocks)
    if total == 0:
        return  # an empty parameter: every block is empty and inside it
    if covered < total:
        raise ValueError(f"blocks cover {covered} of {total} elements: rows or columns are missing")
    _bands([(b.start, b.shape) for b in blocks], 0, shape, covered, total)


def _bands(boxes: list[tuple[tuple, tuple]], dim: int, shape: tuple, covered: int, total: int) -> None:
    if dim == len(shape):
        if len(boxes) > 1:
            raise ValueError(f"blocks at {list(boxes[0][0])} and {list(boxes[1][0])} overlap")
        return
    boxes = sorted(boxes, key=lambda b: (b[0][dim], b[1][dim]))
    lo = boxes[0][0][dim]
    expected = lo
    group: list = []
    first_of_band = None

    def close(band: list) -> None:
        _bands(band, dim + 1, shape, covered, total)

    for box in boxes:
        a, n = box[0][dim], box[1][dim]
        if group and a == group[0][0][dim]:
            if n != group[0][1][dim]:
                raise ValueError(f"blocks at {list(group[0][0])} and {list(box[0])} do not tile in bands (one straddles the other's edge)")
            group.append(box)
            continue
        if group:
            close(group)
        if a < expected:
            raise ValueError(f"blocks at {list(first_of_band[0])} and {list(box[0])} overlap")
        if a > expected:
            raise ValueError(f"blocks cover {covered} of {total} elements: rows or columns are missing")
        group = [box]
        first_of_band = box
        expected = a + n
    close(group)
    if expected != shape[dim] or lo != 0:
        raise ValueError(f"blocks cover {covered} of {total} elements: rows or columns are missing")
