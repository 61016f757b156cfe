"""Storage: everything between arrays and files. Imports only ``xser.errors`` (and numpy, xxhash).

Formats (``formats/``), checksums, the manifest schema (``manifest.py``), training-state
encoding, opened data directories (``opened.py``: reads relative to one directory descriptor),
consistent checkpoint listings (``listing.py``), the write plan (``plan.py``), writers on N
threads (``write.py``), the commit protocols of a local disk (``disk/``: ``finish``, ``publish``, the locks)
and of object stores (``objects/``) on the byte stores (``stores/``), and
the names on disk (``layout.py``). Nothing here knows YAML or component classes.
"""
