"""Checkpoints on a local disk: the commit protocol of directories (``docs/format.md`` sections 4 and 5).

``commit`` (stage, finish, publish by atomic exchange, leftovers), ``slots`` (recovery, rotation, replacement:
the slot renames), ``lock`` (the model lock, the listing lock and reader pins: ``flock``) and ``dirhandle``
(a directory read through its descriptor). The object-store protocol is ``storage/objects``; both sit on the
byte stores (``storage/stores``). Part of the storage layer: imports only ``xser.errors`` and the storage modules.
"""
