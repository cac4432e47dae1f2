"""Where a tenant's sessions live in the store: one namespaced id, built here and nowhere else.

A tenant's session ``agent-7`` is the store's session ``tenant:acme/agent-7``. The store and the
fold runtime know nothing of tenants: the scheduler, the workers and the CLI operate the
namespaced ids like any other, and isolation is the API's alone to keep, in this module. Every
route turns the id of its path into a store id with :func:`store_id` under the caller's tenant,
so a caller can only ever name ids inside its own namespace: another tenant's session is not
found (404), exactly like one that does not exist (never 403, which would confirm it exists).

The alphabets make the mapping one to one and unambiguous: a tenant name is lower-case letters,
digits, ``_`` and ``-`` (no ``/``), so the first ``/`` after ``tenant:`` ends it; a session id of
the API is URL-safe (no ``/``), so it is one path segment.
"""

from __future__ import annotations

import re

from sessionfold.core.errors import InvalidInputError

__all__ = ["MAX_SESSION_ID_LEN", "SESSION_ID_PATTERN", "TENANT_PATTERN", "check_tenant",
           "local_id", "split_store_id", "store_id", "tenant_prefix", "without_namespace"]

#: A tenant name: what ``sessionfold keys create TENANT`` accepts.
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: A session id in the API: URL-safe, one path segment, at most 200 characters (the namespace
#: takes up to 40 of the store's 255).
MAX_SESSION_ID_LEN = 200
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@~-]{0,199}$"
_NAMESPACE = "tenant:"
_TENANT = re.compile(TENANT_PATTERN)
_SESSION = re.compile(SESSION_ID_PATTERN)
#: A store id's namespace as it appears inside a text (a library error's message).
_NAMESPACE_IN_TEXT = re.compile(_NAMESPACE + TENANT_PATTERN[1:-1] + "/")


def check_tenant(name: str) -> str:
    if not _TENANT.fullmatch(name):
        raise InvalidInputError(
            f"a tenant name is 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or "
            f"digit; got {name!r:.60}")
    return name


def tenant_prefix(tenant: str) -> str:
    """The prefix every store id of ``tenant``'s sessions starts with."""
    return f"{_NAMESPACE}{check_tenant(tenant)}/"


def store_id(tenant: str, session_id: str) -> str:
    """The store's id of ``tenant``'s session ``session_id``."""
    if not _SESSION.fullmatch(session_id):
        raise InvalidInputError(
            f"a session id is 1 to {MAX_SESSION_ID_LEN} of A-Z, a-z, 0-9 and . _ : @ ~ -, "
            f"starting with a letter or digit; got {session_id!r:.60}")
    return tenant_prefix(tenant) + session_id


def split_store_id(sid: str) -> tuple[str | None, str]:
    """``(tenant, session id)`` of a store id; ``(None, sid)`` for a session made outside the
    API (by the library, which trusted operators use directly)."""
    if sid.startswith(_NAMESPACE):
        tenant, sep, rest = sid[len(_NAMESPACE):].partition("/")
        if sep and _TENANT.fullmatch(tenant) and _SESSION.fullmatch(rest):
            return tenant, rest
    return None, sid


def without_namespace(text: str) -> str:
    """``text`` with every store id in it written as the API's id (``tenant:acme/agent-7`` as
    ``agent-7``): what the library says of a session reaches a caller in the caller's terms,
    and no answer shows the store's namespace."""
    return _NAMESPACE_IN_TEXT.sub("", text)


def local_id(tenant: str, sid: str) -> str:
    """The API's id of the store id ``sid``, which must be ``tenant``'s."""
    owner, rest = split_store_id(sid)
    if owner != tenant:
        raise InvalidInputError(f"store id {sid!r} is not a session of tenant {tenant!r}")
    return rest
