"""Deprecated path of the ``sessionfold`` command, kept for one release: use
:mod:`sessionfold.cli` (``python -m sessionfold.cli``, or the ``sessionfold`` script).

``python -m sessionfold.workers.cli ARGS`` still runs the command, and warns
(:class:`DeprecationWarning`, shown on stderr when run this way); so does importing ``main`` or
``build_parser`` from here.
"""

from __future__ import annotations

import sys
import warnings

from sessionfold.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

# Run as ``python -m``, this module is __main__, where Python shows DeprecationWarning by default.
warnings.warn("sessionfold.workers.cli is deprecated and goes away in the next release: run "
              "`sessionfold` or `python -m sessionfold.cli`", DeprecationWarning,
              stacklevel=1 if __name__ == "__main__" else 2)

if __name__ == "__main__":
    sys.exit(main())
