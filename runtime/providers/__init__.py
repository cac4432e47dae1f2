"""Summarizer providers: the :class:`~sessionfold.core.summarizers.Summarizer` protocol over a
network API, for the fold runtime.

- :mod:`.anthropic`: :class:`~.anthropic.AnthropicSummarizer`, a cheap model through the
  ``anthropic`` SDK.

Nothing is imported here: a provider's SDK is loaded only by the runtime that uses it (see
:func:`sessionfold.runtime.wiring.make_summarizer`).
"""
