"""Checkpoints on an object store (S3, GCS, HDFS, memory, any fsspec URL): the commit-record protocol.

Object stores have no atomic rename, no directories and no locks, so a model there is kept as
immutable checkpoints, each written once under its own prefix and never moved, and a sequence of
small commit records, each created with a conditional write (``If-None-Match``), the newest of which
says which checkpoints the model has. ``opened.RemoteDir`` reads one checkpoint; ``staging`` writes one
(its prefix, the spool, the uploads); ``commit`` lists, commits and cleans up. ``docs/format.md`` section 6
walks through every step and what a crash at each leaves. Part of the storage layer: imports only ``xser.errors`` and the storage modules.
"""
