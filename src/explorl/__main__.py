import sys

from explorl.cli import main

sys.exit(main())
