#!/usr/bin/env python3
"""Make a checkpoint an independent model with fresh subcollection names (the same as `xser convert`).

    python scripts/conv_checkpoints_to_model.py MODEL --out OUT [--checkpoint K | --all]
"""

import os
import sys

try:
    from xser.cli import main
except ImportError:  # run from a checkout without installing: use the package next to this script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from xser.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], command="convert", prog="conv_checkpoints_to_model.py"))
