# SAILOR — two commands: `make demo` (a full training run through the Airflow DAGs on the local
# backend) and `make test`. Both create .venv when missing; a second run reuses it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.sailor-installed
DB_STAMP := .airflow/.migrated

# Airflow runs from the project: SQLite under .airflow/, no examples, our dags/ and plugins/.
export AIRFLOW_HOME                   := $(CURDIR)/.airflow
export AIRFLOW__CORE__LOAD_EXAMPLES   := False
export AIRFLOW__CORE__DAGS_FOLDER     := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER  := $(CURDIR)/plugins
export AIRFLOW__CORE__PARALLELISM     := 4
export AIRFLOW__CORE__UNIT_TEST_MODE  := False
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS := admin:admin
# Local development only: a fixed password (admin) instead of a generated one, so the README's
# REST examples work as written. Deployments use their own auth manager / passwords file.
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE := $(CURDIR)/.airflow/passwords.json
# SAILOR's own state (region buckets, ledger) lives in .sailor/ unless overridden.
export SAILOR_STATE_DIR ?= $(CURDIR)/.sailor

.PHONY: help venv airflow-db system-deps demo test lint bench airflow clean

help:
	@echo "make demo     set up and run a full training run through the Airflow DAGs (local backend)"
	@echo "make test     set up and run the test suite"
	@echo "make airflow  start 'airflow standalone' on http://localhost:8080 (user admin / admin)"
	@echo "make bench    run the benchmarks in bench/ (each prints one JSON object)"
	@echo "make lint     ruff, the import contracts (lint-imports) and the declared dependencies (deptry)"

venv: $(STAMP)

# torch first (the CPU wheel pinned in requirements.txt), then everything else, then the package.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q "$$(grep -E '^torch==' requirements.txt)"
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

airflow-db: $(DB_STAMP)

$(DB_STAMP): $(STAMP)
	@mkdir -p .airflow
	$(BIN)/airflow db migrate > .airflow/migrate.log 2>&1 || (cat .airflow/migrate.log; exit 1)
	@touch $@

demo: $(DB_STAMP)
	$(BIN)/sailor demo

# The e2e tests start PostgreSQL (Debian's server binaries) and drive headless Chromium through
# chromedriver; install the Debian packages when missing (CI runs as root).
system-deps:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "warning: missing$$missing (apt-get install$$missing); the e2e tests need them"; fi; \
	fi

test: $(DB_STAMP) system-deps
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check dags/ plugins/ sailor_tasks/ tests/ bench/ examples/
	$(BIN)/lint-imports
	$(BIN)/deptry .

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The UI's login is admin/admin: serve it on the loopback interface only (AIRFLOW_HOST=0.0.0.0
# exposes it to the network; set a real password first).
AIRFLOW_HOST ?= 127.0.0.1
airflow: $(DB_STAMP)
	@test -f .airflow/passwords.json || echo '{"admin": "admin"}' > .airflow/passwords.json
	AIRFLOW__API__HOST=$(AIRFLOW_HOST) $(BIN)/airflow standalone

clean:
	rm -rf .airflow .sailor artifacts
