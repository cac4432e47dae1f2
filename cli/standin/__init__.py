"""Stand-ins for the outside world, for tests, replay and the demo: no API key, no network.

- :mod:`.fakeprovider`: :class:`~.fakeprovider.FakeProvider`, a scripted model provider that
  speaks the Anthropic Messages API (in process, or over HTTP for other processes); its parts
  are modules of their own (faults, replies, request size, prompt cache, each API's wire
  format, transports, batches), named in its module doc.
- :mod:`.opsagent`: the scripted on-call operations agent whose long tool-using conversations
  the demo runs.
"""
