"""Weight formats: one reader/writer pair per format, in the table ``FORMATS``.

A format writes one array (or, later, one block of an array) to one file and reads
it back. The manifest records each file's format, so loading never needs to be told.
"""

from __future__ import annotations

from .npy import NPY, Format

__all__ = ["FORMATS", "Format"]

FORMATS: dict[str, Format] = {NPY.name: NPY}
