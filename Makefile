# The two Quick-start commands: `make demo` and `make test` (CI runs `make test`).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint bench clean dashboard-png ray-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,ray]'
	touch $@

demo: install
	$(PY) examples/demo.py

lint: install
	$(VENV)/bin/ruff check src tests bench examples scripts
	$(VENV)/bin/mypy

# Ray Serve 2.60 in a venv of its own (surge's has Ray without Serve's extras): tests run
# Ray's own `serve` CLI against surge; the benchmarks run Ray Serve as their anchor.
ray-venv: install
	$(PY) -c "from bench.common import ray_python; print(ray_python())"

test: lint ray-venv
	sh scripts/ensure-chromium.sh
	$(PY) -m pytest

dashboard-png: install  # regenerate docs/dashboard.png (a short pulse, then a screenshot)
	sh scripts/ensure-chromium.sh
	$(PY) scripts/dashboard_screenshot.py docs/dashboard.png

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
