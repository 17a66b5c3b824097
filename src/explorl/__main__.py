"""``python -m explorl``: the ``explorl`` command line."""

import sys

from explorl.cli import main

if __name__ == "__main__":
    sys.exit(main())
