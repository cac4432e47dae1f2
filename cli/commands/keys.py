"""``sessionfold keys``: the HTTP API's keys, made, listed and revoked by the operator.

::

    sessionfold keys create TENANT [--admin]   # prints the key once, on stdout
    sessionfold keys list [--tenant TENANT]
    sessionfold keys revoke KEY_ID

A key's secret is printed once and never stored (the store keeps its SHA-256 digest), so a lost
key is revoked and replaced, not recovered. A tenant exists once it has a key.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessionfold.store import SessionStore

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = subparsers.add_parser("keys", help="make, list and revoke HTTP API keys",
                                 description="The HTTP API's bearer keys, per tenant.")
    # Nested parsers are of the same class as ``keys``: bad flags exit 2 in one line.
    sub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    sub.required = True
    create = sub.add_parser("create", help="make a key for TENANT and print it once")
    create.add_argument("tenant", metavar="TENANT",
                        help="tenant name: 1-32 of a-z 0-9 _ - (made by its first key)")
    create.add_argument("--admin", action="store_true",
                        help="the key may also use the operator routes (/v1/admin/...)")
    create.set_defaults(handler=_create)
    listing = sub.add_parser("list", help="list keys (never their secrets)")
    listing.add_argument("--tenant", default=None, help="only this tenant's keys")
    listing.set_defaults(handler=_list)
    revoke = sub.add_parser("revoke", help="revoke KEY_ID (API processes stop taking it "
                            "within SESSIONFOLD_API_KEY_CACHE_S)")
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.set_defaults(handler=_revoke)


def _open() -> SessionStore:
    from sessionfold.runtime.settings import Settings
    from sessionfold.runtime.wiring import open_store

    return open_store(Settings())


def _create(args: argparse.Namespace) -> int:
    from sessionfold.service.auth import create_key

    store = _open()
    try:
        made = create_key(store, args.tenant, admin=args.admin)
    finally:
        store.close()
    kind = "admin key" if args.admin else "key"
    print(f"sessionfold keys: made {kind} {made.info.key_id} for tenant {args.tenant}; it is "
          "shown once, below", file=sys.stderr, flush=True)
    print(made.key, flush=True)
    return 0


def _list(args: argparse.Namespace) -> int:
    store = _open()
    try:
        found = store.list_api_keys(args.tenant)
    finally:
        store.close()
    print(f"{'KEY_ID':<14}{'TENANT':<34}{'ADMIN':<7}{'CREATED':<21}REVOKED", flush=True)
    for k in found:
        revoked = k.revoked_at.isoformat(timespec="seconds") if k.revoked_at else "-"
        print(f"{k.key_id:<14}{k.tenant:<34}{'yes' if k.admin else 'no':<7}"
              f"{k.created_at.isoformat(timespec='seconds')[:19]:<21}{revoked}", flush=True)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from sessionfold.core.errors import InvalidInputError

    store = _open()
    try:
        if not store.revoke_api_key(args.key_id):
            raise InvalidInputError(f"no live key {args.key_id!r} (see `sessionfold keys list`)")
    finally:
        store.close()
    print(f"sessionfold keys: revoked {args.key_id}", flush=True)
    return 0
