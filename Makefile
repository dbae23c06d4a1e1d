# s3batch: every target does its own set-up (virtual environment, install, local stack).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK = 1
export NO_MKDOCS_2_WARNING = 1

.PHONY: install test lint audit demo stack-up stack-down bench clean chromium docs docs-serve

# Exactly the locked versions (with their hashes), then the project itself: a release of a dependency
# published since the lock never changes what the tests run on.
$(STAMP): pyproject.toml requirements-dev.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps -e .
	# The project's own bytecode, written once (as the image's compileall does): where the environment sets
	# PYTHONDONTWRITEBYTECODE, an editable install is otherwise compiled from source by every process and,
	# in the workflow sandbox, by every workflow run (a stale file is recompiled in memory, never trusted).
	$(BIN)/python -m compileall -q s3batch workflows activities worker.py
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python scripts/typecheck.py

# The test suite, in TEST_WORKERS parallel pytest-xdist workers, each starting its own Temporal dev
# server and SeaweedFS on loopback ports of its own (tests/conftest.py). Most tests wait (servers,
# heartbeats, workers), so more workers than cores pays: 4 measured best on 2 cores; use about twice
# the cores on a bigger machine (TEST_WORKERS=8), 0 for one process. It runs under coverage (line and
# branch, xdist workers, worker and CLI subprocesses included; see [tool.coverage.*] in
# pyproject.toml): the total is printed, and below fail_under the target fails. A selection of tests
# (PYTEST_ARGS, e.g. tests/test_pages.py or -k resume) prints its coverage without the floor.
TEST_WORKERS ?= 4
# The type check (mypy, about 13 s from a clean clone) runs beside the suite's first seconds, while its
# workers start their servers; its output follows the suite's, and a type error fails the target.
test: $(STAMP) chromium
	$(BIN)/ruff check .
	rm -f .coverage .coverage.*
	mkdir -p .stack
	$(BIN)/python scripts/typecheck.py >.stack/typecheck.log 2>&1 & typecheck=$$!; \
	  $(BIN)/coverage run -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/coverage combine --quiet; \
	  $(BIN)/coverage report $(if $(PYTEST_ARGS),--fail-under=0); covered=$$?; \
	  wait $$typecheck; typed=$$?; echo "---- type check (scripts/typecheck.py, exit $$typed) ----"; \
	  cat .stack/typecheck.log; \
	  [ $$status -ne 0 ] && exit $$status; [ $$typed -ne 0 ] && exit $$typed; exit $$covered

# The quick loop while coding: unit and property tests, no server started (-m "not servers"), in two
# processes, no coverage; about a minute and a half.
.PHONY: test-quick
test-quick: $(STAMP)
	$(BIN)/pytest -m "not servers" -n 2 -q $(PYTEST_ARGS)

# Debian's Chromium for the Web UI test (Playwright drives it; no browser download). Installed
# where apt-get can (root); elsewhere the Web UI test is skipped with a message.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed: the Web UI test will be skipped"; \
	  else echo "chromium not installed (needs root and apt-get): the Web UI test will be skipped"; fi; }

# The documentation site (mkdocs.yml; Material for MkDocs, mkdocstrings): built into site/ with --strict, so
# a warning, a broken link or a missing anchor fails it. Its reference pages are generated from the code at
# build time (scripts/mkdocs_hooks.py). `make docs-serve` rebuilds on every change, on 127.0.0.1:$(DOCS_PORT).
DOCS_PORT ?= 8000
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet --site-dir site

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

