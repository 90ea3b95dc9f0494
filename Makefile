# TaskForge developer commands. Needs only Python 3.11+ and make.
#
#   make run    API on http://localhost:8080 (+ embedded Postgres and Redis unless
#               DATABASE_URL and REDIS_URL are set)
#   make test   the whole test suite; extra pytest arguments: make test ARGS="-k foo"
#
# Every install is the locked set: uv.lock (one resolution for Linux x86-64 and arm64 and
# macOS, every Python from 3.11 on, each file's hash), exported to requirements/*.txt and
# installed by plain pip with --require-hashes.  `make lock` refreshes the lock on purpose.

PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
# Reinstall when the lock's export for development is newer than this file.
STAMP := $(VENV)/.installed
REQUIREMENTS := requirements
PIP_INSTALL := $(VENV)/bin/python -m pip install --disable-pip-version-check -q
BROWSER_STAMP := $(VENV)/.browser
PGBOUNCER_STAMP := $(VENV)/.pgbouncer
PROMETHEUS_STAMP := $(VENV)/.prometheus
DATA := .taskforge
DEVSERVICES := $(BIN)/python -m devservices

# Procfile lines and the test suite find gunicorn, honcho and python in the venv.
export PATH := $(BIN):$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))

.DEFAULT_GOAL := help
.PHONY: help run test lint fmt audit audit-code audit-deps bench lock lock-upgrade clean

help:
	@echo "make run     start the API on http://localhost:8080 (Ctrl-C stops everything)"
	@echo "make test    run the test suite (ARGS=\"-k foo\" passes arguments to pytest)"
	@echo "make lint    ruff check + ruff format --check + mypy (type checking)"
	@echo "make fmt     format and autofix with ruff"
	@echo "make audit   bandit over the code, pip-audit over the installed packages (needs the network)"
	@echo "make bench   throughput and latency figures (ARGS=\"--runs 5\" passes arguments)"
	@echo "make lock    re-resolve uv.lock after a change to pyproject.toml's dependencies"
	@echo "make lock-upgrade  move every locked package to its newest allowed version"
	@echo "make clean   remove .venv and the local data in $(DATA)/"

# The lock's pins with their hashes, then TaskForge itself (editable, built by the locked
# setuptools: no build isolation, so nothing unpinned is fetched for the build).
define install_locked
	$(PIP_INSTALL) --require-hashes --no-deps -r $(1)
	$(PIP_INSTALL) --no-deps --no-build-isolation -e .
endef

$(STAMP): uv.lock $(REQUIREMENTS)/dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "TaskForge needs Python 3.11 or newer as '$(PYTHON)'; try: make PYTHON=python3.12 ..." >&2; \
	  exit 1; }
	@test -x $(VENV)/bin/python || { echo "Creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "Installing TaskForge and its locked dependencies into $(VENV)"
	$(call install_locked,$(REQUIREMENTS)/dev.txt)
	@touch $@

# Migrate, create an admin API key and a dashboard login (user admin) the first time
# (.taskforge/admin_api_key, .taskforge/dashboard_password), print them with the API's and
# the dashboard's addresses, then run the Procfile under honcho. Honcho answers Ctrl-C with exit code 130: that is a normal stop.
# /metrics sums the counters of every process (taskforge/metrics.py: no setting needed).
run: $(STAMP)
	$(DEVSERVICES) run --data $(DATA) --setup -- honcho start || [ $$? -eq 130 ]

# The dashboard's browser tests drive Debian's Chromium. Install it when we can (root with
# apt-get); otherwise those tests skip and say why.
$(BROWSER_STAMP): | $(STAMP)
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's chromium for the dashboard's browser tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium fonts-dejavu-core >/dev/null; } \
	  || echo "chromium could not be installed: the browser tests will be skipped"; \
	else echo "no chromium (apt-get install chromium): the browser tests will be skipped"; fi
	@touch $@

