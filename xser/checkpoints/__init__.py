"""Checkpoints: snapshot -> plan -> write -> finish -> publish, retention, partial saves.

``snapshot`` (the caller's thread: spec text, arrays, metadata), ``policy`` (retention, pure),
``saver`` (``xser.save``, ``CheckpointSaver``, ``write_new_model``), ``publish`` (recovery,
rotation, replacement, the top-level spec) and ``partial`` (``PartialSaver``). May import
``errors``, ``storage``, ``spec`` and ``model``; never the API, tools, interop or CLI.
"""
