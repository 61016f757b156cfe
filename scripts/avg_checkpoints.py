#!/usr/bin/env python3
"""Average a saved model's checkpoints into a new model (the same as `xser avg`).

    python scripts/avg_checkpoints.py MODEL --out OUT [--last N | --checkpoints 0,2 | --best N --metric M]
"""

import sys

from xser.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], command="avg", prog="avg_checkpoints.py"))
