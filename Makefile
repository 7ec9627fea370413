# kvpilot -- every target installs what it needs; nothing is assumed on the machine
# beyond Python 3.11+, Go and apt (the project's machine kind).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.installed

.PHONY: help install lint test unit chart-crds chart-lint demo bench clean

help: ## list targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel
	$(PIP) install -e '.[dev,vllm]'
	touch $@

install: $(STAMP) ## create .venv with kvpilot, the dev tools and the pinned vLLM

lint: install ## ruff and import-linter (the tuner stays sans-I/O)
	$(VENV)/bin/ruff check kvpilot tests bench e2e
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

-include e2e/e2e.mk

chart-crds: ## refresh the chart's copy of crds/ (tests/chart/test_crd_drift.py fails on drift)
	cp crds/inferenceservices.kvpilot.io.yaml charts/kvpilot/files/crds/

chart-lint: install e2e-bin ## helm lint/template, schema, RBAC, drift and Dockerfile checks
	$(PY) -m pytest tests/chart tests/test_dockerfile.py

unit: install ## unit, property and contract tests (no cluster)
	$(PY) -m pytest tests

test: install lint e2e-tools ## everything CI runs: unit, property, contract and e2e tests
	$(PY) -m pytest

demo: install e2e-tools ## the operator end to end: local cluster, GPU node pools, Prometheus, vLLM fleet, scenarios
	$(PY) -m e2e.demo

bench: install ## print the benchmark figures
	$(PY) bench/memory_accuracy.py
	$(PY) bench/plan_speed.py
	$(PY) bench/closed_loop.py

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .import_linter_cache
