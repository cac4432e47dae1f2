"""Which addresses are this machine only: what a command may serve without a login or a key
(``sessionfold flower``, ``standin``, ``serve``). Standard library only, so a command checks it
before anything heavy is loaded."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (``localhost`` or a loopback address)."""
    # Names other than "localhost" are not resolved: what they resolve to can change.
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
