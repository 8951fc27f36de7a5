# Every target sets itself up: a fresh clone needs nothing but python3 (>= 3.11).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[torch,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) examples/demo.py $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy lazarus workflows activities workers bench examples

bench: setup
	$(PY) -m bench recovery --repeats 3

clean:
	rm -rf .lazarus .pytest_cache .mypy_cache .ruff_cache