AUDIT_VENV := .stack/audit-venv
# Known vulnerabilities in the locked dependencies, with pip-audit in a venv of its own. Offline-tolerant:
# where pip-audit cannot be installed or the service cannot be reached, skipped with a message (exit 0);
# a known vulnerability fails the target.
audit:
	@test -x $(AUDIT_VENV)/bin/pip-audit || { $(PYTHON) -m venv $(AUDIT_VENV) \
	  && $(AUDIT_VENV)/bin/pip install --quiet 'pip-audit==2.10.1'; } \
	  || { echo "audit skipped: pip-audit could not be installed (no network?)"; exit 0; }; \
	for lock in requirements.lock requirements-dev.lock; do \
	  $(AUDIT_VENV)/bin/pip-audit --disable-pip --require-hashes --progress-spinner off --timeout 30 \
	    -r $$lock > $(AUDIT_VENV)/$$lock.txt 2>&1; status=$$?; \
	  if [ $$status -ne 0 ] && ! grep -q "known vulnerabilit" $(AUDIT_VENV)/$$lock.txt; then \
	    tail -n 1 $(AUDIT_VENV)/$$lock.txt; \
	    echo "audit of $$lock skipped: the vulnerability service could not be reached"; continue; \
	  fi; \
	  cat $(AUDIT_VENV)/$$lock.txt; \
	  if grep -q "could not be audited" $(AUDIT_VENV)/$$lock.txt; then \
	    echo "audit of $$lock incomplete: the packages above are unknown to the vulnerability service"; fi; \
	  [ $$status -eq 0 ] || exit $$status; \
	done

# The worker image built and run for real on a Docker engine (scripts/container/test.sh; docs/how-to/deploy.md):
# an engine (Debian's docker.io, installed and started where none runs; root and apt-get needed, else
# skipped with a message), the Debian base image built once and cached, the worker image, then
# tests/test_container.py against the local test stack. Stops the engine it started and removes what
# it built but the cached base. CONTAINER_TEST_ARGS: extra pytest arguments (e.g. -k kill).
.PHONY: test-container
test-container: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/container/test.sh $(CONTAINER_TEST_ARGS)

stack-up: $(STAMP)
	$(BIN)/s3batch-stack up

stack-down: $(STAMP)
	$(BIN)/s3batch-stack down

# One worker on the local stack, in the foreground (Ctrl-C stops it): jobs started after `make demo`
# or `make stack-up` run on it. `s3batch-stack up --workers N` starts workers in the background.
.PHONY: worker
worker: $(STAMP)
	$(BIN)/s3batch-stack worker

# Starts the stack and two workers, uploads sample data, runs a job with a progress bar.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# An upgrade with Worker Versioning on the local stack: jobs running on build v1, v2 started beside it and
# made current, new jobs on v2, running runs finishing on v1 or moving at their next file end, v1 stopped
# once drained (scripts/upgrade_demo.py; docs/how-to/upgrade.md).
.PHONY: upgrade-demo
upgrade-demo: $(STAMP)
	$(BIN)/python scripts/upgrade_demo.py

# The same upgrade with the workers as compose services (worker-v1, worker-v2 of docker-compose.yml, profile
# "upgrade"): a Docker engine (as make test-container gets one), the worker image, Temporal and S3 on ports of
# their own (the compose stack where its images can be pulled, else a local stack), v1 up and current, jobs, v2
# up and promoted, v1 stopped once drained; everything removed at the end (scripts/upgrade_demo_compose.py;
# docs/how-to/upgrade.md). Several minutes (image build); not part of make test.
.PHONY: upgrade-demo-compose
upgrade-demo-compose: $(STAMP)
	$(BIN)/python scripts/upgrade_demo_compose.py $(UPGRADE_DEMO_ARGS)

# Many jobs of every kind under combined faults on a stack of its own, the books checked at the end
# (scripts/soak; docs/explanation/reliability.md): SOAK_MINUTES (10) of jobs and faults, then the drain and the check;
# SOAK_SEED replays a run's schedule (its seed is printed first); SOAK_ARGS more flags (--faults-per-minute,
# --jobs, --port-range; python -m scripts.soak --help). Exits 1 on a violation, printing the seed, the faults'
# timeline and the first record that breaks the books.
SOAK_MINUTES ?= 10
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python -m scripts.soak --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) $(SOAK_ARGS)

bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean: stack-down
	rm -rf $(VENV) .stack .bench site
