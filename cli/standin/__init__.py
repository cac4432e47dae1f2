"""Stand-ins for the outside world, for tests, replay and the demo: no API key, no network.

- :mod:`.fakeprovider`: :class:`~.fakeprovider.FakeProvider`, a scripted model provider that
  speaks the Anthropic Messages API (in process, or over HTTP for other processes).
- :mod:`.opsagent`: the scripted on-call operations agent whose long tool-using conversations
  the demo runs.
"""
