"""Specs: YAML text <-> plain trees with locations (``yamlio``), and the saved-model file (``saved``).

May import ``xser.errors`` and ``xser.storage`` (a saved model's spec lives in its data
directory); never the model, checkpoint or tool layers.
"""

from .dumping import dump
from .yamlio import Doc, Tagged, children, format_path, iter_tagged, parse, read, read_text, rewrite_children

__all__ = ["Doc", "Tagged", "children", "dump", "format_path", "iter_tagged", "parse", "read", "read_text", "rewrite_children"]
