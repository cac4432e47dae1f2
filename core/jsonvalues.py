"""What a value inside a message may be: JSON that every reader of a stored message can read back.

A message sessionfold accepts is written as JSON (the store's ledger and window, ``sessionfold
compact``'s output, a request to the provider) and read back by other decoders: pydantic-core
(the store's reader, which stops near 200 levels of nesting), Python's ``json`` (bounded by the
interpreter's recursion limit and its int-to-string digit limit), PostgreSQL's ``json`` type,
and the Messages API itself. A value one of them cannot take must be refused when it comes in,
naming where it is, not found later by a reader that then cannot open the session at all.

So, inside a message:

- nesting is at most :data:`MAX_NESTING_DEPTH` levels of objects and arrays below a content
  block (a tool_use ``input`` is level 1, a key in it level 2, ...). Tool inputs real agents send
  nest a handful of levels; 64 leaves room for any honest schema and keeps the whole stored
  message (3 levels above the block) plus any envelope around it (a request body, an export)
  far under every decoder above;
- text is valid Unicode: a lone surrogate (``"\\ud800"``, legal in a JSON escape and a Python
  string) cannot be encoded as UTF-8, so no database, file or request can carry it;
- numbers are JSON numbers: no NaN or infinity (not JSON; PostgreSQL refuses them), and integers
  of at most :data:`MAX_INT_DIGITS` digits (the lowest int-to-string limit a Python process can
  set, so any Python reader converts them);
- keys are strings, and values are only ``dict``/``list``/``tuple``/``str``/``int``/``float``/
  ``bool``/``None`` (or pydantic models of those: the blocks themselves).

NUL (``"\\x00"``) is text like any other here: JSON escapes it, and the store keeps messages in
``json`` columns, which hold the escape on both backends.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING_DEPTH",
    "UnfitValue",
    "UnreadableJSON",
    "check_json_value",
    "check_text",
    "find_lone_surrogate",
    "read_json",
    "replace_lone_surrogates",
]

#: Levels of objects and arrays a value inside a content block may nest (the value is level 1).
MAX_NESTING_DEPTH = 64
#: Digits an integer inside a message may have (``sys.set_int_max_str_digits`` cannot go lower).
MAX_INT_DIGITS = 640

_INT_BOUND = 10**MAX_INT_DIGITS
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,40}")
_PATH_ROOM = 160  # characters of a field path worth showing; deeper parts read as "…"


class UnfitValue(Exception):
    """A value no reader could take back: ``path`` says where (``input.rows[3]``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def find_lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (None: it is valid Unicode).

    A Python string decoded strictly from UTF-8 never holds one; JSON's ``\\ud800`` escape and
    ``surrogateescape`` decoding do.
    """
    if text.isascii():  # most text, and a scan of its flag only
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def replace_lone_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD.

    For text sessionfold writes from a model's output (a summary): a caller's message with one is
    refused, but a summarizer's reply is data to keep, and one bad character must not make the
    fold that carries it impossible to commit.
    """
    if find_lone_surrogate(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)


def check_text(text: str, path: str) -> None:
    """UnfitValue if ``text`` holds a lone surrogate (UTF-8, so every store, refuses it)."""
    at = find_lone_surrogate(text)
    if at is not None:
        raise UnfitValue(path, f"a lone surrogate (U+{ord(text[at]):04X}) at character {at}; "
                               "text must be valid Unicode (UTF-8 cannot encode it)")


def check_json_value(value: Any, path: str, *, level: int = 1) -> None:
    """UnfitValue naming the first part of ``value`` that is not JSON every reader takes back.

    ``level`` is the nesting level of ``value`` itself (see the module doc). The walk goes no
    deeper than the limit, so a value nested 100,000 levels (or one that contains itself) is
    refused without exhausting the interpreter's stack.
    """
    if isinstance(value, str):
        check_text(value, path)
    elif value is None or isinstance(value, bool):
        return
    elif isinstance(value, int):
        if not -_INT_BOUND < value < _INT_BOUND:
            raise UnfitValue(path, f"an integer of more than {MAX_INT_DIGITS} digits; JSON "
                                   "readers (Python's among them) refuse such numbers")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UnfitValue(path, f"{value!r} is not a JSON number")
    elif isinstance(value, Mapping | list | tuple | BaseModel):
        if level > MAX_NESTING_DEPTH:
            raise UnfitValue(path, f"nested deeper than {MAX_NESTING_DEPTH} levels of objects "
                                   "and arrays (sessionfold's limit, MAX_NESTING_DEPTH)")
        _check_container(value, path, level)
    else:
        raise UnfitValue(path, f"a {type(value).__name__} is not a JSON value")


def _check_container(value: Mapping[Any, Any] | list[Any] | tuple[Any, ...] | BaseModel,
                     path: str, level: int) -> None:
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_json_value(item, _index(path, i), level=level + 1)
        return
    items = iter(value) if isinstance(value, BaseModel) else iter(value.items())
    for key, item in items:
        if not isinstance(key, str):
            raise UnfitValue(path, f"a key of type {type(key).__name__}; JSON keys are strings")
        check_text(key, path)
        check_json_value(item, _key(path, key), level=level + 1)


def _key(path: str, key: str) -> str:
    if len(path) > _PATH_ROOM:
        return path if path.endswith("…") else f"{path}.…"
    return f"{path}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{path}[{key[:40]!a}]"


def _index(path: str, i: int) -> str:
    if len(path) > _PATH_ROOM:
        return path if path.endswith("…") else f"{path}.…"
    return f"{path}[{i}]"


class UnreadableJSON(Exception):
    """JSON text no reader should be handed: the message says why (``not JSON (...)``).
    ``malformed``: the text is not JSON at all (rather than JSON past a reader's limits)."""

    def __init__(self, reason: str, *, malformed: bool = False) -> None:
        super().__init__(reason)
        self.malformed = malformed


def read_json(text: str | bytes, *, line: int | None = None) -> Any:
    """``json.loads`` of a message-bearing text (a session file, a tool call's arguments), with
    what it raises beyond JSONDecodeError turned into UnreadableJSON.

    Python's decoder recurses once per level (RecursionError near 1,000 levels, before any
    limit of ours can be checked) and refuses integers longer than the interpreter's digit limit
    with a bare ValueError; bytes must be UTF-8. ``line``: the text is that line of a file (an
    error then names its column).
    """
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}" if line is None else f"column {exc.colno}"
        raise UnreadableJSON(f"not JSON ({where}: {exc.msg})", malformed=True) from None
    except UnicodeDecodeError as exc:
        raise UnreadableJSON(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise UnreadableJSON(f"JSON nested too deep to read (a value inside a message may nest "
                           f"{MAX_NESTING_DEPTH} levels)") from None
    except ValueError as exc:  # int-to-string digit limit; the message quotes no input
        raise UnreadableJSON(f"JSON with a number of more than {sys.get_int_max_str_digits()} "
                           f"digits ({exc}); a message holds integers of at most "
                           f"{MAX_INT_DIGITS} digits") from None
