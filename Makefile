# Two commands set up and exercise a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# A second environment without triton (as on macOS, where triton ships no wheel): everything but
# the Triton engine must work there.
BARE ?= .venv-notriton
BARE_STAMP := $(BARE)/.installed-stamp
# What touches tcast's engine choice, each CLI's commands and the compression passes (the rest of
# the suite imports triton nowhere either; the whole of it twice would not fit the CI budget).
BARE_TESTS ?= tests/test_tcast_*.py tests/test_tritoncast.py tests/test_cli.py tests/test_quantize_cli.py tests/test_no_silent_noops.py
DEMO_OUT ?= build/demo
# Compiled modules go to build/pycache, outside the source tree, even where PYTHONDONTWRITEBYTECODE
# is set (as on our CI machines): without them every process of the suite - pytest's workers, each
# CLI child - compiled torch, coreai and ours from source again (~1.2 CPU s for torch alone):
# `.ci/run` on a fresh clone took 376 s before, 307 s after (2026-11-27, 2 cores).
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/build/pycache
# Two pytest workers on two cores: OpenMP threads that spin while they wait take the CPU the other
# worker needs (the console scripts set the same: cli/_common.py).
export OMP_WAIT_POLICY ?= PASSIVE
# ... and a second torch thread per worker only contends with the other worker: the main run took
# 770.8 CPU-s (6:42 wall) with one thread each against 879.8 (7:41) with two, the same 2502 tests
# passing (2026-12-02, 2 cores). The tests of threads shared between weights set their own count
# (tests/test_executors.py). The demo keeps torch's threads.
test test-without-triton: export OMP_NUM_THREADS ?= 1
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-without-triton lint samples clean

# --no-compile: byte-compiling every module of torch and its kin costs ~80 s a venv on 2 cores, and
# the suite imports a small part of them (Python compiles those on first import, into build/pycache
# below).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev,ray,plot]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" DEMO_OUT=$(DEMO_OUT) bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal -q
	$(MAKE) test-without-triton

# The main environment's installed packages less triton, linked (scripts/link_venv.py): a second
# install of the same packages would take about a minute of the CI budget.
$(BARE_STAMP): $(STAMP)
	$(PYTHON) scripts/link_venv.py $(VENV) $(BARE) --without triton
	touch $(BARE_STAMP)

# One process: its ~20 CPU-s of tests did not pay for two more processes that each load torch
# (27.2 -> 21.4 CPU-s, 16 -> 22 s wall; 2026-12-03).
test-without-triton: $(BARE_STAMP)
	$(BARE)/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is not None)"
	$(BARE)/bin/python -m pytest -q -rs $(BARE_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

samples: $(STAMP)
	$(BIN)/python sample_models/build.py

clean:
	rm -rf $(VENV) $(BARE) build
