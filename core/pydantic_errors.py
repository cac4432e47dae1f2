"""pydantic's ValidationError in sessionfold's words, for the error tree's messages.

A caller never sees a pydantic traceback: a model it fills in (FoldPolicy, the price settings,
the runtime's Settings) raises the project's own error with :func:`explain`'s message, naming
every bad field; a message or session file names the one field :func:`first_error` picks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import ValidationError

__all__ = ["explain", "field_path", "first_error"]


def explain(what: str, exc: ValidationError, *, unknown: str | None = None,
            where: Callable[[Sequence[int | str]], str] | None = None) -> str:
    """``invalid WHAT: field: reason; ...`` for every error of ``exc``.

    The field is its dotted path (``where(loc)`` when given); the reason pydantic's, without
    its ``Value error,`` prefix, with the value a literal refused, and ``unknown`` (when given)
    for a field the model does not have.
    """
    parts = []
    for err in exc.errors(include_url=False):
        field = where(err["loc"]) if where is not None else ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg += f" (got {err['input']!r})"
        elif err["type"] == "extra_forbidden" and unknown is not None:
            msg = unknown
        parts.append(f"{field}: {msg}" if field else msg)
    return f"invalid {what}: " + "; ".join(parts)


def field_path(prefix: str, loc: Sequence[int | str]) -> str:
    """``loc`` written after ``prefix`` as a field path: ``content[1].tool_use_id``."""
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    """The field path without pydantic's union-branch labels (``str``, ``list[...]``, tags)."""
    out: list[int | str] = []
    tag_after_index = tag_next = False
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("str", "int", "dict", "list")):
            tag_next = part.startswith("tagged-union")
            tag_after_index = part.startswith("list[tagged-union")
            continue
        if tag_next:  # the discriminator value pydantic inserts into the path
            tag_next = False
            continue
        out.append(part)
        if tag_after_index and isinstance(part, int):
            tag_after_index, tag_next = False, True
    return out


def first_error(exc: ValidationError) -> tuple[Sequence[int | str], str]:
    """The one error of ``exc`` to tell a caller about: its path (see :func:`field_path`) and
    its reason."""
    # A union (``str | list[part]``) reports one error per branch; the deepest one is the branch
    # the input was meant for (a list input fails inside the list, not at "not a string").
    errors = exc.errors(include_url=False)
    err = max(errors, key=lambda e: len(e["loc"]))
    if err["type"] == "string_unicode":  # said as the checks after validation say it
        return _clean_loc(err["loc"]), ("a lone surrogate; text must be valid Unicode (UTF-8 "
                                        "cannot encode it)")
    return _clean_loc(err["loc"]), err["msg"].removeprefix("Value error, ")
