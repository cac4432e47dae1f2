#!/usr/bin/env bash
# mypy --strict over every package under its import name: sessionfold.core, .store, .runtime,
# .workers, .client, .service and .cli.
# The editable install maps each package folder (core/, store/ ... cli/) to sessionfold.* with an
# import hook mypy cannot follow, so build a tree of symlinks (kept out of git) that mirrors the
# installed layout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree="$root/build/typecheck"
packages=(core store runtime workers client service cli)
mkdir -p "$tree/sessionfold"
for pkg in "${packages[@]}"; do
  ln -sfn "$root/$pkg" "$tree/sessionfold/$pkg"
done
cd "$root"
if [ $# -eq 0 ]; then
  for pkg in "${packages[@]}"; do set -- "$@" -p "sessionfold.$pkg"; done
fi
MYPYPATH="$tree" exec "${PYTHON:-$root/.venv/bin/python}" -m mypy --strict "$@"
