# Two commands set up and exercise a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_OUT ?= build/demo

.PHONY: demo test lint samples clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,ray,plot]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" DEMO_OUT=$(DEMO_OUT) bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

samples: $(STAMP)
	$(BIN)/python sample_models/build.py

clean:
	rm -rf $(VENV) build
