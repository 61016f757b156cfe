"""The model layer: component classes, parameters, references, building and serializing.

``registry`` (tags <-> classes), ``typecheck``, ``params`` (subcollections), ``refs`` (paths and
names in spec trees), ``build`` (tree -> objects, ``!LoadSerialized``) and ``serialize``
(objects -> tree). May import ``xser.errors``, ``xser.storage`` and ``xser.spec``; never
checkpoints, the API or the tools.
"""