# tests/test_pgbouncer.py runs the service through Debian's pgbouncer (transaction mode).
# Install it when we can (root with apt-get); otherwise those tests skip and say why.
$(PGBOUNCER_STAMP): | $(STAMP)
	@if [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's pgbouncer for the pgbouncer tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      pgbouncer >/dev/null; } \
	  || echo "pgbouncer could not be installed: the pgbouncer tests will be skipped"; \
	else echo "no pgbouncer (apt-get install pgbouncer): the pgbouncer tests will be skipped"; fi
	@touch $@

# tests/test_monitoring.py checks deploy/'s alert rules with Debian's promtool and has a
# real Prometheus scrape the service.  Install it when we can (root with apt-get; about 15 s,
# without the node exporter it recommends); otherwise those tests skip and say why.
$(PROMETHEUS_STAMP): | $(STAMP)
	@if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's prometheus for the alert rules' and dashboard's tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends prometheus >/dev/null; } \
	  || echo "prometheus could not be installed: the monitoring tests will be skipped"; \
	else echo "no prometheus (apt-get install prometheus): the monitoring tests will be skipped"; fi
	@touch $@

# pytest's exit code 5 means "no tests collected": an error when ARGS selected nothing,
# accepted for the whole suite (a project with no tests yet is not a failing project).
#
# The suite runs in TEST_PROCESSES processes (pytest-xdist), a test file per process at a
# time: most tests wait on servers they started, not on the CPU.  Each process has its own
# test database and Redis db (tests/workers.py).  TEST_PROCESSES=0 runs it in one process.
# The whole suite also lists its 25 slowest steps, to keep an eye on its time.
TEST_PROCESSES ?= 3
test: $(STAMP) $(BROWSER_STAMP) $(PGBOUNCER_STAMP) $(PROMETHEUS_STAMP)
	@echo "+ pytest -n $(TEST_PROCESSES) $(ARGS)"
	@$(DEVSERVICES) run --throwaway -- python -m pytest -n $(TEST_PROCESSES) --dist loadfile \
	  $(if $(strip $(ARGS)),$(ARGS),--durations=25) \
	  $(if $(strip $(ARGS)),,|| { rc=$$?; [ $$rc -eq 5 ] && echo "pytest: no tests collected" && exit 0; exit $$rc; })

lint: $(STAMP)
	ruff check .
	ruff format --check .
	mypy .

fmt: $(STAMP)
	ruff format .
	ruff check --fix .

# Security checks; what they found and why what is left stays: docs/security-scan.md.
# audit-code (bandit) works offline and runs in CI. audit-deps (pip-audit) asks PyPI's
# advisory data about every installed package and fails when any could not be checked
# (--strict), so a run without the network cannot pass by skipping everything.
# The shipped packages allow only B101 (assert); the development tools (devservices/,
# bench/) also start processes, from fixed argument lists.
BANDIT := bandit -q -x '*/tests/*,*/migrations/*'

audit: audit-code audit-deps

audit-code: $(STAMP)
	$(BANDIT) -s B101 -r taskforge queues tasks workers dlq dashboard taskforge_client \
	  manage.py gunicorn.conf.py
	$(BANDIT) -s B101,B404,B603,B606,B607 -r devservices bench

audit-deps: $(STAMP)
	pip-audit --strict --skip-editable --progress-spinner off

# bench/run.py starts the API and the loops against a fresh database (taskforge_bench on the
# server of DATABASE_URL, else a throwaway embedded Postgres and Redis), drives them from
# separate load processes and prints a table and one JSON line. About 2-3 minutes.
# The Celery peer row needs Celery (the `bench` extra), installed once beside the rest.
BENCH_STAMP := $(VENV)/.bench
$(BENCH_STAMP): uv.lock $(REQUIREMENTS)/bench.txt | $(STAMP)
	$(call install_locked,$(REQUIREMENTS)/bench.txt)
	@touch $@

bench: $(STAMP) $(BENCH_STAMP)
	@$(DEVSERVICES) run --throwaway -- python bench/run.py $(ARGS)

# The lock.  `make lock` re-resolves uv.lock after pyproject.toml's dependencies changed,
# keeping every other pin (ARGS="--upgrade-package NAME" moves one package);
# `make lock-upgrade` moves every package to the newest version pyproject.toml allows.
# Both then export the requirement files every install reads:
#   requirements/dev.txt      make run, make test, make lint (extras local, test and tracing)
#   requirements/bench.txt    make bench (also the bench extra)
#   requirements/service.txt  the container image (deploy/build.sh: no extra)
#   requirements/uv.txt       uv itself, installed here by the first `make lock`
# A refreshed lock is a change of every install: run the whole suite (make lint, make
# test, make bench's peer row) on it before committing it.  tests/test_lock.py fails while
# pyproject.toml, uv.lock and requirements/ disagree.
UV := $(BIN)/uv
UV_EXPORT := $(UV) export --frozen --no-emit-project --no-header --no-default-groups
LOCK_HEADER := \# Exported from uv.lock by make lock; do not edit.

$(UV): | $(STAMP)
	$(PIP_INSTALL) --require-hashes --no-deps -r $(REQUIREMENTS)/uv.txt

define export_lock
	@mkdir -p $(REQUIREMENTS)
	@for set in "dev:--extra local --extra test --extra tracing" \
	            "bench:--extra local --extra test --extra tracing --extra bench" \
	            "service:" "uv:--only-group lock"; do \
	  name=$${set%%:*}; options=$${set#*:}; \
	  case $$options in --only-group*) groups=;; *) groups="--group build";; esac; \
	  { echo "$(LOCK_HEADER)"; $(UV_EXPORT) $$groups $$options; } > $(REQUIREMENTS)/$$name.txt \
	    || exit 1; \
	  echo "wrote $(REQUIREMENTS)/$$name.txt"; \
	done
endef

lock: $(UV)
	$(UV) lock $(ARGS)
	$(export_lock)

lock-upgrade: $(UV)
	$(UV) lock --upgrade $(ARGS)
	$(export_lock)

clean:
	@if [ -x $(VENV)/bin/python ] && [ -d $(DATA) ]; then \
	  $(DEVSERVICES) stop --data $(DATA) || { \
	    echo "Not removing $(DATA): stop 'make run' first (or delete it by hand)" >&2; exit 1; }; fi
	rm -rf $(VENV) $(DATA) .pytest_cache .ruff_cache .mypy_cache *.egg-info
