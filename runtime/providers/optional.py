"""Providers whose SDK comes with an extra, imported when asked for.

:func:`openai_summarizer_class` is the one place that turns a missing ``openai`` package into
a :class:`~sessionfold.core.errors.MissingExtraError` naming the extra (the workers' wiring and
``sessionfold compact --summarizer openai`` both ask it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessionfold.core.errors import MissingExtraError

if TYPE_CHECKING:
    from .openai import OpenAISummarizer

__all__ = ["openai_summarizer_class"]


def openai_summarizer_class(what: str) -> type[OpenAISummarizer]:
    """:class:`~.openai.OpenAISummarizer`, imported now; without the ``openai`` extra a
    :class:`~sessionfold.core.errors.MissingExtraError` saying that ``what`` needs it."""
    try:
        from .openai import OpenAISummarizer
    except ModuleNotFoundError as exc:
        missing = MissingExtraError.of_missing(exc, what)
        if missing is None:
            raise
        raise missing from exc
    return OpenAISummarizer
