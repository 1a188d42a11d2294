import sys

from vime.cli import main

sys.exit(main())
