# sessionfold: the two commands a newcomer runs.
#
#   make demo   create .venv if needed, install sessionfold with the demo extra (the pipeline's
#               worker side, rich, matplotlib), then run `sessionfold demo`: the whole pipeline on
#               the embedded defaults (Redis, SQLite, scheduler, two workers, Flower, metrics)
#               with a fleet of scripted standing agents, ending with a report and
#               sessionfold-demo.png
#   make test   create .venv if needed, install the dev extra (every role, the linters, the test
#               tools), then ruff, mypy --strict, the TypeScript package (clients/typescript:
#               npm ci, tsc, node --test; Node 18+) and pytest
#
# Each extra is installed into the virtualenv once, and again only when pyproject.toml is newer
# than its stamp, so the targets are cheap once it exists. PYTHON picks the interpreter that
# creates it (3.11+).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
#: What `make demo` and `make compact-example` need, and what every check needs.
DEMO_STAMP := $(VENV)/.sessionfold-demo
DEV_STAMP := $(VENV)/.sessionfold-dev
EXAMPLE := cli/examples/ops-incident-acct-8842.json
PYTEST_ARGS ?=
NEED_311 := import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)

.PHONY: demo compact-example test lint typecheck typescript pytest bench clean-venv

DEMO_ARGS ?=

demo: $(DEMO_STAMP)
	$(BIN)/sessionfold demo $(DEMO_ARGS)

# The pure fold engine alone: fold the bundled example session and report.
compact-example: $(DEMO_STAMP)
	$(BIN)/sessionfold compact $(EXAMPLE) --report

test: lint typecheck typescript pytest

lint: $(DEV_STAMP)
	$(BIN)/ruff check .

# mypy --strict over every package (sessionfold.core, .store, .runtime, .workers, .client,
# .service, .cli).
typecheck: $(DEV_STAMP)
	PYTHON=$(BIN)/python bash tools/typecheck.sh

# The TypeScript package, installed from its lockfile, built, and tested against a real
# `sessionfold serve` and `sessionfold standin` of this virtualenv (each test file starts its own).
typescript: $(DEV_STAMP)
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test

pytest: $(DEV_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(DEV_STAMP)
	$(BIN)/python bench/bench_compact.py

# $(VENV)/.sessionfold-EXTRA: sessionfold installed (editable) with that extra of pyproject.toml.
$(VENV)/.sessionfold-%: pyproject.toml
	@if [ ! -x $(BIN)/python ]; then \
	  $(PYTHON) -c '$(NEED_311)' || { echo "sessionfold needs Python 3.11 or newer;" \
	    "'$(PYTHON)' is $$($(PYTHON) --version 2>&1). Try: make $(MAKECMDGOALS) PYTHON=python3.11" >&2; \
	    exit 1; }; \
	  echo "creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); \
	fi
	@$(BIN)/python -c '$(NEED_311)' || { echo "$(VENV) holds $$($(BIN)/python --version);" \
	  "sessionfold needs 3.11 or newer: make clean-venv, then retry" >&2; exit 1; }
	$(BIN)/python -m pip install --quiet -e '.[$*]'
	@touch $@

clean-venv:
	rm -rf $(VENV)
