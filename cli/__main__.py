"""``python -m sessionfold.cli``: the ``sessionfold`` command."""

import sys

from .main import main

sys.exit(main())
