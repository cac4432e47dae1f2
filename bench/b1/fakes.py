"""The scripted model and the fake summarizer every system shares, on one scaled clock.

- The *scripted model* answers each call with the transcript's next assistant message; it takes
  ``MODEL_SECONDS`` (4.0 s) of latency per call.
- The *fake summarizer* answers with the identifier digest (:func:`b1.needed.digest_summary`,
  at most ``SUMMARY_TOKENS`` = 300 tokens) of the material it is given -- the conversation part
  of the system's summarizer prompt, which each adapter cuts out of its own prompt -- listing
  only identifiers the replayed conversation named (``vocabulary``, set by the replay for each
  transcript); after ``SUMMARIZER_SECONDS`` (2.0 s). Identifiers the prompt asks it to keep
  (sessionfold's ``must_keep``) come first, inside the same cap. Every system gets the same
  function, so needed-context recall compares policies, not summarizer luck. The prompt as a
  whole is what the summarizer is billed for.

Both latencies are multiplied by one ``time_scale`` so a run takes minutes; the *ratio* is what
matters (a background fold helps only if it lands between two calls), and it is kept.

Each summarizer call records whether it ran on the agent's thread -- the thread that replays the
transcript and calls the model. A summarizer call there is latency the agent waits for; one on a
background thread is not. This is measured, not assumed: the background system's folds run on a
real thread of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .counting import Counter
from .needed import digest_summary

__all__ = [
    "MODEL_SECONDS",
    "SUMMARIZER_SECONDS",
    "SUMMARY_TOKENS",
    "FakeSummarizer",
    "ScriptedModel",
    "SummarizerCall",
]

MODEL_SECONDS = 4.0
SUMMARIZER_SECONDS = 2.0
SUMMARY_TOKENS = 300


@dataclass(frozen=True)
class SummarizerCall:
    """One summarizer call: its tokens, its nominal latency, where it ran."""

    input_tokens: int
    output_tokens: int
    #: Latency in model time: the fake's 2.0 s (what an agent waiting on it loses).
    seconds: float
    #: The sleep as measured, divided by the time scale (a loaded machine oversleeps).
    measured_s: float
    on_agent_thread: bool
    #: Answered through a provider's batch API (billed at its batch rate, never on the agent's
    #: path: the provider answers it while the agent goes on).
    batch: bool = False


@dataclass
class FakeSummarizer:
    """Deterministic identifier digests of at most 300 tokens after a scaled 2.0 s; thread-safe."""

    counter: Counter
    time_scale: float
    calls: list[SummarizerCall] = field(default_factory=list)
    agent_thread: int | None = None
    #: The identifiers the conversation being replayed named (None: any identifier).
    vocabulary: frozenset[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def summarize(self, prompt: str, material: str, *, input_tokens: int | None = None,
                  must_keep: Sequence[str] = (), batch: bool = False) -> str:
        """Summarize ``material``, the conversation part of ``prompt`` (the whole text the
        system sends its summarizer model, instruction included).

        ``input_tokens`` is the prompt's size if the caller counted it (a message list is
        counted with its framing); otherwise the prompt text is counted here. ``must_keep``:
        identifiers the prompt asks the summary to keep; they are listed first, within the
        same ``SUMMARY_TOKENS`` cap as everything else (a real summary has a length too).
        ``batch``: the call is a batch API's (see :class:`SummarizerCall`).
        """
        n_in = self.counter.text(prompt, cache=False) if input_tokens is None else input_tokens
        text = digest_summary(material, SUMMARY_TOKENS, counter=self.counter,
                              only=self.vocabulary, first=must_keep)
        started = time.perf_counter()
        time.sleep(SUMMARIZER_SECONDS * self.time_scale)
        elapsed = time.perf_counter() - started
        call = SummarizerCall(
            input_tokens=n_in, output_tokens=self.counter.text(text, cache=False),
            seconds=SUMMARIZER_SECONDS,
            measured_s=elapsed / self.time_scale if self.time_scale > 0 else 0.0,
            on_agent_thread=threading.get_ident() == self.agent_thread and not batch,
            batch=batch,
        )
        with self._lock:
            self.calls.append(call)
        return text


@dataclass
class ScriptedModel:
    """The agent's model: its answer is the transcript's; its latency is a scaled 4.0 s."""

    time_scale: float
    calls: int = 0

    def call(self) -> None:
        self.calls += 1
        time.sleep(MODEL_SECONDS * self.time_scale)
