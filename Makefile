# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make demo   - venv, install, run the scripted agent against a flaky local service
#   make test   - venv, install, lint, type-check, run the suite (embedded Valkey); the
#                 chaos scenarios are `make test-chaos`
#   make docs   - the documentation site (mkdocs.yml, docs/) as HTML in site/, strictly
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-chaos docs test-redis lint bench bench-perf chaos clean test-rabbitmq \
	test-cluster test-e2e screenshot browser honcho dashboard-preview mcp-conformance

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[ops,dev,e2e]'
	touch $(STAMP)
	@echo "toolexec is installed in $(VENV): '. $(VENV)/bin/activate' puts it on your PATH"

demo: $(STAMP)
	$(BIN)/toolexec demo

# ruff, strict mypy, and the import contracts in pyproject.toml (docs/architecture.md,
# Boundaries). mypy and lint-imports (grimp reads the package from its folders) both
# see the package through .typecheck/, a view of symlinks: toolexec -> executor/, with
# tasks/ and fallback/ inside it.
lint: $(STAMP)
	$(BIN)/ruff check .
	rm -rf .typecheck && mkdir -p .typecheck/toolexec
	cd .typecheck/toolexec && ln -s ../../executor/* . && ln -s ../../tasks tasks && ln -s ../../fallback fallback
	$(BIN)/mypy
	$(BIN)/mypy tests/rigs
	PYTHONPATH=.typecheck $(BIN)/lint-imports

# The suite but the chaos scenarios, in two steps; the second runs even when the first
# failed, and the target fails if either did. First the unit and security tiers, spread
# over two pytest processes (pytest-xdist): each has its own embedded Valkey, shared
# worker and temp directories; a module's tests stay in one process (--dist loadfile), so
# its workers start once, and the slowest modules go first (tests/conftest.py). Then the
# integration tests and the browser test in one process: they time parallel calls, urgent
# calls behind backlogs and half-open probes against wall-clock bounds, and four
# processes on two cores made those bounds miss (a clean-clone run, 2026-12-02: six
# such failures in 11.7 min; they pass in one process).
# The chaos scenarios kill servers and time recovery, one at a time, with nothing else
# running: `make test-chaos`, which .ci/run runs after this.
PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder
test: lint
	status=0; \
	$(BIN)/pytest $(PARALLEL) tests/unit tests/security || status=1; \
	$(BIN)/pytest tests/integration tests/e2e || status=1; \
	exit $$status

# Redis, RabbitMQ, Sentinel and workers killed under load (tests/chaos), one at a time.
test-chaos: $(STAMP)
	$(BIN)/pytest tests/chaos

# The official MCP conformance suite's server scenarios against `toolexec mcp --http`
# (Node 22 and the suite come from npm into ~/.cache/toolexec-tests): the scenario table.
mcp-conformance: $(STAMP)
	$(BIN)/pytest tests/integration/test_mcp_conformance.py -s -q

# The site from docs/ and the public modules' docstrings; --strict fails on a broken link,
# a missing anchor or a page left out of the navigation.
# mkdocstrings reads the package through the same view of symlinks as mypy (see lint).
docs: $(STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/toolexec
	cd .typecheck/toolexec && ln -s ../../executor/* . && ln -s ../../tasks tasks && ln -s ../../fallback fallback
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The same suite against an external server, e.g. the one on 127.0.0.1:6379: a server for
# tests. The run uses one of its databases 1-15 that is empty, and empties it again at
# the end; a database holding data is never used or flushed.
TEST_REDIS_URL ?= redis://127.0.0.1:6379
# Not run twice: what starts servers of its own whatever the URL (tests/chaos, the demo,
# the Procfile), the browser test of Flower, the benchmarks' smoke tests (they check that
# a bench prints its table), the MCP conformance suite (it checks the protocol, which
# no Redis server changes) and the unit tests; `make test` and `make test-chaos` run
# them once. The rest runs in one process, as `make test` runs the integration tier
# (under pytest-xdist each process would claim an empty database of its own).
REDIS_RUN_SKIPS = --ignore=tests/chaos --ignore=tests/e2e --ignore=tests/unit \
	--ignore=tests/integration/test_demo.py --ignore=tests/integration/test_procfile.py \
	--ignore-glob='tests/integration/test_*bench*' \
	--ignore=tests/integration/test_mcp_conformance.py
test-redis: $(STAMP)
	TOOLEXEC_TEST_REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest $(REDIS_RUN_SKIPS)

# The core integration modules with RabbitMQ as the broker (toolexec's state stays in
# Redis: embedded, or TOOLEXEC_TEST_REDIS_URL).
RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672//
RABBITMQ_CORE = tests/integration/test_retries.py tests/integration/test_validation.py \
	tests/integration/test_fanout.py tests/integration/test_timeouts.py \
	tests/integration/test_celery_native.py tests/integration/test_worker_pools.py
test-rabbitmq: $(STAMP)
	TOOLEXEC_TEST_BROKER_URL=$(RABBITMQ_URL) $(BIN)/pytest $(RABBITMQ_CORE)

# toolexec's state on a 3-master Redis Cluster of the run's own (redis-server on loopback
# ports, started by the tests) with RabbitMQ as the broker: the core, breaker,
# idempotency, payload and guard modules, and the cluster's own (a script whose keys
# span slots refused; a master killed under load), and `toolexec status` and the metrics
# adding up every shard's buckets (test_observability). Needs redis-server, redis-cli and
# RabbitMQ; without redis-server the modules are skipped and say why.
CLUSTER_MODULES = tests/integration/test_cluster.py tests/integration/test_retries.py \
	tests/integration/test_validation.py tests/integration/test_fanout.py \
	tests/integration/test_timeouts.py tests/integration/test_breaker_workers.py \
	tests/integration/test_breaker_concurrency.py tests/integration/test_idempotency.py \
	tests/integration/test_payloads.py tests/integration/test_guard.py \
	tests/integration/test_observability.py
test-cluster: $(STAMP)
	TOOLEXEC_TEST_CLUSTER=1 TOOLEXEC_TEST_BROKER_URL=$(RABBITMQ_URL) $(BIN)/pytest $(CLUSTER_MODULES)

# Debian's Chromium for the browser test (tests/e2e); Playwright drives it, nothing is downloaded.
browser:
	test -x /usr/lib/chromium/chromium || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

test-e2e: $(STAMP)
	$(BIN)/pytest tests/e2e

# Re-make docs/flower-tasks.png (the screenshot in docs/ops/monitoring.md) with the browser test.
screenshot: $(STAMP)
	TOOLEXEC_UPDATE_DOCS=1 $(BIN)/pytest tests/e2e -k tasks_page

# Re-make docs/dashboard-preview.png: the Grafana dashboard's queries on a real Prometheus
# (Debian's package) scraping a real worker under load, drawn with matplotlib.
dashboard-preview: $(STAMP)
	command -v prometheus >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus)
	$(BIN)/pip install --quiet -e '.[preview]'
	$(BIN)/python docs/deploy/preview/render.py

# The Procfile's processes (Valkey, a worker, Flower) with honcho, on loopback. The
# worker serves TOOLEXEC_TOOLS (e.g. TOOLEXEC_TOOLS=mytools make honcho), else only the
# built-in tools.
honcho: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/honcho start

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

# Cost per layer, memory, the Redis commands of one call, and where the CPU goes
# (py-spy and Dramatiq come with the bench extra).
bench-perf: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/overhead.py --peers
	$(BIN)/python bench/layers.py
	$(BIN)/python bench/memory.py --calls 20000
	$(BIN)/python bench/publish.py
	$(BIN)/python bench/commands.py
	$(BIN)/python bench/cpu_profile.py
	$(BIN)/python bench/runner.py

# Processes killed under load, one table (docs/ops/reliability.md); the soak is separate:
#   $(BIN)/python bench/chaos.py --scenario soak --minutes 20
chaos: $(STAMP)
	$(BIN)/python bench/chaos.py

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .ruff_cache .pytest_cache site
