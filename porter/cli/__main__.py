"""``python -m porter.cli``: the ``porter`` command."""

import sys

from porter.cli import main

sys.exit(main())
