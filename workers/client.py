"""Deprecated path of the agent-facing client, kept for one release: use :mod:`sessionfold.client`.

``from sessionfold.workers.client import connect`` still works and warns
(:class:`DeprecationWarning`). The client moved out of the fold runtime to a package of its own,
:mod:`sessionfold.client` (what agents and app servers import); ``database_url_for`` is
:func:`sessionfold.workers.wiring.store_url`.
"""

from __future__ import annotations

import warnings

from sessionfold.client import (
    AsyncClient,
    AsyncSessionHandle,
    Client,
    OverBudget,
    SessionHandle,
    WindowView,
    connect,
    place_cache_breakpoints,
)

from .wiring import store_url as database_url_for

__all__ = [
    "AsyncClient",
    "AsyncSessionHandle",
    "Client",
    "OverBudget",
    "SessionHandle",
    "WindowView",
    "connect",
    "database_url_for",
    "place_cache_breakpoints",
]

warnings.warn("sessionfold.workers.client is deprecated and goes away in the next release: "
              "import from sessionfold.client", DeprecationWarning, stacklevel=2)
