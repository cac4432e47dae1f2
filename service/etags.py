"""The window's ETag: the session's incarnation and revision, and what waiting "after" one means.

A bare revision would collide: an id deleted and created again starts over at revision 0, and an
app server holding ``"5"`` of the old session would take the new session's revision 5 for the
window it cached. The incarnation (random per created session) tells them apart::

    "3f2a9c1b7d4e6a80-17"         incarnation in hex, then the revision
    "3f2a9c1b7d4e6a80-17-openai"  the same window rendered in the OpenAI chat shape

The shape is part of the tag because the bytes differ: a client holding the Anthropic rendering
must not be told 304 for the OpenAI one. Waiting past a tag (long-poll) reads only its
incarnation and revision, whatever its shape.

:func:`changed` says whether a window has moved past an ETag, by any change (``until="change"``:
an append or a fold) or by a fold only (``until="fold"``: the session's last fold happened after
that revision). A session deleted (or re-created) since has always moved past it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sessionfold.client.shapes import WindowShape
from sessionfold.core.errors import InvalidInputError
from sessionfold.store.notify import WindowState

__all__ = ["ETAG_PATTERN", "ETag", "Until", "changed", "etag_of", "parse_etag"]

Until = Literal["change", "fold"]
#: A window ETag as this API writes it (quotes and a ``W/`` prefix optional, spaces around).
ETAG_PATTERN = r'^\s*(?:W/)?"?([0-9a-f]{1,16})-([0-9]{1,19})(-openai)?"?\s*$'
_ETAG = re.compile(ETAG_PATTERN)


@dataclass(frozen=True, slots=True)
class ETag:
    incarnation: int
    revision: int
    shape: WindowShape = "anthropic"

    def __str__(self) -> str:
        suffix = "-openai" if self.shape == "openai" else ""
        return f'"{self.incarnation:x}-{self.revision}{suffix}"'


def etag_of(state: WindowState, shape: WindowShape = "anthropic") -> ETag:
    return ETag(state.incarnation, state.revision, shape)


def parse_etag(text: str) -> ETag:
    """An ETag as this API wrote it (quotes and a ``W/`` prefix are accepted), with its
    shape."""
    match = _ETAG.fullmatch(text)
    if match is None:
        raise InvalidInputError(f"not a window ETag of this API: {text!r:.80} (expected "
                                "\"<incarnation hex>-<revision>[-openai]\", as the ETag header "
                                "said)")
    return ETag(int(match[1], 16), int(match[2]), "openai" if match[3] else "anthropic")


def changed(state: WindowState | None, after: ETag, until: Until) -> bool:
    """Whether the window in ``state`` (None: deleted) has moved past ``after``."""
    if state is None or state.incarnation != after.incarnation:
        return True
    if until == "fold":
        return state.fold_revision > after.revision
    return state.revision != after.revision
