#!/usr/bin/env bash
# Make the peers' own virtualenvs: bench/.venv-peers-<peer>, from requirements-<peer>.txt.
#
#   bash bench/peers/setup_peers.sh                 # all four: langchain openhands autogen langmem
#   bash bench/peers/setup_peers.sh openhands       # just one
#
# The peers are installed apart from the project (their dependencies would clash with it, and
# openhands-sdk needs Python >= 3.12). PYTHON picks the interpreter; by default pyenv's 3.12.1,
# else python3.12 on the PATH. An existing virtualenv is reused and brought up to the pins.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$(dirname "$here")"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x /root/.pyenv/versions/3.12.1/bin/python ]]; then
    python=/root/.pyenv/versions/3.12.1/bin/python
  else
    python="$(command -v python3.12 || true)"
  fi
fi
if [[ -z "$python" ]] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  echo "setup_peers.sh: need Python >= 3.12 (openhands-sdk); set PYTHON=/path/to/python3.12" >&2
  exit 2
fi

peers=("$@")
if [[ ${#peers[@]} -eq 0 ]]; then
  peers=(langchain openhands autogen langmem)
fi
for peer in "${peers[@]}"; do
  req="$here/requirements-$peer.txt"
  if [[ ! -f "$req" ]]; then
    echo "setup_peers.sh: unknown peer '$peer' (no $req)" >&2
    exit 2
  fi
  venv="$bench/.venv-peers-$peer"
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "setup_peers.sh: $peer ready in $venv"
done
