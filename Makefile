# The two Quick-start commands: `make demo` and `make test` (CI runs `make test`).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: install
	$(PY) examples/demo.py

lint: install
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
