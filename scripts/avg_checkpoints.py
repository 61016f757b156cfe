#!/usr/bin/env python3
"""Average a saved model's checkpoints into a new model (the same as `xser avg`).

    python scripts/avg_checkpoints.py MODEL --out OUT [--last N | --checkpoints 0,2 | --best N --metric M]
"""

import os
import sys

try:
    from xser.cli import main
except ImportError:  # run from a checkout without installing: use the package next to this script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from xser.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], command="avg", prog="avg_checkpoints.py"))
