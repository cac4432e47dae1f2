"""sessionfold.cli: the operator's side. The ``sessionfold`` command, the local stack, replay and
the demo, with the stand-ins they drive.

- :mod:`.main`: ``main()`` of the ``sessionfold`` command (``python -m sessionfold.cli``); each
  area adds its subcommands from :mod:`.commands`.
- :mod:`.files`: session files read from disk (the engine parses their text).
- :mod:`.hosts`: which addresses are this machine only.
- :mod:`.stack`: the whole pipeline on one machine (``sessionfold up`` and the demo).
- :mod:`.replay`: session files replayed as standing agents through a running pipeline.
- :mod:`.demo`: a fleet of scripted agents through the whole pipeline, and the report.
- :mod:`.standin`: stand-ins for the outside world: a scripted model provider that speaks the
  Anthropic Messages API (:mod:`.standin.fakeprovider`), and the scripted operations agent whose
  conversations the demo runs (:mod:`.standin.opsagent`).
- ``examples/``: the bundled example session (``sessionfold compact``).

The CLI sits on top of everything (core ← store ← workers ← client ← service ← cli); nothing
imports it.
"""
