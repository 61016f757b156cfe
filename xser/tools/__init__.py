"""Tools on saved models without their component classes: average, convert, ensemble, inspect.

They read spec text as plain trees and data through opened checkpoints (``storage``), and write
their outputs with ``checkpoints.saver.write_new_model``. May import every layer below the API
and the API itself; never the CLI.
"""
