# s3batch: every target does its own set-up (virtual environment, install, local stack).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: install test lint demo stack-up stack-down bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

# The test suite starts its own Temporal dev server and SeaweedFS on free loopback ports.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest $(PYTEST_ARGS)

stack-up: $(STAMP)
	$(BIN)/s3batch-stack up

stack-down: $(STAMP)
	$(BIN)/s3batch-stack down

# Starts the stack and two workers, uploads sample data, runs a job with a progress bar.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean: stack-down
	rm -rf $(VENV) .stack .bench
