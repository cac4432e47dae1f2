"""The peer compactors, each driven as its users drive it, in a virtualenv of its own.

``setup_peers.sh`` makes the virtualenvs (``bench/.venv-peers-<peer>``, Python 3.12) from the
``requirements-<peer>.txt`` files; ``run_peer.py`` replays the transcripts through one peer with
the shared harness (``bench/b1``) and writes the same JSON the sessionfold systems produce.
Every adapter converts each transcript message to the peer's own types, lets the peer decide
what the model is sent, and converts that back to the Anthropic shape, which the harness
measures. Before a run, each adapter checks that a transcript converted to its types and back is
byte-identical, so any difference in what is billed comes from the peer's compaction alone.
"""
