"""Session files read from disk, for the commands (``compact``, ``replay``, ``demo``).

The engine parses a session file's text (:func:`sessionfold.core.session_files.
load_conversation_json`) and does no I/O; reading the file is the caller's, here.
"""

from __future__ import annotations

from pathlib import Path

from sessionfold.core.errors import InvalidMessageError
from sessionfold.core.messages import Conversation
from sessionfold.core.session_files import load_conversation_json

__all__ = ["load_conversation_file"]


def load_conversation_file(path: str | Path) -> Conversation:
    """Read a session file and load it (see :func:`load_conversation_json`); a file that cannot
    be read is an :class:`InvalidMessageError` naming it, as bad content is."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InvalidMessageError(f"{p}: no such file") from None
    except OSError as exc:
        raise InvalidMessageError(f"{p}: cannot read ({exc})") from None
    return load_conversation_json(raw, source=str(p))
