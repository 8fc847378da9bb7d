# One entry point for checks: CI runs `make check` exactly as the README shows it.
PYTHON ?= python3
PY_SOURCES = gateway ledger handlers tests

.PHONY: install check lint typecheck test chaos up

install:
	$(PYTHON) -m pip install -q -e '.[dev]'

check: install lint typecheck test

lint:
	$(PYTHON) -m ruff format --check $(PY_SOURCES)
	$(PYTHON) -m ruff check $(PY_SOURCES)

typecheck:
	$(PYTHON) -m mypy --strict gateway ledger handlers

test:
	$(PYTHON) -m pytest -q

# The long chaos run (the suite runs a short one): CHAOS_ORDERS, CHAOS_KILLS, CHAOS_SEED to vary it.
chaos:
	CHAOS_ORDERS=$${CHAOS_ORDERS:-200} CHAOS_KILLS=$${CHAOS_KILLS:-10} $(PYTHON) -m pytest -q -s -m chaos tests/e2e/test_chaos.py

up:
	$(PYTHON) -m pip install -q -e .
	effectgate up
