"""sessionfold.service: the HTTP API (``sessionfold serve``) for agents and app servers in any
language.

On top of the client, the store and the fold runtime; the CLI starts it. See :func:`create_app`
and docs/internals.md ("service").

The app (FastAPI, the ``api`` extra) is imported on first use of :func:`create_app`, so that
the modules that need no web framework (:mod:`.tenancy`, :mod:`.auth`) import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
