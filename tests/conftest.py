import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import components  # noqa: E402,F401  (registers the test components)
