# Two commands do all the set-up on a fresh machine with Python 3.11+:
#   make demo   - venv, install, run the scripted agent against a flaky local service
#   make test   - venv, install, lint, type-check, run the whole suite (embedded Valkey)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-redis lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolexec demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

# The same suite against an external server, e.g. the one on 127.0.0.1:6379.
TEST_REDIS_URL ?= redis://127.0.0.1:6379
test-redis: $(STAMP)
	TOOLEXEC_TEST_REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
