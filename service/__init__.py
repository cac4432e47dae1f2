"""sessionfold.service: the HTTP API (``sessionfold serve``) for agents and app servers in any
language.

On top of the client, the store and the fold runtime; the CLI starts it. See :func:`create_app`
and docs/internals.md ("service").
"""

from .app import create_app

__all__ = ["create_app"]
