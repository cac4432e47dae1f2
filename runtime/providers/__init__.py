"""Summarizer providers: the :class:`~sessionfold.core.summarizers.Summarizer` protocol over a
network API, for the fold runtime.

- :mod:`.anthropic`: :class:`~.anthropic.AnthropicSummarizer`, a cheap model through the
  ``anthropic`` SDK (Messages API).
- :mod:`.openai`: :class:`~.openai.OpenAISummarizer`, any server that speaks OpenAI's chat
  completions (OpenAI, gateways, vLLM, Ollama, llama.cpp) through the ``openai`` SDK.
- What they share: :mod:`.prompt` (the prompt both send, and the one parser of its markers),
  :mod:`.sdk_errors` (both SDKs' errors mapped into sessionfold's) and :mod:`.options` (the
  checks of their constructors' options).

No provider is imported here: a provider's SDK is loaded only by the runtime that uses it (see
:func:`sessionfold.runtime.wiring.make_summarizer`).
"""

from collections.abc import Mapping
from types import MappingProxyType

from sessionfold.core.summarizers import DEFAULT_MODEL

__all__ = ["DEFAULT_CONTEXT_TOKENS", "DEFAULT_SUMMARIZER_MODELS"]

#: The model each provider summarizes with unless told (``SESSIONFOLD_SUMMARIZER_MODEL``):
#: cheap ones, and for OpenAI one that is not a reasoning model (no reasoning tokens spent out
#: of the answer's cap).
DEFAULT_SUMMARIZER_MODELS: Mapping[str, str] = MappingProxyType({
    "anthropic": DEFAULT_MODEL,
    "openai": "gpt-4.1-mini",
})

#: The most transcript tokens one call carries unless told (``SESSIONFOLD_SUMMARIZER_CONTEXT_
#: TOKENS``), kept under the default models' windows with room for the instruction and the
#: answer: Haiku's 200K; gpt-4o-mini's 128K, the smallest of the cheap OpenAI models.
DEFAULT_CONTEXT_TOKENS: Mapping[str, int] = MappingProxyType({
    "anthropic": 150_000,
    "openai": 100_000,
})
