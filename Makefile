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

up:
	$(PYTHON) -m pip install -q -e .
	effectgate up
