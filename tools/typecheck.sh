#!/usr/bin/env bash
# mypy --strict over the three packages under their import names.
# The editable install maps core/, store/, workers/ to sessionfold.* with an import hook mypy
# cannot follow, so build a tree of symlinks (kept out of git) that mirrors the installed layout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree="$root/build/typecheck"
mkdir -p "$tree/sessionfold"
for pkg in core store workers; do
  ln -sfn "$root/$pkg" "$tree/sessionfold/$pkg"
done
cd "$root"
[ $# -gt 0 ] || set -- -p sessionfold.core -p sessionfold.store -p sessionfold.workers
MYPYPATH="$tree" exec "${PYTHON:-$root/.venv/bin/python}" -m mypy --strict "$@"
